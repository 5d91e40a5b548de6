"""Agent commands under bubblewrap.

The sandbox: a new user namespace with uid/gid 65534 and no capabilities; new pid, ipc, uts,
cgroup and (unless lifted) network namespaces; an allow-listed view of the host, read-only
(``view``: system folders, the submitter's toolchains, the org's code, org.toml's binds; every
org home and the deny-list hidden inside them; the rest absent); ``/proc`` of the sandbox only,
a minimal ``/dev``, a private, size-capped ``/tmp``; the workspace — and any other writable path
the caller names — bound writable at its own path (or where ``present_at`` says); a clean
environment; a system-call filter (``seccomp``); rlimits, a process limit and a disk quota
(``limits``); killed with its parent (``--die-with-parent``) and, on timeout, as a whole
(killing bubblewrap tears down the pid namespace). bubblewrap reads its options from a
descriptor (``--args``), so pid 1's command line inside names no host path. The processes around
it (the caller's death watched outside and inside, the pids cgroup joined, the rlimits, the
backstop) are one compiled program each side where it is built (``stage.py``), else shell stages.

Running as root, uid 65534 inside still maps to host uid 0: files owned by root look owned by the
sandbox, so what keeps them safe is that they are absent, hidden or read-only, not their mode
bits. That is why the view is an allow-list, and why inside it every file or folder only root's
user or group may read (``/etc/shadow``, private keys: ``mode.root_private_paths``) is hidden.
"""
from __future__ import annotations

import json
import math
import os
import shlex
from pathlib import Path
from typing import Callable, Mapping, Sequence

import structlog

from roles.workbench.sandbox.capture import Captured, run_bounded
from roles.workbench.sandbox.environment import SANDBOX_HOME, clean_env
from roles.workbench.sandbox.errors import SandboxConfigError, SandboxFailed, SandboxUnavailable
from roles.workbench.sandbox import stage
from roles.workbench.sandbox.limits import (SHELL_OWN_PROCS, STAGED_OWN_PROCS, Limits, PidsCgroup, inner_prefix, outer_prefix,
                                            over_quota, preexec_rlimits, process_limit_kind, rlimits, which)
from roles.workbench.sandbox.seccomp import memfd, program
from roles.workbench.sandbox.toolchains import SYSTEM, Exposure, Toolchain
from roles.workbench.sandbox.view import View, build

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
    return which("bwrap")


def namespace_args(*, network: bool, uid: int = SANDBOX_UID, gid: int = SANDBOX_GID) -> list[str]:
    args = ["--unshare-user", "--uid", str(uid), "--gid", str(gid), "--unshare-pid", "--unshare-ipc",
            "--unshare-uts", "--unshare-cgroup-try"]
    if not network:
        args.append("--unshare-net")
    return args + ["--die-with-parent", "--new-session", "--cap-drop", "ALL"]


