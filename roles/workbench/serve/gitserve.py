"""Serving the coordinator host's workspace histories to worker hosts with ``git daemon``.

A loop-agent on a worker host shares no file system with the coordinator host. It fetches the
baseline of its work item from ``<home>/history/<work_id>.git`` here and pushes every checkpoint
back (``roles.workbench.workspace.remote``), over git's own protocol: ``git://<host>:<port>/<work_id>.git``
served by one ``git daemon``; or over ssh:// through sshd's forced command ``org git-shell``
(``roles.workbench.serve.gitshell``), with the same settings and hook (below).

What is served: the repositories below ``history_dir`` and nothing else. ``--base-path`` maps a
request's path below it, the directory argument whitelists it (a path outside is refused), and the
daemon refuses any path with a ``.`` or ``..`` component (``aliased``). ``--strict-paths`` is not
used: with it the whitelist matches whole paths only, so a folder of repositories serves none. A
push to a repository that does not exist is refused by the daemon (``no such repository``): a
worker can never create one; the coordinator's eval-agent creates it with the baseline.

Trust model. Objects are content-addressed: a worker cannot change what a commit id names, only
add objects and move refs, and ``receive.fsckObjects`` refuses malformed objects. The eval-agent
verifies the commit that state.db names, by id, so a ref a worker moves changes nothing it
verifies. The one ref that matters is the baseline, which protected files are restored from
before verifying: the ``pre-receive`` hook this module writes refuses any update to
``refs/loop-org/*`` (the baseline is the coordinator host's alone), any ref outside
``refs/iterations/*``, ``refs/actions/*``, ``refs/discarded/*`` and ``refs/heads/checkpoints``, and
any deletion (histories only grow; ``receive.denyDeletes`` says so too). The hooks directory is
given with ``-c core.hooksPath``, which git passes on to the ``receive-pack`` it starts, so a
repository's own ``hooks/`` is never run. The hook's text and the ``-c`` settings
(``githooks.receive_config``) are written once, in ``roles.workbench.serve.githooks``, and used by this
daemon and by ``org git-shell`` alike.

Over ssh://, a worker's ``git push`` runs ``git receive-pack`` through sshd, which by itself would
run it with none of these settings: the baseline would not be guarded and a repository's own hooks
would run. A worker's key is therefore given the forced command ``org git-shell --home <home>`` in
``~/.ssh/authorized_keys`` (``command="...",restrict``; ``org hosts ssh-line KEYFILE`` prints the
line), which serves ``git-upload-pack`` and ``git-receive-pack`` on a repository directly below
``history_dir`` only, with ``receive_config``, and refuses anything else; the coordinator host
advertises ``[hosts] git_url = "ssh://user@host:port/"`` then (``hosts.git_url``). sshd
authenticates each worker by its key.

Anyone who can reach the daemon's port can fetch any work item's history and push checkpoints to
it: git:// has no authentication, so the supervisor starts the daemon only when org.toml says so
in as many words (``[hosts] git_unauthenticated = true``, for a private network or a tunnel).
Over ssh:// each joined host's key names the host (``org git-shell --host NAME``), which then
reaches only its own work items' histories (``roles.workbench.serve.gitscope``).
"""
from __future__ import annotations

import errno
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import structlog

from roles.workbench.serve.githooks import hooks_dir_for, receive_config, serve_env, write_hooks
from state_db.kernel.errors import OrgError

log = structlog.get_logger("supervisor.gitserve")

START_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 5.0


class GitServeError(OrgError):
    """The git daemon could not be started; ``code`` says why."""

    code = "git_serve_failed"


