"""Running one process tree bounded in time and output.

The process starts in its own session; on timeout the whole group is killed (and ``on_timeout``
may kill more, e.g. a cgroup's members). Output is drained continuously, so a chatty child never
blocks on a full pipe, and only its head and tail are kept: failures usually print at the end.
"""
from __future__ import annotations

import os
import select
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

TRUNCATION_MARK = b"\n...[output truncated]...\n"
_READER_GRACE_S = 2.0  # a pipe still held open after the kill is given up on after this long


@dataclass(frozen=True)
class Captured:
    """What one process did. ``exit_code`` is None when it was killed on timeout; ``stderr`` is
    empty when stderr was merged into ``output``."""

    exit_code: int | None
    output: str
    stderr: str
    timed_out: bool
    truncated: bool
    duration_s: float
    stopped: bool = False  # killed because ``should_stop`` said so (not a timeout)


class HeadTail:
    """Keeps the first and last ``cap // 2`` bytes of a stream and counts the rest."""

    def __init__(self, cap: int) -> None:
        self.half = max(cap // 2, 1)
        self.head, self.tail, self.seen = bytearray(), bytearray(), 0

    def add(self, chunk: bytes) -> None:
        self.seen += len(chunk)
        room = self.half - len(self.head)
        if room > 0:
            self.head.extend(chunk[:room])
            chunk = chunk[room:]
        if chunk:
            self.tail.extend(chunk)
            del self.tail[:-self.half]

    @property
    def truncated(self) -> bool:
        return self.seen > len(self.head) + len(self.tail)

    def text(self) -> str:
        mark = TRUNCATION_MARK if self.truncated else b""
        return (bytes(self.head) + mark + bytes(self.tail)).decode("utf-8", errors="replace")


def _drain(stream, sink: HeadTail) -> threading.Thread:
    def pump() -> None:
        try:
            while chunk := stream.read1(65536):
                sink.add(chunk)
        except (OSError, ValueError):  # closed under us after the grace period
            pass

    thread = threading.Thread(target=pump, name="sandbox-drain", daemon=True)
    thread.start()
    return thread


def _feed(stream, data: bytes) -> threading.Thread:
    def write() -> None:
        try:
            stream.write(data)
        except (BrokenPipeError, OSError, ValueError):  # the child stopped reading: its business
            pass
        finally:
            try:
                stream.close()
            except OSError:
                pass

    thread = threading.Thread(target=write, name="sandbox-stdin", daemon=True)
    thread.start()
    return thread


def _wait(proc: subprocess.Popen, deadline: float, should_stop: Callable[[], bool] | None,
          poll_s: float) -> bool:
    """Wait for ``proc`` until ``deadline`` (monotonic); True when ``should_stop`` asked to stop.
    Raises ``subprocess.TimeoutExpired`` at the deadline. A pidfd becomes readable the moment the
    process exits, without ``Popen.wait``'s polling loop (which adds up to 50 ms per command)."""
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        fd = None
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired(proc.args, 0)
            step = min(left, poll_s) if should_stop is not None else left
            if fd is not None:
                exited = bool(select.select([fd], [], [], step)[0])
            else:
                try:
                    proc.wait(timeout=step)
                    exited = True
                except subprocess.TimeoutExpired:
                    exited = False
            if exited:
                proc.wait()
                return False
            if should_stop is not None and should_stop():
                return True
    finally:
        if fd is not None:
            os.close(fd)


def kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_bounded(argv: Sequence[str], *, cwd: str | os.PathLike | None, env: Mapping[str, str],
                timeout_s: float, max_output: int, stdin: bytes | None = None,
                separate_stderr: bool = False, pass_fds: Sequence[int] = (),
                preexec: Callable[[], None] | None = None,
                on_timeout: Callable[[], None] | None = None,
                should_stop: Callable[[], bool] | None = None, poll_s: float = 1.0) -> Captured:
    """Run ``argv`` and wait for it, at most ``timeout_s`` seconds.

    Params: ``max_output`` bytes are kept of stdout (and, when ``separate_stderr``, as many of
    stderr); ``stdin`` is written then closed (default: /dev/null); ``pass_fds`` stay open in the
    child; ``on_timeout`` runs after the group is killed; ``should_stop`` is asked every ``poll_s``
    seconds (in the calling thread) and a True kills the tree like a timeout (``stopped``).
    Errors: ``OSError`` when ``argv[0]`` cannot be executed.
    Returns: ``Captured``.
    """
    t0 = time.monotonic()
    proc = subprocess.Popen(
        list(argv), cwd=cwd, env=dict(env), pass_fds=tuple(pass_fds), preexec_fn=preexec,
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE if separate_stderr else subprocess.STDOUT, start_new_session=True)
    out, err = HeadTail(max_output), HeadTail(max_output)
    readers = [_drain(proc.stdout, out)]
    if separate_stderr:
        readers.append(_drain(proc.stderr, err))
    if stdin is not None:
        _feed(proc.stdin, stdin)
    timed_out = stopped = False
    try:
        stopped = _wait(proc, t0 + timeout_s, should_stop, poll_s)
        if stopped:
            kill_group(proc.pid)
            if on_timeout is not None:
                on_timeout()
            proc.wait()
    except subprocess.TimeoutExpired:
        timed_out = True
        kill_group(proc.pid)
        if on_timeout is not None:
            on_timeout()
        proc.wait()
    except BaseException:  # interrupted while waiting: never leave the tree behind
        kill_group(proc.pid)
        proc.wait()
        raise
    deadline = time.monotonic() + _READER_GRACE_S
    for reader in readers:
        reader.join(timeout=max(deadline - time.monotonic(), 0.0))
    if not any(r.is_alive() for r in readers):
        # closing a pipe another thread is blocked reading would wait for that read to end;
        # a reader still alive (an escaped grandchild holds the pipe) closes nothing and ends at EOF
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
    return Captured(None if timed_out or stopped else proc.returncode, out.text(), err.text(), timed_out,
                    out.truncated or err.truncated, time.monotonic() - t0, stopped)
