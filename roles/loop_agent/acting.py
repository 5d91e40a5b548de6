"""What one attempt does, for the loop engine: gather, act, commit the iteration and its
checkpoint, reflect on the verdict (the wrap-up act that may end a run is ``wrapup.hand_off``).

``Acting`` touches the workspace and the model; the loop engine (``roles.loop_agent.engine``)
decides which step comes next and hands it, with each step, the view of the run the step was
derived from (``steps.RunView``), the backend of the ladder's rung and the stop policy. Acting
owns what one run's attempts carry between transactions: whether the workspace still needs its
crash reset, the reflection the next transaction writes, the time waited for verdicts, and a
model error the policy is to see.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import replace

from roles.base import telemetry
from roles.loop_agent import gate, progress as prog, triage
from roles.loop_agent.backends.base import ActContext, ActOutcome, Remaining, Usage
from roles.loop_agent.context import assemble
from roles.loop_agent.lessons import derive_lesson
from roles.loop_agent.steps import RunView
from roles.loop_agent.stop import RunProgress, fingerprint
from roles.loop_agent.transcript import Transcript
from state_db.kernel.errors import Conflict, RunTaken
from state_db.queries import work as work_q
from state_db.queries.decisions import Decision
from state_db.queries.iterations import open_attempts
from state_db.queries.transcript import used_bytes as transcript_bytes
from state_db.queries.usage import of_attempt, org_spend
from state_db.queries.verdicts import Verdict
from state_db.queries.work import WorkItem
from state_db.vocab import AttemptOutcome, StopReason, TranscriptKind, VerdictOutcome, WorkStatus

INTERRUPTED = "interrupted"
DISCARDED = "discarded"         # an attempt thrown away because the run must stop (the policy says why)


class Acting:
    """Attempts, commits, reflections and the wrap-up of one run.

    Args:
        writer: StateWriter as the loop-agent that holds the run.
        work_id: the work item.
        history: the workspace's shadow history.
        settings: the loop settings (``engine.LoopSettings``).
        interrupt: set, it cuts the current act (the attempt is discarded).
        clock: monotonic clock.
        log: the run's bound logger.
    """

    def __init__(self, writer, work_id: str, history, settings, *, interrupt, clock, log):
        self.w = writer
        self.work_id = work_id
        self.history = history
        self.settings = settings
        self.interrupt = interrupt
        self.clock = clock
        self.log = log
        self.needs_reset = True           # the first attempt of every engine (a new process) resets
        self.reflected = prog.Reflected()
        self.unwritten: tuple[int, dict] | None = None   # a reflection the next transaction writes
        self.waited = 0.0                 # time spent waiting for verdicts, written with the reflection
        self.model_error: str | None = None             # the policy's model_error flag, with its detail
        self._transcript: Transcript | None = None      # the open attempt's entries not yet written

    def work(self) -> WorkItem:
        return work_q.item(self.w.conn, self.work_id)

    def count_wait(self, seconds: float) -> None:
        """Time spent waiting for a verdict: the run's time, written with the next reflection."""
        self.waited += seconds

    def org_spend_over(self) -> bool:
        """Whether the org's spend has reached ``limits.total_spend_usd`` (the policy's org_limit)."""
        cap = self.settings.org_spend_cap_usd
        return cap is not None and org_spend(self.w.conn) >= cap

    def settled(self, its: list[dict]) -> str:
        """The state the next act starts from: the last checkpoint, or the checkpoint of an
        action a human approved after it."""
        last = its[-1]["checkpoint"] if its else self.history.baseline()
        return gate.settled_checkpoint(self.w.conn, self.work_id, its[-1]["n"] if its else 0) or last

    def reset_once(self, its: list[dict]) -> None:
        """The crash reset (an attempt cut or crashed may have left changes), before anything
        else touches the workspace — an approved action included, whose effect must survive."""
        if self.needs_reset:
            self.history.reset_to(self.settled(its))
            self.needs_reset = False

    def checkpoint_action(self, its, decision: Decision) -> tuple[str, str | None]:
        """Record what an approved action left (``gate.settle``'s ``after_action``): (its
        checkpoint, a note for its result). A workspace the action left over its disk quota is
        not recorded as it is: it goes back to the state before the action (the action ran,
        its effect is dropped) and the note says why — the doer asked for it."""
        used = self._quota_used()
        note = None
        if used is not None:
            self.history.reset_to(self.settled(its))
            note = (f"[loop-org] error[disk_quota]: the action left the workspace at {used / 2**20:.0f} MB (apparent "
                    f"sizes), over its {self.settings.disk_mb} MB quota; its changes were discarded")
            self.log.warning("action_over_quota", decision=decision.id, used_mb=round(used / 2**20),
                             quota_mb=self.settings.disk_mb, next="its changes are discarded; the run goes on")
        return self.history.checkpoint_action(decision.id), note

    def _quota_used(self) -> int | None:
        """What the workspace would take written out, when that is over its quota (else None)."""
        if self.settings.disk_mb is None:
            return None
        from roles.workbench.sandbox.limits import Limits, over_quota
        return over_quota(self.history.workspace, Limits(disk_mb=self.settings.disk_mb))

    def start(self, work: WorkItem) -> None:
        self.history.baseline()
        if gate.interrupted(self.w.conn, self.work_id):
            its = prog.load(self.w.conn, work)[1]
            printed = getattr(self.settings.gate_runner, "partial_output", None)
            gate.ask_again_if_interrupted(self.w, self.work_id,
                                          lambda d: self.history.changed_in_workspace(self.settled(its)),
                                          None if printed is None else lambda d: printed(str(self.history.workspace)))
        with self.w.transaction() as tx:
            if work.status == WorkStatus.DISPATCHED:
                tx.set_status("work_items", self.work_id, WorkStatus.RUNNING)
            # an attempt left open by a crash is discarded (its workspace changes are reset below);
            # its time up to its last sign of life (its last model response) still counts
            lost = 0.0
            for cut in open_attempts(tx.conn, self.work_id):
                lost += max(0.0, (cut.alive_at or cut.started_at) - cut.started_at)
                tx.update("attempts", (self.work_id, cut.attempt), ended_at=tx.now, outcome=AttemptOutcome.DISCARDED)
            if lost:
                now = work_q.item(tx.conn, self.work_id)
                tx.update("work_items", self.work_id, elapsed_s=now.elapsed_s + lost,
                          discarded_s=now.discarded_s + lost, updated_at=tx.now)

    def act(self, view: RunView, backend, policy) -> str | bool:
        """One attempt at the iteration after ``view``'s, with ``backend`` under ``policy``:
        committed (True), cut by an interrupt (discarded; False), or discarded because the run
        must stop (``DISCARDED``: the policy's flags say why)."""
        work, progress, its, verdicts = view.work, view.progress, view.iterations, view.verdicts
        n = progress.iterations + 1
        attempt = work.attempt + 1
        # the attempt's time runs from before its row is written to inside the transaction that
        # closes it, so what counts covers its recorded span (started_at to ended_at) whole:
        # the reset, the prompt's assembly, the act, the checkpoint and the commits
        t0 = self.clock()
        with self.w.transaction() as tx:
            self.write_reflection(tx)
            tx.update("work_items", self.work_id, attempt=attempt, next_step=None, updated_at=tx.now)
            tx.insert("attempts", {"work_id": self.work_id, "attempt": attempt, "iteration": n,
                                   "instance": self.w.instance, "started_at": tx.now})
        last = self.settled(its)
        # a cut or crashed attempt may have left changes: back to the last settled state (the
        # last checkpoint, or an approved action's). In the normal flow the workspace already is it.
        self.reset_once(its)
        with telemetry.current().step("gather") as span:
            prompt = assemble(
                work.goal + _verify_note(work) + _rung_note(work), self.settings.instructions, self.settings.skills,
                self.settings.knowledge, prog.digests(its, verdicts, self.reflected), prog.lessons(its, self.settings.lessons_max, self.reflected),
                feedback(self.w.conn, self.work_id, its, verdicts), n,
                k_recent=self.settings.recent_iterations, summary_cap_chars=self.settings.summary_cap_chars)
            span.set({"loop_org.prompt_bytes": prompt.manifest.get("variable_bytes")})
        spent = {"tokens": progress.tokens, "cost": progress.cost_usd,
                 "largest_input": progress.largest_input, "largest_cost": progress.largest_cost}

        def seen() -> RunProgress:
            """``progress`` with what this act has spent so far, and its largest call."""
            return replace(progress, tokens=spent["tokens"], cost_usd=spent["cost"],
                           elapsed_s=progress.elapsed_s + self.clock() - t0,
                           largest_input=spent["largest_input"], largest_cost=spent["largest_cost"])

        def remaining() -> Remaining:
            # an act may spend up to where each budget trips (its limit less the wrap-up's slice)
            now = seen()
            trips = {cap.field: cap.trip_at(now) for cap in policy.budgets()}

            def left(cap, used):
                return None if cap is None else max(0, cap - used)
            # the request's output is bounded; its input is taken to be the largest so far
            return Remaining(tokens=left(trips.get("tokens"), now.tokens + now.largest_input),
                             cost_usd=left(trips.get("cost_usd"), now.cost_usd),
                             seconds=left(trips.get("elapsed_s"), now.elapsed_s))

        record = self._transcript = self.new_transcript(n, attempt)
        record.record(TranscriptKind.PROMPT, {"text": prompt.variable, "system_bytes": len(prompt.system_prefix),
                                              "manifest": prompt.manifest})
        ctx = ActContext(self.work_id, n, attempt, self.history.workspace, prompt.system_prefix, prompt.variable,
                         max_turns=self.settings.max_turns, remaining=remaining, record=record.record)

        def on_usage(u: Usage) -> None:
            self.commit_usage(u, n, attempt)
            spent["tokens"] += u.budget_tokens
            spent["cost"] += u.cost_usd
            spent["largest_input"] = max(spent["largest_input"], input_of(u))
            spent["largest_cost"] = max(spent["largest_cost"], u.cost_usd)

        def budget_left() -> str | None:
            if self.interrupt.is_set():
                return INTERRUPTED
            now = self.work()
            if now.assigned_to != self.w.instance:
                # handed to another loop-agent while this one acted (the coordinator took it for
                # gone): no more model calls for a run this one can no longer commit
                raise RunTaken(self.w.actor, self.work_id, now.assigned_to)
            live = replace(seen(), cancelled=now.cancel_requested, org_limit=self.org_spend_over())
            reason = policy.budget_check(live)
            if reason is None and live.cancelled:
                reason = StopReason.CANCELLED
            if reason is None and live.org_limit:
                reason = StopReason.ORG_LIMIT
            return None if reason is None else str(reason)

        self.log.info("act_started", iteration=n, attempt=attempt, prompt_bytes=prompt.manifest.get("variable_bytes"))
        try:
            outcome = backend.act(ctx, on_usage=on_usage, budget_left=budget_left)
        except Exception as exc:
            self._keep_transcript_of_failed_act(exc)
            raise
        record.record(TranscriptKind.OUTCOME, outcome_entry(outcome))
        if outcome.status == "budget_exhausted" and outcome.error_code in (INTERRUPTED, StopReason.CANCELLED,
                                                                             StopReason.ORG_LIMIT):
            self._close_attempt(attempt, AttemptOutcome.INTERRUPTED, t0, outcome.error_code)
            self.history.reset_to(last)
            self.needs_reset = False
            # cancelled / org_limit: the policy's flags (the work item's cancel, the org's spend) end it
            return False if outcome.error_code == INTERRUPTED else DISCARDED
        if outcome.status == "model_error":
            self._close_attempt(attempt, AttemptOutcome.MODEL_ERROR, t0, outcome.error_code)
            self.history.reset_to(last)
            self.needs_reset = False
            self.model_error = f"{outcome.error_code}: {outcome.error}"     # the policy's ModelError fires
            return DISCARDED
        self._commit(work, n, attempt, outcome, prompt.manifest, t0, last, its, backend, policy)
        return True

    def new_transcript(self, n: int, attempt: int) -> Transcript:
        return Transcript(self.work_id, n, attempt, used_bytes=transcript_bytes(self.w.conn, self.work_id),
                          run_bytes=self.settings.transcript_bytes, clock=time.time)   # wall time: shown to people

    def _keep_transcript_of_failed_act(self, exc: Exception) -> None:
        """An act that raised: what it recorded since its last model response is written now, with
        how it ended (the attempt stays open, to be discarded by whoever takes the run up again)."""
        self._transcript.record(TranscriptKind.OUTCOME, {"status": "error", "error_code": type(exc).__name__,
                                                         "error": str(exc)[:1000], "turns": 0})
        try:
            with self.w.transaction(render=False) as tx:
                self._flush_transcript(tx)
        except Exception as failed:  # noqa: BLE001 - the act's own error is the one to report
            self.log.warning("transcript_not_written", error=str(failed), next="the act's error is raised")

    def _flush_transcript(self, tx) -> None:
        if self._transcript is not None:
            self._transcript.flush(tx)

    def commit_usage(self, u: Usage, n: int, attempt: int) -> None:
        try:
            with self.w.transaction(render=False) as tx:
                tx.insert("model_calls", {"request_id": u.request_id, "work_id": self.work_id, "iteration": n,
                                          "attempt": attempt, "instance": self.w.instance, "model": u.model,
                                          "input_tokens": u.input_tokens, "output_tokens": u.output_tokens,
                                          "cache_write_tokens": u.cache_creation_input_tokens,
                                          "cache_read_tokens": u.cache_read_input_tokens, "cost_usd": u.cost_usd,
                                          "at": tx.now}, journal=False)
                tx.update("attempts", (self.work_id, attempt), alive_at=tx.now)   # a sign of life
                self._flush_transcript(tx)      # what the act said up to this response, at no extra cost
        except Conflict:
            self.log.warning("usage_already_counted", request_id=u.request_id)

    def _within_quota(self, n: int, outcome: ActOutcome, last_commit: str) -> ActOutcome:
        """The act's outcome, once the workspace is known to fit its disk quota: a tree over it
        (apparent sizes: ``limits.over_quota``) is never recorded — its history blobs and every
        snapshot would write it in full on the host. The doer made it, so the act counts: its
        changes are discarded (the workspace reset to ``last_commit``) and the summary says why."""
        used = self._quota_used()
        if used is None:
            return outcome
        self.history.reset_to(last_commit)
        note = (f"[loop-org] error[disk_quota]: the workspace held {used / 2**20:.0f} MB (apparent sizes), over its "
                f"{self.settings.disk_mb} MB quota; this act's changes were discarded and not verified. Keep the "
                "workspace small: no large or sparse files.\n")
        self.log.warning("checkpoint_over_quota", iteration=n, used_mb=round(used / 2**20),
                         quota_mb=self.settings.disk_mb, next="the act's changes are discarded; the act counts")
        return dataclasses.replace(outcome, summary=note + outcome.summary)

    def _commit(self, work, n, attempt, outcome: ActOutcome, manifest, t0: float, last_commit, its, backend,
                policy) -> None:
        outcome = self._within_quota(n, outcome, last_commit)
        with telemetry.current().step("checkpoint") as span:
            checkpoint = self.history.checkpoint(n)
            changed = self.history.changed_paths(last_commit, checkpoint)
            fp = fingerprint(self.history.tree_id(checkpoint), "")
            span.set({"loop_org.checkpoint": checkpoint, "loop_org.changed_paths": len(changed)})
        with self.w.transaction() as tx:
            elapsed = self.clock() - t0         # after tx.now, the attempt's ended_at: its span whole
            u = of_attempt(tx.conn, self.work_id, n, attempt)
            tx.insert("iterations", {
                "work_id": self.work_id, "n": n, "attempt": attempt, "act_status": outcome.status,
                "model": getattr(getattr(backend, "config", None), "model", None),
                "act_summary": outcome.summary[:4000], "tool_calls": [dict(c) for c in outcome.tool_calls][:200],
                "input_tokens": u.input_tokens, "output_tokens": u.output_tokens,
                "cache_write_tokens": u.cache_write_tokens, "cache_read_tokens": u.cache_read_tokens,
                "cost_usd": u.cost_usd, "elapsed_s": round(elapsed, 4), "fingerprint": fp, "checkpoint": checkpoint,
                "changed_paths": changed[:500], "prompt": manifest, "committed_at": tx.now})
            tx.update("work_items", self.work_id, elapsed_s=work_q.item(tx.conn, self.work_id).elapsed_s + elapsed,
                      updated_at=tx.now)
            tx.update("attempts", (self.work_id, attempt), ended_at=tx.now, outcome=AttemptOutcome.COMMITTED)
            self._flush_transcript(tx)
            gate.record_requests(tx, self.work_id, n, outcome.requests)
            # an error class the policy does not know, met for the first time in this run, asks a human
            unknown = triage.unknown(policy, triage.tool_errors(outcome.tool_calls), its, tx.conn, self.work_id)
            if triage.ask(tx, self.work_id, n, unknown, where=f"iteration {n}"):
                self.log.warning("unknown_error", iteration=n, classes=sorted(unknown),
                                 next="verified as usual, then parked for a human")
        self.log.info("iteration_committed", iteration=n, attempt=attempt, act=outcome.status,
                      changed=len(changed), next="verify by the eval-agent")

    def reflect(self, it: dict, verdict: Verdict) -> None:
        summary = prog.summary_of(verdict)
        # an error verdict is the machine's failure (the environment, the sandbox): nothing to learn
        lesson = None if summary.passed or verdict.outcome == VerdictOutcome.ERROR else derive_lesson(
            summary.failing, verdict.feedback)
        outcome = "pass" if summary.passed else ";".join(f"{c}:{s}" for c, s in summary.failing)
        fp = fingerprint(self.history.tree_id(it["checkpoint"]), outcome)
        # written with the next transaction (the next attempt's start, or the run's end): a
        # crash before that leaves a verdict without its reflection, which the next run derives
        # again, identically
        self.unwritten = (it["n"], {"verdict_id": verdict.id, "feedback": verdict.feedback[:4000],
                                     "lesson": lesson, "fingerprint": fp})
        self.log.info("reflected", iteration=it["n"], verdict=verdict.outcome, lesson=bool(lesson))

    def write_reflection(self, tx) -> None:
        if self.unwritten is not None:
            n, columns = self.unwritten
            tx.update("iterations", (self.work_id, n), **columns)
            self.unwritten = None
        if self.waited:
            work = work_q.item(tx.conn, self.work_id)
            tx.update("work_items", self.work_id, elapsed_s=work.elapsed_s + self.waited, updated_at=tx.now)
            self.waited = 0.0

    def _close_attempt(self, attempt: int, outcome: AttemptOutcome, t0: float, detail: str | None = None) -> None:
        """Close a discarded attempt begun at ``t0``; its time counts toward the run (time is
        counted once, like tokens, whatever happens to the work it bought)."""
        with self.w.transaction() as tx:
            elapsed = self.clock() - t0
            tx.update("attempts", (self.work_id, attempt), ended_at=tx.now, outcome=outcome, detail=detail)
            self._flush_transcript(tx)
            work = work_q.item(tx.conn, self.work_id)
            tx.update("work_items", self.work_id, elapsed_s=work.elapsed_s + elapsed,
                      discarded_s=work.discarded_s + elapsed, updated_at=tx.now)


