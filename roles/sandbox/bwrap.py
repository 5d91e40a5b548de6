"""Agent commands under bubblewrap.

The sandbox: a new user namespace with uid/gid 65534 and no capabilities; new pid, ipc, uts,
cgroup and (unless lifted) network namespaces; the host file system read-only (``--ro-bind / /``);
``/proc`` of the sandbox only, a minimal ``/dev``, a private ``/tmp``; hidden paths (the org home,
the real home, ``/run``) covered by empty read-only tmpfs; the workspace — and any other writable
path the caller names — bound back writable, even inside a hidden path; a clean environment;
rlimits and a process limit (``limits``); killed with its parent (``--die-with-parent``) and,
on timeout, as a whole (killing bubblewrap tears down the pid namespace).

Running as root, uid 65534 inside still maps to host uid 0: files owned by root look owned by the
sandbox, so what keeps them safe is that they are read-only or hidden, not their mode bits. That
is why the real home, ``/run`` (root-owned sockets) and every file or folder only root's user or
group may read (``/etc/shadow``, private keys: ``mode.root_private_paths``) are hidden by default.
"""
from __future__ import annotations

import json
import math
import os
import shlex
import shutil
from pathlib import Path
from typing import Callable, Mapping, Sequence

import structlog

from roles.sandbox.capture import Captured, run_bounded
from roles.sandbox.environment import SANDBOX_HOME, clean_env
from roles.sandbox.errors import SandboxConfigError, SandboxFailed, SandboxUnavailable
from roles.sandbox.limits import Limits, PidsCgroup, inner_prefix, outer_prefix, preexec_rlimits, process_limit_kind

log = structlog.get_logger("sandbox")

SANDBOX_UID = 65534
SANDBOX_GID = 65534
_UNHIDEABLE = frozenset({"/", "/proc", "/dev", "/tmp"})
_FIX = ("check that unprivileged user namespaces are enabled (sysctl user.max_user_namespaces > 0; "
        "kernel.unprivileged_userns_clone = 1 on Debian kernels; on Ubuntu 24.04 AppArmor's "
        "kernel.apparmor_restrict_unprivileged_userns = 0 or a bwrap profile), or — at your own risk — "
        "set sandbox.mode = \"unsandboxed\" with sandbox.allow_unsandboxed = true in org.toml")
_BACKSTOP_GRACE_S = 10
_probed: dict[str, str | None] = {}


def bubblewrap() -> str | None:
    """Path of the bwrap executable, or None."""
    return shutil.which("bwrap")


def namespace_args(*, network: bool, uid: int = SANDBOX_UID, gid: int = SANDBOX_GID) -> list[str]:
    args = ["--unshare-user", "--uid", str(uid), "--gid", str(gid), "--unshare-pid", "--unshare-ipc",
            "--unshare-uts", "--unshare-cgroup-try"]
    if not network:
        args.append("--unshare-net")
    return args + ["--die-with-parent", "--new-session", "--cap-drop", "ALL"]


def mount_args(workspace: Path, *, writable: Sequence[Path] = (), readonly: Sequence[Path] = (),
               hide: Sequence[Path] = (), home: str = SANDBOX_HOME) -> list[str]:
    """bwrap arguments building the file-system view.

    Parents are mounted before children (sorted by depth), so a workspace inside a hidden org
    home, or an org home inside a read-only project, both come out right.
    Errors: ``SandboxConfigError`` for a relative or missing workspace/bind source.
    """
    entries: dict[str, int] = {}  # path -> 0 hide, 1 read-only bind, 2 writable bind
    for p in hide:
        real = os.path.realpath(p)
        if real in _UNHIDEABLE:
            raise SandboxConfigError(f"{real} cannot be hidden; hide a folder below it")
        if os.path.exists(real):
            entries.setdefault(real, 0)
    for kind, paths in ((1, readonly), (2, [workspace, *writable])):
        for p in paths:
            if not os.path.isabs(p):
                raise SandboxConfigError(f"sandbox path {str(p)!r} must be absolute")
            real = os.path.realpath(p)
            if not os.path.exists(real):
                raise SandboxConfigError(f"sandbox path {real} does not exist; create it or drop it from the binds")
            entries[real] = max(entries.get(real, 0), kind)
    args = ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp", "--dir", home]
    folders = set()
    for path, kind in sorted(entries.items(), key=lambda e: (len(Path(e[0]).parts), e[1], e[0])):
        if kind == 0 and not os.path.isdir(path):
            args += ["--ro-bind", "/dev/null", path]      # a hidden file reads as empty
            continue
        folders.add(path)
        args += (["--tmpfs", path], ["--ro-bind", path, path], ["--bind", path, path])[kind]
    # empty *and* read-only: writes to a hidden place must fail, not vanish into a tmpfs
    for path, kind in entries.items():
        if kind == 0 and path in folders:
            args += ["--remount-ro", path]
    return args


