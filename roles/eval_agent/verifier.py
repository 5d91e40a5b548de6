"""The eval-agent's judgement of one committed iteration, and the preflight before the first act.

It verifies checkpoint n in its own snapshot — never the live workspace the doer can still
change — of a tree it constructs (``scope``): the baseline plus the doer's changes inside the
run's change scope, with protected files (tests) restored from the baseline and, inside the
scope, everything that changes how a check runs held to the baseline (``held``). The tree is a
commit of the history (the verdict's ``verified``): what the checks ran on is what the workspace
is made to hold at ``goal_met``. It runs every verify command there, and writes the verdict as
the eval-agent. A check passes only with an exit code of 0 *and* evidence that its
tests ran as many as on the baseline (``evidence``). A passing verdict on the latest committed
iteration ends the run with ``goal_met`` in the same transaction: nobody else can.

Before the first act (``preflight``), every verify command runs once on the baseline, in the
same sandbox. A command that cannot start (exit 126/127, the shell's "not found", a missing
module, the sandbox failing, a timeout) ends the work item with ``verify_unrunnable`` before any
model call, with a message that names the command and quotes what it said. The baseline's
result is kept: later verdicts compare their test counts with it. A baseline that already passes
asks a human (a pending ``baseline_passes`` decision) whether to go on.

Every bound on the verification path fails closed: a runner report listing more tests than are
compared, output cut past its bound where the pass would rest on it (``checks``), a change larger
than the review reads (``review``) give an ``error`` verdict coded ``verify_limit`` or
``review_too_large`` — "could not verify", the run ends for a human — never a pass and never a
comparison skipped. A pass also needs the live workspace to hold what the checkpoint recorded,
read file by file (``DELIVERED_CHECK``): what the history could not record was never verified.

A check that cannot start during the run is never blamed on the doer: the verdict is ``error``,
its check carries the code (``verify_unrunnable``, ``sandbox_failed``, ``verifier_error``), and
the run ends ``verify_unrunnable`` in the same transaction (it does not pause for a decision: the
machine has to be fixed first, and ``org show`` says what to change).
"""
from __future__ import annotations

import re
import shlex
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, replace
from pathlib import Path

from roles.base import telemetry
from roles.eval_agent import canaries, evidence, held as held_rules
from roles.workbench.sandbox import held_out
from roles.eval_agent import nearest, runnable
from roles.eval_agent import scope as scope_rules
from roles.eval_agent.codes import LIMIT_CODES
from roles.eval_agent.checks import CheckResult, VerifyUnavailable, run_check, snapshot_settings
from roles.eval_agent.review import REVIEW_CHECK, Review, ReviewFailed, judged
from roles.workbench.sandbox.reports import ReportFile
from roles.workbench.workspace.protect import DEFAULT_PROTECTED_PATTERNS
from state_db.ending import StopDecision, end_run, goal_met as goal_met_rule
from state_db.kernel.errors import NotFound, OrgError, StateError
from state_db.kernel.home import OrgHome
from state_db.queries import peers, verdicts, work as work_q
from state_db.queries.decisions import action_checkpoints
from state_db.queries.iterations import iteration, last_n
from state_db.queries.review import claim_of, pending_decision
from state_db.queries.verdicts import Preflight
from state_db.queries.work import WorkItem
from state_db.vocab import (DecisionStatus, PreflightOutcome, ReviewVerdict, StopReason, VerdictOutcome, WorkStatus)
from state_db.writer import StateWriter

PROTECTED_CHECK = "protected files unchanged"
LIMIT = "verify_limit"                  # a bound on the verification path was exceeded (``codes.LIMIT_CODES``)
DELIVERED_CHECK = "workspace is what was recorded"
# An eval-agent verifies the iterations of every running work item of its share in turn (up to
# one per busy loop-agent: 16 each for two eval-agents at N = 32), so it keeps that many
# histories: fewer, and each verification opened its item's repositories again. A history holds
# about one open file.
_KEEP_HISTORIES = 40
# What an interpreter or a build tool says when the *command* cannot start (the shell's own "not
# found" is exit 127, "not executable" 126). Kept narrow: a test that fails on a missing file
# prints "No such file or directory" too, and that is a failure, not an unrunnable command.
_CANNOT_START = re.compile(r"^(?:\S*/)?python[\d.]*: (?:No module named|can't open file)|"
                           r"^npm (?:ERR!|error) Missing script|No rule to make target|no makefile found|"
                           r"^error: no such command|^bwrap: ", re.MULTILINE)


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
    held_back: tuple[dict, ...] = ()
    ended: str | None = None            # the stop reason this verdict ended the run with, if any
    verified: str | None = None         # the commit of the tree the checks ran on (``scope``)


