"""Shadow git history of a workspace, kept in the org home and never inside the workspace.

The repository is ``<org_home>/history/<work_id>.git`` and its work tree is the workspace, so
nothing is ever written into the workspace (no ``.git``, no index, no lock file). An entry named
``.git`` is never part of a work tree, so a workspace that is itself a git repository keeps its
own ``.git`` untouched: it is neither recorded, restored nor cleaned. A repository nested below
the top is recorded as a gitlink to its ``HEAD``, as git's ``add`` records it.

Everything else is recorded, ignored files included: the eval-agent must verify exactly what the
doer produced. Build caches (``__pycache__``, ``.pytest_cache``, ...) are left out. Git records
files, not directories, so empty directories are not part of a checkpoint (a reset removes
them).

Everything runs in-process on libgit2 (``shadow``); no git process is started. Checkpoint cost
grows with what changed, not with the workspace size: the history's index (``<git_dir>/index``)
is the stat cache, so only files whose stat changed are read and only the trees above them are
written; a reset or a snapshot rewrites only what differs.

Crash contract (kill -9 at any point): once ``checkpoint`` returns, the checkpoint is a git
commit that its ref names, in git's own files. Objects are written before the refs that name
them and refs under git's lock protocol, so a kill leaves at worst objects no ref names and a
stale lock file, which the next ``baseline`` or ``reset_to`` (the first steps of a restarted
run) clears. ``git fsck`` accepts the history at any moment, and the next run reads the last
recorded checkpoint.

The running loop's history (``defer=True``) keeps its index in memory and writes it out every
``INDEX_EVERY`` changed entries and when the run stops (``flush_pending``): an older index on
disk is never wrong, a later reader only reads the files changed since again. It also moves
``refs/heads/checkpoints`` only when the run stops, resets or records an action: each checkpoint
is named at once by its own new ``refs/iterations/<n>``, and moving the branch too would replace
a file on every checkpoint, which ext4 answers by flushing the new file's data (about half a
millisecond on this machine's disk, several when it is busy). A kill leaves the branch at an
earlier checkpoint, which ``git fsck`` accepts; the restarted run's first step is a
``reset_to`` the last checkpoint state.db recorded, which moves it.

Refs: ``refs/loop-org/baseline``, ``refs/iterations/<n>`` per committed iteration,
``refs/heads/checkpoints`` (HEAD, the parent of the next checkpoint, with its reflog), and
``refs/discarded/<n>/<commit>`` for a checkpoint replaced by a later attempt of iteration n.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Callable

import pygit2
import structlog

from roles.workbench.workspace import shadow
from roles.workbench.workspace.errors import (  # noqa: F401 - re-exported: callers import them from here
    HistoryError, NoBaseline, RefConflict, RefLocked, UnknownCommit, WorkspaceMissing,
)
from roles.workbench.workspace.shadow import ANY
from roles.workbench.workspace.views import BASELINE_REF, HEAD_REF, HistoryViews, inside

log = structlog.get_logger("loop_agent.history")

INDEX_EVERY = 64  # a deferring history writes its index out after this many changed entries


def iteration_ref(iteration: int) -> str:
    return f"refs/iterations/{iteration}"


class WorkspaceHistory(HistoryViews):
    """Baseline, checkpoints, reset, diff and snapshots of one workspace.

    Args:
        git_dir: where the shadow repository lives (``<org_home>/history/<work_id>.git``);
            created on first use. Must not be inside ``workspace``.
        workspace: the directory the agent works in.
        on_step: called with the name of each durable write step (``commit_written``,
            ``ref_updated:<ref>``, ``index_written``, ``snapshot_writing``); tests kill the
            process there to prove crash safety.
        defer: keep the index in memory and write it out now and then (every ``INDEX_EVERY``
            changed entries, and at ``flush_pending``), and move the branch ref (HEAD) at
            ``flush_pending``, ``reset_to`` and ``checkpoint_action``: for the one writer of a
            running loop. Commits and each checkpoint's own ref are never deferred.

    Raises:
        HistoryError(code="history_inside_workspace"): ``git_dir`` is inside the workspace.
    """

    def __init__(self, git_dir: Path, workspace: Path, *,
                 on_step: Callable[[str], None] | None = None, defer: bool = False) -> None:
        self.git_dir = Path(git_dir).absolute()
        self.workspace = Path(workspace).absolute()
        if inside(self.git_dir, self.workspace):
            raise HistoryError(
                f"history {self.git_dir} is inside workspace {self.workspace}; "
                "keep it in the org home",
                code="history_inside_workspace",
            )
        self._step = on_step or (lambda step: None)
        self._every = INDEX_EVERY if defer else 1
        self._defer = defer
        self._head: str | None = None   # where HEAD moves at the next flush (``defer``)
        self._commits: dict[str, pygit2.Oid] = {}   # commit id -> its tree, for ids resolved before
        self._head_file = os.fspath(self.git_dir / "HEAD")
        self._there = False             # seen to exist: a history is only ever removed by delete()

    # -- plumbing -------------------------------------------------------------------------

    def _exists(self) -> bool:
        if not self._there:             # asked ~9 times an iteration
            self._there = os.path.exists(self._head_file)
        return self._there

    def _shadow(self) -> shadow.Shadow:
        return shadow.shadow_for(self.git_dir, self.workspace)

    @property
    def _repo(self) -> pygit2.Repository:
        return self._shadow().repo

    def _ws(self) -> Path:
        """The workspace, checked to exist (it would otherwise be recorded as empty)."""
        if not self.workspace.is_dir():
            raise WorkspaceMissing(
                f"workspace {self.workspace} is missing; restore it or cancel the work item"
            )
        return self.workspace

    def _ensure_repo(self) -> None:
        if not self._exists():
            shadow.create(self.git_dir, HEAD_REF)

    def _ref(self, name: str) -> str | None:
        return shadow.read_ref(self._repo, name)

    def _current_head(self) -> str | None:
        """The parent of the next checkpoint: HEAD, or where it moves at the next flush."""
        if self._head is not None:
            return self._head
        return self._ref(HEAD_REF) if self._exists() else None

    def _move_head(self, commit: str, message: str) -> None:
        """Move HEAD to ``commit`` now, or at the next flush for a deferring history."""
        if self._defer:
            self._head = commit
        else:
            self._set_ref(HEAD_REF, commit, message)

    def _write_head(self) -> None:
        """Move HEAD where a deferring history said it goes."""
        if self._head is not None:
            if self._ref(HEAD_REF) != self._head:
                self._set_ref(HEAD_REF, self._head, "loop-org: checkpoints of the run")
            self._head = None

    def _set_ref(self, name: str, new: str, message: str, *, expect: object = ANY) -> None:
        shadow.set_ref(self._repo, name, new, expect=expect, message=message)
        self._step(f"ref_updated:{name}")

    def _resolve(self, rev: str) -> str | None:
        if not self._exists():
            return None  # reading never creates a history
        if rev in self._commits:
            return rev   # a commit id seen before: objects never change (the loop asks ~9 times an iteration)
        if not rev or rev.startswith("-"):
            return None  # never let a caller's value pass for an option
        try:
            commit = self._repo.revparse_single(rev).peel(pygit2.Commit)
        except (KeyError, ValueError, TypeError, pygit2.GitError):
            return None
        found = str(commit.id)
        if found == rev:
            if len(self._commits) >= 4096:
                self._commits.clear()
            self._commits[rev] = commit.tree_id
        return found

    def _commit_of(self, rev: str) -> str:
        commit = self._resolve(rev)
        if commit is None:
            raise UnknownCommit(f"{rev!r} is not a commit of history {self.git_dir}")
        return commit

    def _tree_of(self, commit: str) -> pygit2.Oid:
        tree = self._commits.get(commit)
        return tree if tree is not None else self._repo[commit].tree_id

    def _write_commit(self, tree: str, parents: list[str], message: str) -> str:
        sig = shadow.signature()
        commit = self._repo.create_commit(None, sig, sig, message + "\n", pygit2.Oid(hex=tree),
                                          [pygit2.Oid(hex=p) for p in parents])
        self._step("commit_written")
        return str(commit)

    def _record(self) -> str:
        """Record the workspace (it must exist) and return its tree id."""
        self._ws()
        return self._shadow().record()[0]

    def _settle(self, every: int | None = None) -> None:
        if self._shadow().settle_index(every or self._every):
            self._step("index_written")

    def _clear_stale_locks(self) -> None:
        """Remove lock files a killed writer left (``index.lock``, ``refs/**.lock``, ...).

        Only the loop-agent running the work item writes the index and refs, one process at a
        time; it calls this when it (re)starts a run or an attempt (``baseline``, ``reset_to``),
        so a lock found then belongs to a process that died. Snapshots have their own.
        """
        for lock in shadow.clear_stale_locks(self.git_dir):
            log.warning("history_stale_lock_removed", lock=str(lock))

    def flush_pending(self) -> None:
        """Write the index out if it changed in memory (``defer``); cheap when it did not. The
        loop calls it when it stops."""
        if self._exists():
            self._write_head()
            self._settle(1)

    # -- recording --------------------------------------------------------------------------

    def baseline_commit(self) -> str | None:
        """The recorded baseline, or None if none was taken yet."""
        return self._resolve(BASELINE_REF)

    def baseline(self) -> str:
        """Record the workspace as it is now as the baseline; idempotent.

        Returns: the baseline commit id (the existing one if already recorded).
        Raises: WorkspaceMissing, HistoryError.
        """
        self._clear_stale_locks()
        existing = self.baseline_commit()
        if existing:
            if self._ref(HEAD_REF) is None:  # killed between the two ref writes
                self._set_ref(HEAD_REF, existing, "loop-org: baseline")
            return existing
        self._ws()
        self._ensure_repo()
        commit = self._write_commit(self._record(), [], "loop-org baseline")
        # HEAD first: a crash before the baseline ref leaves a history that baselines again.
        self._set_ref(HEAD_REF, commit, "loop-org: baseline")
        self._set_ref(BASELINE_REF, commit, "loop-org: baseline", expect=None)
        self._settle(1)
        log.info("workspace_baseline", workspace=str(self.workspace), commit=commit)
        return commit

    def ensure_held(self, commit: str) -> None:
        """Make sure ``commit`` and the baseline are in this history before they are read. A
        local history holds everything it recorded: nothing to do (``RemoteHistory`` fetches)."""

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

        Returns: the commit id. Raises: NoBaseline, WorkspaceMissing, RefLocked, RefConflict.
        """
        if not isinstance(iteration, int) or iteration < 1:
            raise HistoryError(f"iteration must be an int >= 1, got {iteration!r}",
                               code="bad_iteration")
        head = self._current_head()
        if head is None:
            raise NoBaseline("no baseline recorded; call baseline() before checkpoint()")
        ref = iteration_ref(iteration)
        old = self._ref(ref)
        tree = self._record()
        if old is not None and str(self._tree_of(old)) == tree:
            if head != old:  # same step again after a reset: continue from it
                self._move_head(old, f"loop-org: iteration {iteration} again")
            self._settle()
            return old
        commit = self._write_commit(tree, [head], f"loop-org checkpoint\n\niteration: {iteration}")
        message = f"loop-org: checkpoint of iteration {iteration}"
        if old:
            discarded = f"refs/discarded/{iteration}/{old}"
            if self._ref(discarded) != old:  # already there if killed right after it
                self._set_ref(discarded, old, message, expect=None)
            log.warning("checkpoint_replaced", workspace=str(self.workspace),
                        iteration=iteration, discarded=old, commit=commit)
        self._set_ref(ref, commit, message, expect=old)
        self._move_head(commit, message)
        self._settle()
        return commit

    def checkpoint_action(self, name: str) -> str:
        """Record the current workspace as the checkpoint of an action a human approved
        (``refs/actions/<name>``, on top of HEAD, so the next iteration starts from it and
        ``org diff`` shows it). Idempotent: an existing ref is returned unchanged.

        Returns: the commit id. Raises: NoBaseline, WorkspaceMissing, RefLocked.
        """
        if not name or not all(c.isalnum() or c in "-_" for c in name):
            raise HistoryError(f"an action checkpoint needs a plain name, got {name!r}", code="bad_action_name")
        ref = f"refs/actions/{name}"
        existing = self._resolve(ref)
        if existing:
            return existing
        head = self._current_head()
        if head is None:
            raise NoBaseline("no baseline recorded; call baseline() before checkpoint_action()")
        message = f"loop-org: human-approved action {name}"
        commit = self._write_commit(self._record(), [head], f"loop-org checkpoint\n\naction: {name}")
        self._set_ref(ref, commit, message, expect=None)
        self._set_ref(HEAD_REF, commit, message)
        self._head = None
        self._settle()
        log.info("action_checkpoint", workspace=str(self.workspace), action=name, commit=commit)
        return commit

    def record_apart(self, ref: str, parent: str, message: str) -> str | None:
        """Record the workspace as it is now as a commit on top of ``parent``, named by ``ref``
        (which must be new), without moving HEAD: changes kept apart from the run's result
        (``delivered``). Idempotent: an existing ``ref`` is returned unchanged. Returns None when
        the workspace holds ``parent``'s tree exactly.
        Raises: UnknownCommit, WorkspaceMissing, RefLocked, RefConflict."""
        existing = self._resolve(ref)
        if existing:
            return existing
        base = self._commit_of(parent)
        tree = self._record()
        self._settle()
        if tree == str(self._tree_of(base)):
            return None
        commit = self._write_commit(tree, [base], message)
        self._set_ref(ref, commit, message.splitlines()[0], expect=None)
        return commit

    def changed_in_workspace(self, since: str) -> list[str]:
        """Paths the workspace has changed since commit ``since`` (recorded, not committed: no
        ref moves). Raises WorkspaceMissing."""
        return sorted(self._changed(self._tree_of(self._commit_of(since)), self._record()))

    def fingerprint_of_workspace(self) -> str:
        """Tree id of the workspace as it is now (same content -> same id). Cheap."""
        self._ws()
        self._ensure_repo()
        tree = self._record()
        self._settle()
        return tree

    def tree_id(self, commit: str) -> str:
        """Tree id of a recorded commit. Raises: UnknownCommit."""
        return str(self._tree_of(self._commit_of(commit)))

    # -- restoring -----------------------------------------------------------------------------

    def reset_to(self, commit: str) -> None:
        """Make the workspace exactly ``commit``: modified files restored, deleted files
        recreated, files and directories not in the commit removed (ignored ones and nested
        repositories too). The workspace's own ``.git`` is never touched. The next checkpoint's
        parent is ``commit``.

        Raises: UnknownCommit, WorkspaceMissing, RefLocked.
        """
        self._clear_stale_locks()
        target = self._commit_of(commit)
        self._ws()
        self._shadow().sync(str(self._tree_of(target)))
        self._head = None
        if self._ref(HEAD_REF) != target:
            self._set_ref(HEAD_REF, target, f"loop-org: reset to {target}")
        self._settle()
        log.info("workspace_reset", workspace=str(self.workspace), commit=target)

    def delete(self) -> None:
        """Remove the whole shadow history (the workspace is untouched)."""
        shadow.forget(self.git_dir)
        self._commits.clear()
        self._there = False
        shutil.rmtree(self.git_dir, ignore_errors=True)
