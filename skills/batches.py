"""Review batches: ≥ ``candidates_per_batch`` pending candidates not yet in a batch → the curator
opens one (the coordinator announces ``candidate_batches.created``); a batch with no pending
candidate left is closed. Deferred candidates never count and are never put in a batch again."""
from __future__ import annotations

import time

from state_db.queries import replays as replays_q
from state_db.queries import skills as Q
from state_db.vocab import BatchStatus

OPEN, CLOSED = BatchStatus.OPEN, BatchStatus.CLOSED


def open_if_due(tx, per_batch: int, *, wait_for_replays: bool = False) -> str | None:
    """Open a batch of every unbatched pending candidate when there are ≥ ``per_batch``; with
    ``wait_for_replays``, only candidates whose replays have ended (or that none could be planned
    for) count and join (skills/replay.py)."""
    ids = Q.unbatched(tx.conn)
    if wait_for_replays:
        waiting = replays_q.unmeasured_candidates(tx.conn)
        ids = [i for i in ids if i not in waiting]
    if len(ids) < per_batch:
        return None
    bid = f"b-{time.strftime('%Y%m%d', time.gmtime(tx.now))}-{Q.batch_count(tx.conn) + 1}"
    tx.insert("candidate_batches", {"id": bid, "status": OPEN, "created_at": tx.now})
    for cid in ids:
        tx.update("skill_candidates", cid, batch_id=bid)
    return bid


def close_finished(tx) -> list[str]:
    """Close open batches that have no pending candidate left; returns their ids."""
    done = [b.id for b in Q.finished_batches(tx.conn)]
    for bid in done:
        tx.set_status("candidate_batches", bid, CLOSED, closed_at=tx.now)
    return done
