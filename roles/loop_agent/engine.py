"""The loop: gather → act → commit iteration (+ checkpoint) → verify → reflect, until the
machine says stop.

The engine advances by steps (``roles.loop_agent.steps``): ``advance(step)`` does what the step
names and returns the next one — act again, await a verdict, reflect, wrap up, await a human,
parked, paused, ended — so where a run stands is a value. A run that pauses or parks stores its
next step on the work item; the engine that picks it up again resumes from it (checked against
state.db, which stays the truth: a step that finds the run moved on derives the next from it).
What one attempt does — gather, act, commit, reflect, and the wrap-up act — is done by the engine's
``Acting`` (``roles.loop_agent.acting``); this module decides which step comes next. Each step
``derive`` returns carries the view of the run it was derived from (``steps.RunView``), and
``advance`` acts on that view, never on a cache of its own: a step without one (decoded from the
work item) is derived again from state.db first.

Every ending goes through the stop policy (``policy``) and ``state_db.ending.end_run``: a model
error, a cancel, the org spend cap and a verdict wait given up all raise the policy's flags, and
the policy's decision is what ends the run. When a budget trips, one bounded wrap-up act writes
a hand-off note first (``roles.loop_agent.wrapup.hand_off``); the stop reason stays the budget's. An error
the policy does not know pauses the run for a human (``roles.loop_agent.triage``).

Exactly-once, precisely:
- each model call's usage is committed the moment it arrives, keyed by request id, so tokens and
  cost count once whatever happens later;
- an iteration number is committed once (primary key, and StateWriter refuses gaps);
- an attempt cut by a crash, a forced suspend or a cancel is discarded: the next attempt starts by
  resetting the workspace to the last committed checkpoint. Attempts are numbered and recorded.

The engine never writes ``goal_met``: a passing verdict by the eval-agent on the latest committed
iteration ends the run, written by the eval-agent itself in the verdict's transaction, by the
same rule the policy's ``GoalMet`` evaluates (``state_db.ending.goal_met``); the engine's
``GoalMet`` decision then meets that ending in ``end_run``. The verify seam is a callable
``verify(work_id, n)`` that returns once an eval-agent verdict for iteration n is in state.db.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Callable

import structlog

from roles.base import telemetry
from roles.loop_agent import gate, progress as prog, steps, triage, wrapup
from roles.loop_agent.acting import INTERRUPTED, Acting  # noqa: F401 - INTERRUPTED: the code of a cut act
from roles.loop_agent.backends.base import Backend
from roles.loop_agent.remote_verify import VerifyAbandoned, VerifyInterrupted
from roles.loop_agent.policy import StopPolicy, policy_from_caps
from roles.loop_agent.steps import (ActAgain, AwaitHuman, AwaitPreflight, AwaitVerdict, Ended, Parked, Paused,
                                    Reflect, RunView, Step, WrapUp)
from roles.loop_agent.stop import StopDecision
from roles.workbench.workspace import delivered
from roles.loop_agent.transcript import RUN_BYTES
from state_db import ending
from state_db.kernel.errors import Conflict, OrgError, RunTaken
from state_db.queries import loop as loopq, work as work_q
from state_db.queries.iterations import count, iteration as iteration_row
from state_db.queries.usage import of_work
from state_db.queries.verdicts import latest_eval_verdict, verified
from state_db.queries.work import Ladder, WorkItem
from state_db.vocab import StopReason, WorkStatus
from state_db.writer import StateWriter

INSTRUCTIONS = """You are a loop-agent of loop-org. You change files in the workspace, with the
tools you are given, so that the goal below is met. You do not decide when the work is done:
after each of your turns an independent eval-agent runs the verify commands on a snapshot of the
workspace, with the protected files (tests) restored from the start, and its feedback comes back
to you. Editing tests to make them pass never counts. Keep each iteration focused: read what
you need, make the change, and end your turn with a one-paragraph summary of what you did and why.
"""



@dataclass
class LoopSettings:
    recent_iterations: int = 3
    summary_cap_chars: int = 2000
    lessons_max: int = 5
    no_progress: tuple[int, int] = (3, 5)
    max_turns: int = 20
    org_spend_cap_usd: float | None = None
    wrapup_reserve: float = 0.0
    instructions: str = INSTRUCTIONS
    skills: list = field(default_factory=list)
    knowledge: list = field(default_factory=list)
    gate_runner: Callable = gate.refuse_runner
    disk_mb: int | None = None        # the workspace's quota (sandbox.disk_mb): no larger tree is recorded
    transcript_bytes: int = RUN_BYTES

    @classmethod
    def from_config(cls, cfg) -> "LoopSettings":
        return cls(recent_iterations=cfg.loop.recent_iterations, summary_cap_chars=cfg.loop.summary_cap_chars,
                   lessons_max=cfg.loop.lessons_max,
                   no_progress=(cfg.loop.no_progress_repeat, cfg.loop.no_progress_window),
                   org_spend_cap_usd=cfg.limits.total_spend_usd, wrapup_reserve=cfg.loop.wrapup_reserve,
                   disk_mb=cfg.sandbox.disk_mb, transcript_bytes=cfg.loop.transcript_bytes)


def policy_for(work: WorkItem, settings: LoopSettings) -> StopPolicy:
    return policy_from_caps(work.caps, no_progress=settings.no_progress, wrapup_reserve=settings.wrapup_reserve)


def end_unbuildable(writer: StateWriter, work_id: str, settings: LoopSettings, exc: Exception) -> StopDecision | None:
    """A run whose backend cannot be built (no key, unknown model, a bad script) will not fix
    itself: the policy's ``ModelError`` ends it. Returns the ending recorded (None: it had ended)."""
    work = work_q.item(writer.conn, work_id)
    if work is None or ending.recorded(work) is not None:
        return None
    detail = f"{exc.code if isinstance(exc, OrgError) else 'backend_config'}: {exc}"
    progress, _, _ = prog.load(writer.conn, work, model_error=detail)
    decision = policy_for(work, settings).evaluate(progress)
    with writer.transaction() as tx:
        return ending.end_run(tx, work_id, decision)