def feedback_of(checks: list[CheckResult], protected: list[str], held: list | None = None) -> str:
    """Specific, actionable feedback for the next gather: which check failed and how."""
    parts = []
    for c in checks:
        if c.name == DELIVERED_CHECK and not c.passed:
            parts.append(f"Not a pass: {c.output_tail}. Remove them, or make them files of the workspace.")
    if protected:
        parts.append(f"Protected files were changed and were restored for verification: {', '.join(protected)}. "
                     "Do not edit tests to make them pass; change the code under test.")
    if held:
        parts.append(held_rules.note_for_doer(held))
    for c in checks:
        if not c.passed and c.name not in (PROTECTED_CHECK, REVIEW_CHECK, DELIVERED_CHECK):
            if c.code:
                why = f"could not run: {c.code}"
            elif c.timed_out:
                why = "timed out"
            elif c.exit_code == 0:
                why = "exit 0, but not a pass"
            else:
                why = "could not run" if c.exit_code is None else f"exit {c.exit_code}"
            tail = "\n".join(c.output_tail.strip().splitlines()[-15:])
            parts.append(f"Check `{c.command}` failed ({why}):\n{tail}")
    return "\n\n".join(parts) if parts else "All checks passed."


def cannot_start(check: CheckResult, *, baseline: bool = False) -> str | None:
    """Why ``check`` shows that its command could not start at all (None: it ran).

    On the baseline (``baseline``) a timeout and an interpreter's "no module named" count too;
    during the run they are the doer's (a hang, a deleted virtual environment) and fail the check.
    """
    if check.code:
        return check.code
    if check.exit_code in (126, 127):
        return f"exit {check.exit_code}"
    if baseline and check.timed_out:
        return f"timed out after {check.duration_ms / 1000:.0f} s"
    if baseline and check.exit_code not in (0, None) and check.tests is None \
            and _CANNOT_START.search(check.output_tail[-1500:]):
        return f"exit {check.exit_code}"
    return None


def unrunnable_message(check: CheckResult, why: str, *, where: str, workspace: Path | None = None) -> str:
    said = " / ".join(ln.strip() for ln in check.output_tail.strip().splitlines()[-3:] if ln.strip())[:400]
    hint = ("make the command's program reachable in the sandbox: use a path inside the workspace "
            "(e.g. .venv/bin/python -m pytest), add its folder to sandbox.readonly_binds in org.toml, "
            "or check it with 'org doctor'")
    program = nearest.program_of(check.command)
    near = nearest.nearest(program, workspace) if program and workspace is not None else None
    if near:
        hint = (f"{program} does not exist; the nearest is {near}: submit again with "
                f"--verify {shlex.quote(check.command.replace(program, near, 1))}")
    if check.exit_code == 126:
        hint = "make the file executable (chmod +x), or run it through its interpreter (sh FILE, python FILE)"
    if check.timed_out:
        hint = "raise sandbox.cpu_seconds in org.toml, or verify with a faster command"
    return f"verify command `{check.command}` cannot run {where} ({why}): {said or 'no output'} — {hint}"


