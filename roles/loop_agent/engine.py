"""The loop: gather → act → commit iteration (+ checkpoint) → verify → reflect, until the
machine says stop.

Exactly-once, precisely:
- each model call's usage is committed the moment it arrives, keyed by request id, so tokens and
  cost count once whatever happens later;
- an iteration number is committed once (primary key, and StateWriter refuses gaps);
- an attempt cut by a crash, a forced suspend or a cancel is discarded: the next attempt starts by
  resetting the workspace to the last committed checkpoint. Attempts are numbered and recorded.

The engine never decides ``goal_met``: a passing verdict by the eval-agent on the latest committed
iteration ends the run, written by the eval-agent itself. The verify seam is a callable
``verify(work_id, n)`` that returns once an eval-agent verdict for iteration n is in state.db.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import orjson
import structlog

from roles import telemetry
from roles.loop_agent import gate, progress as prog
from roles.loop_agent.backends.base import ActContext, ActOutcome, Backend, Remaining, Usage
from roles.loop_agent.context import assemble
from roles.loop_agent.lessons import derive_lesson
from roles.loop_agent.remote_verify import VerifyAbandoned, VerifyInterrupted
from roles.loop_agent.policy import StopPolicy, policy_from_caps
from roles.loop_agent.stop import StopDecision, fingerprint
from state_db import queries
from state_db.errors import Conflict
from state_db.vocab import StopReason, WorkStatus
from state_db.writer import StateWriter

INSTRUCTIONS = """You are a loop-agent of loop-org. You change files in the workspace, with the
tools you are given, so that the goal below is met. You do not decide when the work is done:
after each of your turns an independent eval-agent runs the verify commands on a snapshot of the
workspace, with the protected files (tests) restored from the start, and its feedback comes back
to you. Editing tests to make them pass never counts. Keep each iteration focused: read what
you need, make the change, and end your turn with a one-paragraph summary of what you did and why.
"""

INTERRUPTED = "interrupted"


@dataclass
class LoopSettings:
    recent_iterations: int = 3
    summary_cap_chars: int = 2000
    lessons_max: int = 5
    no_progress: tuple[int, int] = (3, 5)
    max_turns: int = 20
    org_spend_cap_usd: float | None = None
    instructions: str = INSTRUCTIONS
    skills: list = field(default_factory=list)
    knowledge: list = field(default_factory=list)
    gate_runner: Callable = gate.refuse_runner

    @classmethod
    def from_config(cls, cfg) -> "LoopSettings":
        return cls(recent_iterations=cfg.loop.recent_iterations, summary_cap_chars=cfg.loop.summary_cap_chars,
                   lessons_max=cfg.loop.lessons_max,
                   no_progress=(cfg.loop.no_progress_repeat, cfg.loop.no_progress_window),
                   org_spend_cap_usd=cfg.limits.total_spend_usd)


def policy_for(work: dict, settings: LoopSettings) -> StopPolicy:
    caps = orjson.loads(work["caps"]) if isinstance(work["caps"], str) else work["caps"]
    return policy_from_caps(max_iterations=caps.get("max_iterations"), budget_tokens=caps.get("budget_tokens"),
                            budget_usd=caps.get("budget_usd"), timeout_s=caps.get("timeout_s"),
                            no_progress=settings.no_progress)


class LoopEngine:
    """Runs one work item's loop for one loop-agent.

    Args:
        writer: StateWriter as this loop-agent (the work item must be assigned to it).
        work_id: the work item.
        backend: the act backend.
        verify: the verify seam, ``verify(work_id, n)``; returns when the verdict is in state.db.
        history: the workspace's shadow history.
        settings: loop settings (context bounds, no_progress, org spend cap).
        interrupt: set it to cut the current act (suspend --force, shutdown); the attempt is
            discarded and ``run`` returns None.
        pause: set it to stop at the next safe boundary (after an iteration is verified).
        clock: monotonic clock.
    """

    def __init__(self, writer: StateWriter, work_id: str, backend: Backend, verify: Callable[[str, int], object],
                 history, settings: LoopSettings | None = None, *, interrupt: threading.Event | None = None,
                 pause: threading.Event | None = None, clock: Callable[[], float] = time.monotonic):
        self.w = writer
        self.work_id = work_id
        self.backend = backend
        self.verify = verify
        self.history = history
        self.settings = settings or LoopSettings()
        self.interrupt = interrupt or threading.Event()
        self.pause = pause or threading.Event()
        self._needs_reset = True          # the first attempt of every engine (a new process) resets
        self._reflected = prog.Reflected()
        self._unwritten: tuple[int, dict] | None = None   # a reflection the next transaction writes
        self._waited = 0.0                # time spent waiting for verdicts, written with the reflection
        self.clock = clock
        self.log = structlog.get_logger("loop").bind(work_id=work_id, instance=writer.instance)

    # -- reading ------------------------------------------------------------------------------
    def work(self) -> dict:
        return dict(self.w.conn.execute("SELECT * FROM work_items WHERE id = ?", (self.work_id,)).fetchone())

    def _org_spend_over(self) -> bool:
        cap = self.settings.org_spend_cap_usd
        if cap is None:
            return False
        return queries.org_spend(self.w.conn) >= cap

    # -- the loop -----------------------------------------------------------------------------
    def run(self) -> StopDecision | None:
        """Run until a stop condition fires (returns it), or until ``pause`` (at the next safe
        boundary) or ``interrupt`` (at once, discarding the act) is set: then returns None."""
        try:
            try:
                decision = self._run()
            except VerifyInterrupted:
                decision = None
            except VerifyAbandoned as exc:
                decision = self._end(StopDecision(StopReason(exc.reason), exc.detail))
            if self._unwritten is not None:            # paused, interrupted, or ended by the eval-agent
                with self.w.transaction() as tx:
                    self._write_reflection(tx)
            if decision is not None and telemetry.current().enabled:
                self._trace_end(decision)
            return decision
        finally:
            self._flush_history()

    def _trace_end(self, decision: StopDecision) -> None:
        """The run's span (the root of its trace), from its creation to now, with its stop reason."""
        work = queries.work_item(self.w.conn, self.work_id)
        telemetry.current().run_ended(self.work_id, work["created_at"], str(decision.reason), decision.detail, {
            "loop_org.iterations": work["iterations"], "loop_org.tokens": work.get("tokens"),
            "loop_org.cost_usd": work.get("cost_usd"), "loop_org.instance": self.w.instance})

    def _flush_history(self) -> None:
        """Write the history's deferred objects and refs out as git's own (a killed run's are
        written by the next run, at its start)."""
        try:
            self.history.flush_pending()
        except Exception as exc:  # noqa: BLE001 - pending refs stay readable and are retried
            self.log.warning("history_not_flushed", error=str(exc), next="the next run writes it out")

    def _run(self) -> StopDecision | None:
        work = self.work()
        if work["status"] == WorkStatus.ENDED:
            return StopDecision(StopReason(work["stop_reason"]), work["stop_detail"] or "")
        policy = policy_for(work, self.settings)
        self._start(work)
        while True:
            work = self.work()
            if work["status"] == WorkStatus.ENDED:
                return StopDecision(StopReason(work["stop_reason"]), work["stop_detail"] or "")
            progress, its, verdicts = prog.load(self.w.conn, work, running_s=self._waited,
                                                org_limit=self._org_spend_over(),
                                                human_rejected=gate.rejected_with_stop(self.w.conn, self.work_id),
                                                reflected=self._reflected, unwritten=self._unwritten)
            if not its and not prog.preflight_done(self.w.conn, self.work_id):
                # the verify commands run once on the baseline before the first model call: one
                # that cannot start ends the run (verify_unrunnable) before a token is spent
                self.verify(self.work_id, 0)
                continue
            if its and its[-1]["n"] not in verdicts:
                self._verify_and_reflect(its[-1])          # resumed between commit and verdict
                continue
            if its and its[-1]["verdict_id"] is None and its[-1]["n"] in verdicts:
                self._reflect(its[-1], verdicts[its[-1]["n"]])
                continue
            decision = policy.evaluate(progress)
            if decision is None and not gate.settle(self.w, self.work_id, work["workspace"], self.settings.gate_runner,
                                                    before_action=lambda: self._reset_once(its),
                                                    after_action=self._checkpoint_action):
                self.log.info("parked", why="a decision waits for a human",
                              next="whichever loop-agent is free resumes it once decided")
                return None
            if decision is None and gate.rejected_with_stop(self.w.conn, self.work_id):
                continue                                    # re-evaluate: human_rejected fires
            if decision is not None:
                if decision.reason == StopReason.GOAL_MET:
                    continue                                # the eval-agent ends the run; re-read
                return self._end(decision)
            if self.interrupt.is_set() or self.pause.is_set():
                return None
            result = self._attempt(work, progress, its, verdicts, policy)
            if isinstance(result, StopDecision):
                return self._end(result)
            if not result:
                return None                                 # cut by an interrupt: discarded

    def _settled(self, its: list[dict]) -> str:
        """The state the next act starts from: the last checkpoint, or the checkpoint of an
        action a human approved after it."""
        last = its[-1]["checkpoint"] if its else self.history.baseline()
        return gate.settled_checkpoint(self.w.conn, self.work_id, its[-1]["n"] if its else 0) or last

    def _reset_once(self, its: list[dict]) -> None:
        """The crash reset (an attempt cut or crashed may have left changes), before anything
        else touches the workspace — an approved action included, whose effect must survive."""
        if self._needs_reset:
            self.history.reset_to(self._settled(its))
            self._needs_reset = False

    def _checkpoint_action(self, decision: dict) -> str:
        return self.history.checkpoint_action(decision["id"])

    def _start(self, work: dict) -> None:
        self.history.baseline()
        gate.ask_again_if_interrupted(self.w, self.work_id)
        with self.w.transaction() as tx:
            if work["status"] == WorkStatus.DISPATCHED:
                tx.set_status("work_items", self.work_id, WorkStatus.RUNNING)
            # an attempt left open by a crash is discarded (its workspace changes are reset below);
            # its time up to its last sign of life (its last model response) still counts
            lost = 0.0
            for row in tx.conn.execute("""SELECT attempt, started_at, alive_at FROM attempts
                                           WHERE work_id = ? AND ended_at IS NULL""", (self.work_id,)).fetchall():
                lost += max(0.0, (row["alive_at"] or row["started_at"]) - row["started_at"])
                tx.update("attempts", (self.work_id, row["attempt"]), ended_at=tx.now, outcome="discarded")
            if lost:
                now = tx.get("work_items", self.work_id)
                tx.update("work_items", self.work_id, elapsed_s=now["elapsed_s"] + lost,
                          discarded_s=now["discarded_s"] + lost, updated_at=tx.now)

    def _attempt(self, work, progress, its, verdicts, policy) -> StopDecision | bool:
        """One attempt at the next iteration: committed and verified (True), cut by an interrupt
        (discarded; False), or discarded because the run ends (the reason). Traced as the
        iteration's span (derived ids: ``roles.telemetry``)."""
        n, attempt = progress.iterations + 1, work["attempt"] + 1
        with telemetry.current().iteration(self.work_id, n, attempt) as span:
            result = self._act(work, progress, its, verdicts, policy)
            span.set({"loop_org.outcome": "committed" if result is True else "discarded" if result is False
                      else f"ended:{result.reason}"})
            return result

    def _act(self, work, progress, its, verdicts, policy) -> StopDecision | bool:
        n = progress.iterations + 1
        attempt = work["attempt"] + 1
        with self.w.transaction() as tx:
            self._write_reflection(tx)
            tx.update("work_items", self.work_id, attempt=attempt, updated_at=tx.now)
            tx.insert("attempts", {"work_id": self.work_id, "attempt": attempt, "iteration": n,
                                   "instance": self.w.instance, "started_at": tx.now})
        last = self._settled(its)
        # a cut or crashed attempt may have left changes: back to the last settled state (the
        # last checkpoint, or an approved action's). In the normal flow the workspace already is it.
        self._reset_once(its)
        with telemetry.current().step("gather") as span:
            prompt = assemble(
                work["goal"] + _verify_note(work), self.settings.instructions, self.settings.skills,
                self.settings.knowledge, prog.digests(its, verdicts, self._reflected), prog.lessons(its, self.settings.lessons_max, self._reflected),
                _feedback(self.w.conn, self.work_id, its, verdicts), n,
                k_recent=self.settings.recent_iterations, summary_cap_chars=self.settings.summary_cap_chars)
            span.set({"loop_org.prompt_bytes": prompt.manifest.get("variable_bytes")})
        t0 = self.clock()
        spent = {"tokens": progress.tokens, "cost": progress.cost_usd}
        caps = orjson.loads(work["caps"]) if isinstance(work["caps"], str) else work["caps"]

        def remaining() -> Remaining:
            def left(cap, used):
                return None if cap is None else max(0, cap - used)
            return Remaining(tokens=left(caps.get("budget_tokens"), spent["tokens"]),
                             cost_usd=left(caps.get("budget_usd"), spent["cost"]),
                             seconds=left(caps.get("timeout_s"), progress.elapsed_s + self.clock() - t0))

        ctx = ActContext(self.work_id, n, attempt, Path(work["workspace"]), prompt.system_prefix, prompt.variable,
                         max_turns=self.settings.max_turns, remaining=remaining)

        def on_usage(u: Usage) -> None:
            self._commit_usage(u, n, attempt)
            spent["tokens"] += u.budget_tokens
            spent["cost"] += u.cost_usd

        def budget_left() -> str | None:
            if self.interrupt.is_set():
                return INTERRUPTED
            now = self.work()
            live = progress.__class__(**{**progress.__dict__, "tokens": spent["tokens"], "cost_usd": spent["cost"],
                                         "elapsed_s": progress.elapsed_s + self.clock() - t0,
                                         "cancelled": bool(now["cancel_requested"]),
                                         "org_limit": self._org_spend_over()})
            reason = policy.budget_check(live)
            if reason is None and live.cancelled:
                reason = StopReason.CANCELLED
            if reason is None and live.org_limit:
                reason = StopReason.ORG_LIMIT
            return None if reason is None else str(reason)

        self.log.info("act_started", iteration=n, attempt=attempt, prompt_bytes=prompt.manifest.get("variable_bytes"))
        outcome = self.backend.act(ctx, on_usage=on_usage, budget_left=budget_left)
        elapsed = self.clock() - t0
        if outcome.status == "budget_exhausted" and outcome.error_code in (INTERRUPTED, StopReason.CANCELLED,
                                                                             StopReason.ORG_LIMIT):
            self._close_attempt(attempt, outcome.error_code, elapsed)
            self.history.reset_to(last)
            self._needs_reset = False
            if outcome.error_code == StopReason.CANCELLED:
                return StopDecision(StopReason.CANCELLED, "cancelled during an act; the act was discarded")
            if outcome.error_code == StopReason.ORG_LIMIT:
                return StopDecision(StopReason.ORG_LIMIT, "the org-wide spend cap was reached")
            return False
        if outcome.status == "model_error":
            self._close_attempt(attempt, f"model_error:{outcome.error_code}", elapsed)
            self.history.reset_to(last)
            self._needs_reset = False
            return StopDecision(StopReason.MODEL_ERROR, f"{outcome.error_code}: {outcome.error}")
        self._commit(work, n, attempt, outcome, prompt.manifest, elapsed, last)
        return True

    def _commit_usage(self, u: Usage, n: int, attempt: int) -> None:
        try:
            with self.w.transaction(render=False) as tx:
                tx.insert("model_calls", {"request_id": u.request_id, "work_id": self.work_id, "iteration": n,
                                          "attempt": attempt, "instance": self.w.instance, "model": u.model,
                                          "input_tokens": u.input_tokens, "output_tokens": u.output_tokens,
                                          "cache_write_tokens": u.cache_creation_input_tokens,
                                          "cache_read_tokens": u.cache_read_input_tokens, "cost_usd": u.cost_usd,
                                          "at": tx.now}, journal=False)
                tx.update("attempts", (self.work_id, attempt), alive_at=tx.now)   # a sign of life
        except Conflict:
            self.log.warning("usage_already_counted", request_id=u.request_id)

    def _commit(self, work, n, attempt, outcome: ActOutcome, manifest, elapsed, last_commit) -> None:
        with telemetry.current().step("checkpoint") as span:
            checkpoint = self.history.checkpoint(n)
            changed = self.history.changed_paths(last_commit, checkpoint)
            fp = fingerprint(self.history.tree_id(checkpoint), "")
            span.set({"loop_org.checkpoint": checkpoint, "loop_org.changed_paths": len(changed)})
        with self.w.transaction() as tx:
            u = tx.one("""SELECT COALESCE(SUM(input_tokens),0), COALESCE(SUM(output_tokens),0),
                                 COALESCE(SUM(cache_write_tokens),0), COALESCE(SUM(cache_read_tokens),0),
                                 COALESCE(SUM(cost_usd),0)
                            FROM model_calls WHERE work_id = ? AND iteration = ? AND attempt = ?""",
                       (self.work_id, n, attempt))
            tx.insert("iterations", {
                "work_id": self.work_id, "n": n, "attempt": attempt, "act_status": outcome.status,
                "act_summary": outcome.summary[:4000], "tool_calls": [dict(c) for c in outcome.tool_calls][:200],
                "input_tokens": u[0], "output_tokens": u[1], "cache_write_tokens": u[2], "cache_read_tokens": u[3],
                "cost_usd": u[4], "elapsed_s": round(elapsed, 4), "fingerprint": fp, "checkpoint": checkpoint,
                "changed_paths": changed[:500], "prompt": manifest, "committed_at": tx.now})
            tx.update("work_items", self.work_id, elapsed_s=tx.get("work_items", self.work_id)["elapsed_s"] + elapsed,
                      updated_at=tx.now)
            tx.update("attempts", (self.work_id, attempt), ended_at=tx.now, outcome="committed")
            gate.record_requests(tx, self.work_id, n, outcome.requests)
        self.log.info("iteration_committed", iteration=n, attempt=attempt, act=outcome.status,
                      changed=len(changed), next="verify by the eval-agent")
        self._verify_and_reflect({"n": n, "checkpoint": checkpoint})

    def _verify_and_reflect(self, it: dict) -> None:
        t0 = self.clock()
        with telemetry.current().step("await_verdict", {"loop_org.iteration": it["n"]}) as span:
            try:
                self.verify(self.work_id, it["n"])
            finally:
                self._waited += self.clock() - t0      # the run's time: acts plus waits for verdicts
            verdict = prog.verdict_of(self.w.conn, self.work_id, it["n"])
            span.set({"loop_org.verdict": verdict["outcome"] if verdict else None})
        if verdict is None:
            raise Conflict(f"no eval-agent verdict for iteration {it['n']} of {self.work_id}",
                           hint="the eval-agent must verify every committed iteration")
        self._reflect(it, verdict)

    def _reflect(self, it: dict, verdict: dict) -> None:
        summary = prog.summary_of(verdict)
        lesson = None if summary.passed else derive_lesson(summary.failing, verdict["feedback"])
        outcome = "pass" if summary.passed else ";".join(f"{c}:{s}" for c, s in summary.failing)
        fp = fingerprint(self.history.tree_id(it["checkpoint"]), outcome)
        # written with the next transaction (the next attempt's start, or the run's end): a
        # crash before that leaves a verdict without its reflection, which the next run derives
        # again, identically
        self._unwritten = (it["n"], {"verdict_id": verdict["id"], "feedback": verdict["feedback"][:4000],
                                     "lesson": lesson, "fingerprint": fp})
        self.log.info("reflected", iteration=it["n"], verdict=verdict["outcome"], lesson=bool(lesson))

    def _write_reflection(self, tx) -> None:
        if self._unwritten is not None:
            n, columns = self._unwritten
            tx.update("iterations", (self.work_id, n), **columns)
            self._unwritten = None
        if self._waited:
            work = tx.get("work_items", self.work_id)
            tx.update("work_items", self.work_id, elapsed_s=work["elapsed_s"] + self._waited, updated_at=tx.now)
            self._waited = 0.0

    def _close_attempt(self, attempt: int, outcome: str, elapsed: float) -> None:
        """Close a discarded attempt; its time counts toward the run (time is counted once,
        like tokens, whatever happens to the work it bought)."""
        with self.w.transaction() as tx:
            tx.update("attempts", (self.work_id, attempt), ended_at=tx.now, outcome=outcome)
            work = tx.get("work_items", self.work_id)
            tx.update("work_items", self.work_id, elapsed_s=work["elapsed_s"] + elapsed,
                      discarded_s=work["discarded_s"] + elapsed, updated_at=tx.now)

    def _end(self, decision: StopDecision) -> StopDecision:
        with self.w.transaction() as tx:
            work = tx.get("work_items", self.work_id)
            self._write_reflection(tx)
            if work["status"] == WorkStatus.ENDED:
                return StopDecision(StopReason(work["stop_reason"]), work["stop_detail"] or "")
            tx.set_status("work_items", self.work_id, WorkStatus.ENDED, stop_reason=decision.reason,
                          stop_detail=decision.detail[:1000])
        self.log.info("run_ended", reason=str(decision.reason), detail=decision.detail)
        return decision


def _feedback(conn, work_id: str, its: list, verdicts: dict) -> str:
    if not its:
        return ""
    last = its[-1]["n"]
    text = verdicts[last]["feedback"] if last in verdicts else ""
    human = gate.feedback_for(conn, work_id, last)
    return f"{text}\n\n{human}".strip() if human else text


def _verify_note(work: dict) -> str:
    cmds = orjson.loads(work["verify"]) if isinstance(work["verify"], str) else work["verify"]
    return "\n\nThe eval-agent verifies with: " + "; ".join(f"`{c}`" for c in cmds) if cmds else ""