def probe(bwrap: str) -> str | None:
    """None when bubblewrap can build a sandbox here, else its error message. Cached."""
    if bwrap not in _probed:
        argv = [bwrap, *namespace_args(network=False), "--ro-bind", "/", "/", "--proc", "/proc",
                "--dev", "/dev", "true"]
        try:
            got = run_bounded(argv, cwd="/", env=clean_env(), timeout_s=10.0, max_output=4000)
            ok = got.exit_code == 0
            _probed[bwrap] = None if ok else (got.output.strip() or f"bwrap exited with {got.exit_code}")
        except OSError as exc:
            _probed[bwrap] = f"cannot execute {bwrap}: {exc.strerror or exc}"
    return _probed[bwrap]


class BwrapRunner:
    """Runs commands in one workspace's sandbox; implements the loop-agent's ``CommandRunner``.

    Params: ``workspace`` (writable; None: each call's ``cwd`` is the workspace — what
    ``WorkspaceTools`` passes); ``writable`` more writable paths; ``readonly_binds`` paths
    shown read-only even inside a hidden path; ``hide`` paths covered by an empty read-only
    tmpfs; ``limits``; ``network`` lifts the network block; ``env`` extra variables on top of
    the clean environment; ``bwrap`` the executable (default: found on PATH).
    Errors (from ``run``/``execute``): ``SandboxUnavailable`` (no bwrap), ``SandboxFailed``
    (bwrap cannot build the sandbox), ``SandboxConfigError`` (bad paths).
    """

    kind = "bubblewrap"

    def __init__(self, workspace: Path | None, *, writable: Sequence[Path] = (), readonly_binds: Sequence[Path] = (),
                 hide: Sequence[Path] = (), limits: Limits | None = None, network: bool = False,
                 env: Mapping[str, str] | None = None, bwrap: str | None = None) -> None:
        self.workspace = Path(workspace) if workspace is not None else None
        self.writable = tuple(Path(p) for p in writable)
        self.readonly_binds = tuple(Path(p) for p in readonly_binds)
        self.hide = tuple(Path(p) for p in hide)
        self.limits = limits or Limits()
        self.network = network
        self.env = dict(env or {})
        self.bwrap = bwrap

    def describe(self) -> str:
        return (f"bubblewrap at {self.bwrap or bubblewrap()} (uid {SANDBOX_UID}, "
                f"{'network allowed' if self.network else 'no network'}, process limit: {process_limit_kind()})")

    def run(self, command: Sequence[str] | str, cwd: Path, timeout_s: float, max_output_bytes: int) -> Captured:
        """``CommandRunner.run``: stdout and stderr combined, head and tail kept."""
        return self.execute(command, cwd=cwd, timeout_s=timeout_s, max_output=max_output_bytes)

    def execute(self, command: Sequence[str] | str, *, timeout_s: float, cwd: Path | None = None,
                max_output: int | None = None, stdin: bytes | None = None, env: Mapping[str, str] | None = None,
                writable: Sequence[Path] = (), readonly_binds: Sequence[Path] = (),
                separate_stderr: bool = False, limits: Limits | None = None,
                should_stop: Callable[[], bool] | None = None, poll_s: float = 1.0) -> Captured:
        """Run ``command`` (argv, or a shell line when a str) in the sandbox.

        Params: ``cwd`` (default: the workspace) must be visible inside; ``env`` adds variables
        for this call; ``writable``/``readonly_binds`` add binds for this call; ``limits``
        replaces the runner's for this call; ``should_stop`` is polled every ``poll_s`` seconds
        while the command runs and a True kills it (``Captured.stopped``).
        Returns: ``Captured`` (exit code 128+N when the command died of signal N; 127 with
        bubblewrap's message when the command cannot be executed).
        """
        bwrap = self.bwrap or bubblewrap()
        if bwrap is None:
            raise SandboxUnavailable("bubblewrap (bwrap) is not installed, so agent commands are refused; "
                                     "install the 'bubblewrap' package")
        problem = probe(bwrap)
        if problem is not None:
            raise SandboxFailed(f"bubblewrap cannot build a sandbox here: {problem}; {_FIX}")
        argv = ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)
        workspace = self.workspace or cwd
        if workspace is None:
            raise SandboxConfigError("a sandbox without a workspace needs the cwd of each command")
        workdir = os.path.realpath(cwd or workspace)
        mounts = mount_args(Path(workspace), writable=[*self.writable, *writable],
                            readonly=[*self.readonly_binds, *readonly_binds], hide=self.hide)
        limits = limits or self.limits
        cgroup = PidsCgroup.create(limits)
        status_r, status_w = os.pipe()
        alive_r, alive_w = os.pipe()  # only this process holds alive_w: EOF inside means we died
        try:
            full = [*_outer_stage(alive_r, cgroup), *outer_prefix(limits), bwrap,
                    *namespace_args(network=self.network), *mounts, "--chdir", workdir,
                    "--json-status-fd", str(status_w), "--", *_watch_parent(alive_r), *inner_prefix(limits),
                    *_backstop(timeout_s), *argv]
            got = run_bounded(full, cwd="/", env=clean_env({**self.env, **(env or {})}), timeout_s=timeout_s,
                              max_output=max_output or limits.max_output, stdin=stdin,
                              separate_stderr=separate_stderr, pass_fds=(status_w, alive_r),
                              preexec=preexec_rlimits(limits), should_stop=should_stop, poll_s=poll_s,
                              on_timeout=cgroup.kill_all if cgroup else None)
            os.close(status_w)
            status_w = -1
            started = _command_started(status_r)
        finally:
            if status_w >= 0:
                os.close(status_w)
            for fd in (status_r, alive_r, alive_w):
                os.close(fd)
            if cgroup is not None:
                cgroup.close()
        if not started and not (got.timed_out or got.stopped):
            return _setup_failure(got)
        return got