class Verifier:
    """Verifies iterations for one org home.

    Args:
        home: org home (histories live in ``history/``, snapshots in ``eval/``).
        writer: a StateWriter with actor eval-agent.
        timeout_s: per verify command.
        history_factory: (git_dir, workspace) -> history (injectable).
        runner_factory: (snapshot dir, the work item's workspace) -> command runner (the sandbox);
            None runs plain processes.
        reviewer: the review (``review.Reviewer``) of passes with criteria and of the doer's
            claims that the goal is impossible; None: no review.
        scope: globs that widen every work item's change scope (``[verify] scope``).
        canaries: plant canary tests at every verification (``canaries``; ``[verify] canaries``).
    """

    def __init__(self, home: OrgHome, writer: StateWriter, *, timeout_s: float = 300.0, history_factory=None,
                 runner_factory=None, reviewer=None, scope: tuple[str, ...] = (), canaries: bool = True,
                 host: str = ""):
        if history_factory is None:
            from roles.workbench.workspace.history import WorkspaceHistory as history_factory
        self.home = home
        self.writer = writer
        self.timeout_s = timeout_s
        self.history_factory = history_factory
        self.runner_factory = runner_factory
        self.reviewer = reviewer
        self.scope = tuple(scope)
        self.canaries = canaries
        self.host = host
        self._histories: OrderedDict[tuple[str, str], object] = OrderedDict()
        ReportFile.sweep(home.root / "eval-reports")      # what a killed eval-agent left

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

    def existing(self, work_id: str, n: int) -> verdicts.Verdict | None:
        return verdicts.latest_eval_verdict(self.writer.conn, work_id, n)

    def _work(self, work_id: str) -> WorkItem:
        work = work_q.item(self.writer.conn, work_id)
        if work is None:
            raise NotFound(f"work item {work_id} does not exist")
        return work

    def _snapshot(self, history, commit: str, snapshot: Path, paths: list[str]) -> list[str]:
        try:
            return history.materialize(commit, snapshot, paths=paths)
        except OrgError as exc:
            if exc.code != "dest_not_empty":
                raise
            history.discard_snapshot(snapshot)     # left half-written by a killed eval-agent
            return history.materialize(commit, snapshot, paths=paths)

    def _run(self, work: WorkItem, snapshot: Path, planted: canaries.Planted | None = None) -> list[CheckResult]:
        """Run every verify command in ``snapshot``. Raises VerifyUnavailable (the sandbox)."""
        runner = self.runner_factory(snapshot, Path(work.workspace)) if self.runner_factory else None
        commands = list(work.verify)
        if not [c for c in commands if c.strip()]:
            raise StateError(f"{work.id} has no verify command", code="no_verify_command",
                             hint="submit with at least one --verify command")
        def run_over() -> bool:       # a cancelled or ended run's checks are stopped, not waited for
            now = work_q.item(self.writer.conn, work.id)
            return now is None or now.status == WorkStatus.ENDED or now.cancel_requested
        unseen = held_out.names(work.verify_hidden) if work.verify_hidden else frozenset()
        settings = snapshot_settings(snapshot)
        checks = []
        for cmd in commands:
            # a fresh file each time, made by the host where no sandbox reaches (``ReportFile``)
            report = ReportFile.create(self.home.root / "eval-reports", runner)
            try:
                checks.append(run_check(cmd, snapshot, timeout_s=self.timeout_s, runner=runner,
                                        should_stop=run_over, report=report, planted=planted, settings=settings))
            finally:
                report.discard()
        # the doer sees no held-out check's name or code in the output (they still count)
        return [replace(c, output_tail=canaries.without(c.output_tail, unseen)) for c in checks] if unseen else checks

    def _held_out(self, work: WorkItem, snapshot: Path) -> None:
        """Write the work item's held-out checks into ``snapshot``. Raises HiddenError."""
        if work.verify_hidden:
            held_out.copy_into(snapshot, work.verify_hidden)

    def verify(self, work_id: str, n: int) -> Verdict | Preflight:
        """Verify committed iteration ``n`` of ``work_id`` (idempotent: an existing verdict is
        returned); ``n == 0`` is the preflight on the baseline. Traced, when tracing is on, as a
        child of the iteration's span in the run's trace (``roles.base.telemetry``)."""
        tracing = telemetry.current()
        if not tracing.enabled:
            return self._verify(work_id, n)
        it = iteration(self.writer.conn, work_id, n)
        with tracing.verification(work_id, n, it.attempt if it else None) as span:
            result = self._verify(work_id, n)
            span.set({"loop_org.verdict": result.outcome, "loop_org.goal_met": getattr(result, "goal_met", None),
                      "loop_org.ended": str(result.ended) if result.ended else None})
            return result

    def _verify(self, work_id: str, n: int) -> Verdict | Preflight:
        if n == 0:
            return self.preflight(work_id)
        work = self._work(work_id)
        it = iteration(self.writer.conn, work_id, n)
        if it is None:
            raise NotFound(f"iteration {n} of {work_id} is not committed", hint="verify only committed iterations")
        found = self.existing(work_id, n)
        if found:
            return _from_row(found, work.stop_reason == StopReason.GOAL_MET)
        history = self._history(work_id, work.workspace)
        history.ensure_held(it.checkpoint)      # a joined host's copy fetches it (and the baseline)
        snapshot = self.home.root / "eval" / work_id
        verified, built = self._construct(history, work, it.checkpoint, n)
        self._snapshot(history, verified, snapshot, [])
        protected, held = list(built.protected), list(built.held)
        try:
            self._held_out(work, snapshot)
        except held_out.HiddenError as exc:          # could not verify: never a verification without them
            return self.record_error(work_id, n, exc.code, str(exc))
        baseline = self._baseline_checks(work_id)
        planted, hosts = (canaries.for_iteration(history, snapshot, baseline, work.verify) if self.canaries
                          else (canaries.Planted(), {}))
        try:
            checks = self._run(work, snapshot, planted)
        except VerifyUnavailable as exc:
            if exc.code != "sandbox_unavailable":
                raise                       # transient (the sandbox failed to start): retried, then an error
            return self.record_error(work_id, n, exc.code, str(exc))
        checks = [canaries.judged(_judged(c, baseline), planted, hosts.get(c.command)) for c in checks]
        limited = [c for c in checks if c.code == LIMIT]
        if limited:
            return self.record(work_id, n, checks, protected, held=held, outcome=VerdictOutcome.ERROR, verified=verified,
                               end_detail=f"iteration {n} could not be verified ({LIMIT}): "
                                          f"{limited[0].output_tail.rsplit('[eval-agent] ', 1)[-1]}")
        unrunnable = [(c, why) for c in checks if (why := cannot_start(c))]
        if unrunnable:
            c, why = unrunnable[0]
            coded = [replace(x, code=x.code or "verify_unrunnable") if cannot_start(x) else x for x in checks]
            return self.record(work_id, n, coded, protected, held=held, outcome=VerdictOutcome.ERROR, verified=verified,
                               end_detail=unrunnable_message(c, why, where="in the sandbox during the run",
                                                             workspace=Path(work.workspace)))
        modules = runnable.modules_of(history.file_ids(it.checkpoint))
        machine = [(c, why) for c in checks if (why := runnable.environment_failed(
            c, (baseline or {}).get(c.command), workspace_modules=modules))]
        if machine:                 # the environment's failure, never the doer's: no lesson, no repeated_failure
            c, why = machine[0]
            coded = [replace(x, code=runnable.ENVIRONMENT_FAILED) if any(x is m for m, _ in machine) else x
                     for x in checks]
            return self.record(work_id, n, coded, protected, held=held, outcome=VerdictOutcome.ERROR,
                               verified=verified,
                               end_detail=f"iteration {n} could not be verified: `{c.command}` did not reach its "
                                          f"tests ({why}) where the baseline's run did — the machine's failure, "
                                          "not the doer's; fix the environment (see 'org doctor')")
        if all(c.passed for c in checks) and (unrecorded := self._unrecorded(history, it)):
            checks.append(CheckResult(
                name=DELIVERED_CHECK, command="(compare the workspace with the checkpoint, file by file)",
                passed=False, exit_code=None, timed_out=False, signature="unrecorded:" + ",".join(unrecorded[:20]),
                output_tail=("the workspace holds what the history did not record, so it was not verified and would "
                             "reach the user: " + ", ".join(unrecorded[:20]))[:2000], duration_ms=0.0))
        if protected:
            checks.append(CheckResult(name=PROTECTED_CHECK, command="(compare with baseline)", passed=False,
                                      exit_code=None, timed_out=False, signature="protected:" + ",".join(protected),
                                      output_tail="changed: " + ", ".join(protected), duration_ms=0.0))
        try:
            review = self._review(work, it, history, checks, tuple(h.path for h in held))
        except ReviewFailed as exc:          # tried again already: an error verdict, never the doer's fault
            return self.record_error(work_id, n, exc.code, str(exc))
        return self.record(work_id, n, checks, protected, held=held, review=review, verified=verified)

    def _review(self, work, it, history, checks: list[CheckResult], held: tuple[str, ...] = ()) -> Review | None:
        """The review of iteration ``it`` when one is due: on a pass of a work item with review
        criteria, and on every claim of the doer that the goal is impossible. Raises ReviewFailed."""
        if self.reviewer is None:
            return None
        claim = claim_of(list(it.tool_calls))
        if not self.reviewer.wanted(work, passed=all(c.passed for c in checks), claim=claim):
            return None
        diff = history.diff(history.baseline_commit(), it.checkpoint)
        return self.reviewer.review(work, it.n, diff=diff, checks=checks, claim=claim, held=held)

    def _unrecorded(self, history, it) -> list[str]:
        """Paths where the live workspace differs from iteration ``it``'s checkpoint, read file by
        file (build caches aside: delivery removes them). What differs there was never recorded, so
        never verified, and would still be in the user's workspace at goal_met; so are files
        changed inside a repository nested there at the baseline (its work tree is not recorded).
        A history of another host's workspace (``remote``) is not read from here, nor is the
        workspace of a run a loop-agent of another host committed: it works in a copy of its own,
        and the workspace here is not the one it delivers to."""
        if getattr(history, "remote", None) or not Path(history.workspace).is_dir():
            return []
        if self._committed_elsewhere(it):
            return []
        commit = it.checkpoint
        return history.workspace_differences(commit, skip_caches=True) + history.nested_touched(commit)

    def _committed_elsewhere(self, it) -> bool:
        """Whether iteration ``it`` was committed by a loop-agent registered on another host."""
        if not self.host:
            return False
        from state_db.queries.iterations import attempt_instance
        instance = attempt_instance(self.writer.conn, it.work_id, it.attempt)
        committer = peers.peer(self.writer.conn, instance) if instance is not None else None
        return committer is not None and committer.host != self.host

    def _construct(self, history, work: WorkItem, commit: str, n: int) -> tuple[str, scope_rules.Construction]:
        """The commit of the tree the checks of ``commit`` run on — the baseline plus the doer's
        changes inside the run's scope, protected files restored, what changes how a check runs
        held (``scope``) — and how it was built."""
        patterns = (*(DEFAULT_PROTECTED_PATTERNS if work.default_protect else ()), *work.protect)
        protected = history.protected_paths(patterns=patterns) if patterns else []
        approved = set()
        for action in action_checkpoints(self.writer.conn, work.id):    # a human approved these changes
            try:
                parent = history.parent_of(action)
                approved.update(history.changed_paths(parent, action) if parent else ())
            except OrgError:
                continue                        # not in this host's copy: its paths stay outside the scope
        built = scope_rules.construct(
            history.entries(None), history.entries(commit),
            scope=scope_rules.Scope((*self.scope, *work.scope), approved=frozenset(approved)),
            protected=protected, commands=list(work.verify), read_base=lambda p: history.read_path(None, p),
            read_target=lambda p: history.read_path(commit, p))
        return history.derive(commit, built.edits, f"loop-org verified tree\n\niteration: {n}"), built

    def _baseline_checks(self, work_id: str) -> dict[str, CheckResult] | None:
        """The preflight's run of each verify command on the baseline, by command."""
        done = verdicts.preflight(self.writer.conn, work_id)
        if done is None:
            return None
        return {c["command"]: CheckResult.decode(c) for c in done.checks}

    # -- the preflight ----------------------------------------------------------------------------

    def preflight(self, work_id: str) -> Preflight:
        """Run every verify command on the baseline once (idempotent)."""
        done = verdicts.preflight(self.writer.conn, work_id)
        if done is not None:
            return done
        work = self._work(work_id)
        history = self._history(work_id, work.workspace)
        snapshot = self.home.root / "eval" / work_id
        base = history.baseline_commit() or history.baseline()
        self._snapshot(history, base, snapshot, [])
        try:
            self._held_out(work, snapshot)
            planted = canaries.for_preflight(history, snapshot, work.verify) if self.canaries else None
            checks = self._run(work, snapshot, planted)
            if planted is not None:
                checks, again = canaries.calibrated(checks, planted)
                if again:               # a runner ran them where their outcome cannot be read: without them
                    self._snapshot(history, base, snapshot, [])
                    self._held_out(work, snapshot)
                    checks = [replace(c, canary=None) for c in self._run(work, snapshot)]
        except held_out.HiddenError as exc:
            return self.record_preflight_error(work_id, exc.code, str(exc))
        except VerifyUnavailable as exc:
            if exc.code != "sandbox_unavailable":
                raise
            return self.record_preflight_error(work_id, exc.code, str(exc))
        for c in checks:
            why = cannot_start(c, baseline=True)
            if why:
                coded = [replace(x, code="verify_unrunnable") if cannot_start(x, baseline=True) else x for x in checks]
                return self._write_preflight(work_id, PreflightOutcome.UNRUNNABLE, coded,
                                             unrunnable_message(c, why, where="on the baseline",
                                                                workspace=Path(work.workspace)))
        files = history.file_ids(None)
        deps = runnable.declared(lambda p: history.read_path(None, p), files)
        modules = runnable.modules_of(files)
        for c in checks:
            found = runnable.why_not_ran(c, dependencies=deps, workspace_modules=modules)
            if found:
                what, hint = found
                coded = [replace(x, code="verify_unrunnable") if x is c else x for x in checks]
                return self._write_preflight(work_id, PreflightOutcome.UNRUNNABLE, coded,
                                             f"verify command `{c.command}` never reached its tests on the baseline: "
                                             f"{what} — {hint}")
        if all(c.passed for c in checks) and all(evidence.judge(c.counts, None, baseline_known=False).problem is None
                                                 for c in checks):
            return self._write_preflight(work_id, PreflightOutcome.ALREADY_PASSES, checks,
                                         "baseline: every check passes already (" + _counts_line(checks) + ")")
        return self._write_preflight(work_id, PreflightOutcome.READY, checks, "baseline: " + _counts_line(checks)
                                     + ", as expected before any work")

    def record_preflight_error(self, work_id: str, code: str, message: str) -> Preflight:
        work = work_q.item(self.writer.conn, work_id)
        commands = list(work.verify) if work else []
        named = ", ".join(f"`{c}`" for c in commands) or "the verify commands"
        check = CheckResult(name="preflight", command="; ".join(commands) or "(the verify commands)", passed=False,
                            exit_code=None, timed_out=False, signature=code, output_tail=message[-2000:],
                            duration_ms=0.0, code=code)
        return self._write_preflight(work_id, PreflightOutcome.UNRUNNABLE, [check],
                                     f"verify command {named} cannot run on the baseline ({code}): "
                                     f"{_sentence(message, 700)} — fix the machine (see 'org doctor'), then submit "
                                     "again")

    def _write_preflight(self, work_id: str, outcome: str, checks: list[CheckResult], detail: str) -> Preflight:
        ended = None
        row = {"work_id": work_id, "outcome": str(outcome), "checks": tuple(c.encode() for c in checks),
               "detail": detail[:2000], "written_by": self.writer.instance, "at": time.time()}
        with self.writer.transaction() as tx:
            done = verdicts.preflight(tx.conn, work_id)
            if done is not None:
                return done
            tx.insert("preflights", {**row, "checks": list(row["checks"])})
            work = work_q.item(tx.conn, work_id)
            if outcome == PreflightOutcome.UNRUNNABLE and work.status != WorkStatus.ENDED:
                ended = end_run(tx, work_id, StopDecision(StopReason.VERIFY_UNRUNNABLE, detail)).reason
            elif outcome == PreflightOutcome.ALREADY_PASSES and work.status != WorkStatus.ENDED:
                action = {"kind": "baseline_passes", "command": "",
                          "reason": "every verify command passes on the baseline, before any work"}
                tx.insert("decisions", {"id": f"d-{uuid.uuid4().hex[:8]}", "work_id": work_id, "iteration": 0,
                                        "kind": "baseline_passes", "action": action,
                                        "question": (f"{detail}. Go on with the run anyway? approve: go on; "
                                                     "reject: end it (human_rejected)")[:1000],
                                        "status": DecisionStatus.PENDING, "created_at": tx.now})
        return Preflight(**row, ended=ended)

    # -- writing verdicts -------------------------------------------------------------------------

    def record_error(self, work_id: str, n: int, code: str, message: str) -> Verdict:
        """An ``error`` verdict: the check could not run, for a reason that is not the doer's."""
        if n == 0:
            return self.record_preflight_error(work_id, code, message)
        check = CheckResult(name="verifier", command="(run the verify commands)", passed=False, exit_code=None,
                            timed_out=False, signature=code, output_tail=message[-2000:], duration_ms=0.0, code=code)
        todo = ("a human judges the change; the doer is not charged with it" if code in LIMIT_CODES
                else "fix the machine (see 'org doctor'); the doer is not charged with it")
        return self.record(work_id, n, [check], [], outcome=VerdictOutcome.ERROR,
                           end_detail=f"iteration {n} could not be verified ({code}): {message[:400]} — {todo}")

    def record(self, work_id: str, n: int, checks: list[CheckResult], protected: list[str],
               outcome: str | None = None, *, held: list | None = None, end_detail: str | None = None,
               review: Review | None = None, verified: str | None = None) -> Verdict:
        """Write the verdict. ``review`` can only veto: it is one more check, and ``impossible``
        pauses the run with a decision for the human in the same transaction. An iteration that
        has an eval-agent's verdict already keeps it: that one is returned and nothing is written."""
        checks = [*checks, review.check()] if review is not None else list(checks)
        outcome = outcome or (VerdictOutcome.PASS if all(c.passed for c in checks) else VerdictOutcome.FAIL)
        vid = f"v-{uuid.uuid4().hex[:12]}"
        held = list(held or [])
        outcome, feedback = judged(outcome, feedback_of(checks, protected, held), review)
        goal_met, ended = False, None
        with self.writer.transaction() as tx:
            # one verdict an iteration: two eval-agents that disagreed for a moment on whose it
            # was (the org's list changing) may both verify it; the second writes nothing
            # (store writes are serialised, so this check holds until the commit)
            already = verdicts.latest_eval_verdict(tx.conn, work_id, n)
            if already is not None:
                work = work_q.item(tx.conn, work_id)
                return _from_row(already, work is not None and work.stop_reason == StopReason.GOAL_MET)
            tx.insert("verdicts", {"id": vid, "work_id": work_id, "iteration": n, "outcome": outcome,
                                   "checks": [c.encode() for c in checks], "feedback": feedback,
                                   "protected_changed": protected, "written_by": self.writer.instance,
                                   "held_back": [h.encode() for h in held], "evidence": evidence_line(checks),
                                   "review": review.encode() if review is not None else None, "verified": verified,
                                   "at": time.time()})
            work = work_q.item(tx.conn, work_id)
            if review is not None and review.verdict == ReviewVerdict.IMPOSSIBLE and work.status != WorkStatus.ENDED:
                self._ask_impossible(tx, work, n, review)
            latest = last_n(tx.conn, work_id)
            met = goal_met_rule(n, latest, outcome == VerdictOutcome.PASS, True, evidence_line(checks))
            if met is not None and work.status != WorkStatus.ENDED:
                goal_met = end_run(tx, work_id, met).reason == StopReason.GOAL_MET
            elif outcome == VerdictOutcome.ERROR and work.status != WorkStatus.ENDED:
                ended = end_run(tx, work_id, StopDecision(StopReason.VERIFY_UNRUNNABLE, end_detail or feedback)).reason
            elif (forged := canaries.forged_checks(checks)) and work.status != WorkStatus.ENDED:
                ended = end_run(tx, work_id, StopDecision(StopReason.EVIDENCE_FORGED, _forged_detail(n, forged))).reason
        return Verdict(vid, work_id, n, outcome, tuple(checks), feedback, tuple(protected), goal_met,
                       tuple(h.encode() for h in held), ended or (StopReason.GOAL_MET if goal_met else None), verified)

    def _ask_impossible(self, tx, work: WorkItem, n: int, review: Review) -> None:
        """The review judged the goal impossible: a decision for the human (approve: the run ends
        ``impossible``; respond: it goes on with their text), and the run pauses. Never an end by
        itself."""
        if pending_decision(tx.conn, work.id, StopReason.IMPOSSIBLE):
            return
        who = ("the doer declared it and the eval-agent's review agrees" if review.claim is not None
               else "the eval-agent's review judged so")
        action = {"kind": str(StopReason.IMPOSSIBLE), "command": "", "reason": review.text()[:1000],
                  "claim": (review.claim or "")[:1000], "model": review.model}
        question = (f"impossible: the goal cannot be met as stated ({who}): {review.text()} — approve: confirm, the "
                    "run ends impossible; respond TEXT: it goes on with your answer; reject: it goes on without one")
        tx.insert("decisions", {"id": f"d-{uuid.uuid4().hex[:8]}", "work_id": work.id, "iteration": n,
                                "kind": str(StopReason.IMPOSSIBLE), "action": action, "question": question[:1000],
                                "status": DecisionStatus.PENDING, "created_at": tx.now})
        if work.status == WorkStatus.RUNNING:
            tx.set_status("work_items", work.id, WorkStatus.PAUSED)


