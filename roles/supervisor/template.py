"""Starting the role template (``roles.supervisor.forkserver``) with the standard library only.

The supervisor starts the template first thing, before it imports anything of its own: the
template's imports are the longest step of the org's start-up, and on two cores they overlap
with the supervisor's own imports and with it opening the org only if the template is already
running. So this module imports nothing beyond the standard library, and neither does the
package it is in. The template is the supervisor itself, forked (``launch(fork=True)``) once it
has imported what both need (``COMMON``) and before it opens anything: no second interpreter
starts, and nothing both need is imported twice.
"""
from __future__ import annotations

import ctypes
import os
import resource
import signal
import socket
import subprocess
import sys
from typing import NoReturn

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
# What the roles import, in two stages. The template forks the first roles as soon as the light
# stage is in, then imports the heavy stage once they are ready (``forkserver.serve``) and says
# it is warm; a role forked after
# that finds all of it already imported. The light stage is what a role needs to be ready (the
# runtime, the transport, the store: a loop-agent's process without its engine). What a role
# needs only to work is in the heavy stage: the loop engine and the workspace history, the
# verifier, the curation pipeline, the triggers' checks, the model SDK (~2 s of CPU). A role
# forked before the template is warm imports those itself when it first works (the coordinator,
# the curator and the eval-agent import their own modules after the fork, on the other core),
# and an idle loop-agent forked before is forked again from the warm template, so the pages of
# the many loop-agents are shared. A module that fails to import is skipped (the role that needs
# it reports the failure itself).
LIGHT = (
    "roles.loop_agent.process",
    # every role imports these before it is ready: once here rather than once in each
    "roles.base.telemetry",
    "pwd",
)
HEAVY = (
    "roles.loop_agent.engine",
    "roles.loop_agent.tools",
    "roles.workbench.workspace.history",
    "roles.eval_agent.process",
    "roles.eval_agent.verifier",
    "roles.eval_agent.review",
    # its warm-up (``forkserver._warm_sandbox``) runs after the heavy stage: what each sandboxed
    # command needs, made once for every role forked warm
    "roles.workbench.sandbox.mode",
    "croniter",
    "roles.coordinator.process",
    "roles.coordinator.triggers",
    "roles.curator.process",
    "roles.curator.pipeline",
    "anthropic",
    # the SDK imports it at its first request, and it reads every installed package's entry points
    "opentelemetry.propagate",
    "roles.loop_agent.backends.factory",
    "roles.loop_agent.backends.anthropic_backend",
    "roles.workbench.scripted.server",
    # an HTTP server's bind looks up the host's name (socket.getfqdn), which imports this codec
    "encodings.idna",
)
PRELOAD = LIGHT + ("--",) + HEAVY
# What the supervisor needs that every role needs too (the configuration and its validators, the
# store, the logs, the error tree): the supervisor imports it before it forks the template
# (``launch(fork=True)``), so it is imported once, not once in each process side by side; after
# the fork the two go on at once, the template with the rest of the light stage, the supervisor
# with its own few modules and opening the org.
COMMON = (
    "argparse",
    "roles.supervisor.forkserver",
    "roles.base.instances",
    "state_db.kernel.config",
    "state_db.kernel.home",
    "state_db.kernel.logsetup",
    "state_db.queries",
    "state_db.writer",
    "transport.keys",
)


