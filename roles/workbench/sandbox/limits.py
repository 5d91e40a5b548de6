"""Resource limits of a sandboxed command: CPU time, address space, file size, disk, process count.

CPU time, address space and file size (``RLIMIT_FSIZE``: a write past it fails with ``EFBIG``
and ``SIGXFSZ``, "File size limit exceeded") are rlimits set on the process that execs bubblewrap (``prlimit`` as
a wrapper, so no ``preexec_fn`` runs in a threaded parent); every process in the sandbox inherits
them. CPU time counts per process: a tree of busy processes is bounded by the wall-clock timeout.

The process count is the hard one. ``RLIMIT_NPROC`` is counted per user *inside* the sandbox's
user namespace, which is what we want — but the kernel never enforces it for processes whose
host uid is 0, and running as root the sandbox's uid 65534 maps to host uid 0. So:

- ``cgroup``: a pids cgroup per run (``pids.max``), when a writable pids hierarchy exists (v1,
  or v2 where the controller can be delegated). Exact, covers threads, also used to kill the tree.
- ``prlimit``: ``prlimit --nproc`` *inside* the sandbox (not on bubblewrap: a limit on the
  namespace's creator also caps the host user's whole process count). Enforced when not root.
- ``none``: neither is possible (root without a writable pids cgroup); the wall-clock timeout
  and the pid namespace still end a fork bomb, and ``describe()`` says so.

Disk: the private ``/tmp`` is a tmpfs of ``disk_mb``; the workspace, a bind of the host's file
system that no mount option can cap, is measured after each command (``over_quota``) and a
command that leaves it over ``disk_mb`` fails with ``error[disk_quota]`` (``bwrap``). The
measure is what the host would write, not what the sandbox paid: each path counts the larger of
its blocks and its apparent size, so a sparse file that costs the workspace nothing counts what
its history's blob and every snapshot of it would take (the loop-agent refuses to record a tree
over the quota: ``roles/loop_agent/acting.py``).
"""
from __future__ import annotations

import os
import shutil
import signal
import time
import uuid
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import structlog

log = structlog.get_logger("sandbox.limits")

CGROUP_DIR = "loop-org-sandbox"
# the sandbox's own processes in a run's pids cgroup besides the command, by the form of its stages
SHELL_OWN_PROCS = 5   # the run's shell, bubblewrap's monitor, the namespace's init, the watcher inside, the timer
STAGED_OWN_PROCS = 3  # with sandbox-stage (stage.py): bubblewrap's monitor, the namespace's init, the inner stage


@dataclass(frozen=True)
class Limits:
    """Per-command limits; None switches one off. ``max_output`` bytes are kept (head and tail)."""

    cpu_s: int | None = 300
    memory_mb: int | None = 2048
    max_procs: int | None = 256
    max_output: int = 1_000_000
    file_size_mb: int | None = 128
    disk_mb: int | None = 2048

    @classmethod
    def from_config(cls, cfg) -> Limits:
        return cls(cpu_s=int(cfg.sandbox.cpu_seconds), memory_mb=int(cfg.sandbox.memory_mb),
                   max_procs=int(cfg.sandbox.max_processes), max_output=int(cfg.sandbox.output_bytes),
                   file_size_mb=int(cfg.sandbox.file_size_mb), disk_mb=int(cfg.sandbox.disk_mb))


_FOUND: dict[tuple[str, str], str | None] = {}


def which(name: str) -> str | None:
    """``shutil.which(name)``, kept while this process's PATH is the same and the file found is
    still executable (each sandboxed command asks for four tools, and a PATH search is a stat per
    folder). A tool that disappears is searched for again; one not found is searched for each time."""
    key = (name, os.environ.get("PATH", ""))
    found = _FOUND.get(key)
    if found is not None and os.access(found, os.X_OK):
        return found
    found = _FOUND[key] = shutil.which(name)
    return found


def prlimit_binary() -> str | None:
    return which("prlimit")