def _judged(check: CheckResult, baseline: dict[str, CheckResult] | None) -> CheckResult:
    """``check`` with its evidence judged against the baseline's run of the same command; its
    report keeps counts and failing ids only (the baseline's keeps every id)."""
    counts = check.counts
    base = baseline.get(check.command) if baseline is not None else None
    junit = check.junit
    kept = None if junit is None else {
        "counts": junit["counts"], "truncated": junit["truncated"],
        "failing": [i for i, o in junit["ids"].items() if o in ("failed", "error")][:50]}
    basis = "tests" if counts is not None or (base is not None and (base.counts or base.junit)) else "exit_code"
    if not check.passed:
        return replace(check, evidence=basis, junit=kept)
    over = [r for r in (junit, base.junit if base is not None else None) if r is not None and r["truncated"]]
    if over:        # the per-test comparison cannot be made whole: could not verify, never a skipped comparison
        note = (f"\n[eval-agent] the runner's report lists more tests than the eval-agent compares "
                f"({len(over[0]['ids'])}), so whether every baseline test ran cannot be shown — verify a "
                "subset of the tests per command (several --verify commands), or judge the change yourself")
        return replace(check, passed=False, code=LIMIT, evidence="tests", signature=LIMIT, junit=kept,
                       output_tail=(check.output_tail + note)[-2000:])
    if junit is None and "[eval-agent] output cut at its bound" in check.output_tail[-200:]:   # ``checks.CUT``
        # a pass that rests on what the command printed, of which a part was cut: could not verify
        note = ("\n[eval-agent] its output passed its bound and was cut, so the pass it prints cannot be read "
                "whole — have the runner print less (-q), or judge the change yourself")
        return replace(check, passed=False, code=LIMIT, signature=LIMIT, evidence=basis, junit=kept,
                       output_tail=(check.output_tail + note)[-2000:])
    ev = evidence.judge(counts, base.counts if base else None, baseline_known=base is not None,
                        junit=junit, baseline_junit=base.junit if base else None)
    if ev.problem is None:
        return replace(check, evidence=ev.basis, junit=kept)
    note = f"\n[eval-agent] not a pass: the check {ev.problem}"
    return replace(check, passed=False, evidence=ev.basis, signature="evidence:" + ev.problem.split(" (")[0],
                   output_tail=(check.output_tail + note)[-2000:], junit=kept)