def mount_args(view: View, workspace: Path, *, inside: Path | None = None, writable: Sequence[Path] = (),
               hide: Sequence[Path] = (), home: str = SANDBOX_HOME, tmp_mb: int | None = None,
               binds: Sequence[tuple[Path, Path]] = ()) -> list[str]:
    """bwrap arguments building the file-system view: nothing but what ``view`` shows.

    ``workspace`` is bound writable at ``inside`` (default: its own path); ``writable`` more
    writable paths; ``binds`` more (host path, path inside) writable binds (a runner's report
    file, presented in the private ``/tmp``); ``hide`` more paths covered (only where something
    shown would reveal them);
    ``tmp_mb`` caps the private ``/tmp``. Parents are mounted before children (sorted by depth),
    so a workspace inside a hidden org home, or an org home inside a shown folder, both come out
    right; the root itself is an empty read-only tmpfs.
    Errors: ``SandboxConfigError`` for a relative or missing workspace/bind source.
    """
    entries: dict[str, tuple[int, str]] = {}  # destination -> (0 hide | 1 read-only | 2 writable, source)
    shown = [e.path for e in view.readonly]
    binds = [(workspace, inside or workspace), *((p, p) for p in writable), *binds]
    # a hidden place matters where something shown would reveal it, or around a writable bind
    # (a workspace inside the org home): there it is an empty, read-only folder
    around = [os.path.normpath(dest) for _, dest in binds]
    # what the view hides inside a writable bind (a host socket, an org home) is covered too,
    # where that bind is the folder itself at its own path (elsewhere, as a snapshot presented
    # at the workspace's path, it is not there)
    own_place = [os.path.realpath(src) for src, dest in binds if os.path.realpath(src) == os.path.normpath(dest)]
    in_view = {e.path for e in view.hidden}
    for p in [*(Path(e.path) for e in view.hidden), *hide]:
        real = os.path.realpath(p)
        if real in _UNHIDEABLE:
            raise SandboxConfigError(f"{real} cannot be hidden; hide a folder below it")
        if real in own_place:
            continue                      # the writable folder itself is shown, not hidden
        if os.path.lexists(real) and (_inside_any(real, shown) or any(_inside_any(d, [real]) for d in around)
                                      or (real in in_view and _inside_any(real, own_place))):
            entries.setdefault(real, (0, real))
    for path in shown:
        if path not in entries:
            entries[path] = (1, path)
    for source, dest in binds:
        if not os.path.isabs(source) or not os.path.isabs(dest):
            raise SandboxConfigError(f"sandbox path {str(source)!r} must be absolute")
        real = os.path.realpath(source)
        if not os.path.exists(real):
            raise SandboxConfigError(f"sandbox path {real} does not exist; create it or drop it from the binds")
        target = real if dest == source else os.path.normpath(dest)
        entries[target] = (2, real)
    # the repository's own metadata is the user's, never the doer's: a hook, a config
    # (core.fsmonitor, core.hooksPath) or an alias written there would run at the user's next git
    # command, outside any sandbox. It is shown read-only where the workspace is: commands may
    # read the history (a version from tags, a diff), none may change it.
    ws_real = os.path.realpath(workspace)
    ws_dest = os.path.normpath(inside or workspace) if inside is not None else ws_real
    meta = os.path.join(ws_real, ".git")
    if os.path.lexists(meta) and not os.path.islink(meta):
        entries[os.path.join(ws_dest, ".git")] = (3, meta)
    args = _system_links() + ["--dev", "/dev", "--proc", "/proc",
                              *(["--size", str(tmp_mb * 2**20)] if tmp_mb else []), "--tmpfs", "/tmp", "--dir", home]
    folders = set()
    mounted: dict[str, tuple[int, str]] = {}
    # parents first: by depth (the number of "/" in a normalised absolute path), then kind, then path
    for dest, (kind, source) in sorted(entries.items(), key=lambda e: (e[0].rstrip("/").count("/"), e[1][0], e[0])):
        if kind == 0 and not os.path.isdir(dest):
            args += ["--ro-bind", "/dev/null", dest]      # a hidden file reads as empty
            continue
        if kind == 3:                                     # read-only inside a writable bind
            args += ["--ro-bind", source, dest]
            continue
        if kind == 1 and not os.path.exists(source):
            continue
        if kind == 1 and _shown_already(dest, mounted):
            continue
        mounted[dest] = (kind, source)
        folders.add(dest)
        args += (["--tmpfs", dest], ["--ro-bind", source, dest], ["--bind", source, dest])[kind]
    # empty *and* read-only: writes to a hidden place must fail, not vanish into a tmpfs
    for dest, (kind, _) in entries.items():
        if kind == 0 and dest in folders:
            args += ["--remount-ro", dest]
    return args + ["--remount-ro", "/"]


def _shown_already(path: str, mounted: dict[str, tuple[int, str]]) -> bool:
    """Whether ``path`` (shown read-only at its own place) is shown as it is by what is mounted
    already: its nearest mounted ancestor is itself shown read-only at its own place (a
    recursive bind: everything below comes along, host mounts too), and ``path`` is its own real
    path (a link could lead out of that ancestor). Each mount costs bubblewrap a pass over the
    sandbox's mount table, so a toolchain's folders inside a shown home are not mounted twice."""
    below, parent = path, os.path.dirname(path)
    while parent != below:
        found = mounted.get(parent)
        if found is not None:
            return found == (1, parent) and os.path.realpath(path) == path
        below, parent = parent, os.path.dirname(parent)
    return False


