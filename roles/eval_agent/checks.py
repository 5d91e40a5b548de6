"""Running verify commands and summarising their failures into stable signatures.

A failure signature must be the same when the same check fails the same way twice, whatever the
timings, addresses or snapshot paths in its output: that is what ``repeated_failure`` compares.
"""
from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from roles.workbench.sandbox.check import run_check_command
from state_db.kernel.errors import OrgError
from state_db.text import clean

OUTPUT_TAIL = 2000
# said at the end of a check's output cut at its bound: a pass that rests on the output (no runner
# report) cannot be read whole, so the verifier calls it "could not verify" (``verify_limit``)
CUT = "\n[eval-agent] output cut at its bound of {} bytes\n"
_NOISE = [
    (re.compile(r"0x[0-9a-fA-F]+"), "<addr>"),
    (re.compile(r"\b\d+(\.\d+)?\s*(s|ms|us|µs|sec|seconds)\b"), "<time>"),
    (re.compile(r"\b\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(\.\d+)?\b"), "<date>"),
    (re.compile(r"/tmp/[^\s:'\"]+"), "<tmp>"),
    (re.compile(r"pid[ =]\d+"), "pid <n>"),
    (re.compile(r"run-[0-9]+-[0-9a-f]+|run-[0-9a-f]{8,}"), "<cgroup>"),
]
_NUMBER = re.compile(r"[-+]?\d+(?:[.,]\d+)*(?:[eE][-+]?\d+)?")
_ERROR_KIND = re.compile(r"\b([A-Z]\w*(?:Error|Exception|Failure|Interrupt|Exit))\b")
_SALIENT = re.compile(r"(error|fail|assert|exception|traceback|expected|panic)", re.IGNORECASE)


class VerifyUnavailable(OrgError):
    """The check could not be run at all (no sandbox, sandbox failed): no verdict is written, so
    the doer is not charged with it; the eval-agent retries on its next tick."""

    code = "verify_unavailable"


@dataclass(frozen=True)
class CheckResult:
    name: str
    command: str
    passed: bool
    exit_code: int | None
    timed_out: bool
    signature: str | None
    output_tail: str
    duration_ms: float
    tests: dict | None = None       # the runner's summary (``evidence.TestCounts``), when one was read
    evidence: str = ""              # "tests" / "exit_code" (what a pass rests on); "" before a judgement
    code: str | None = None         # why the check could not run (``verify_unrunnable``, ``sandbox_failed``, …)
    junit: dict | None = None       # the runner's own report ({"counts", "ids", "truncated"}), when it wrote one
    canary: dict | None = None      # what the canaries showed (``canaries``): the baseline's hosts, or a forgery

    def encode(self) -> dict:
        """The check record; ``failing_tests`` (the failing test ids, ``evidence.failing_tests``)
        is computed from what is stored, so the record's readers need no parser of ours."""
        from roles.eval_agent.evidence import failing_tests
        return {**asdict(self), "failing_tests": [] if self.passed else failing_tests(self.junit, self.output_tail)}

    @classmethod
    def decode(cls, data: dict) -> "CheckResult":
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})

    @property
    def counts(self):
        from roles.eval_agent.evidence import TestCounts
        return TestCounts.decode(self.tests)


def failure_signature(output: str, exit_code: int | None, timed_out: bool, snapshot: Path) -> str:
    """A short hash of what the failure is, with run-to-run noise removed.

    Where the runner names the failing tests, the signature is those ids and the kinds of error
    raised (``AssertionError``, ``TypeError``): whatever a message prints — a time, a random
    number, a word — the same tests failing the same way is the same failure. Otherwise it is the
    salient lines of the output with timings, addresses, temporary paths and every number left out.
    """
    from roles.eval_agent.evidence import failing_ids
    text = output.replace(str(snapshot), "<ws>")
    for pattern, repl in _NOISE:
        text = pattern.sub(repl, text)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    salient = [ln for ln in lines if _SALIENT.search(ln)][-20:] or lines[-5:]
    ids = failing_ids(output)
    if ids:
        kinds = sorted({m for ln in salient for m in _ERROR_KIND.findall(ln)})
        basis = f"exit={exit_code} timeout={timed_out}\nids=" + ",".join(ids) + "\nkinds=" + ",".join(kinds)
    else:
        basis = f"exit={exit_code} timeout={timed_out}\n" + "\n".join(_NUMBER.sub("<n>", ln) for ln in salient)
    return hashlib.sha256(basis.encode()).hexdigest()[:16]