def _forged_detail(n: int, forged: list[CheckResult]) -> str:
    c = forged[0]
    return (f"iteration {n}: the test report of `{c.command}` was not written by an honest run ({c.canary['forged']}); "
            "the eval-agent's own tests in the snapshot contradict it — review the change with 'org diff' "
            "(its checkpoints are kept); the doer's code rewrites the runner's evidence")


def _counts_line(checks) -> str:
    parts = []
    for c in checks:
        counts = c.counts
        if counts is not None:
            parts.append(f"`{c.command}`: {counts.failed + counts.errors} of {counts.ran} tests fail"
                         + (f", {counts.skipped} skipped" if counts.skipped else ""))
        else:
            parts.append(f"`{c.command}`: exit {c.exit_code} (no test summary: its pass will rest on the exit code)")
    return "; ".join(parts)


def evidence_line(checks) -> str:
    """One line: what the verdict's pass (or fail) rests on."""
    parts = []
    for c in checks:
        if c.name in (PROTECTED_CHECK, REVIEW_CHECK, DELIVERED_CHECK) or c.code:
            continue
        counts = c.counts
        if counts is not None:
            parts.append(counts.line() + (" (from its report)" if c.junit is not None else ""))
        elif c.evidence == "tests":
            parts.append(f"`{c.command}`: no test summary or report, where the baseline had one")
        else:
            parts.append(f"`{c.command}`: exit code only")
    return "; ".join(parts)


def _sentence(text: str, limit: int) -> str:
    """``text`` cut at a sentence or clause end within ``limit`` characters, never mid-word."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    cut = max(text.rfind(". ", 0, limit), text.rfind("; ", 0, limit))
    return text[: cut + 1] if cut > limit // 2 else text[:limit].rsplit(" ", 1)[0] + " …"


def _from_row(stored: verdicts.Verdict, goal_met: bool) -> Verdict:
    """The verdict message of a verdict already in state.db."""
    return Verdict(stored.id, stored.work_id, stored.iteration, stored.outcome,
                   tuple(CheckResult.decode(c) for c in stored.checks), stored.feedback, stored.protected_changed,
                   goal_met, stored.held_back, verified=stored.verified)


