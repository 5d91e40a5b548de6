"""Shadow git history of a workspace, kept in the org home and never inside the workspace.

``GIT_DIR`` is ``<org_home>/history/<work_id>.git`` and ``GIT_WORK_TREE`` is the workspace, so
nothing is ever written into the workspace (no ``.git``, no index, no lock file). Git never
treats an entry named ``.git`` as part of a work tree, so a workspace that is itself a git
repository keeps its own ``.git`` untouched: it is neither recorded, restored nor cleaned.

Everything else is recorded, ignored files included (``add --force``): the eval-agent must
verify exactly what the doer produced. Git records files, not directories, so empty
directories are not part of a checkpoint (a reset removes them).

Checkpoint cost grows with what changed, not with the workspace size, and the steady state
runs no git process: objects are written and read in-process as loose objects in git's exact
format (``objects``), refs are moved under git's lock protocol (``refs``), and a stat cache in
the git dir (``statcache``) lets a checkpoint read only files whose stat changed and rebuild
only their trees (``scan``), and lets a reset or a snapshot rewrite only what differs
(``checkout``, ``snapshot``). Whatever the in-process path does not reproduce exactly — nested
repositories, ``.gitattributes``, sockets and fifos, packed objects, revisions in git's own
syntax — is handed to git, as before (``gitpath``): the history and its trees are the same
either way, and git reads, diffs and archives what was written in-process as its own.

Crash safety (kill -9 at any point): objects and refs are written to temp or lock files and
renamed into place; the stat cache is written after the refs, carries a checksum (a torn one
is ignored) and names the ``HEAD`` it was written with, so a cache that does not match the
refs is discarded and the files are read again, once. A killed writer's ref locks are cleared
when the run or an attempt restarts (``baseline``, ``reset_to``).

The running loop's history (``defer=True``) appends its new objects and ref updates to two
pending files instead of creating files (``pending``, ``refs``): after the run's first, a
checkpoint creates no file at all, where it used to create five. Every reader finds pending objects and refs at once;
they become git's own files before git runs on the repository, when the run stops
(``flush_pending``) and when a restarted run clears a killed one's leftovers. Both files are
written before state.db records the checkpoint, as the loose files were.

Refs: ``refs/loop-org/baseline``, ``refs/iterations/<n>`` per committed iteration,
``refs/heads/checkpoints`` (HEAD, the parent of the next checkpoint), and
``refs/discarded/<n>/<commit>`` for a checkpoint replaced by a later attempt of iteration n.
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Callable

import structlog

from roles.workspace import objects, statcache
from roles.workspace.errors import (  # noqa: F401 - re-exported: callers import them from here
    FastPathUnavailable, GitFailed, GitMissing, HistoryError, NoBaseline, RefConflict,
    RefLocked, UnknownCommit, WorkspaceMissing,
)
from roles.workspace.gitcli import IDENTITY, GitCli
from roles.workspace.gitpath import GitPath
from roles.workspace.pending import PENDING_OBJECTS
from roles.workspace.refs import PENDING as PENDING_REFS
from roles.workspace.refs import Refs, clear_stale_locks, resolve
from roles.workspace.views import BASELINE_REF, HEAD_REF, HistoryViews, inside
from roles.workspace.workspace_cache import WorkspaceCache

log = structlog.get_logger("loop_agent.history")


def iteration_ref(iteration: int) -> str:
    return f"refs/iterations/{iteration}"


def has_pending(git_dir: Path) -> bool:
    """Whether a deferring writer left objects or refs in ``git_dir`` not yet written out."""
    return (git_dir / PENDING_OBJECTS).exists() or (git_dir / PENDING_REFS).exists()


class WorkspaceHistory(HistoryViews):
    """Baseline, checkpoints, reset, diff and snapshots of one workspace.

    Args:
        git_dir: where the shadow repository lives (``<org_home>/history/<work_id>.git``);
            created on first use. Must not be inside ``workspace``.
        workspace: the directory the agent works in.
        git: the git executable.
        on_step: called with the name of each durable write step (``commit_written``,
            ``ref_locked:<ref>``, ``ref_updated:<ref>``, ``cache_written``,
            ``snapshot_writing``); tests kill the process there to prove crash safety.
        defer: append new objects and ref updates to pending files and write them out as
            git's own later (``pending``, ``refs``): for the one writer of a running loop,
            which calls ``flush_pending`` when it stops. Readers (other instances, other
            processes) find pending objects and refs at once; git is given them before it
            runs on the repository.

    Raises:
        HistoryError(code="history_inside_workspace"): ``git_dir`` is inside the workspace.
    """

    def __init__(self, git_dir: Path, workspace: Path, *, git: str = "git",
                 on_step: Callable[[str], None] | None = None, defer: bool = False) -> None:
        self.git_dir = Path(git_dir).absolute()
        self.workspace = Path(workspace).absolute()
        if inside(self.git_dir, self.workspace):
            raise HistoryError(
                f"history {self.git_dir} is inside workspace {self.workspace}; "
                "keep it in the org home",
                code="history_inside_workspace",
            )
        self._git = GitCli(self.git_dir, git)
        self._step = on_step or (lambda step: None)
        self._defer = defer
        self._refs = self._make_refs()
        self._git.before_run = self._before_git
        self._gitpath = GitPath(self._git, HEAD_REF, BASELINE_REF)
        self._cache = WorkspaceCache(self.git_dir, self.workspace, self._step)
        self._ready = (self.git_dir / "HEAD").exists()

    # -- plumbing -------------------------------------------------------------------------

    def _store(self) -> objects.ObjectStore:
        store = objects.store_for(self.git_dir)
        if self._defer:
            store.defer_writes = True
        return store

    def _make_refs(self) -> Refs:
        return Refs(self.git_dir, self._ident, self._step, deferred=self._defer,
                    before_flush=lambda: self._store().publish_pending(drop=True))

    def _before_git(self) -> None:
        """Git reads objects and refs from its own files: write pending ones out first (a
        reader writes out the objects only; the writer drops what it wrote out)."""
        if self._defer:
            self._refs.flush()
        else:
            self._store().publish_pending(drop=False)

    def _ident(self) -> str:
        return objects.ident(IDENTITY["GIT_COMMITTER_NAME"], IDENTITY["GIT_COMMITTER_EMAIL"])

    def _fallback(self, operation: str, exc: Exception) -> None:
        log.info("history_git_fallback", operation=operation, reason=str(exc),
                 workspace=str(self.workspace), next="git does this step")

    def _ws(self) -> Path:
        """The workspace, checked to exist (git would otherwise record an empty tree)."""
        if not self.workspace.is_dir():
            raise WorkspaceMissing(
                f"workspace {self.workspace} is missing; restore it or cancel the work item"
            )
        return self.workspace

    def _ensure_repo(self) -> None:
        if self._ready or (self.git_dir / "HEAD").exists():
            self._ready = True
            return
        self._git.init(HEAD_REF)
        self._ready = True

    def _resolve(self, rev: str) -> str | None:
        if not self._ready and not (self.git_dir / "HEAD").exists():
            return None  # reading never creates a history
        self._ready = True
        if not rev or rev.startswith("-"):
            return None  # never let a caller's value reach git as an option
        try:
            return resolve(self._refs, self._store(), rev)
        except FastPathUnavailable:
            pass
        return self._gitpath.resolve(rev)

    def _commit_of(self, rev: str) -> str:
        commit = self._resolve(rev)
        if commit is None:
            raise UnknownCommit(f"{rev!r} is not a commit of history {self.git_dir}")
        return commit

    def _tree_of(self, commit: str) -> bytes:
        return self._store().commit(bytes.fromhex(commit))[0]

    def _write_commit(self, tree: str, parents: list[str], message: str) -> str:
        commit = objects.write_commit(self._store(), tree, parents, message, IDENTITY)
        self._step("commit_written")
        return commit

    def _clear_stale_locks(self) -> None:
        """Remove lock files a killed writer left (``index.lock``, ``refs/**.lock``, ...) and,
        in a deferring history, write out the objects and refs it left pending.

        Only the loop-agent running the work item writes the index and refs, one process at a
        time; it calls this when it (re)starts a run or an attempt (``baseline``, ``reset_to``),
        so a lock found then belongs to a process that died. Snapshot indexes are separate.
        """
        for lock in clear_stale_locks(self.git_dir):
            log.warning("history_stale_lock_removed", lock=str(lock))
        self._refs.flush()  # a killed writer's pending objects and refs, if this one defers

    def flush_pending(self) -> None:
        """Write deferred objects and refs out as git's own (``defer``); cheap when there are
        none. The loop calls it when it stops."""
        self._refs.flush()

    # -- recording --------------------------------------------------------------------------

    def baseline_commit(self) -> str | None:
        """The recorded baseline, or None if none was taken yet."""
        return self._resolve(BASELINE_REF)

    def baseline(self) -> str:
        """Record the workspace as it is now as the baseline; idempotent.

        Returns: the baseline commit id (the existing one if already recorded).
        Raises: WorkspaceMissing, GitMissing, GitFailed.
        """
        self._clear_stale_locks()
        existing = self.baseline_commit()
        if existing:
            try:
                if self._refs.read(HEAD_REF) is None:  # killed between the two ref writes
                    self._refs.update(HEAD_REF, existing, message="loop-org: baseline",
                                      also_log=("HEAD",))
            except FastPathUnavailable:
                pass  # a symbolic or packed-only HEAD ref: git's business, nothing to repair
            return existing
        self._ws()
        self._ensure_repo()
        try:
            head = self._refs.read(HEAD_REF)
            tree, node, _ = self._cache.record(self._store(), head)
            commit = self._write_commit(tree, [], "loop-org baseline")
            # HEAD first: a crash before the baseline ref leaves a history that baselines again.
            self._refs.update(HEAD_REF, commit, message="loop-org: baseline", also_log=("HEAD",))
            self._refs.update(BASELINE_REF, commit, expect=None, message="loop-org: baseline")
            self._cache.save(node, commit)
        except (FastPathUnavailable, OSError) as exc:
            self._fallback("baseline", exc)
            commit = self._gitpath.baseline(self._ws(), self._cache.handed_to_git())
        log.info("workspace_baseline", workspace=str(self.workspace), commit=commit)
        return commit

    def iteration_commit(self, iteration: int) -> str | None:
        """The checkpoint recorded for ``iteration``, or None."""
        return self._resolve(iteration_ref(iteration))

    def checkpoint(self, iteration: int) -> str:
        """Record the current workspace as the checkpoint of ``iteration``.

        Idempotent for the same iteration and the same tree: if ``refs/iterations/<n>`` already
        holds this tree (e.g. a crash between checkpoint and the state.db commit, then the same
        step again) it is returned unchanged. If it holds another tree, it belongs to an attempt
        that was discarded (the act was cut and re-run): the ref moves to the new commit and the
        old one stays visible as ``refs/discarded/<n>/<commit>``.

        Returns: the commit id. Raises: NoBaseline, WorkspaceMissing, GitFailed, RefLocked.
        """
        if not isinstance(iteration, int) or iteration < 1:
            raise HistoryError(f"iteration must be an int >= 1, got {iteration!r}",
                               code="bad_iteration")
        if not (self._ready or (self.git_dir / "HEAD").exists()):
            raise NoBaseline("no baseline recorded; call baseline() before checkpoint()")
        try:
            return self._checkpoint_fast(iteration)
        except (FastPathUnavailable, OSError) as exc:
            self._fallback("checkpoint", exc)
            return self._gitpath.checkpoint(iteration, iteration_ref(iteration), self._ws(),
                                            self._cache.handed_to_git())

    def _checkpoint_fast(self, iteration: int) -> str:
        ref = iteration_ref(iteration)
        head = self._refs.read(HEAD_REF)
        if head is None:
            raise NoBaseline("no baseline recorded; call baseline() before checkpoint()")
        old = self._refs.read(ref)
        old_tree = self._tree_of(old).hex() if old else None
        self._ws()
        tree, node, dirty = self._cache.record(self._store(), head)
        if old_tree == tree:
            if head != old:  # same step again after a reset: continue from it
                self._refs.update(HEAD_REF, old, message=f"loop-org: iteration {iteration} again",
                                  also_log=("HEAD",))
            if dirty or head != old:
                self._cache.save(node, old)
            return old
        commit = self._write_commit(tree, [head], f"loop-org checkpoint\n\niteration: {iteration}")
        message = f"loop-org: checkpoint of iteration {iteration}"
        if old:
            discarded = f"refs/discarded/{iteration}/{old}"
            if self._refs.read(discarded) != old:  # already there if killed right after it
                self._refs.update(discarded, old, expect=None, message=message, reflog=False)
            log.warning("checkpoint_replaced", workspace=str(self.workspace),
                        iteration=iteration, discarded=old, commit=commit)
        self._refs.update(ref, commit, expect=old, message=message, reflog=False)
        self._refs.update(HEAD_REF, commit, message=message, also_log=("HEAD",))
        self._cache.save(node, commit)
        return commit

    def checkpoint_action(self, name: str) -> str:
        """Record the current workspace as the checkpoint of an action a human approved
        (``refs/actions/<name>``, on top of HEAD, so the next iteration starts from it and
        ``org diff`` shows it). Idempotent: an existing ref is returned unchanged.

        Returns: the commit id. Raises: NoBaseline, WorkspaceMissing, GitFailed, RefLocked.
        """
        if not name or not all(c.isalnum() or c in "-_" for c in name):
            raise HistoryError(f"an action checkpoint needs a plain name, got {name!r}", code="bad_action_name")
        ref = f"refs/actions/{name}"
        existing = self._resolve(ref)
        if existing:
            return existing
        if not (self._ready or (self.git_dir / "HEAD").exists()):
            raise NoBaseline("no baseline recorded; call baseline() before checkpoint_action()")
        message = f"loop-org: human-approved action {name}"
        try:
            head = self._refs.read(HEAD_REF)
            if head is None:
                raise NoBaseline("no baseline recorded; call baseline() before checkpoint_action()")
            self._ws()
            tree, node, _ = self._cache.record(self._store(), head)
            commit = self._write_commit(tree, [head], f"loop-org checkpoint\n\naction: {name}")
            self._refs.update(ref, commit, expect=None, message=message, reflog=False)
            self._refs.update(HEAD_REF, commit, message=message, also_log=("HEAD",))
            self._cache.save(node, commit)
        except (FastPathUnavailable, OSError) as exc:
            self._fallback("checkpoint_action", exc)
            commit = self._gitpath.checkpoint_ref(ref, message, self._ws(), self._cache.handed_to_git())
        log.info("action_checkpoint", workspace=str(self.workspace), action=name, commit=commit)
        return commit

    def fingerprint_of_workspace(self) -> str:
        """Tree id of the workspace as it is now (same content -> same id). Cheap."""
        self._ws()
        self._ensure_repo()
        try:
            head = self._refs.read(HEAD_REF)
            tree, node, dirty = self._cache.record(self._store(), head)
            if dirty:
                self._cache.save(node, head)
            return tree
        except (FastPathUnavailable, OSError) as exc:
            self._fallback("fingerprint", exc)
            return self._gitpath.stage(self._ws(), self._cache.handed_to_git())

    def tree_id(self, commit: str) -> str:
        """Tree id of a recorded commit. Raises: UnknownCommit."""
        oid = self._commit_of(commit)
        try:
            return self._tree_of(oid).hex()
        except FastPathUnavailable:
            return self._gitpath.tree_id(oid)

    # -- restoring -----------------------------------------------------------------------------

    def reset_to(self, commit: str) -> None:
        """Make the workspace exactly ``commit``: modified files restored, deleted files
        recreated, files and directories not in the commit removed (ignored ones too). The
        workspace's own ``.git`` is never touched. The next checkpoint's parent is ``commit``.

        Raises: UnknownCommit, WorkspaceMissing, GitFailed.
        """
        self._clear_stale_locks()
        target = self._commit_of(commit)
        ws = self._ws()
        try:
            head = self._refs.read(HEAD_REF)
            tree = self._tree_of(target)
            node, stale = self._cache.sync(self._store(), tree, head)
            if head != target:
                self._refs.update(HEAD_REF, target, message=f"loop-org: reset to {target}",
                                  also_log=("HEAD",))
            if stale or head != target:
                self._cache.save(node, target)
        except (FastPathUnavailable, OSError) as exc:
            self._fallback("reset", exc)
            self._cache.handed_to_git()
            self._gitpath.reset(target, ws)
        log.info("workspace_reset", workspace=str(self.workspace), commit=target)

    def delete(self) -> None:
        """Remove the whole shadow history (the workspace is untouched)."""
        shutil.rmtree(self.git_dir, ignore_errors=True)
        self._refs = self._make_refs()
        objects.forget(self.git_dir)
        statcache.forget_under(self.git_dir)
        self._ready = False
