"""Shadow git history of a workspace, kept in the org home and never inside the workspace.

``GIT_DIR`` is ``<org_home>/history/<work_id>.git`` and ``GIT_WORK_TREE`` is the workspace, so
nothing is ever written into the workspace (no ``.git``, no index, no lock file). Git never
treats an entry named ``.git`` as part of a work tree, so a workspace that is itself a git
repository keeps its own ``.git`` untouched: it is neither recorded, restored nor cleaned.

Everything else is recorded, ignored files included (``add --force``): the eval-agent must
verify exactly what the doer produced. Git records files, not directories, so empty
directories are not part of a checkpoint (a reset removes them).

Checkpoint cost grows with what changed, not with the workspace size: a private index kept in
the git dir carries git's stat cache (and the untracked cache), so ``add`` only rehashes files
whose stat data changed, and the cache-tree makes ``write-tree`` rewrite only changed trees.

Refs: ``refs/loop-org/baseline``, ``refs/iterations/<n>`` per committed iteration,
``refs/heads/checkpoints`` (HEAD, the parent of the next checkpoint), and
``refs/discarded/<n>/<commit>`` for a checkpoint replaced by a later attempt of iteration n.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Sequence

import structlog

from roles.workspace.protect import DEFAULT_PROTECTED_PATTERNS, match_paths
from state_db.errors import StateError

log = structlog.get_logger("loop_agent.history")

BASELINE_REF = "refs/loop-org/baseline"
HEAD_REF = "refs/heads/checkpoints"
_ZERO = "0" * 40

# Repository settings that keep a checkpoint proportional to what changed, and keep user or
# system configuration (hooks, autocrlf, fsmonitor daemons, excludes) out of the picture.
_REPO_CONFIG = (
    ("core.untrackedCache", "true"),
    ("core.fsmonitor", "false"),
    ("core.autocrlf", "false"),
    ("core.safecrlf", "false"),
    ("core.symlinks", "true"),
    ("core.fileMode", "true"),
    ("core.quotePath", "false"),
    ("core.logAllRefUpdates", "always"),
    ("gc.auto", "0"),
    ("index.version", "4"),
    # Writing a fresh snapshot is I/O bound: parallel workers help even on 2 cores.
    ("checkout.workers", "4"),
    ("advice.addEmbeddedRepo", "false"),
    ("commit.gpgSign", "false"),
)


class HistoryError(StateError):
    """Base error of the workspace history; ``code`` is machine-readable."""

    code = "history_error"


class GitMissing(HistoryError):
    code = "git_missing"


class WorkspaceMissing(HistoryError):
    code = "workspace_missing"


class UnknownCommit(HistoryError):
    code = "unknown_commit"


class NoBaseline(HistoryError):
    code = "no_baseline"


class GitFailed(HistoryError):
    """A git command failed; ``args``, ``returncode`` and ``stderr`` say which and why."""

    code = "git_failed"

    def __init__(self, args: Sequence[str], returncode: int, stderr: str) -> None:
        self.git_args = tuple(args)
        self.returncode = returncode
        self.stderr = stderr
        super().__init__(
            f"git {' '.join(args[:3])} exited {returncode}: {stderr.strip()[:500]}; "
            "check the workspace is readable and the org home is writable"
        )


def iteration_ref(iteration: int) -> str:
    return f"refs/iterations/{iteration}"


def _inside(path: Path, root: Path) -> bool:
    """True if ``path`` is ``root`` or below it (symlinks resolved)."""
    p, r = os.path.realpath(path), os.path.realpath(root)
    return p == r or p.startswith(r.rstrip(os.sep) + os.sep)


class WorkspaceHistory:
    """Baseline, checkpoints, reset, diff and snapshots of one workspace.

    Args:
        git_dir: where the shadow repository lives (``<org_home>/history/<work_id>.git``);
            created on first use. Must not be inside ``workspace``.
        workspace: the directory the agent works in.
        git: the git executable.

    Raises:
        HistoryError(code="history_inside_workspace"): ``git_dir`` is inside the workspace.
    """

    def __init__(self, git_dir: Path, workspace: Path, *, git: str = "git") -> None:
        self.git_dir = Path(git_dir).absolute()
        self.workspace = Path(workspace).absolute()
        self._git_exe = git
        if _inside(self.git_dir, self.workspace):
            raise HistoryError(
                f"history {self.git_dir} is inside workspace {self.workspace}; "
                "keep it in the org home",
                code="history_inside_workspace",
            )
        env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
        env.update(
            GIT_CONFIG_NOSYSTEM="1",
            GIT_CONFIG_GLOBAL=os.devnull,
            GIT_TERMINAL_PROMPT="0",
            GIT_AUTHOR_NAME="loop-org",
            GIT_AUTHOR_EMAIL="loop-org@localhost",
            GIT_COMMITTER_NAME="loop-org",
            GIT_COMMITTER_EMAIL="loop-org@localhost",
        )
        self._env = env
        self._ready = (self.git_dir / "HEAD").exists()

    # -- plumbing -------------------------------------------------------------------------

    def _run(
        self,
        args: Sequence[str],
        *,
        work_tree: Path | None = None,
        input: bytes | None = None,
        env: dict[str, str] | None = None,
        ok: tuple[int, ...] = (0,),
        git_dir: Path | None = None,
    ) -> subprocess.CompletedProcess[bytes]:
        cmd = [self._git_exe, f"--git-dir={git_dir or self.git_dir}"]
        if work_tree is not None:
            cmd.append(f"--work-tree={work_tree}")
        try:
            proc = subprocess.run(
                cmd + list(args),
                input=input,
                capture_output=True,
                env=env or self._env,
                cwd=work_tree or "/",
            )
        except FileNotFoundError as exc:
            if work_tree is not None and not work_tree.is_dir():
                raise WorkspaceMissing(f"workspace {work_tree} does not exist") from exc
            raise GitMissing(
                f"git executable {self._git_exe!r} not found; install git to record workspaces"
            ) from exc
        if proc.returncode not in ok:
            raise GitFailed(args, proc.returncode, proc.stderr.decode("utf-8", "replace"))
        return proc

    def _out(self, args: Sequence[str], **kw) -> str:
        return self._run(args, **kw).stdout.decode("utf-8", "surrogateescape").strip()

    def _ws(self) -> Path:
        """The workspace, checked to exist (git would otherwise record an empty tree)."""
        if not self.workspace.is_dir():
            raise WorkspaceMissing(
                f"workspace {self.workspace} is missing; restore it or cancel the work item"
            )
        return self.workspace

    def _ensure_repo(self) -> None:
        if self._ready:
            return
        # Initialise beside the final path and rename, so a crash never leaves half a repo.
        self.git_dir.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.git_dir.with_name(f".{self.git_dir.name}.init-{uuid.uuid4().hex[:8]}")
        try:
            self._run(["init", "--quiet", "--bare"], git_dir=tmp)
            for key, value in _REPO_CONFIG:
                self._run(["config", key, value], git_dir=tmp)
            self._run(["symbolic-ref", "HEAD", HEAD_REF], git_dir=tmp)
            try:
                os.rename(tmp, self.git_dir)
            except OSError:
                if not (self.git_dir / "HEAD").exists():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        self._ready = True

    def _resolve(self, rev: str) -> str | None:
        if not self._ready and not (self.git_dir / "HEAD").exists():
            return None  # reading never creates a history
        self._ready = True
        if not rev or rev.startswith("-"):
            return None  # never let a caller's value reach git as an option
        proc = self._run(["rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"], ok=(0, 1))
        return proc.stdout.decode().strip() or None

    def _commit_of(self, rev: str) -> str:
        commit = self._resolve(rev)
        if commit is None:
            raise UnknownCommit(f"{rev!r} is not a commit of history {self.git_dir}")
        return commit

    def _stage_tree(self) -> str:
        """Stage the whole workspace into the private index and return its tree id."""
        ws = self._ws()
        self._run(["add", "--all", "--force"], work_tree=ws)
        return self._out(["write-tree"], work_tree=ws)

    def _clear_stale_locks(self) -> None:
        """Remove lock files a killed writer left (``index.lock``, ``refs/**.lock``, ...).

        Only the loop-agent running the work item writes the index and refs, one process at a
        time; it calls this when it (re)starts a run or an attempt (``baseline``, ``reset_to``),
        so a lock found then belongs to a process that died. Snapshot indexes are separate.
        """
        if not self.git_dir.is_dir():
            return
        stale = [self.git_dir / n for n in ("index.lock", "HEAD.lock", "packed-refs.lock")]
        stale += list((self.git_dir / "refs").rglob("*.lock"))
        for lock in stale:
            if lock.exists():
                log.warning("history_stale_lock_removed", lock=str(lock))
                lock.unlink(missing_ok=True)

    def _ls_tree(self, commit: str) -> dict[str, bytes]:
        """Map path -> raw ``ls-tree`` entry (``mode type oid\\tpath``) for every file."""
        raw = self._run(["ls-tree", "-r", "-z", "--full-tree", commit]).stdout
        entries = {}
        for entry in raw.split(b"\0"):
            if entry:
                path = entry.split(b"\t", 1)[1].decode("utf-8", "surrogateescape")
                entries[path] = entry
        return entries

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
            return existing
        self._ensure_repo()
        tree = self._stage_tree()
        commit = self._out(["commit-tree", tree, "-m", "loop-org baseline"])
        self._run(
            ["update-ref", "--stdin"],
            input=f"create {BASELINE_REF} {commit}\nupdate {HEAD_REF} {commit}\n".encode(),
        )
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

        Returns: the commit id. Raises: NoBaseline, WorkspaceMissing, GitFailed.
        """
        if not isinstance(iteration, int) or iteration < 1:
            raise HistoryError(f"iteration must be an int >= 1, got {iteration!r}",
                               code="bad_iteration")
        ref = iteration_ref(iteration)
        known = {}
        if self._ready or (self.git_dir / "HEAD").exists():
            heads = self._out(["for-each-ref", "--format=%(refname) %(objectname) %(tree)",
                               ref, HEAD_REF])
            known = {name: (oid, tree) for name, oid, tree in map(str.split, heads.splitlines())}
        if HEAD_REF not in known:
            raise NoBaseline("no baseline recorded; call baseline() before checkpoint()")
        tree = self._stage_tree()
        old, old_tree = known.get(ref, (None, None))
        parent = known[HEAD_REF][0]
        if old_tree == tree:
            if parent != old:  # same step again after a reset: continue from it
                self._run(["update-ref", HEAD_REF, old])
            return old
        message = f"loop-org checkpoint\n\niteration: {iteration}"
        commit = self._out(["commit-tree", tree, "-p", parent, "-m", message])
        updates = [f"update {ref} {commit} {old or _ZERO}", f"update {HEAD_REF} {commit}"]
        if old:
            updates.append(f"create refs/discarded/{iteration}/{old} {old}")
            log.warning("checkpoint_replaced", workspace=str(self.workspace),
                        iteration=iteration, discarded=old, commit=commit)
        self._run(["update-ref", "--stdin"], input=("\n".join(updates) + "\n").encode())
        return commit

    def fingerprint_of_workspace(self) -> str:
        """Tree id of the workspace as it is now (same content -> same id). Cheap."""
        self._ensure_repo()
        return self._stage_tree()

    def tree_id(self, commit: str) -> str:
        """Tree id of a recorded commit. Raises: UnknownCommit."""
        return self._out(["rev-parse", f"{self._commit_of(commit)}^{{tree}}"])

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
        self._run(["read-tree", "--reset", "-u", target], work_tree=ws)
        # -ff also removes git repositories the agent created in subdirectories.
        self._run(["clean", "-ffdxq"], work_tree=ws)
        self._run(["update-ref", HEAD_REF, target])
        log.info("workspace_reset", workspace=str(self.workspace), commit=target)

    # -- showing ---------------------------------------------------------------------------------

    def _range(self, from_commit: str | None, to_commit: str | None) -> tuple[str, str]:
        start = self._commit_of(from_commit or BASELINE_REF)
        return start, self._commit_of(to_commit or HEAD_REF)

    def diff_bytes(self, from_commit: str | None = None, to_commit: str | None = None) -> bytes:
        """Unified, binary-safe patch (``git apply`` reads it) between two commits.

        Defaults: from the baseline to the latest checkpoint. Raises: UnknownCommit.
        """
        a, b = self._range(from_commit, to_commit)
        return self._run(
            ["diff", "--binary", "--full-index", "--no-renames", "--no-color",
             "--no-ext-diff", "--no-textconv", a, b]
        ).stdout

    def diff(self, from_commit: str | None = None, to_commit: str | None = None) -> str:
        """``diff_bytes`` as text; undecodable bytes survive via ``surrogateescape``."""
        return self.diff_bytes(from_commit, to_commit).decode("utf-8", "surrogateescape")

    def export_patch(
        self, dest: Path, from_commit: str | None = None, to_commit: str | None = None
    ) -> Path:
        """Write the patch to ``dest`` atomically and return ``dest``."""
        dest = Path(dest)
        data = self.diff_bytes(from_commit, to_commit)
        tmp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex[:8]}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, dest)
        return dest

    def changed_paths(self, a: str, b: str) -> list[str]:
        """Paths added, modified, deleted or changed in mode between commits ``a`` and ``b``."""
        raw = self._run(
            ["diff", "--name-only", "-z", "--no-renames", self._commit_of(a), self._commit_of(b)]
        ).stdout
        return sorted(p.decode("utf-8", "surrogateescape") for p in raw.split(b"\0") if p)

    # -- protected paths and snapshots ---------------------------------------------------------

    def protected_paths(
        self, baseline: str | None = None,
        patterns: Sequence[str] = DEFAULT_PROTECTED_PATTERNS,
    ) -> list[str]:
        """Files present at ``baseline`` (default: the recorded one) matching ``patterns``."""
        return match_paths(self._ls_tree(self._commit_of(baseline or BASELINE_REF)), patterns)

    def _snapshot_index(self, dest: Path) -> Path:
        key = hashlib.sha1(os.path.realpath(dest).encode("utf-8", "surrogateescape")).hexdigest()
        return self.git_dir / "snapshots" / f"{key[:20]}.index"

    def _restored_tree(self, target: str, source_entries: dict[str, bytes],
                       paths: Sequence[str]) -> str:
        """Tree of ``target`` with ``paths`` taken from ``source_entries`` (a private index)."""
        index = self.git_dir / f"restore-{os.getpid()}-{uuid.uuid4().hex[:8]}.index"
        env = dict(self._env, GIT_INDEX_FILE=str(index))
        try:
            self._run(["read-tree", target], env=env)
            # --replace drops entries in the way (a file where a directory was, or back).
            self._run(["update-index", "-z", "--replace", "--index-info"], env=env,
                      input=b"".join(source_entries[p] + b"\0" for p in paths))
            return self._out(["write-tree"], env=env)
        finally:
            index.unlink(missing_ok=True)

    def materialize(
        self,
        commit: str,
        dest_dir: Path,
        *,
        restore_from: str | None = None,
        paths: Sequence[str] | None = None,
    ) -> list[str]:
        """Write ``commit`` into ``dest_dir`` with ``paths`` restored from ``restore_from``.

        ``dest_dir`` must be absent, empty, or a snapshot this history wrote before (one
        writer per snapshot directory; a torn one is rewritten whole): then only
        what differs is rewritten and anything else found there (build output, files the
        verify commands wrote) is removed, so re-verifying the next checkpoint costs what
        changed, not the workspace size. Tampering is caught by git's stat check (ctime
        included), never trusted to mtimes alone.

        Args:
            commit: what to write (typically a checkpoint).
            dest_dir: the snapshot directory.
            restore_from: where protected content comes from (default: the baseline).
            paths: protected paths (default: ``protected_paths(restore_from)``); those absent
                from ``restore_from`` are ignored.
        Returns: the protected paths that differ between ``restore_from`` and ``commit``
            (modified, deleted or mode-changed), sorted; the snapshot has them restored.
        Raises: UnknownCommit, GitFailed, HistoryError with code ``dest_not_empty`` or
            ``dest_inside_workspace``.
        """
        target = self._commit_of(commit)
        source = self._commit_of(restore_from or BASELINE_REF)
        dest = Path(dest_dir).absolute()
        if _inside(dest, self.workspace):
            raise HistoryError(f"snapshot directory {dest} is inside the workspace; "
                               "write snapshots elsewhere", code="dest_inside_workspace")
        index = self._snapshot_index(dest)
        lock = index.with_name(index.name + ".lock")
        if lock.exists():
            # One writer per snapshot directory: a lock means the last one was killed midway.
            log.warning("snapshot_torn", snapshot=str(dest))
            self.discard_snapshot(dest)
        fresh = not dest.exists() or not any(dest.iterdir())
        if not fresh and not index.exists():
            raise HistoryError(f"snapshot directory {dest} is not empty and was not written "
                               "by this history; pass a fresh one", code="dest_not_empty")
        if fresh:
            index.unlink(missing_ok=True)
        dest.mkdir(parents=True, exist_ok=True)
        index.parent.mkdir(exist_ok=True)
        source_entries = self._ls_tree(source)
        wanted = set(match_paths(source_entries, DEFAULT_PROTECTED_PATTERNS)
                     if paths is None else paths) & source_entries.keys()
        differing = sorted(wanted & set(self.changed_paths(source, target)))
        tree = self._restored_tree(target, source_entries, differing) if differing else target
        env = dict(self._env, GIT_INDEX_FILE=str(index))
        self._run(["read-tree", "--reset", "-u", tree], work_tree=dest, env=env)
        if not fresh:
            self._run(["clean", "-ffdxq"], work_tree=dest, env=env)
        return differing

    def discard_snapshot(self, dest_dir: Path) -> None:
        """Remove a snapshot directory written by ``materialize`` and its private index."""
        dest = Path(dest_dir).absolute()
        index = self._snapshot_index(dest)
        shutil.rmtree(dest, ignore_errors=True)
        index.unlink(missing_ok=True)
        index.with_name(index.name + ".lock").unlink(missing_ok=True)

    def delete(self) -> None:
        """Remove the whole shadow history (the workspace is untouched)."""
        shutil.rmtree(self.git_dir, ignore_errors=True)
        self._ready = False
