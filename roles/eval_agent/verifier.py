"""The eval-agent's judgement of one committed iteration.

It verifies checkpoint n in its own snapshot — never the live workspace the doer can still
change — with protected files restored from the baseline, runs every verify command there, and
writes the verdict as the eval-agent. A passing verdict on the latest committed iteration ends
the run with ``goal_met`` in the same transaction: nobody else can.
"""
from __future__ import annotations

import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import orjson

from roles.eval_agent.checks import CheckResult, VerifyUnavailable, run_check
from state_db.errors import NotFound, StateError
from state_db.home import OrgHome
from state_db.vocab import StopReason, VerdictOutcome, WorkStatus
from state_db.writer import StateWriter

PROTECTED_CHECK = "protected files unchanged"
_KEEP_HISTORIES = 8


@dataclass(frozen=True)
class Verdict:
    id: str
    work_id: str
    iteration: int
    outcome: str
    checks: tuple[CheckResult, ...]
    feedback: str
    protected_changed: tuple[str, ...]
    goal_met: bool


def feedback_of(checks: list[CheckResult], protected: list[str]) -> str:
    """Specific, actionable feedback for the next gather: which check failed and how."""
    parts = []
    if protected:
        parts.append(f"Protected files were changed and were restored for verification: {', '.join(protected)}. "
                     "Do not edit tests to make them pass; change the code under test.")
    for c in checks:
        if not c.passed and c.name != PROTECTED_CHECK:
            why = "timed out" if c.timed_out else ("could not run" if c.exit_code is None else f"exit {c.exit_code}")
            tail = "\n".join(c.output_tail.strip().splitlines()[-15:])
            parts.append(f"Check `{c.command}` failed ({why}):\n{tail}")
    return "\n\n".join(parts) if parts else "All checks passed."


class Verifier:
    """Verifies iterations for one org home.

    Args:
        home: org home (histories live in ``history/``, snapshots in ``eval/``).
        writer: a StateWriter with actor eval-agent.
        timeout_s: per verify command.
        history_factory: (git_dir, workspace) -> history (injectable).
        runner_factory: (snapshot dir, the work item's workspace) -> command runner (the sandbox);
            None runs plain processes.
    """

    def __init__(self, home: OrgHome, writer: StateWriter, *, timeout_s: float = 300.0, history_factory=None,
                 runner_factory=None):
        if history_factory is None:
            from roles.workspace.history import WorkspaceHistory as history_factory
        self.home = home
        self.writer = writer
        self.timeout_s = timeout_s
        self.history_factory = history_factory
        self.runner_factory = runner_factory
        self._histories: OrderedDict[tuple[str, str], object] = OrderedDict()

    def _history(self, work_id: str, workspace: str):
        """The work item's shadow history, kept for the next iteration (its object caches make
        the next snapshot cheaper); the few most recent work items only."""
        key = (work_id, workspace)
        history = self._histories.pop(key, None)
        if history is None:
            history = self.history_factory(self.home.history_dir / f"{work_id}.git", Path(workspace))
        self._histories[key] = history
        while len(self._histories) > _KEEP_HISTORIES:
            self._histories.popitem(last=False)
        return history

    def existing(self, work_id: str, n: int) -> dict | None:
        row = self.writer.conn.execute("SELECT * FROM verdicts WHERE work_id=? AND iteration=? ORDER BY at DESC LIMIT 1",
                                       (work_id, n)).fetchone()
        return dict(row) if row else None

    def verify(self, work_id: str, n: int) -> Verdict:
        """Verify committed iteration ``n`` of ``work_id`` (idempotent: an existing verdict is returned)."""
        conn = self.writer.conn
        work = conn.execute("SELECT * FROM work_items WHERE id=?", (work_id,)).fetchone()
        it = conn.execute("SELECT * FROM iterations WHERE work_id=? AND n=?", (work_id, n)).fetchone()
        if work is None or it is None:
            raise NotFound(f"iteration {n} of {work_id} is not committed", hint="verify only committed iterations")
        found = self.existing(work_id, n)
        if found:
            return _from_row(found, work["stop_reason"] == StopReason.GOAL_MET)
        history = self._history(work_id, work["workspace"])
        snapshot = self.home.root / "eval" / work_id
        patterns = orjson.loads(work["protect"]) or None
        paths = history.protected_paths(patterns=patterns) if patterns else None
        try:
            protected = history.materialize(it["checkpoint"], snapshot, paths=paths)
        except Exception as exc:
            if getattr(exc, "code", None) != "dest_not_empty":
                raise
            history.discard_snapshot(snapshot)     # left half-written by a killed eval-agent
            protected = history.materialize(it["checkpoint"], snapshot, paths=paths)
        runner = self.runner_factory(snapshot, Path(work["workspace"])) if self.runner_factory else None
        try:
            checks = [run_check(cmd, snapshot, timeout_s=self.timeout_s, runner=runner)
                      for cmd in orjson.loads(work["verify"])]
        except VerifyUnavailable as exc:
            if exc.code != "sandbox_unavailable":
                raise                       # transient (the sandbox failed to start): retried later
            # permanent until bubblewrap is installed: say so in a verdict instead of waiting forever
            checks = [CheckResult(name="sandbox", command="(run verify commands in the sandbox)", passed=False,
                                  exit_code=None, timed_out=False, signature="sandbox_unavailable",
                                  output_tail=str(exc), duration_ms=0.0)]
            return self.record(work_id, n, checks, [], outcome=VerdictOutcome.ERROR)
        if protected:
            checks.append(CheckResult(name=PROTECTED_CHECK, command="(compare with baseline)", passed=False,
                                      exit_code=None, timed_out=False, signature="protected:" + ",".join(protected),
                                      output_tail="changed: " + ", ".join(protected), duration_ms=0.0))
        if not checks:
            raise StateError(f"{work_id} has no verify command", code="no_verify_command",
                             hint="submit with at least one --verify command")
        return self.record(work_id, n, checks, protected)

    def record(self, work_id: str, n: int, checks: list[CheckResult], protected: list[str],
               outcome: str | None = None) -> Verdict:
        outcome = outcome or (VerdictOutcome.PASS if all(c.passed for c in checks) else VerdictOutcome.FAIL)
        vid = f"v-{uuid.uuid4().hex[:12]}"
        feedback = feedback_of(checks, protected)
        goal_met = False
        with self.writer.transaction() as tx:
            tx.insert("verdicts", {"id": vid, "work_id": work_id, "iteration": n, "outcome": outcome,
                                   "checks": [c.encode() for c in checks], "feedback": feedback,
                                   "protected_changed": protected, "written_by": self.writer.instance,
                                   "at": time.time()})
            work = tx.get("work_items", work_id)
            latest = tx.one("SELECT MAX(n) FROM iterations WHERE work_id=?", (work_id,))[0]
            if outcome == VerdictOutcome.PASS and latest == n and work["status"] != WorkStatus.ENDED:
                tx.set_status("work_items", work_id, WorkStatus.ENDED, stop_reason=StopReason.GOAL_MET,
                              stop_detail=f"iteration {n} passed every check")
                goal_met = True
        return Verdict(vid, work_id, n, outcome, tuple(checks), feedback, tuple(protected), goal_met)


def _from_row(row: dict, goal_met: bool) -> Verdict:
    checks = tuple(CheckResult.decode(c) for c in orjson.loads(row["checks"]))
    return Verdict(row["id"], row["work_id"], row["iteration"], row["outcome"], checks, row["feedback"],
                   tuple(orjson.loads(row["protected_changed"])), goal_met)
