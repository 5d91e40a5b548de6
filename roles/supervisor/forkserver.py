"""Role processes forked from a pre-imported template (a fork server).

Started with ``exec`` every role process imports the same code on its own — the runtime,
ZeroMQ, structlog, pygit2 and, in a loop-agent, the model SDK (about 2 s of CPU) — and keeps its
own copy of every page of it. The template imports it once, in the two stages
``roles.supervisor.template`` lists; each role is then a ``fork()`` of it, and the imported code's
pages stay shared between the roles (copy-on-write; ``gc.freeze()`` keeps the collector from
touching them), which ``bench/scale.py`` measures as proportional set size per role. The
template is the supervisor itself, forked once it has imported what both need
(``template.COMMON``, ``template.launch(fork=True)``); then the template imports the rest of the
first stage while the supervisor opens the org, side by side on two cores. A role forked before
the second stage imports what it lacks itself, and the second stage waits until those roles are
ready (``serve``). A template that dies is started again as an interpreter of its own.

Protocol, over a socketpair, one JSON object per line:

- supervisor → template: ``{"spawn": module, "argv": [...], "env": {...}, "out": path}``, one
  line per role, many sent at once (``ForkServer.spawn_many``);
- template → supervisor: ``{"pid": N, "warm": bool}`` or ``{"error": "..."}`` in answer, in the
  order asked, ``{"warm": true}`` once the second stage is in, and
  ``{"exit": N, "code": C}`` whenever a forked role ends (``C`` as ``Popen.returncode``: the
  exit status, or minus the signal number).

The template is single-threaded (a fork of a threaded process may inherit a held lock), dies with
the supervisor (``PR_SET_PDEATHSIG``), and each role dies with the template the same way, so no
role outlives the supervisor. A template that dies takes its roles with it; the supervisor
restarts them as crashed roles, through a new template. ``[supervisor] spawn = "exec"`` in
org.toml starts every role as its own interpreter instead, as before.
"""
from __future__ import annotations

import gc
import importlib
import os
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import orjson

from roles.base import readiness
from roles.supervisor.template import HEAVY, LIGHT, PRELOAD, launch, pdeathsig, run_and_exit, subreaper
from state_db.kernel.errors import OrgError

__all__ = ["ForkServer", "ForkServerError", "ForkedRole", "HEAVY", "LIGHT", "PRELOAD", "build_validators", "serve"]

IDLE_BEFORE_HEAVY_S = 0.2      # nothing asked or said for this long: the start-up burst is over
READY_WAIT_MAX_S = 10.0        # the longest the heavy stage waits for the roles forked cold to be ready


class ForkServerError(OrgError):
    """The template could not be started or did not answer (the supervisor then starts the role
    as its own interpreter)."""

    code = "fork_server"
    hint = "roles are started as their own interpreters instead; see logs/supervisor.log"


