"""Which runner agent commands get, from org.toml's ``[sandbox]`` section.

- ``mode = "bubblewrap"`` (default): a ``BwrapRunner`` when bwrap is installed; otherwise a
  ``RefusingRunner`` whose every command raises ``SandboxUnavailable``.
- ``mode = "unsandboxed"`` (the config check insists on ``allow_unsandboxed = true`` with it): an
  ``UnsandboxedRunner`` — plain processes with the clean environment, nothing else.
"""
from __future__ import annotations

import functools
import os
import sqlite3
import stat
import sys
import threading
from pathlib import Path
from typing import Callable, Mapping, Sequence

from roles.workbench.sandbox.bwrap import SANDBOX_UID, BwrapRunner, bubblewrap, probe
from roles.workbench.sandbox.capture import Captured, run_bounded
from roles.workbench.sandbox.environment import clean_env
from roles.workbench.sandbox.errors import SandboxError, SandboxUnavailable
from roles.workbench.sandbox.limits import Limits, process_limit_kind
from roles.workbench.sandbox.toolchains import Toolchain
from roles.workbench.sandbox.view import default_visible
from state_db.connection import connect
from state_db.kernel.errors import StateError
from state_db.queries.work import toolchain_of_workspace

_ALWAYS_HIDDEN = ("/run",)  # sockets of the host's services; as root the sandbox could connect to them
_PRIVATE_ROOTS = ("/etc", "/var", "/opt", "/srv", "/boot", "/usr/local")


def unsandboxed_allowed(cfg) -> bool:
    return cfg.sandbox.mode == "unsandboxed" and bool(cfg.sandbox.allow_unsandboxed)


def warm() -> None:
    """Make, ahead of the first sandboxed command, what every command needs and each process keeps
    once made: bubblewrap's probe, the stages' program (``stage.ensure``: built once, where a C
    compiler is), the system-call filter, the root-private files under the shown
    system folders (``root_private_paths``: thousands of stat calls) and this process's
    toolchain's listing. Met cold, they cost the first command ~150 ms of CPU, paid by whoever
    waits for it: an eval-agent's first preflight held every run it was to start. The role
    template runs this after its heavy stage, so every role forked from it shares what it made;
    an eval-agent forked before runs it once ready, ahead of its first verification. Never
    raises: what fails here fails again, coded, at the command."""
    from roles.workbench.sandbox import stage
    from roles.workbench.sandbox.seccomp import program
    from roles.workbench.sandbox.view import build
    try:
        found = bubblewrap()
        if found is not None:
            probe(found)
            stage.ensure()
        program()
        build(None, own_home=None)
    except Exception:  # noqa: BLE001 - the command that needs it reports the failure itself
        pass


def default_hidden(org_home: Path) -> list[Path]:
    """Paths no agent command may see even when a caller shows a folder around them: the org
    home, the real home, /run, and what only the host's root user or group may read
    (``root_private_paths``). The view hides them anyway where it shows their parents."""
    hidden = [Path(org_home), Path.home(), *map(Path, _ALWAYS_HIDDEN), *root_private_paths()]
    return [p for p in hidden if str(p) not in ("/", "")]


def root_private_paths(roots: tuple[str, ...] = _PRIVATE_ROOTS, max_depth: int = 4) -> tuple[Path, ...]:
    """Files and folders under ``roots`` that only the host's root user or group may read.

    Running as root, the sandbox's uid and gid map to the host's root: without capabilities it
    cannot pass another user's permission bits, but a root-owned file's owner bits (or a
    root-group file's group bits) let it through — /etc/shadow, /etc/ssl/private, host keys.
    Those are hidden, found by their mode bits rather than listed by name, down to
    ``max_depth`` levels below each root, on the root's own file system. A hidden folder is
    not walked; symbolic links are not followed. Each root is walked once per process (a file
    made private later is hidden from the next process on: ``warm`` walks the shown ones in the
    role template, so the roles forked from it share that walk)."""
    return tuple(sorted(p for root in roots for p in _root_private_under(root, max_depth)))