def _outer_stage(alive_fd: int, cgroup: PidsCgroup | None) -> list[str]:
    """The first process of a run: a shell armed with the parent-death signal at its first exec
    (bubblewrap arms --die-with-parent only after its own start-up). It starts a watcher, joins
    the run's pids cgroup (the watcher stays outside it), runs the rest, then stops the watcher
    and exits with the rest's status: it reaps both, so a finished run leaves no process behind.

    Once ``alive_fd`` reads EOF while the run goes on (this process died), the watcher kills
    the group and the run's process group. That catches what no parent-death signal does: a
    sandbox child still starting when its bubblewrap died blocks forever on an eventfd, before
    the in-sandbox watcher exists."""
    setpriv = shutil.which("setpriv")
    kill = f"echo 1 > {shlex.quote(str(cgroup.kill_file))}; " if cgroup else ""
    join = f"echo $$ > {shlex.quote(str(cgroup.procs))} || {{ kill $w; exit 126; }}; " if cgroup else ""
    script = (f"{{ read _ </proc/self/fd/{alive_fd}; {kill}kill -KILL -$$; }} </dev/null >/dev/null 2>&1 & "
              f"w=$!; {join}\"$@\"; s=$?; kill $w 2>/dev/null; wait $w 2>/dev/null; exit $s")
    return [*([setpriv, "--pdeathsig", "KILL", "--"] if setpriv else []), "/bin/sh", "-c", script, "sh"]


