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

OUTPUT_TAIL = 2000
_NOISE = [
    (re.compile(r"0x[0-9a-fA-F]+"), "<addr>"),
    (re.compile(r"\b\d+(\.\d+)?\s*(s|ms|us|µs|sec|seconds)\b"), "<time>"),
    (re.compile(r"\b\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(\.\d+)?\b"), "<date>"),
    (re.compile(r"/tmp/[^\s:'\"]+"), "<tmp>"),
    (re.compile(r"pid[ =]\d+"), "pid <n>"),
    (re.compile(r"run-[0-9]+-[0-9a-f]+|run-[0-9a-f]{8,}"), "<cgroup>"),
]
_SALIENT = re.compile(r"(error|fail|assert|exception|traceback|expected|panic)", re.IGNORECASE)


class VerifyUnavailable(Exception):
    """The check could not be run at all (no sandbox, sandbox failed): no verdict is written, so
    the doer is not charged with it; the eval-agent retries on its next tick."""

    def __init__(self, message: str, *, code: str):
        super().__init__(message)
        self.code = code


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

    def encode(self) -> dict:
        return asdict(self)

    @classmethod
    def decode(cls, data: dict) -> "CheckResult":
        return cls(**data)


def failure_signature(output: str, exit_code: int | None, timed_out: bool, snapshot: Path) -> str:
    """A short hash of what the failure says, with run-to-run noise removed."""
    text = output.replace(str(snapshot), "<ws>")
    for pattern, repl in _NOISE:
        text = pattern.sub(repl, text)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    salient = [ln for ln in lines if _SALIENT.search(ln)][-20:] or lines[-5:]
    basis = f"exit={exit_code} timeout={timed_out}\n" + "\n".join(salient)
    return hashlib.sha256(basis.encode()).hexdigest()[:16]


def run_check(command: str, cwd: Path, *, timeout_s: float, max_output: int = 1_000_000,
              env: dict | None = None, runner=None) -> CheckResult:
    """Run one verify command in ``cwd`` (a snapshot), bounded in time and output.

    With ``runner`` (the sandbox org.toml asks for: verify commands run code the agent wrote)
    the command runs there; a refused sandbox is a failed check with its code. Without one it
    runs as a plain process in its own group, killed as a whole on timeout.
    """
    t0 = time.monotonic()
    if runner is not None:
        try:
            res = runner.run(command, cwd, timeout_s, max_output)
            code, text, timed_out = res.exit_code, res.output, res.timed_out
        except Exception as exc:  # noqa: BLE001 - the verifier's own failure, not the doer's
            raise VerifyUnavailable(f"verify command could not run: {exc}",
                                    code=getattr(exc, "code", None) or "sandbox_error") from exc
        passed = code == 0 and not timed_out
        return CheckResult(
            name=command, command=command, passed=passed, exit_code=None if timed_out else code, timed_out=timed_out,
            signature=None if passed else failure_signature(text, code, timed_out, cwd),
            output_tail=text[-OUTPUT_TAIL:], duration_ms=round((time.monotonic() - t0) * 1000, 2))
    proc = subprocess.Popen(["/bin/sh", "-c", command], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                            env=env if env is not None else _clean_env())
    timed_out = False
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
    text = out[-max_output:].decode("utf-8", "replace")
    passed = proc.returncode == 0 and not timed_out
    return CheckResult(
        name=command, command=command, passed=passed,
        exit_code=None if timed_out else proc.returncode, timed_out=timed_out,
        signature=None if passed else failure_signature(text, proc.returncode, timed_out, cwd),
        output_tail=text[-OUTPUT_TAIL:], duration_ms=round((time.monotonic() - t0) * 1000, 2))


def _clean_env() -> dict:
    """Verify commands run code the agent wrote: no keys of ours in their environment."""
    keep = ("PATH", "LANG", "LC_ALL", "TERM", "TZ", "PYTHONDONTWRITEBYTECODE")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    env["HOME"] = "/nonexistent"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env