def shown_private_roots(folders: Sequence[str]) -> tuple[str, ...]:
    """The roots of ``root_private_paths`` that a file inside one of ``folders`` can lie in: those
    inside a folder, or holding one. The others need no walk (what they hold is not shown), and
    /var alone is a third of the walk's stat calls on a Debian host."""
    def within(path: str, top: str) -> bool:
        return path == top or path.startswith(top.rstrip("/") + "/")
    return tuple(r for r in _PRIVATE_ROOTS if any(within(r, f) or within(f, r) for f in folders))


@functools.lru_cache(maxsize=32)
def _root_private_under(root: str, max_depth: int) -> tuple[Path, ...]:
    found: list[Path] = []
    try:
        st = os.stat(root, follow_symlinks=False)
    except OSError:
        return ()
    if not stat.S_ISDIR(st.st_mode):
        return ()
    stack: list[tuple[str, int, int]] = [(root, 1, st.st_dev)]
    while stack:
        top, depth, dev = stack.pop()
        try:
            entries = list(os.scandir(top))
        except OSError:
            continue
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if st.st_uid != 0 and st.st_gid != 0:
                continue
            if stat.S_ISDIR(st.st_mode):
                if st.st_mode & _OTHERS_ENTER != _OTHERS_ENTER:
                    found.append(Path(entry.path))
                elif depth < max_depth and st.st_dev == dev:
                    stack.append((entry.path, depth + 1, dev))
            elif stat.S_ISREG(st.st_mode) and not st.st_mode & stat.S_IROTH:
                found.append(Path(entry.path))
    return tuple(found)


_OTHERS_ENTER = stat.S_IROTH | stat.S_IXOTH


class RefusingRunner:
    """Stands in when no sandbox is available: every command raises the coded error."""

    kind = "refused"

    def __init__(self, error: SandboxError) -> None:
        self.error = error

    def describe(self) -> str:
        return f"agent commands refused: {self.error}"

    def run(self, command, cwd, timeout_s, max_output_bytes) -> Captured:
        raise self.error

    def execute(self, command, **_: object) -> Captured:
        raise self.error


class UnsandboxedRunner:
    """Plain processes in their own session, with the clean environment (HOME stays the real
    one) and the same time/output bounds. Only when org.toml explicitly allows it."""

    kind = "unsandboxed"

    def __init__(self, workspace: Path | None, *, limits: Limits | None = None,
                 env: Mapping[str, str] | None = None) -> None:
        self.workspace = Path(workspace) if workspace is not None else None
        self.limits = limits or Limits()
        self.env = dict(env or {})

    def describe(self) -> str:
        return "unsandboxed (allowed by org.toml): agent commands run as plain processes"

    def run(self, command: Sequence[str] | str, cwd: Path, timeout_s: float, max_output_bytes: int) -> Captured:
        return self.execute(command, cwd=cwd, timeout_s=timeout_s, max_output=max_output_bytes)

    def execute(self, command: Sequence[str] | str, *, timeout_s: float, cwd: Path | None = None,
                max_output: int | None = None, stdin: bytes | None = None, env: Mapping[str, str] | None = None,
                writable: Sequence[Path] = (), readonly_binds: Sequence[Path] = (),
                separate_stderr: bool = False, limits: Limits | None = None,
                should_stop: Callable[[], bool] | None = None, poll_s: float = 1.0,
                binds: Sequence[tuple[Path, Path]] = ()) -> Captured:
        """Same parameters as ``BwrapRunner.execute``; binds and ``limits`` have no meaning here."""
        from roles.workbench.sandbox.bwrap import _outer_stage
        argv = ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)
        full_env = clean_env({**self.env, **(env or {})}, home=os.environ.get("HOME", "/"))
        # dies with this process, children included: a watcher kills the command's process group
        # once the pipe only this process writes reads EOF (a human-approved action never outlives
        # the loop-agent that runs it, so a crash never leaves it running beside the next attempt)
        alive_r, alive_w = os.pipe()
        try:
            return run_bounded([*_outer_stage(alive_r, None), *argv], cwd=cwd or self.workspace or "/",
                               env=full_env, timeout_s=timeout_s, max_output=max_output or self.limits.max_output,
                               stdin=stdin, separate_stderr=separate_stderr, pass_fds=(alive_r,),
                               should_stop=should_stop, poll_s=poll_s)
        except OSError as exc:  # like a shell: the command is not there
            return Captured(127, f"{argv[0]}: {exc.strerror or exc}\n", "", False, False, 0.0)
        finally:
            os.close(alive_r)
            os.close(alive_w)