def _port_free(host: str, port: int) -> bool:
    """Whether ``host:port`` can be bound now (as the daemon binds it, with ``SO_REUSEADDR``)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return False
            raise GitServeError(f"cannot listen on {host}:{port}: {exc.strerror}", code="git_listen_failed",
                                hint="give an address of this host") from None
    return True


def _accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def _dies_with_parent() -> list[str]:
    """The daemon ends with the process that started it (the supervisor), however that one
    ends: ``setpriv --pdeathsig TERM`` arms the parent-death signal before ``git`` runs (its own
    session keeps it out of the supervisor's signals otherwise), and ``git`` ends the
    ``git-daemon`` it runs on TERM. A supervisor killed with -9 left its daemon listening on the
    port, and the next org given that port could not start. Without ``setpriv`` (util-linux) the
    daemon is stopped only by ``stop()``."""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "TERM", "--"] if setpriv else []


class GitServer:
    """One ``git daemon`` serving ``history_dir`` at ``git://<host>:<port>/<work_id>.git``.

    Args:
        history_dir: the folder of the workspace histories (``<home>/history``).
        host: the address to listen on (an address of this host, never 0.0.0.0 on an open network).
        port: the TCP port (git's own is 9418).
    """

    def __init__(self, history_dir: Path, host: str, port: int) -> None:
        self.history_dir = Path(history_dir).absolute()
        self.host = host
        self.port = int(port)
        self.hooks_dir = hooks_dir_for(self.history_dir)
        self.log_path = self.history_dir.parent / "logs" / "git-daemon.log"
        self._proc: subprocess.Popen | None = None

    def url(self, work_id: str) -> str:
        """The URL a worker host fetches and pushes the history of ``work_id`` at."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"git://{host}:{self.port}/{work_id}.git"

    def command(self) -> list[str]:
        """The daemon's command line."""
        return ["git", *receive_config(self.hooks_dir),
                "daemon", "--reuseaddr", "--export-all", "--enable=receive-pack",
                f"--base-path={self.history_dir}", f"--listen={self.host}", f"--port={self.port}",
                "--informative-errors", "--init-timeout=10", "--timeout=300",
                "--log-destination=stderr", str(self.history_dir)]

    def _env(self) -> dict[str, str]:
        """No user or system git configuration, no inherited ``GIT_*`` setting; the hook is told
        that nobody is known (``daemon``): the ref rules hold, no host scope can."""
        from roles.workbench.serve.githooks import SCOPE_ENV
        return {**serve_env(), SCOPE_ENV: "daemon"}

    def start(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Start the daemon; return once its port accepts connections.

        Raises:
            GitServeError(code="git_port_taken"): something else listens on the port.
            GitServeError(code="git_missing"): no ``git`` executable.
            GitServeError(code="git_serve_failed"): the daemon exited or did not listen in time.
        """
        if self.alive():
            return
        if not _port_free(self.host, self.port):
            raise GitServeError(f"port {self.host}:{self.port} is taken by another process",
                                code="git_port_taken",
                                hint="stop what listens there or configure another port for the git server")
        self.history_dir.mkdir(parents=True, exist_ok=True)
        write_hooks(self.hooks_dir)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as out:
            try:
                self._proc = subprocess.Popen([*_dies_with_parent(), *self.command()], stdin=subprocess.DEVNULL,
                                              stdout=out, stderr=out, env=self._env(), start_new_session=True)
            except FileNotFoundError:
                raise GitServeError("git is not installed", code="git_missing",
                                    hint="install git on the coordinator host") from None
        self._wait_listening(timeout_s)
        log.info("git_server_started", url=self.url("<work_id>"), pid=self._proc.pid,
                 history=str(self.history_dir))

    def _wait_listening(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                break
            if _accepts(self.host, self.port):
                time.sleep(0.05)   # a daemon that lost the port race exits at once
                if self._proc.poll() is None:
                    return
                break
            time.sleep(0.02)
        code = self._proc.poll()
        self.stop()
        why = self._last_log_line() or (f"exit status {code}" if code is not None else "no answer")
        taken = "already in use" in why or "unable to allocate" in why
        raise GitServeError(
            f"git daemon on {self.host}:{self.port} did not start: {why}",
            code="git_port_taken" if taken else "git_serve_failed",
            hint=("stop what listens there or configure another port for the git server" if taken
                  else f"see {self.log_path}"))

    def _last_log_line(self) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
            lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        except OSError:
            return ""
        return lines[-1] if lines else ""

    def alive(self) -> bool:
        """Whether the daemon this object started is running."""
        return self._proc is not None and self._proc.poll() is None

    def stop(self) -> None:
        """Stop the daemon and the connections it is serving: SIGTERM to its process group, then
        SIGKILL if it has not exited within ``STOP_TIMEOUT_S``. Idempotent."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if proc.poll() is not None:
                break       # reaped: its id may be another process's by now, never signal it
            try:
                os.killpg(proc.pid, sig)   # its own session: the daemon and its children only
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout=STOP_TIMEOUT_S)
                break
            except subprocess.TimeoutExpired:
                continue
        log.info("git_server_stopped", pid=proc.pid, returncode=proc.returncode)