class ForkedRole:
    """A role forked by the template, with the part of ``subprocess.Popen``'s interface the
    supervisor uses: ``pid``, ``returncode``, ``poll()``, ``wait(timeout)``."""

    def __init__(self, server: "ForkServer", pid: int, warm: bool) -> None:
        self.server, self.pid, self.returncode = server, pid, None
        self.warm = warm            # forked after the heavy stage: the model SDK is already in

    def poll(self) -> int | None:
        if self.returncode is None:
            self.server.pump(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(f"role {self.pid}", timeout)
            self.server.pump(0.05 if left is None else min(0.05, left))
        return self.returncode


class ForkServer:
    """The supervisor's side: starts the template, asks it for roles, collects their exits."""

    def __init__(self, python: str = sys.executable, preload: tuple[str, ...] = PRELOAD,
                 pidfile: Path | None = None) -> None:
        self.python, self.preload, self.pidfile = python, preload, pidfile
        self.proc: subprocess.Popen | None = None
        self.sock: socket.socket | None = None
        self._buf = b""
        self._roles: dict[int, ForkedRole] = {}
        self._orphans: list[ForkedRole] = []
        self._answers: list = []           # a ForkedRole per fork, or the error said instead
        self.warm = False           # the template has imported the heavy stage

    # -- the template process ------------------------------------------------------------
    def start(self) -> None:
        self.adopt(*launch(self.python, self.preload))

    def adopt(self, proc: subprocess.Popen, sock: socket.socket) -> None:
        """Take over a template ``template.launch`` started (the supervisor starts it before it
        imports anything else)."""
        self.proc, self.sock, self._buf, self.warm = proc, sock, b"", False
        # the roles of a template that died end with it, but their exits went to init, not here:
        # each is marked ended once it is gone (``pump``), whatever the new template says
        self._orphans += [r for r in self._roles.values() if r.returncode is None]
        self._roles = {}
        self._write_pidfile()

    def started(self) -> bool:
        return self.proc is not None

    def record_pid(self, pidfile: Path) -> None:
        """Name the pid file (a template started before the org's lock was taken writes it now)."""
        self.pidfile = pidfile
        if self.alive():
            self._write_pidfile()

    def _write_pidfile(self) -> None:
        if self.pidfile is not None:
            from roles.supervisor import procs
            procs.write_pidfile(self.pidfile, self.proc.pid)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def spawn(self, module: str, argv: list[str], env: dict[str, str], out: Path) -> ForkedRole:
        """Fork a role running ``python -m module argv...`` with ``env``, output to ``out``."""
        role = self.spawn_many([(module, argv, env, out)])[0]
        if isinstance(role, ForkServerError):
            raise role
        return role

    def spawn_many(self, requests: list[tuple[str, list[str], dict[str, str], Path]]) -> list:
        """Fork one role per ``(module, argv, env, out)``, the requests sent together, so the
        template forks them back to back instead of one per round trip (the org's start-up).

        Returns, in order, a ``ForkedRole`` or the ``ForkServerError`` of a fork that failed.
        Raises ForkServerError when the template is gone or does not answer."""
        if not self.alive():
            self._lost()
            self.start()
        try:
            self.sock.sendall(b"".join(orjson.dumps({"spawn": module, "argv": argv, "env": env, "out": str(out)})
                                       + b"\n" for module, argv, env, out in requests))
        except OSError as exc:
            raise ForkServerError(f"the fork server is gone: {exc}") from exc
        deadline = time.monotonic() + 30
        while len(self._answers) < len(requests):
            if time.monotonic() > deadline or not self.alive():
                raise ForkServerError("the fork server did not answer a spawn request")
            self.pump(0.05)
        answers, self._answers = self._answers[:len(requests)], self._answers[len(requests):]
        return [a if isinstance(a, ForkedRole) else ForkServerError(f"the fork server could not fork: {a.get('error')}")
                for a in answers]

    def pump(self, timeout: float) -> None:
        """Read what the template said (answers and exits), waiting up to ``timeout`` seconds."""
        if self._orphans:
            for role in self._orphans:
                if _gone(role.pid):
                    role.returncode = -signal.SIGKILL
            self._orphans = [r for r in self._orphans if r.returncode is None]
        if self.sock is None:
            self._lost()                            # roles of a dead template: ended when gone
            return
        ready, _, _ = select.select([self.sock], [], [], timeout)
        if ready:
            try:
                data = self.sock.recv(65536)
            except OSError:
                data = b""
            if not data:
                self._lost()
                return
            self._buf += data
            while b"\n" in self._buf:
                line, self._buf = self._buf.split(b"\n", 1)
                msg = orjson.loads(line)
                if "exit" in msg:
                    role = self._roles.pop(msg["exit"], None)
                    if role is not None:
                        role.returncode = msg["code"]
                elif "warm" in msg and "pid" not in msg:
                    self.warm = True
                elif "pid" in msg:
                    # known from its answer on: its exit may come in the same read, before the
                    # spawn that asked for it has looked at its answers
                    role = ForkedRole(self, msg["pid"], bool(msg.get("warm")))
                    self._roles[role.pid] = role
                    self._answers.append(role)
                else:
                    self._answers.append(msg)
        elif not self.alive():
            self._lost()

    def _lost(self) -> None:
        """The template died: its roles died with it (they were its children); say so."""
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        for role in self._roles.values():
            if role.returncode is None and _gone(role.pid):
                role.returncode = -signal.SIGKILL   # its status went to init with the template
        self._roles = {pid: r for pid, r in self._roles.items() if r.returncode is None}

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        if self.pidfile is not None:
            self.pidfile.unlink(missing_ok=True)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return Path(f"/proc/{pid}/status").exists() and "State:\tZ" in Path(f"/proc/{pid}/status").read_text()


# -- the template ---------------------------------------------------------------------------------

def _child(sock: socket.socket, wake_r: int, wake_w: int, req: dict, said: int | None = None,
           others: list = ()) -> None:
    """In the forked child: become the role, then exit with its status (never returns).
    ``said``: the pipe it closes once ready (``readiness.tell_template``); ``others``: the
    template's ends of the other roles' pipes, closed here."""
    def become() -> int:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        sock.close()
        os.close(wake_r)
        os.close(wake_w)
        for end in others:
            if end is not None:
                os.close(end)
        pdeathsig(signal.SIGTERM)
        if os.getppid() == 1:                       # the template died while forking
            return 1
        null = os.open(os.devnull, os.O_RDONLY)
        out = os.open(req["out"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(null)
        os.close(out)
        os.environ.clear()
        os.environ.update(req["env"])
        readiness.template_pipe = said
        # the template's objects stay frozen in the role: the collector never walks them (a full
        # collection over ~190,000 inherited objects takes 100-175 ms and writes to every page
        # they sit on, unsharing it); what the role itself makes is collected as usual
        import runpy
        sys.argv = [req["spawn"], *req["argv"]]
        runpy.run_module(req["spawn"], run_name="__main__", alter_sys=True)
        return 0

    run_and_exit(become)


def _load(names, *, collect: bool = True) -> None:
    """Import ``names`` and freeze what is now alive (imported objects stay on shared pages).

    ``collect``: a full collection first, so garbage is not frozen with them. The light stage
    goes without: it finds nothing to free there (imports make next to no cyclic garbage), and
    walking every object takes 15-20 ms of the start-up's longest step, before the first fork."""
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - the role that needs it reports it
            pass
    build_validators()
    if collect:
        gc.collect()
    gc.freeze()


def _warm_sandbox() -> None:
    """What every sandboxed command needs and a process keeps once made (``sandbox.mode.warm``),
    made here once for every role forked warm, not once in each on its first command."""
    mode = sys.modules.get("roles.workbench.sandbox.mode")
    if mode is not None:
        mode.warm()


def build_validators() -> None:
    """Build org.toml's validators once, before the forks (in the supervisor, before it forks the
    template, and in a template started as its own interpreter). pydantic builds them when a
    configuration is first validated (``defer_build``), ~25-50 ms of CPU, and the supervisor and
    every role validate their org.toml first thing: built before the fork, none builds its own
    copy. Once built, this costs nothing."""
    if "state_db.kernel.config" not in sys.modules:
        return
    try:
        from state_db.kernel.config import Config, defaults
        Config(defaults())
    except Exception:  # noqa: BLE001 - a role that cannot validate its configuration says so itself
        pass


def serve(fd: int, preload: list[str]) -> int:
    sock = socket.socket(fileno=fd)
    light, heavy = (preload[:preload.index("--")], preload[preload.index("--") + 1:]) if "--" in preload \
        else (preload, [])
    _load(light, collect=False)
    warm = not heavy
    # Every sandboxed command leaves an orphan: bubblewrap returns as soon as the sandbox's first
    # process reports the command's status, before that process has exited. Given to the
    # machine's init, it stays a zombie wherever init does not reap (a container whose first
    # process is not an init: one per command, until no process can start), and its CPU, with
    # every command it reaped inside, is counted nowhere in the org. The template adopts them,
    # reaps them, and tells the supervisor only of its own children's exits.
    subreaper()
    forked: set[int] = set()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    buf = b""
    # The heavy stage (~2 s of CPU) waits until the roles forked before it are ready, not only
    # for a pause in the requests: on a busy host a role takes longer than the pause to start,
    # and the heavy stage would take the CPU it needs. Each role forked cold is given the write
    # end of a pipe of its own and closes it once its ready row is written (``readiness.
    # tell_template``); its exit closes it too. The template watches the read ends: all of them at
    # their end, and the pause, and it imports the heavy stage (``READY_WAIT_MAX_S`` at the most:
    # a module run here need not be a role that says so).
    # (poll, not select: an org of many roles holds more descriptors than select's 1,024)
    starting: dict[int, float] = {}                 # read end -> when its role was forked
    poller = select.poll()
    for fd_ in (sock.fileno(), wake_r):
        poller.register(fd_, select.POLLIN)
    while True:
        if warm:
            timeout = None
        elif starting:
            timeout = max(0.0, min(starting.values()) + READY_WAIT_MAX_S - time.monotonic())
        else:
            timeout = IDLE_BEFORE_HEAVY_S
        try:
            ready = [fd_ for fd_, _ in poller.poll(None if timeout is None else timeout * 1000)]
        except InterruptedError:
            ready = []
        for r in [r for r in ready if r in starting]:
            poller.unregister(r)
            os.close(r)                             # its role is ready, or gone
            del starting[r]
        if not ready and not warm:                  # the start-up is over: the heavy stage
            for r in starting:
                poller.unregister(r)
                os.close(r)
            starting.clear()
            _load(heavy)
            _warm_sandbox()
            warm = True
            sock.sendall(orjson.dumps({"warm": True}) + b"\n")
            continue
        if wake_r in ready:
            os.read(wake_r, 4096)
        _reap(sock, forked)
        if sock.fileno() in ready:
            data = sock.recv(65536)
            if not data:                            # the supervisor closed it: stop
                return 0
            buf += data
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                req = orjson.loads(line)
                said_r, said_w = os.pipe() if not warm else (None, None)     # both close on exec
                try:
                    pid = os.fork()
                except OSError as exc:
                    for end in (said_r, said_w):
                        if end is not None:
                            os.close(end)
                    sock.sendall(orjson.dumps({"error": str(exc)}) + b"\n")
                    continue
                if pid == 0:
                    _child(sock, wake_r, wake_w, req, said_w, [*starting, said_r])
                if said_w is not None:
                    os.close(said_w)
                    starting[said_r] = time.monotonic()
                    poller.register(said_r, select.POLLIN)
                forked.add(pid)
                sock.sendall(orjson.dumps({"pid": pid, "warm": warm}) + b"\n")


def _reap(sock: socket.socket, forked: set[int]) -> None:
    """Reap every exited child: the roles this template forked (their exits are reported) and
    the orphans it adopted (not)."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if pid not in forked:
            continue
        forked.discard(pid)
        sock.sendall(orjson.dumps({"exit": pid, "code": os.waitstatus_to_exitcode(status)}) + b"\n")


if __name__ == "__main__":
    sys.exit(serve(int(sys.argv[1]), sys.argv[2:]))
