"""Running the model's commands: the ``CommandRunner`` protocol ``run_command`` calls, and the
unsandboxed ``SubprocessRunner`` (the sandbox's runner implements the same protocol)."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Protocol, Sequence


@dataclass(frozen=True)
class CommandResult:
    """What a command did: ``exit_code`` is None when it was killed on timeout."""

    exit_code: int | None
    output: str
    timed_out: bool
    truncated: bool


class CommandRunner(Protocol):
    def run(self, command: Sequence[str] | str, cwd: Path, timeout_s: float,
            max_output_bytes: int) -> CommandResult:
        """Run ``command`` (argv, or a shell line when a str) in ``cwd``; stdout and stderr
        combined, at most ``max_output_bytes`` kept; killed after ``timeout_s``."""
        ...


#: environment names never handed to agent commands (org credentials stay with the org)
_SECRET_ENV = re.compile(r"^ANTHROPIC_|(_API_KEY|_TOKEN|_SECRET|_PASSWORD)$")


class SubprocessRunner:
    """Unsandboxed runner: a plain subprocess in its own session, killed as a group on timeout.
    Keeps the head and the tail of long output (failures usually print at the end)."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        base = os.environ if env is None else env
        self.env = {k: v for k, v in base.items() if not _SECRET_ENV.search(k)}

    def run(self, command: Sequence[str] | str, cwd: Path, timeout_s: float,
            max_output_bytes: int) -> CommandResult:
        proc = subprocess.Popen(command, shell=isinstance(command, str), cwd=cwd, env=self.env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)
        half = max(max_output_bytes // 2, 1)
        head, tail, seen = bytearray(), bytearray(), [0]

        def drain() -> None:  # keeps reading so a chatty child never blocks on a full pipe
            assert proc.stdout is not None
            while chunk := proc.stdout.read1(65536):
                seen[0] += len(chunk)
                room = half - len(head)
                head.extend(chunk[:room])
                tail.extend(chunk[room:] if room > 0 else chunk)
                del tail[:-half]

        reader = threading.Thread(target=drain, daemon=True)
        reader.start()
        timed_out = False
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
            proc.wait()
        reader.join(timeout=2.0)  # a grandchild that escaped the group may hold the pipe open
        proc.stdout.close()
        truncated = seen[0] > len(head) + len(tail)
        data = bytes(head) + (b"\n...[output truncated]...\n" if truncated else b"") + bytes(tail)
        return CommandResult(None if timed_out else proc.returncode,
                             data.decode("utf-8", errors="replace"), timed_out, truncated)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
