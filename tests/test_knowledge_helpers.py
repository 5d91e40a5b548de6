"""Shared helpers for the knowledge, skills and curator tests (no tests here).

State is built through StateWriter as the real actors would: runs through the real loop engine
with the eval-agent's verifier, notes through the curator's retro path.
"""
from __future__ import annotations

import time

from knowledge.notes import NoteDraft, write_retro
from state_db.vocab import Actor, StopReason, WorkStatus
from tests.support.loop import BUGGY, FIXED, ScriptedActs, engine, make_workspace, submit

BAD = {"write": {"calc.py": BUGGY.replace("a - b", "a * b")}}          # add(2, 3) == 6
BAD_AGAIN = {"write": {"calc.py": BUGGY.replace("a - b", "a * b") + "\n# again\n"}}  # same failure
BAD2 = {"write": {"calc.py": "def add(a, b):\n    return \"wrong\"\n"}}   # fails differently: a word, not a number
GOOD = {"write": {"calc.py": FIXED}}


def run_loop(home, root, work_id, acts, *, settings=None, caps=None):
    """One real run of the loop engine on a fresh calc workspace; returns its stop decision."""
    ws = make_workspace(root / work_id)
    submit(home, ws, work_id=work_id, caps=caps)
    return engine(home, work_id, ScriptedActs(acts), settings=settings).run()


def ended_run(writer_for, run_id: str, goal: str = "a goal") -> str:
    """A run that a human submitted and cancelled (ended) — enough for notes to refer to."""
    now = time.time()
    with writer_for(Actor.HUMAN).transaction() as tx:
        tx.insert("work_items", {"id": run_id, "goal": goal, "workspace": f"/tmp/ws-{run_id}", "verify": ["true"],
                                 "backend": "anthropic", "status": WorkStatus.QUEUED, "created_by": "human",
                                 "created_at": now, "updated_at": now})
        tx.set_status("work_items", run_id, WorkStatus.ENDED, stop_reason=StopReason.CANCELLED)
    return run_id


def note(fact: str, judgment: str, rationale: str = "Seen once.", applicability: str = "Any run.",
         **evidence) -> NoteDraft:
    return NoteDraft(fact, judgment, rationale, applicability, evidence)


def put_notes(writer_for, run_id: str, drafts: list[NoteDraft]) -> list[str]:
    """End a run and store ``drafts`` as its retro, as the curator does."""
    ended_run(writer_for, run_id)
    with writer_for(Actor.CURATOR).transaction() as tx:
        return write_retro(tx, run_id, drafts)


def rows(writer, sql, params=()):
    return [dict(r) for r in writer.conn.execute(sql, params).fetchall()]