def outcome_entry(outcome: ActOutcome) -> dict:
    """The transcript's record of how an act ended."""
    return {"status": outcome.status, "stop_reason": outcome.stop_reason, "error_code": outcome.error_code,
            "error": outcome.error, "turns": outcome.turns, "summary": outcome.summary}


def input_of(u: Usage) -> int:
    """What of a call's budget tokens is its input (known only once the call is answered)."""
    return u.input_tokens + u.cache_creation_input_tokens


def feedback(conn, work_id: str, its: list, verdicts: dict) -> str:
    if not its:
        return ""
    last = its[-1]["n"]
    text = verdicts[last].feedback if last in verdicts else ""
    human = gate.feedback_for(conn, work_id, last)
    return f"{text}\n\n{human}".strip() if human else text


def _rung_note(work: WorkItem) -> str:
    """What a run on a higher rung of its model ladder is told: why the weaker model stopped."""
    ladder = work.ladder
    if ladder.rung == 0:
        return ""
    return (f"\n\nThis run has moved to a stronger model ({ladder.label()}, from iteration {ladder.since + 1}): "
            f"the previous one stopped — {ladder.why[:600]}. The iterations above show what it tried; "
            "take a different approach.")


def _verify_note(work: WorkItem) -> str:
    cmds = work.verify
    return "\n\nThe eval-agent verifies with: " + "; ".join(f"`{c}`" for c in cmds) if cmds else ""