def _watch_parent(fd: int) -> list[str]:
    """A watcher inside the sandbox that kills every process in it once ``fd`` (a pipe whose only
    write end this process holds) reads EOF. bubblewrap's own --die-with-parent leaves a gap: a
    parent killed between bubblewrap's clone and its child arming the signal left that child (the
    sandbox's pid 1, which waits for all its descendants) running the command as an orphan. The
    watcher starts after that gap, and a parent already gone means an immediate EOF. (The
    command inherits the read end too, which can only ever read EOF; ``/bin/sh`` may not handle
    two-digit descriptors, hence the path.)"""
    script = f"{{ read _ </proc/self/fd/{fd}; kill -KILL -1; }} </dev/null >/dev/null 2>&1 & exec \"$@\""
    return ["/bin/sh", "-c", script, "sh"]


def _backstop(timeout_s: float) -> list[str]:
    """A second clock inside the sandbox: should it ever outlive its parent (a parent killed in
    the instant before the parent-death signal is armed), it still ends."""
    binary = shutil.which("timeout")
    return [binary, "-s", "KILL", str(math.ceil(timeout_s) + _BACKSTOP_GRACE_S)] if binary else []


def _command_started(fd: int) -> bool:
    """True when bubblewrap reported the command's exit (it ran). Reads what is buffered only:
    a sandboxed process may still hold a copy of the pipe's write end."""
    os.set_blocking(fd, False)
    data = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            break
        if not chunk:
            break
        data += chunk
    for line in data.decode("utf-8", "replace").splitlines():
        try:
            if "exit-code" in json.loads(line):
                return True
        except (ValueError, TypeError):
            continue
    return False


def _setup_failure(got: Captured) -> Captured:
    text = "\n".join(ln for ln in (got.output + "\n" + got.stderr).splitlines() if ln.startswith("bwrap:"))
    if "execvp" in text:  # the command itself does not exist: the caller's problem, shown like a shell would
        return Captured(127, text + "\n", "", False, False, got.duration_s)
    log.error("sandbox setup failed", message=text or got.output[-500:], exit_code=got.exit_code)
    raise SandboxFailed(f"bubblewrap could not set up the sandbox: {text or got.output.strip()[-500:]}; "
                        "check the paths bound into it, or " + _FIX)


def run_sandboxed(command: Sequence[str] | str, *, workspace: Path, timeout_s: float,
                  writable: Sequence[Path] = (), readonly_binds: Sequence[Path] = (),
                  env: Mapping[str, str] | None = None, cpu_s: int | None = 300, memory_mb: int | None = 2048,
                  max_procs: int | None = 256, max_output: int = 1_000_000, network: bool = False,
                  hide: Sequence[Path] = (), cwd: Path | None = None, stdin: bytes | None = None,
                  separate_stderr: bool = False, bwrap: str | None = None) -> Captured:
    """Run one command in a sandbox built for it; see ``BwrapRunner`` for the parameters and errors.

    The project's code and the running Python stay visible read-only (as with
    ``runner_from_config``), even when they live under the sandbox's private ``/tmp``."""
    from roles.sandbox.mode import default_visible
    readonly_binds = (*default_visible(), *readonly_binds)
    runner = BwrapRunner(workspace, writable=writable, readonly_binds=readonly_binds, hide=hide,
                         limits=Limits(cpu_s, memory_mb, max_procs, max_output), network=network,
                         env=env, bwrap=bwrap)
    return runner.execute(command, timeout_s=timeout_s, cwd=cwd, stdin=stdin, separate_stderr=separate_stderr)