#: Stop reasons that wait for a pending question whether the run ends for a reason of its own.
CAPS_THAT_WAIT = frozenset({StopReason.MAX_ITERATIONS, StopReason.TOKEN_BUDGET, StopReason.COST_BUDGET,
                            StopReason.TIMEOUT, StopReason.NO_PROGRESS, StopReason.REPEATED_FAILURE})


#: Stop reasons a model ladder answers with its next rung (DESIGN.md, "The loop").
CLIMBS = frozenset({StopReason.REPEATED_FAILURE, StopReason.NO_PROGRESS})


def _same(a: Step, b: Step) -> bool:
    """Whether two steps name the same point of a run (decision lists and details aside)."""
    return type(a) is type(b) and getattr(a, "n", None) == getattr(b, "n", None)


class LoopEngine:
    """Runs one work item's loop for one loop-agent.

    Args:
        writer: StateWriter as this loop-agent (the work item must be assigned to it).
        work_id: the work item.
        backend: the act backend.
        verify: the verify seam, ``verify(work_id, n)``; returns when the verdict is in state.db.
        history: the workspace's shadow history.
        settings: loop settings (context bounds, no_progress, org spend cap, wrap-up reserve).
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
        self._base_backend = backend      # the backend as built; a ladder's rung is this on another model
        self.verify = verify
        self.history = history
        self.settings = settings or LoopSettings()
        self.interrupt = interrupt or threading.Event()
        self.pause = pause or threading.Event()
        self._policy: StopPolicy | None = None
        self._abandoned: tuple[str, str] | None = None  # a verdict wait given up: (reason, detail)
        self.clock = clock
        self.log = structlog.get_logger("loop").bind(work_id=work_id, instance=writer.instance)
        self.acting = Acting(writer, work_id, history, self.settings, interrupt=self.interrupt, clock=clock,
                             log=self.log)

    # -- reading ------------------------------------------------------------------------------
    def work(self) -> WorkItem:
        return work_q.item(self.w.conn, self.work_id)

    @property
    def policy(self) -> StopPolicy:
        if self._policy is None:
            self._policy = policy_for(self.work(), self.settings)
        return self._policy

    # -- the loop -----------------------------------------------------------------------------
    def run(self) -> StopDecision | None:
        """Advance until the run ends (returns the decision), parks for a human, or pauses at
        ``pause`` (next safe boundary) or ``interrupt`` (at once, discarding the act): then the
        next step is stored on the work item and None returned."""
        try:
            step = self.resume()
            while not isinstance(step, (Ended, Parked, Paused)):
                step = self.advance(step)
            if self.acting.unwritten is not None:      # paused, parked, or ended by the eval-agent
                with self.w.transaction() as tx:
                    self.acting.write_reflection(tx)
            if not isinstance(step, Ended):
                self.store(step)
                return None
            if telemetry.current().enabled:
                self._trace_end(step.decision)
            return step.decision
        finally:
            self._flush_history()

    def resume(self) -> Step:
        """Where this run goes on: its stored next step (a paused or parked run), else the step
        state.db says comes next."""
        work = self.work()
        if (done := ending.recorded(work)) is not None:
            self._deliver(done)
            return Ended(done)
        self._policy = policy_for(work, self.settings)
        self._on_rung(work.ladder)
        self.acting.start(work)
        stored = steps.decode(work.next_step)
        if isinstance(stored, Paused):
            stored = stored.next
        if isinstance(stored, Parked):
            stored = AwaitHuman(stored.decisions)
        return stored if stored is not None else self.derive()

    def store(self, step: Step) -> None:
        """Keep ``step`` on the work item (bookkeeping: no journal event of its own)."""
        with self.w.transaction(render=False) as tx:
            if not work_q.item(tx.conn, self.work_id).ended:
                tx.update("work_items", self.work_id, next_step=steps.dumps(step), updated_at=tx.now)

    def derive(self) -> Step:
        """The next step as state.db says, the stop policy deciding whether the run ends; it
        carries the view of the run it was derived from (``RunView``)."""
        work = self.work()
        done = ending.recorded(work)
        conn = self.w.conn
        acting = self.acting
        progress, its, verdicts = prog.load(conn, work, running_s=acting.waited, org_limit=acting.org_spend_over(),
                                            model_error=acting.model_error or False,
                                            human_rejected=gate.rejected_with_stop(conn, self.work_id),
                                            needs_human=_confirmed(conn, self.work_id),
                                            reflected=acting.reflected, unwritten=acting.unwritten)
        view = RunView(work, progress, tuple(its), verdicts)

        def derived(step: Step) -> Step:
            return replace(step, view=view)
        decision = self.policy.evaluate(progress)
        if done is not None:        # ended meanwhile (the verdict's goal_met, a cancel): end_run keeps that ending
            return derived(Ended(self._end(decision or done)))
        if decision is None and self._abandoned is not None:     # the policy always agrees; never wait again
            decision = StopDecision(StopReason(self._abandoned[0]), self._abandoned[1])
        if self._abandoned is None or decision is None:
            if not its and not verified(conn, self.work_id, 0):
                # the verify commands run once on the baseline before the first model call: one
                # that cannot start ends the run (verify_unrunnable) before a token is spent
                return derived(AwaitPreflight())
            if its and its[-1]["n"] not in verdicts:
                return derived(AwaitVerdict(its[-1]["n"]))     # resumed between commit and verdict
            if its and its[-1]["verdict_id"] is None:
                return derived(Reflect(its[-1]["n"]))
        if (decision is not None and decision.reason in CLIMBS and done is None and self._abandoned is None
                and work.ladder.can_climb()):
            self._climb(work.ladder, progress.iterations, decision)
            return self.derive()
        if decision is not None and decision.reason in CAPS_THAT_WAIT and self._abandoned is None:
            # the run asked a human whether it ends (impossible, an unknown error) on the iteration
            # a cap fires: the honest answer comes first; the cap ends the run if the human says go on
            asked = loopq.pending_endings(conn, self.work_id)
            if asked:
                return derived(AwaitHuman(asked))
        if decision is not None:
            if self._abandoned is not None and decision.reason == self._abandoned[0]:
                decision = StopDecision(decision.reason, self._abandoned[1])    # the wait's own account
            if work.ladder.models:            # the stop reason records the rung the run ended on
                decision = StopDecision(decision.reason, f"{decision.detail} (on {work.ladder.label()})")
            if self.policy.wraps_up(decision):
                return derived(WrapUp(decision))
            return derived(Ended(self._end(decision)))
        if work.status == WorkStatus.PAUSED or loopq.open_decisions(conn, self.work_id):
            return derived(AwaitHuman(loopq.pending_decisions(conn, self.work_id)))
        nxt = ActAgain(progress.iterations + 1)
        return derived(Paused(nxt) if self.interrupt.is_set() or self.pause.is_set() else nxt)

    def _on_rung(self, ladder: Ladder) -> None:
        """Act on the model of the ladder's rung (no ladder: the backend as built)."""
        if ladder.model and hasattr(self._base_backend, "with_model"):
            self.backend = self._base_backend.with_model(ladder.model)

    def _climb(self, ladder: Ladder, iterations: int, decision: StopDecision) -> None:
        """``decision`` (repeated_failure or no_progress) would end the run on a rung below the
        top: it goes on with the next model, within the same caps; the loop detectors judge only
        the iterations after the climb, and the next prompt says what failed."""
        up = replace(ladder, rung=ladder.rung + 1, since=iterations,
                     why=f"{decision.reason} on {ladder.model}: {decision.detail}")
        with self.w.transaction() as tx:
            tx.update("work_items", self.work_id, ladder=up.encode(), updated_at=tx.now)
            tx.journal("work_items.climbed", self.work_id, {"from": ladder.model, "to": up.model, "rung": up.rung,
                                                             "after_iteration": iterations, "why": up.why})
        self._on_rung(up)
        self.log.info("ladder_climbed", model=up.model, rung=up.rung + 1, of=len(up.models), why=str(decision.reason),
                      next="the next iteration acts on the stronger model")

    def advance(self, step: Step) -> Step:
        """Take ``step``; return the one after it. It acts on the step's own view of the run; a
        step without one (a stored step) is checked against state.db first, derived again."""
        view = step.view
        if view is None:
            fresh = self.derive()
            if not _same(fresh, step):
                self.log.info("step_moved_on", stored=step.kind, now=fresh.kind)
                return fresh
            step, view = fresh, fresh.view
        if isinstance(step, AwaitPreflight):
            return self._await(0) or self.derive()
        if isinstance(step, AwaitVerdict):
            return self._await_verdict(step.n)
        if isinstance(step, Reflect):
            self.acting.reflect(view.iteration(step.n), view.verdicts[step.n])
            return self.derive()
        if isinstance(step, WrapUp):
            return Ended(self._end(*wrapup.hand_off(self.acting, view, step.decision, self.backend, self.policy)))
        if isinstance(step, AwaitHuman):
            its = view.iterations
            if not gate.settle(self.w, self.work_id, str(self.history.workspace), self.settings.gate_runner,
                               before_action=lambda: self.acting.reset_once(its),
                               after_action=partial(self.acting.checkpoint_action, its)):
                self.log.info("parked", why="a decision waits for a human",
                              next="whichever loop-agent is free resumes it once decided")
                return Parked(loopq.pending_decisions(self.w.conn, self.work_id))
            return self.derive()
        if isinstance(step, ActAgain):
            return self._act_again(step, view)
        raise Conflict(f"the loop cannot take a {step.kind} step", hint="a paused, parked or ended run is resumed")

    def _act_again(self, step: ActAgain, view: RunView) -> Step:
        """One attempt at iteration ``step.n`` on the run as ``view`` shows it and, once it is
        committed, the wait for its verdict (both in the iteration's span, derived ids:
        ``roles.base.telemetry``)."""
        n, attempt = view.progress.iterations + 1, view.work.attempt + 1
        with telemetry.current().iteration(self.work_id, n, attempt) as span:
            try:
                result = self.acting.act(view, self.backend, self.policy)
            except Exception as exc:  # noqa: BLE001 - an error out of an act: known ones propagate, new ones ask
                asked = self._ask_about(exc, view.iterations)
                if asked is None:
                    raise
                span.set({"loop_org.outcome": "asked a human"})
                return asked
            span.set({"loop_org.outcome": "committed" if result is True else "discarded" if result is False
                      else f"ended:{self.acting.model_error and 'model_error' or 'policy'}"})
            if result is True:
                return self._await_verdict(n)
        if result is False:
            return Paused(step)                          # cut by an interrupt: discarded
        return self.derive()                             # discarded: the policy says why it stops

    def _await(self, n: int) -> Step | None:
        """Wait for the verdict of ``n`` (0: the preflight). Returns None once it is in (or the
        run ended), else the step a pause or a given-up wait leads to."""
        t0 = self.clock()
        try:
            if n == 0:
                self.verify(self.work_id, 0)        # the preflight: no iteration's span, not the run's time
            else:
                with telemetry.current().step("await_verdict", {"loop_org.iteration": n}) as span:
                    self.verify(self.work_id, n)
                    if telemetry.current().enabled:
                        verdict = latest_eval_verdict(self.w.conn, self.work_id, n)
                        span.set({"loop_org.verdict": verdict.outcome if verdict else None})
        except VerifyInterrupted:
            return Paused(AwaitVerdict(n) if n else AwaitPreflight())
        except VerifyAbandoned as exc:
            self._abandoned = (exc.reason, exc.detail)
            return self.derive()
        finally:
            if n:
                self.acting.count_wait(self.clock() - t0)  # the run's time: acts plus waits for verdicts
        return None

    def _await_verdict(self, n: int) -> Step:
        """Wait for the verdict of iteration ``n`` and reflect on it at once (a run the verdict
        ended keeps its last reflection too)."""
        after = self._await(n)
        if after is not None:
            return after
        verdict = latest_eval_verdict(self.w.conn, self.work_id, n)
        if verdict is None:
            if ending.recorded(self.work()) is None:
                raise Conflict(f"no eval-agent verdict for iteration {n} of {self.work_id}",
                               hint="the eval-agent must verify every committed iteration")
        else:
            it = iteration_row(self.w.conn, self.work_id, n)
            self.acting.reflect({"n": n, "checkpoint": it.checkpoint}, verdict)
        return self.derive()

    def _ask_about(self, exc: Exception, its) -> Step | None:
        """An exception out of an act: a class this run has not met asks a human (the run parks);
        one it has met propagates (the loop-agent retries on a later tick)."""
        if triage.machine_busy(exc):
            self.log.warning("store_busy", error=str(exc), next="retried on a later tick, as after a crash")
            return None
        if isinstance(exc, RunTaken):     # the run is another loop-agent's now: nothing of it is this one's to ask
            return None
        cls = triage.exception_class(exc)
        if self.policy.recognises(cls) or cls in loopq.errors_asked(self.w.conn, self.work_id):
            return None
        self.log.warning("unknown_error", error_class=cls, error=str(exc), next="parked for a human")
        with self.w.transaction() as tx:
            triage.ask(tx, self.work_id, its[-1]["n"] if its else 0, {cls: f"{type(exc).__name__}: {exc}"},
                       where="an act")
        gate.park(self.w, self.work_id)
        return Parked(loopq.pending_decisions(self.w.conn, self.work_id))

    def _trace_end(self, decision: StopDecision) -> None:
        """The run's span (the root of its trace), from its creation to now, with its stop reason."""
        work, used = self.work(), of_work(self.w.conn, self.work_id)
        telemetry.current().run_ended(self.work_id, work.created_at, str(decision.reason), decision.detail, {
            "loop_org.iterations": count(self.w.conn, self.work_id), "loop_org.tokens": used.tokens,
            "loop_org.cost_usd": used.cost_usd, "loop_org.instance": self.w.instance})

    def _flush_history(self) -> None:
        """Write the history's deferred objects and refs out as git's own (a killed run's are
        written by the next run, at its start)."""
        try:
            self.history.flush_pending()
        except Exception as exc:  # noqa: BLE001 - pending refs stay readable and are retried
            self.log.warning("history_not_flushed", error=str(exc), next="the next run writes it out")

    def _end(self, decision: StopDecision, handoff: dict | None = None) -> StopDecision:
        """The policy's ``decision`` through ``end_run`` (with the hand-off note, if any, in the
        same transaction); returns the ending recorded — an earlier one if the run had ended."""
        with self.w.transaction() as tx:
            self.acting.write_reflection(tx)
            if handoff is not None:
                tx.insert("handoffs", handoff)
            recorded = ending.end_run(tx, self.work_id, decision)
        self.log.info("run_ended", reason=str(recorded.reason), detail=recorded.detail, policy=str(decision.reason),
                      recorded="now" if recorded == decision else "earlier")
        self._deliver(recorded)
        return recorded

    def _deliver(self, ending_: StopDecision) -> None:
        """At goal_met, make the workspace hold the tree the eval-agent verified, byte for byte, the
        doer's changes outside the scope kept apart (``roles.workbench.workspace.delivered``); once, recorded
        on the work item (a run resumed after a crash here delivers then)."""
        if ending_.reason != StopReason.GOAL_MET or getattr(self.history, "record_apart", None) is None:
            return
        work = self.work()
        verdict = latest_eval_verdict(self.w.conn, self.work_id)
        if work.delivered or verdict is None or not verdict.verified:
            return
        try:
            target = verdict.verified
            if self.history.tree_or_none(target) is None:     # made by an eval-agent on another host
                it = iteration_row(self.w.conn, self.work_id, verdict.iteration)
                target = delivered.rebuild(self.history, it.checkpoint, list(verdict.held_back), verdict.iteration)
                if target is None:
                    raise delivered.VerifiedUnknown(f"the verified tree {verdict.verified} is not in this host's "
                                                    "history and cannot be made again here")
            record = delivered.deliver(self.history, target, verdict.iteration).encode()
        except OrgError as exc:
            record = {"verified": verdict.verified, "held": None, "held_paths": [], "differs": [], "proved": False,
                      "error": exc.code, "detail": str(exc)[:400]}
        if not record["proved"]:
            self.log.warning("workspace_not_delivered", verified=verdict.verified, differs=record["differs"][:5],
                             error=record.get("error"), next="org show names the difference; the human decides")
        with self.w.transaction() as tx:
            tx.update("work_items", self.work_id, delivered=record)


def _confirmed(conn, work_id: str) -> str | bool:
    """The ``needs_human`` flag: a human confirmed the stop an unknown error asked about."""
    cls = loopq.stop_confirmed(conn, work_id)
    return f"a human confirmed the stop after an error the stop policy does not know ({cls})" if cls else False