def outer_prefix(limits: Limits) -> list[str]:
    """argv prefix applying CPU and address-space limits to bubblewrap and all it starts.
    Empty when no such limit is set; falls back to ``preexec_rlimits`` when prlimit is missing."""
    opts = _outer_opts(limits)
    binary = prlimit_binary()
    if not opts or binary is None:
        return []
    return [binary, *opts, "--"]


def rlimits(limits: Limits) -> list[tuple[str, int, int]]:
    """The rlimits of a run, as (name, soft, hard): prlimit's option names, ``stage.c``'s too."""
    out = [("core", 0, 0)]
    if limits.cpu_s is not None:
        # soft limit: SIGXCPU (catchable); one second later the hard limit's SIGKILL
        out.append(("cpu", limits.cpu_s, limits.cpu_s + 1))
    if limits.memory_mb is not None:
        size = limits.memory_mb * 1024 * 1024
        out.append(("as", size, size))
    if limits.file_size_mb is not None:
        size = limits.file_size_mb * 2**20
        out.append(("fsize", size, size))
    return out


def _outer_opts(limits: Limits) -> list[str]:
    return [f"--{name}={soft}:{hard}" for name, soft, hard in rlimits(limits)]


def preexec_rlimits(limits: Limits):
    """The same limits as a ``preexec_fn``, for systems without the prlimit tool (util-linux)."""
    if prlimit_binary() is not None:
        return None
    import resource
    which_limit = {"core": resource.RLIMIT_CORE, "cpu": resource.RLIMIT_CPU, "as": resource.RLIMIT_AS,
                   "fsize": resource.RLIMIT_FSIZE}
    chosen = [(which_limit[name], soft, hard) for name, soft, hard in rlimits(limits)]

    def apply() -> None:
        for res, soft, hard in chosen:
            resource.setrlimit(res, (soft, hard))
    return apply


def over_quota(folder: Path, limits: Limits) -> int | None:
    """Bytes ``folder`` would take written out (each path: the larger of its blocks and its
    apparent size) when that is over ``limits.disk_mb``, else None. The walk stops as soon as
    the quota is passed; symbolic links are not followed, a hard link counts at each path (each
    is a file of its own in a snapshot)."""
    if limits.disk_mb is None:
        return None
    cap, used, stack = limits.disk_mb * 2**20, 0, [str(folder)]
    while stack:
        try:
            entries = os.scandir(stack.pop())
        except OSError:
            continue
        with entries:
            for entry in entries:
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                used += max(st.st_blocks * 512, st.st_size)
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
        if used > cap:
            return used
    return None


# -- process count --------------------------------------------------------------------------


def process_limit_kind() -> str:
    """``cgroup``, ``prlimit`` or ``none``: how ``max_procs`` is enforced on this machine."""
    if _pids_base() is not None:
        return "cgroup"
    if os.geteuid() != 0 and prlimit_binary() is not None:
        return "prlimit"
    return "none"


def inner_prefix(limits: Limits) -> list[str]:
    """argv prefix run inside the sandbox: ``prlimit --nproc`` when that is the enforcing kind."""
    if limits.max_procs is None or process_limit_kind() != "prlimit":
        return []
    return [prlimit_binary() or "prlimit", f"--nproc={limits.max_procs}:{limits.max_procs}", "--"]