def run_check(command: str, cwd: Path, *, timeout_s: float, max_output: int = 1_000_000,
              env: dict | None = None, runner=None, should_stop=None, report=None, planted=None,
              settings: dict | None = None) -> CheckResult:
    """Run one verify command in ``cwd`` (a snapshot), bounded in time and output.

    With ``runner`` (the sandbox org.toml asks for: verify commands run code the agent wrote)
    the command runs there; a refused sandbox raises VerifyUnavailable with its code, and
    ``should_stop`` (polled while it runs) stops a check whose run ended meanwhile
    (VerifyUnavailable with code ``run_ended``). Without one it runs as a plain process in its
    own group, killed as a whole on timeout.

    ``report`` is the ``reports.ReportFile`` of a JUnit XML report pytest is asked to write
    (``PYTEST_ADDOPTS``, whatever runs pytest: ``pytest``, ``python -m pytest``, ``uv run``, a
    Makefile); what it holds becomes ``junit``. A report the host refuses to read (too large:
    ``hostile.read_regular``) fails the check, whatever its exit code: a bound never passes.

    ``planted`` (``canaries.Planted``): the canaries in ``cwd``. What the report says of them is
    ``canary["seen"]`` (for the verifier to judge), and they are taken out of everything else:
    ``junit``, the counts, the output (``canary["named"]``: the raw output named one). The output
    is stored without terminal control sequences (``state_db.text.clean``).

    ``settings``: variables set for the command wherever it runs (``snapshot_settings``).
    """
    t0 = time.monotonic()
    extra = dict(settings or {})
    if report is not None:
        extra["PYTEST_ADDOPTS"] = f"--junitxml={report.inside}"
    if runner is not None:
        try:
            res = run_check_command(runner, command, cwd, timeout_s=timeout_s, max_output=max_output, env=extra,
                                    should_stop=should_stop, binds=report.binds if report else ())
            code, text, timed_out = res.exit_code, res.output, res.timed_out
            text += CUT.format(max_output) if getattr(res, "truncated", False) else ""
        except Exception as exc:  # noqa: BLE001 - the verifier's own failure, not the doer's
            raise VerifyUnavailable(f"verify command could not run: {exc}",
                                    code=exc.code if isinstance(exc, OrgError) else "sandbox_error") from exc
        if getattr(res, "stopped", False):
            raise VerifyUnavailable("the run ended while its check ran; the check was stopped", code="run_ended")
    else:
        proc = subprocess.Popen(["/bin/sh", "-c", command], cwd=cwd, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                env={**(env if env is not None else _clean_env()), **extra})
        timed_out = False
        try:
            out, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
        text, code = out[-max_output:].decode("utf-8", "replace"), proc.returncode
        text += CUT.format(max_output) if len(out) > max_output else ""
    passed = code == 0 and not timed_out
    junit, canary = None, None
    text = clean(text)
    if report is not None:
        junit, refused = report.read()
        if refused is not None:
            passed = False
            text += f"\n[eval-agent] not a pass: the test report was refused ({refused.code}): {refused}\n"
        if planted is not None and planted.canaries:
            from roles.eval_agent import canaries
            seen = canaries.observe(report.host, planted)
            junit = canaries.strip(junit, planted, seen)
            canary = {"seen": seen, "named": any(n in text for n in planted.names)}
            text = canaries.scrub(text, planted, seen if junit is not None else None)
    return CheckResult(
        name=command, command=command, passed=passed, exit_code=None if timed_out else code, timed_out=timed_out,
        signature=None if passed else failure_signature(text, code, timed_out, cwd),
        output_tail=text[-OUTPUT_TAIL:], duration_ms=round((time.monotonic() - t0) * 1000, 2),
        tests=_summary(text, junit), junit=junit, canary=canary)


def _summary(text: str, junit: dict | None = None) -> dict | None:
    """The test counts: from the runner's own report when it wrote one, else from its output."""
    if junit is not None:
        return junit["counts"]
    from roles.eval_agent.evidence import parse
    counts = parse(text)
    return counts.encode() if counts is not None else None


def snapshot_settings(snapshot: Path) -> dict[str, str]:
    """Variables for verify commands run in ``snapshot``: ``UV_NO_SYNC`` when it holds the
    project's own environment (``.venv/pyvenv.cfg`` beside a ``pyproject.toml``).

    ``uv run`` syncs the environment before it runs, and finds the project's own install stale
    by the modification times of its cache keys (``pyproject.toml``, ``setup.py``,
    ``setup.cfg``), which the history does not record: in a snapshot checked out now they are
    newer than the install the user made, so uv would build the project again — over a network
    the sandbox does not have — although nothing it is built from changed. Nothing a sync could
    bring can differ from what the snapshot holds: the environment folder and the packaging
    metadata are outside every default change scope (``eval_agent.scope``), so the verified
    tree holds the baseline's, as the user synced them before submitting, and whatever the doer
    changed in the environment after the baseline is held back (restored or left out) before
    the snapshot is written; and the project's editable install points at the workspace's path,
    where the sandbox shows the snapshot, so the code the checks import is the verified tree's.
    Without an environment in the snapshot uv resolves as it would anyway (and, offline, the
    preflight calls the command unrunnable with uv's own message)."""
    if (snapshot / ".venv" / "pyvenv.cfg").is_file() and (snapshot / "pyproject.toml").is_file():
        return {"UV_NO_SYNC": "1"}
    return {}


def _clean_env() -> dict:
    """Verify commands run code the agent wrote: no keys of ours in their environment."""
    keep = ("PATH", "LANG", "LC_ALL", "TERM", "TZ", "PYTHONDONTWRITEBYTECODE")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    env["HOME"] = "/nonexistent"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env