def pdeathsig(sig: int) -> None:
    """Have the kernel send ``sig`` to this process when its parent dies."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, sig)


def subreaper() -> None:
    """Make this process the one its descendants' orphans are given to, instead of the machine's
    init (not inherited by its children)."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def open_files_limit() -> int:
    """Raise this process's soft limit of open files to its hard limit, so the org's processes
    (the template, every role, every sandbox) inherit it, and return the limit now in force.

    Each role holds a few descriptors per peer it talks to (ZeroMQ's ipc connections), its
    database files, its logs and its wake FIFO; the coordinator and the eval-agents talk to every
    loop-agent, and the soft limit many shells start with (1,024) is what a hundred loop-agents
    reach. The hard limit is the machine owner's word on what may be used; nothing asks past it.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard
    if hard == resource.RLIM_INFINITY:       # "no limit" is refused for files: the kernel's own cap
        try:
            with open("/proc/sys/fs/nr_open") as f:
                want = int(f.read())
        except (OSError, ValueError):
            return soft
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            return want
        except (ValueError, OSError):
            return soft
    return soft


def launch(python: str = sys.executable, preload: tuple[str, ...] = PRELOAD, *,
           fork: bool = False) -> tuple[subprocess.Popen, socket.socket]:
    """Start a template that imports ``preload``; return it (a ``Popen``, or a ``ForkedTemplate``
    with the same interface) and this side of its socket.

    It dies with this process (``PR_SET_PDEATHSIG``) and is not given the org's keys.

    ``fork``: the template is this process, forked, rather than a new interpreter: no interpreter
    starts, and what this process imported (``COMMON``) is not imported again. Only for a
    process that has imported modules and nothing else, the supervisor before it opens the org:
    it runs one thread (a fork of a threaded process may inherit a held lock) and holds no file
    but its standard input and output (the template gets no database, log or lock of the
    supervisor's). And only when its environment holds none of the org's keys: a fork keeps the
    environment it started with in its memory (``/proc/PID/environ``), whatever ``os.environ``
    is made to say, and every role is a fork of the template. Otherwise it starts an
    interpreter, with the keys left out."""
    bare = fork and _one_thread_stdio_only() and not any(k.startswith("ORG_KEY") for k in os.environ)
    ours, theirs = socket.socketpair()
    if bare:
        try:
            return _fork(ours, theirs, preload), ours
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORG_KEY")}
    try:
        proc = subprocess.Popen(
            [python, "-m", "roles.supervisor.forkserver", str(theirs.fileno()), *preload],
            pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, env=env,
            preexec_fn=lambda: pdeathsig(signal.SIGKILL))
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()
    return proc, ours


def _one_thread_stdio_only() -> bool:
    fds = os.listdir("/proc/self/fd")           # its own descriptor for the listing is one more
    return len(os.listdir("/proc/self/task")) == 1 and len(set(fds) - {"0", "1", "2"}) <= 1


def _fork(ours: socket.socket, theirs: socket.socket, preload: tuple[str, ...]) -> "ForkedTemplate":
    parent = os.getpid()
    pid = os.fork()
    if pid:
        return ForkedTemplate(pid)

    def template() -> int:                   # as launched, never back to the caller
        ours.close()
        pdeathsig(signal.SIGKILL)
        if os.getppid() != parent:           # the supervisor died before the line above
            return 1
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        from roles.supervisor.forkserver import serve
        return serve(theirs.fileno(), list(preload))

    run_and_exit(template)


def run_and_exit(body) -> NoReturn:
    """In a forked child: run ``body`` (it returns an exit status), print what it raises, and
    exit with its status (``SystemExit`` as the interpreter would), never returning to the code
    the fork was taken in nor running its clean-ups."""
    code = 1
    try:
        code = body()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - printed to the process's output, exit 1
        import traceback
        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


class ForkedTemplate:
    """The part of ``subprocess.Popen``'s interface ``ForkServer`` uses, for a template forked
    by ``launch(fork=True)``: ``pid``, ``returncode``, ``poll()``, ``wait(timeout)``,
    ``terminate()``, ``kill()``."""

    def __init__(self, pid: int) -> None:
        self.pid, self.returncode = pid, None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:            # reaped elsewhere: gone, status unknown
                self.returncode = -signal.SIGKILL
            else:
                if pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        import select
        import time
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            exited = os.pidfd_open(self.pid)     # readable once it has exited: no polling
        except OSError:
            exited = None
        try:
            while self.poll() is None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise subprocess.TimeoutExpired(f"template {self.pid}", timeout)
                if exited is not None:
                    select.select([exited], [], [], left)
                else:
                    time.sleep(0.01 if left is None else min(0.01, left))
        finally:
            if exited is not None:
                os.close(exited)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)