def _inside_any(path: str, tops: Sequence[str]) -> bool:
    return any(path == t or path.startswith(t.rstrip("/") + "/") for t in tops)


def _system_links() -> list[str]:
    """Merged-/usr systems link /bin, /lib… into /usr: the same links inside."""
    args: list[str] = []
    for path in SYSTEM:
        if os.path.islink(path) and path.count("/") == 1:
            args += ["--symlink", os.readlink(path), path]
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
    ``WorkspaceTools`` passes); ``present_at`` the path the workspace appears at inside (the eval
    snapshot shown at the work item's workspace path; default its own path); ``writable`` more
    writable paths; ``readonly_binds`` more paths shown read-only; ``hide`` more paths covered
    by an empty read-only tmpfs; ``own_home`` this org's home (hidden, as every registered one);
    ``toolchain_of`` maps the workspace path inside to the ``Toolchain`` recorded for its work
    item (None, or a None answer: this process's PATH and HOME); ``limits``; ``network`` lifts
    the network block; ``env`` extra variables on top of the clean environment; ``bwrap`` the
    executable (default: found on PATH).
    Errors (from ``run``/``execute``): ``SandboxUnavailable`` (no bwrap, no seccomp),
    ``SandboxFailed`` (bwrap cannot build the sandbox), ``SandboxConfigError`` (bad paths).
    """

    kind = "bubblewrap"

    def __init__(self, workspace: Path | None, *, writable: Sequence[Path] = (), readonly_binds: Sequence[Path] = (),
                 hide: Sequence[Path] = (), limits: Limits | None = None, network: bool = False,
                 env: Mapping[str, str] | None = None, bwrap: str | None = None, present_at: Path | None = None,
                 own_home: Path | None = None,
                 toolchain_of: Callable[[Path], Toolchain | None] | None = None) -> None:
        self.workspace = Path(workspace) if workspace is not None else None
        self.present_at = Path(present_at) if present_at is not None else None
        self.writable = tuple(Path(p) for p in writable)
        self.readonly_binds = tuple(Path(p) for p in readonly_binds)
        self.hide = tuple(Path(p) for p in hide)
        self.own_home = Path(own_home) if own_home is not None else None
        self.toolchain_of = toolchain_of
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

    def view(self, inside: Path, readonly_binds: Sequence[Path] = (), workspace: Path | None = None) -> View:
        """What a command in the workspace shown at ``inside`` sees (``view.build``); ``workspace``
        the folder bound there, whose host sockets are covered too."""
        toolchain = self.toolchain_of(inside) if self.toolchain_of else None
        extra = [Exposure(os.path.realpath(p), "asked for by the org") for p in (*self.readonly_binds, *readonly_binds)]
        return build(toolchain, own_home=self.own_home, readonly=extra, workspace=workspace)

    def execute(self, command: Sequence[str] | str, *, timeout_s: float, cwd: Path | None = None,
                max_output: int | None = None, stdin: bytes | None = None, env: Mapping[str, str] | None = None,
                writable: Sequence[Path] = (), readonly_binds: Sequence[Path] = (),
                separate_stderr: bool = False, limits: Limits | None = None,
                should_stop: Callable[[], bool] | None = None, poll_s: float = 1.0,
                binds: Sequence[tuple[Path, Path]] = ()) -> Captured:
        """Run ``command`` (argv, or a shell line when a str) in the sandbox.

        Params: ``cwd`` (default: the workspace) must be visible inside — a path in the workspace
        is translated to where the workspace appears; ``env`` adds variables for this call;
        ``writable``/``readonly_binds`` add binds for this call, ``binds`` (host path, path
        inside) writable ones presented elsewhere (``reports.ReportFile``); ``limits`` replaces the
        runner's for this call; ``should_stop`` is polled every ``poll_s`` seconds while the
        command runs and a True kills it (``Captured.stopped``).
        Returns: ``Captured`` (exit code 128+N when the command died of signal N; 127 with
        bubblewrap's message when the command cannot be executed; 1 with an
        ``error[disk_quota]`` line when the workspace outgrew ``limits.disk_mb``).
        """
        bwrap = self.bwrap or bubblewrap()
        if bwrap is None:
            raise SandboxUnavailable("bubblewrap (bwrap) is not installed, so agent commands are refused; "
                                     "install the 'bubblewrap' package")
        problem = probe(bwrap)
        if problem is not None:
            raise SandboxFailed(f"bubblewrap cannot build a sandbox here: {problem}; {_FIX}")
        filter_bpf = program()
        argv = ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)
        workspace = self.workspace or cwd
        if workspace is None:
            raise SandboxConfigError("a sandbox without a workspace needs the cwd of each command")
        inside = Path(os.path.normpath(self.present_at or os.path.realpath(workspace)))
        workdir = _translate(os.path.realpath(cwd or workspace), os.path.realpath(workspace), inside)
        limits = limits or self.limits
        view = self.view(inside, readonly_binds, Path(os.path.realpath(workspace)))
        hide = [*self.hide, *([self.own_home] if self.own_home else [])]
        mounts = mount_args(view, Path(workspace), inside=inside, writable=[*self.writable, *writable],
                            hide=hide, tmp_mb=limits.disk_mb, binds=binds)
        staged = stage.binary()
        cgroup = PidsCgroup.create(limits, own=STAGED_OWN_PROCS if staged is not None else SHELL_OWN_PROCS)
        status_r, status_w = os.pipe()
        alive_r, alive_w = os.pipe()  # only this process holds alive_w: EOF inside means we died
        seccomp_fd = memfd(filter_bpf, "seccomp")
        options = [*namespace_args(network=self.network), *mounts, "--chdir", workdir,
                   "--json-status-fd", str(status_w), "--seccomp", str(seccomp_fd)]
        # read from a descriptor, not argv: bubblewrap's argv is pid 1's cmdline inside
        args_fd = memfd(b"".join(a.encode() + b"\0" for a in options), "bwrap-args")
        try:
            if staged is not None:      # the same stages, one small program each side (stage.py)
                full = [*_staged_outer(staged, alive_r, cgroup, limits), bwrap, "--args", str(args_fd), "--",
                        *_staged_inner(staged, alive_r, timeout_s), *inner_prefix(limits), *argv]
            else:
                full = [*_outer_stage(alive_r, cgroup), *outer_prefix(limits), bwrap, "--args", str(args_fd),
                        "--", *_watch_parent(alive_r), *inner_prefix(limits), *_backstop(timeout_s), *argv]
            # Python reads the compiled files it finds (a virtual environment's, read-only here) and
            # writes none: nothing lands in the workspace, and nothing is recompiled each run (a
            # PYTHONPYCACHEPREFIX would make it ignore them: ~3 s more per pytest run)
            inner_env = {"PATH": view.path, "PYTHONDONTWRITEBYTECODE": "1", **view.env}
            got = run_bounded(full, cwd="/", env=clean_env({**inner_env, **self.env, **(env or {})}),
                              timeout_s=timeout_s, max_output=max_output or limits.max_output, stdin=stdin,
                              separate_stderr=separate_stderr, pass_fds=(status_w, alive_r, seccomp_fd, args_fd),
                              preexec=None if staged is not None else preexec_rlimits(limits),
                              should_stop=should_stop, poll_s=poll_s,
                              on_timeout=cgroup.kill_all if cgroup else None)
            os.close(status_w)
            status_w = -1
            started = _command_started(status_r)
        finally:
            if status_w >= 0:
                os.close(status_w)
            for fd in (status_r, alive_r, alive_w, seccomp_fd, args_fd):
                os.close(fd)
            if cgroup is not None:
                cgroup.close()
        if not started and not (got.timed_out or got.stopped):
            return _setup_failure(got)
        return _quota_checked(got, Path(workspace), limits)


def _translate(path: str, workspace: str, inside: Path) -> str:
    """``path`` as seen inside, where the workspace appears at ``inside``."""
    if path == workspace or path.startswith(workspace.rstrip("/") + "/"):
        return str(inside / os.path.relpath(path, workspace))
    return path


def _quota_checked(got: Captured, workspace: Path, limits: Limits) -> Captured:
    """The workspace's disk quota, checked after each command (a bind mount of the host's file
    system cannot be capped from inside the sandbox): over it, the command fails with one line
    saying so, and keeps failing until files are removed."""
    used = over_quota(workspace, limits)
    if used is None:
        return got
    line = (f"\nerror[disk_quota]: the workspace holds {used / 2**20:.0f} MB (apparent sizes: sparse files count "
            f"in full), over the sandbox's {limits.disk_mb} MB quota — delete files you do not need (org.toml "
            "sandbox.disk_mb sets the quota)\n")
    log.warning("workspace over its disk quota", workspace=str(workspace), used_mb=round(used / 2**20),
                quota_mb=limits.disk_mb)
    return Captured(got.exit_code or 1, got.output + line, got.stderr, got.timed_out, got.truncated, got.duration_s,
                    got.stopped)


def _outer_stage(alive_fd: int, cgroup: PidsCgroup | None) -> list[str]:
    """The first process of a run: a shell armed with the parent-death signal at its first exec
    (bubblewrap arms --die-with-parent only after its own start-up). It starts a watcher, joins
    the run's pids cgroup (the watcher stays outside it), runs the rest, then stops the watcher
    and exits with the rest's status: it reaps both, so a finished run leaves no process behind.

    Once ``alive_fd`` reads EOF while the run goes on (this process died), the watcher kills
    the group and the run's process group. That catches what no parent-death signal does: a
    sandbox child still starting when its bubblewrap died blocks forever on an eventfd, before
    the in-sandbox watcher exists."""
    setpriv = which("setpriv")
    kill = f"echo 1 > {shlex.quote(str(cgroup.kill_file))}; " if cgroup else ""
    join = f"echo $$ > {shlex.quote(str(cgroup.procs))} || {{ kill $w; exit 126; }}; " if cgroup else ""
    script = (f"{{ read _ </proc/self/fd/{alive_fd}; {kill}kill -KILL -$$; }} </dev/null >/dev/null 2>&1 & "
              f"w=$!; {join}\"$@\"; s=$?; kill $w 2>/dev/null; wait $w 2>/dev/null; exit $s")
    return [*([setpriv, "--pdeathsig", "KILL", "--"] if setpriv else []), "/bin/sh", "-c", script, "sh"]


def _staged_outer(program: str, alive_fd: int, cgroup: PidsCgroup | None, limits: Limits) -> list[str]:
    """``_outer_stage`` and the rlimits (``outer_prefix``) as ``sandbox-stage outer``: armed with
    the parent-death signal first, the child joins the cgroup and takes the limits before it execs
    bubblewrap, the parent watches ``alive_fd`` outside the cgroup and ends with the child."""
    spec = ",".join(f"{name}={soft}:{hard}" for name, soft, hard in rlimits(limits)) or "-"
    return [program, "outer", str(alive_fd), str(cgroup.procs) if cgroup else "-",
            str(cgroup.kill_file) if cgroup else "-", spec, "--"]


def _staged_inner(program: str, alive_fd: int, timeout_s: float) -> list[str]:
    """``_watch_parent`` and ``_backstop`` as ``sandbox-stage inner``: the command in a child
    (without ``alive_fd``), every process of the sandbox killed once ``alive_fd`` reads EOF or the
    backstop passes."""
    return [program, "inner", str(alive_fd), str(math.ceil(timeout_s) + _BACKSTOP_GRACE_S), "--"]


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
    binary = which("timeout")
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
    ``runner_from_config``, see ``view``), even when they live under the sandbox's private ``/tmp``."""
    runner = BwrapRunner(workspace, writable=writable, readonly_binds=readonly_binds, hide=hide,
                         limits=Limits(cpu_s, memory_mb, max_procs, max_output), network=network,
                         env=env, bwrap=bwrap)
    return runner.execute(command, timeout_s=timeout_s, cwd=cwd, stdin=stdin, separate_stderr=separate_stderr)