def runner_from_config(cfg, org_home, workspace: Path | None = None, *, readonly_binds: Sequence[Path] = (),
                       bwrap: str | None = None, present_at: Path | None = None):
    """The runner for agent commands in ``workspace``.

    Params: ``cfg`` the org config; ``org_home`` an ``OrgHome`` or its root path (hidden from the
    sandbox); ``workspace`` the writable folder (None: each command's ``cwd``, which is what
    ``WorkspaceTools`` passes — one runner then serves any workspace); ``readonly_binds`` more
    folders shown read-only (e.g. a CLI's own folder), on top of org.toml's
    ``sandbox.readonly_binds``; ``bwrap`` overrides the executable found on PATH; ``present_at``
    the path the workspace appears at inside (the eval snapshot shown at the work item's own
    workspace path, so absolute paths recorded there work).
    The toolchain shown is the one recorded with the work item that holds the workspace
    (``toolchain_for``), else this process's PATH and HOME.
    Returns: ``BwrapRunner`` | ``UnsandboxedRunner`` | ``RefusingRunner`` (all have ``run`` —
    the ``CommandRunner`` protocol — and ``execute``). Never raises: problems surface, coded, when
    a command is run.
    """
    limits = Limits.from_config(cfg)
    if unsandboxed_allowed(cfg):
        return UnsandboxedRunner(workspace, limits=limits)
    found = bwrap or bubblewrap()
    if found is None:
        return RefusingRunner(SandboxUnavailable(
            "bubblewrap (bwrap) is not installed, so agent commands are refused; install the "
            "'bubblewrap' package, or — at your own risk — set sandbox.mode = \"unsandboxed\" and "
            "sandbox.allow_unsandboxed = true in org.toml"))
    root = Path(org_home if isinstance(org_home, (str, os.PathLike)) else org_home.root)
    visible = [*(Path(p) for p in cfg.sandbox.readonly_binds), *(Path(p) for p in readonly_binds)]
    return BwrapRunner(workspace, readonly_binds=visible, limits=limits, bwrap=found, present_at=present_at,
                       own_home=root, toolchain_of=functools.partial(toolchain_for, _store_of(org_home, root)))


def _store_of(org_home, root: Path) -> Path | str:
    """The org's store (state.db, or the PostgreSQL URL org.toml names)."""
    from state_db.kernel.home import OrgHome
    return org_home.db_path if isinstance(org_home, OrgHome) else OrgHome(root).db_path


# one read connection per thread and store for toolchain_for: every sandboxed command asks
_READERS = threading.local()


def toolchain_for(db_path: Path | str, workspace: Path) -> Toolchain | None:
    """The toolchain recorded with the work item holding ``workspace`` (the one with its lock,
    else the latest), or None (no such item, or a state.db without the column). The thread's
    read connection is kept for the next command; one that fails is closed and opened again."""
    readers = _READERS.__dict__.setdefault("by_store", {})
    for _ in range(2):                  # a failing connection is replaced once
        try:
            conn = readers.get(str(db_path))
            if conn is None:
                conn = readers[str(db_path)] = connect(db_path, readonly=True)
            recorded = toolchain_of_workspace(conn, str(workspace))
            return Toolchain.decode(recorded) if recorded is not None else None
        except (sqlite3.Error, StateError, ValueError, TypeError):
            stale = readers.pop(str(db_path), None)
            if stale is not None:
                try:
                    stale.close()
                except Exception:  # noqa: BLE001 - it failed already; a new one is opened
                    pass
    return None


def describe_mode(cfg) -> str:
    """One line for start-up and ``org doctor``: which isolation agent commands get."""
    if unsandboxed_allowed(cfg):
        return "unsandboxed (allowed by org.toml): agent commands run as plain processes, without isolation"
    found = bubblewrap()
    if found is None:
        return "agent commands refused: bubblewrap missing (install the 'bubblewrap' package)"
    problem = probe(found)
    if problem is not None:
        return f"agent commands refused: bubblewrap at {found} cannot start a sandbox ({problem})"
    return (f"sandbox: bubblewrap at {found} (uid {SANDBOX_UID}, no network, "
            f"process limit: {process_limit_kind()})")