class PidsCgroup:
    """One run's pids cgroup. The spawned process writes itself into ``procs`` before it execs
    bubblewrap; ``close()`` kills what is left and removes the group."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def create(cls, limits: Limits, own: int = SHELL_OWN_PROCS) -> PidsCgroup | None:
        """A fresh group limited to ``limits.max_procs`` (+ ``own``: the sandbox's own processes in
        it besides the command), or None when
        no writable pids hierarchy exists or no limit is asked for."""
        base = _pids_base()
        if base is None or limits.max_procs is None:
            return None
        _sweep_now_and_then(base)
        path = base / f"run-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        try:
            path.mkdir()
            (path / "pids.max").write_text(str(limits.max_procs + own))
        except OSError as exc:
            log.warning("pids cgroup not created; the process limit is not enforced for this command",
                        path=str(path), error=str(exc))
            _rmdir(path)
            return None
        return cls(path)

    @property
    def procs(self) -> Path:
        return self.path / "cgroup.procs"

    @property
    def kill_file(self) -> Path:
        return self.path / "cgroup.kill"

    def kill_all(self) -> None:
        kill = self.kill_file
        if kill.exists():  # cgroup v2: atomic, catches processes forked while we iterate
            try:
                kill.write_text("1")
                return
            except OSError:
                pass
        for _ in range(3):
            pids = self.members()
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def members(self) -> list[int]:
        try:
            return [int(p) for p in (self.path / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            return []

    def close(self) -> None:
        """Kill what is left; remove the group now if it is already empty, else at a later sweep
        (waiting here for the kernel to release the killed members would cost every command)."""
        if self.members():
            self.kill_all()
        _rmdir(self.path)


def _rmdir(path: Path) -> bool:
    try:
        path.rmdir()
        return True
    except FileNotFoundError:
        return True
    except OSError:
        return False


SWEEP_EVERY_S = 10.0
_swept_at = float("-inf")      # when this process last swept


def _sweep_now_and_then(base: Path) -> None:
    """``_sweep`` at most every ``SWEEP_EVERY_S`` in a process: a left group is empty and holds
    nothing, while listing every live run's group before each command cost the busiest roles."""
    global _swept_at
    now = time.monotonic()
    if now - _swept_at >= SWEEP_EVERY_S:
        _swept_at = now
        _sweep(base)


def _sweep(base: Path) -> None:
    """Remove empty run groups left by a crashed parent: only groups whose creating process is
    gone (``run-<pid>-<hex>``), never one another live process just made and has not joined yet
    (rmdir also refuses a populated group)."""
    try:
        stale = [p for p in base.iterdir() if p.name.startswith("run-")]
    except OSError:
        return
    for p in stale[:50]:
        parts = p.name.split("-")
        if len(parts) == 3 and parts[1].isdigit() and not Path(f"/proc/{parts[1]}").exists():
            _rmdir(p)


@lru_cache(maxsize=1)
def _pids_base() -> Path | None:
    """The folder under which per-run pids groups are created, or None."""
    try:
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
        own = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in mounts:
        left, _, right = line.partition(" - ")
        fields, rest = left.split(), right.split()
        if len(fields) < 5 or len(rest) < 3:
            continue
        mountpoint, fstype, options = Path(fields[4]), rest[0], rest[2].split(",")
        if fstype == "cgroup" and "pids" in options:
            rel = _own_path(own, lambda ctrls: "pids" in ctrls.split(","))
            base = _prepare_v1(mountpoint, rel)
        elif fstype == "cgroup2":
            rel = _own_path(own, lambda ctrls: ctrls == "")
            base = _prepare_v2(mountpoint, rel)
        else:
            continue
        if base is not None:
            return base
    return None


def _own_path(lines: list[str], match) -> str | None:
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) == 3 and match(parts[1]):
            return parts[2]
    return None


def _prepare_v1(mountpoint: Path, rel: str | None) -> Path | None:
    if rel is None:
        return None
    base = mountpoint / rel.lstrip("/") / CGROUP_DIR
    try:
        base.mkdir(exist_ok=True)
    except OSError:
        return None
    return base if (base / "pids.max").exists() and os.access(base, os.W_OK) else None


def _prepare_v2(mountpoint: Path, rel: str | None) -> Path | None:
    if rel is None:
        return None
    parent = mountpoint / rel.lstrip("/")
    try:
        if "pids" not in (parent / "cgroup.controllers").read_text().split():
            return None
        base = parent / CGROUP_DIR
        base.mkdir(exist_ok=True)
        if not (base / "pids.max").exists():
            # fails (EBUSY) when our own group holds processes and is not the root: give up
            (parent / "cgroup.subtree_control").write_text("+pids")
        (base / "cgroup.subtree_control").write_text("+pids")
    except OSError:
        return None
    return base if (base / "pids.max").exists() else None
