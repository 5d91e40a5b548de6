"""Review batches: ≥ ``candidates_per_batch`` pending candidates not yet in a batch → the curator
opens one (the coordinator announces ``candidate_batches.created``); a batch with no pending
candidate left is closed. Deferred candidates never count and are never put in a batch again."""
from __future__ import annotations

import time

from state_db.vocab import CandidateStatus as C

OPEN, CLOSED = "open", "closed"


def unbatched(conn) -> list[str]:
    return [r[0] for r in conn.execute(
        "SELECT id FROM skill_candidates WHERE status = ? AND batch_id IS NULL ORDER BY created_at, id",
        (C.PENDING,))]


def open_if_due(tx, per_batch: int) -> str | None:
    """Open a batch of every unbatched pending candidate when there are ≥ ``per_batch``."""
    ids = unbatched(tx.conn)
    if len(ids) < per_batch:
        return None
    n = tx.one("SELECT COUNT(*) FROM candidate_batches")[0] + 1
    bid = f"b-{time.strftime('%Y%m%d', time.gmtime(tx.now))}-{n}"
    tx.insert("candidate_batches", {"id": bid, "status": OPEN, "created_at": tx.now})
    for cid in ids:
        tx.update("skill_candidates", cid, batch_id=bid)
    return bid


def close_finished(tx) -> list[str]:
    """Close open batches that have no pending candidate left."""
    done = [r[0] for r in tx.conn.execute(
        """SELECT b.id FROM candidate_batches b WHERE b.status = ? AND NOT EXISTS
             (SELECT 1 FROM skill_candidates c WHERE c.batch_id = b.id AND c.status = ?)""", (OPEN, C.PENDING))]
    for bid in done:
        tx.set_status("candidate_batches", bid, CLOSED, closed_at=tx.now)
    return done
