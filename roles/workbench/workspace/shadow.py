"""The shadow repository on libgit2 (pygit2): created, recorded into, checked out, its refs moved.

libgit2 is configured by ``safegit``: no user or system configuration is read, and it runs
nothing a repository names (no hook, no filter or diff driver, no fsmonitor). No content
conversion happens either way, whatever the workspace's ``.gitattributes`` ask for: every
repository made here has ``info/attributes`` (``ATTRIBUTES``), which git and libgit2 read after
every ``.gitattributes`` and which unsets ``text``, ``eol``, ``ident``, ``filter`` and
``working-tree-encoding`` for every path. A file is recorded as the bytes the workspace holds and
written out as the bytes recorded, so the workspace, the history and every snapshot hold the same
bytes (what the checks run on is what the user gets); ``core.autocrlf`` is off in ``REPO_CONFIG``.

Crash safety (kill -9 at any point): libgit2 writes an object to a temp file renamed into place,
a ref under git's lock protocol (``<ref>.lock`` renamed over the ref, then its reflog line
appended) and an index as ``index.lock`` renamed over the index. A killed writer leaves the old
or the new file, at worst a stale lock (``clear_stale_locks``) and objects no ref names, which
``git fsck`` accepts; callers write objects before the refs that name them.

The index is the stat cache. Its entries say which blob each file held when its stat (mtime,
ctime, inode, size, mode, owner) was taken, so a scan hashes only files whose stat changed,
and racily clean ones, as git does. An index on disk is never wrong, only older: an entry whose
stat no longer matches is read again. So a writer may keep its index in memory and write it out
now and then (``Shadow.save_index``); anything that happened since is found by stat.

A directory is made to hold a tree (``Shadow.sync``) in two steps: one libgit2 scan of the
directory against the index finds what the index does not describe (changed by stat, ctime
included, so a rewritten file is caught even with its mtime put back; new files and folders,
empty ones too, nested repositories) and removes it; then libgit2's checkout writes the paths
where the index and the tree differ, and only those. The directory's own ``.git`` entries are
never looked at (libgit2 skips them), so a workspace that is a repository keeps its ``.git``.

Build caches (``CACHE_DIRS``) are never recorded, at any depth: they are not the doer's work,
change on every run, and would make every checkpoint (and the no-progress fingerprint) differ.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time
import uuid
from pathlib import Path

import pygit2
import structlog
from pygit2.enums import CheckoutStrategy, DeltaStatus, DiffOption, FileMode, RepositoryOpenFlag

from roles.workbench.workspace import safegit
from roles.workbench.workspace.errors import HistoryError, RefConflict, RefLocked

log = structlog.get_logger("loop_agent.history")
safegit.libgit2()  # the process-wide configuration, before any repository is opened

CACHE_DIRS = frozenset({b"__pycache__", b".pytest_cache", b".mypy_cache", b".ruff_cache"})
NAME, EMAIL = "loop-org", "loop-org@localhost"
ANY = object()  # ``set_ref``'s ``expect``: move the ref whatever it holds

# Settings of the shadow repository, for libgit2 and for anyone running git on it.
REPO_CONFIG = (
    ("core.logAllRefUpdates", "true"),   # reflogs for refs/heads/* and HEAD only
    ("core.autocrlf", "false"),
    ("core.safecrlf", "false"),
    ("core.symlinks", "true"),
    ("core.fileMode", "true"),
    ("core.trustctime", "true"),
    ("core.fsmonitor", "false"),
    ("core.quotePath", "false"),
    ("gc.auto", "0"),
    ("commit.gpgSign", "false"),
    ("user.name", NAME),                 # the reflog's identity
    ("user.email", EMAIL),
)

# Read after every .gitattributes (info/attributes comes last): no path of a shadow repository is
# ever converted on its way in or out (line endings, keyword expansion, filters, encodings).
ATTRIBUTES = b"* -text -eol -crlf -ident -filter -working-tree-encoding\n"

_D = DiffOption
# Recording: every file not recorded as it is now, new folders reported whole (walked here, so a
# build cache is never descended into), nested repositories left to their HEAD.
_RECORD = (_D.INCLUDE_UNTRACKED | _D.INCLUDE_IGNORED | _D.INCLUDE_TYPECHANGE | _D.SKIP_BINARY_CHECK
           | _D.UPDATE_INDEX | _D.IGNORE_SUBMODULES)
# Scanning a snapshot: the same, without writing the index out. A file written since the index
# was last written is racily clean to libgit2 (its stat is not older than the index file), is read
# again and, with UPDATE_INDEX, has the whole index written for it: every snapshot, since each
# one writes what changed. Reading a few such files again costs less than writing the index.
_SCAN = _RECORD & ~_D.UPDATE_INDEX
_C = CheckoutStrategy
_CHECKOUT_PATHS = _C.FORCE | _C.RECREATE_MISSING | _C.DISABLE_PATHSPEC_MATCH | _C.DONT_WRITE_INDEX
_CHECKOUT_ALL = _C.FORCE | _C.RECREATE_MISSING | _C.REMOVE_UNTRACKED | _C.REMOVE_IGNORED | _C.DONT_WRITE_INDEX
_GONE = (DeltaStatus.DELETED,)
_NEW = (DeltaStatus.UNTRACKED, DeltaStatus.IGNORED)


def signature() -> pygit2.Signature:
    """The author and committer of every commit: loop-org, now, in the local timezone."""
    return pygit2.Signature(NAME, EMAIL)


def create(git_dir: Path, head_ref: str) -> None:
    """Create the bare repository with ``REPO_CONFIG``, ``HEAD`` naming ``head_ref``; atomic
    (built beside and renamed into place; a concurrent creator's repository is kept)."""
    git_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = git_dir.with_name(f".{git_dir.name}.init-{uuid.uuid4().hex[:8]}")
    try:
        init_bare(tmp, head_ref)
        # No fan-out directories (objects/00..ff) ahead: libgit2 makes each when its first object
        # goes there, about 76 of them over a 30-checkpoint run. All 256 made here put a burst
        # of directory metadata on the journal just as the run starts, and the loop's first
        # checkpoints waited on it (bench/loop.py: overhead 10-16 ms, against 6-11 ms without).
        try:
            os.rename(tmp, git_dir)
        except OSError:
            if not (git_dir / "HEAD").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def init_bare(path: Path, head_ref: str, *, alternates: Path | None = None) -> None:
    """Lay out a new bare repository at ``path`` (which must not exist): ``HEAD`` naming
    ``head_ref``, a ``config`` holding ``REPO_CONFIG``, ``objects/`` with ``info/`` and ``pack/``
    (borrowing ``alternates``' objects when given) and ``refs/``: what git and libgit2 need, no more.
    ``pygit2.init_repository`` also writes a description, hooks and ``info/exclude`` and rewrites
    the config once per key (~4.5 ms against ~0.7 ms here), on the path to a run's first act."""
    os.mkdir(path)
    os.makedirs(path / "objects" / "info")
    os.mkdir(path / "objects" / "pack")    # libgit2 reads packs only from a folder there at open
    os.mkdir(path / "refs")
    os.mkdir(path / "info")
    (path / "info" / "attributes").write_bytes(ATTRIBUTES)
    config = "[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n\tbare = true\n" + "".join(
        f"[{key.split('.')[0]}]\n\t{key.split('.')[1]} = {value}\n" for key, value in REPO_CONFIG)
    (path / "config").write_text(config, encoding="utf-8")
    if alternates is not None:
        (path / "objects" / "info" / "alternates").write_text(f"{alternates}\n", encoding="utf-8")
    (path / "HEAD").write_text(f"ref: {head_ref}\n", encoding="utf-8")


def no_conversion(git_dir: Path) -> None:
    """Give a repository made before ``ATTRIBUTES`` existed (or whose file was changed) its
    ``info/attributes``: the bytes recorded are the bytes in the work tree."""
    path = os.path.join(git_dir, "info", "attributes")
    try:
        with open(path, "rb") as f:
            if f.read() == ATTRIBUTES:
                return
    except FileNotFoundError:
        pass
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{uuid.uuid4().hex[:8]}.tmp"
    with open(tmp, "wb") as f:
        f.write(ATTRIBUTES)
    os.replace(tmp, path)


def open_repository(git_dir: Path) -> pygit2.Repository:
    return pygit2.Repository(os.fspath(git_dir), RepositoryOpenFlag.NO_SEARCH)


def clear_stale_locks(git_dir: Path) -> list[Path]:
    """Remove the lock files a killed writer left and return them: ``index.lock``,
    ``HEAD.lock``, ``packed-refs.lock`` at the top and every ``*.lock`` below ``refs/``; and
    its temp object files older than ten minutes."""
    removed: list[Path] = []
    try:
        top = list(os.scandir(git_dir))
    except FileNotFoundError:
        return removed
    removed += [Path(e.path) for e in top if e.name in ("index.lock", "HEAD.lock", "packed-refs.lock")]
    stack = [os.path.join(git_dir, "refs")]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except FileNotFoundError:
            continue
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                stack.append(entry.path)
            elif entry.name.endswith(".lock"):
                removed.append(Path(entry.path))
    # a killed writer's half-written objects (libgit2 renames whole ones into place); any other
    # writer's are seconds old at most
    old = time.time() - 600
    try:
        for entry in os.scandir(os.path.join(git_dir, "objects")):
            if entry.name.startswith("tmp_object_git2_") and entry.stat().st_mtime < old:
                removed.append(Path(entry.path))
    except FileNotFoundError:
        pass
    for lock in removed:
        lock.unlink(missing_ok=True)
    return removed


def read_ref(repo: pygit2.Repository, name: str) -> str | None:
    """The object id ``name`` holds (a symbolic ref followed), or None."""
    try:
        ref = repo.lookup_reference(name)
        if ref.type != pygit2.enums.ReferenceType.DIRECT:
            ref = ref.resolve()
        return str(ref.target)
    except (KeyError, ValueError, pygit2.GitError):
        return None


def set_ref(repo: pygit2.Repository, name: str, new: str, *, expect: object = ANY,
            message: str) -> None:
    """Point ``name`` at ``new`` under git's lock protocol, with a reflog line where git keeps
    one (``refs/heads/*``, and ``HEAD`` when it names the branch).

    Args:
        expect: what the ref must hold now (None: it must not exist; ANY: anything); checked
            under the ref's lock (compare-and-swap).
    Raises: RefLocked (a lock file is in the way), RefConflict (``expect`` did not hold).
    """
    oid = pygit2.Oid(hex=new)
    try:
        if expect is ANY:
            repo.create_reference_direct(name, oid, True, message)
        elif expect is None:
            repo.create_reference_direct(name, oid, False, message)
        else:
            ref = repo.references.get(name)
            if ref is None or str(ref.target) != expect:
                raise RefConflict(f"{name} holds {ref.target if ref else 'nothing'}, expected {expect}; "
                                  "another writer moved it: run one loop-agent per work item")
            ref.set_target(oid, message)   # fails if the ref moved since it was read
    except pygit2.AlreadyExistsError:
        raise RefConflict(f"{name} exists, expected nothing; another writer made it: "
                          "run one loop-agent per work item") from None
    except (pygit2.GitError, OSError) as exc:   # pygit2 raises OSError for a lock in the way
        text = str(exc)
        if "lock" in text:
            raise RefLocked(f"{name}.lock") from None
        if "old reference value does not match" in text or "modified" in text:
            raise RefConflict(f"{name} moved while being updated: {text}; "
                              "run one loop-agent per work item") from None
        raise HistoryError(f"cannot update {name}: {text}; check the org home is writable",
                           code="ref_failed") from None


def remove(path: bytes) -> None:
    """Remove a file, symlink or directory tree (a symlink is never followed)."""
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    except (FileNotFoundError, NotADirectoryError):
        pass


def _cached(raw: bytes) -> bool:
    """Whether a path lies in a build cache (``CACHE_DIRS``)."""
    return any(part in CACHE_DIRS for part in raw.split(b"/")[:-1])


class Shadow:
    """The shadow repository with one work tree (the workspace, or a snapshot directory) and that
    work tree's index, kept in memory between calls.

    Args:
        git_dir: the repository (its own ``index`` file is the work tree's stat cache).
        workdir: the work tree.
    """

    def __init__(self, git_dir: Path, workdir: Path) -> None:
        self.git_dir = git_dir
        self.workdir = workdir
        no_conversion(git_dir)
        self.repo = open_repository(git_dir)
        self._top = os.fsencode(workdir).rstrip(b"/") + b"/"
        self._workdir_set = False
        self.unsaved = 0          # index entries changed in memory since it was last written
        self.lock = threading.RLock()

    def _index(self) -> pygit2.Index:
        if not self._workdir_set:
            self.repo.workdir = os.fspath(self.workdir)
            self._workdir_set = True
        try:
            return self.repo.index
        except (pygit2.GitError, OSError) as exc:
            # damaged (by hand: libgit2 replaces it whole): it is only a cache, read the files again
            log.warning("history_index_discarded", index=str(self.git_dir / "index"), reason=str(exc),
                        next="every file is read again once")
            (self.git_dir / "index").unlink(missing_ok=True)
            self.repo = open_repository(self.git_dir)
            self.repo.workdir = os.fspath(self.workdir)
            return self.repo.index

    def save_index(self) -> None:
        """Write the index out (``index.lock`` renamed into place)."""
        with self.lock:
            try:
                self._index().write()
            except (pygit2.GitError, OSError) as exc:
                if "lock" in str(exc):
                    raise RefLocked(str(self.git_dir / "index.lock")) from None
                raise
            self.unsaved = 0

    def settle_index(self, every: int) -> bool:
        """Write the index out if ``every`` entries or more changed in memory since it was last
        written, or if it was never written: until then libgit2 cannot tell racily clean entries
        (a file changed within the timestamp tick its entry was taken in). Returns whether it
        was written."""
        if self.unsaved and (self.unsaved >= every or not (self.git_dir / "index").exists()):
            self.save_index()
            return True
        return False

    # -- recording ---------------------------------------------------------------------------------

    def record(self) -> tuple[str, int]:
        """Record the work tree into the index and write its trees: (tree id, entries changed).

        Files whose stat matches their index entry are not read; new folders are walked here
        (build caches skipped, a nested repository recorded as a gitlink to its ``HEAD``).
        """
        with self.lock:
            index = self._index()
            removed, added, folders = [], [], []
            for delta in index.diff_to_workdir(flags=_RECORD).deltas:
                if delta.status in _GONE:
                    removed.append(os.fsdecode(delta.old_file.raw_path))
                    continue
                raw = delta.new_file.raw_path
                if raw.endswith(b"/"):
                    folders.append(raw[:-1])
                elif not _cached(raw):
                    added.append(raw)
            for path in removed:
                index.remove(path)
            for folder in folders:
                self._new_folder(folder, added)
            for raw in added:
                self._add(index, raw)
            changed = len(removed) + len(added)
            self.unsaved += changed
            return str(index.write_tree()), changed

    def _add(self, index: pygit2.Index, raw: bytes) -> None:
        try:
            index.add(os.fsdecode(raw))
        except (pygit2.GitError, OSError) as exc:
            full = self._top + raw
            if os.path.isdir(full) and not os.path.islink(full):
                found: list[bytes] = []           # a nested repository without a commit yet:
                self._new_folder(raw, found, nested=False)  # its files, as files
                for sub in found:
                    self._add(index, sub)
                return
            if not os.path.lexists(full):
                return          # removed while being recorded: the next checkpoint sees it gone
            raise HistoryError(f"cannot record {os.fsdecode(raw)!r} in {self.workdir}: {exc}; "
                               "rename or remove it", code="unrecordable_path") from None

    def _new_folder(self, rel: bytes, out: list[bytes], *, nested: bool = True) -> None:
        """Every file below a folder the index does not know yet, into ``out``. A nested
        repository goes in as the folder itself, which the index records as a gitlink to its
        ``HEAD`` (as git's ``add`` does); build caches are skipped."""
        if rel.rsplit(b"/", 1)[-1] in CACHE_DIRS:
            return
        full = self._top + rel
        if nested and os.path.lexists(full + b"/.git"):
            out.append(rel)
            return
        try:
            entries = list(os.scandir(full))
        except (FileNotFoundError, NotADirectoryError):
            return
        for entry in entries:
            if entry.name == b".git":
                continue
            sub = rel + b"/" + entry.name
            if entry.is_dir(follow_symlinks=False):
                self._new_folder(sub, out)
            elif entry.is_file(follow_symlinks=False) or entry.is_symlink():
                out.append(sub)

    # -- checkout ----------------------------------------------------------------------------------

    def sync(self, tree: str) -> int:
        """Make the work tree hold ``tree`` exactly, rewriting only what differs; return how
        many paths were removed or written. The index is updated in memory (``save_index``
        writes it)."""
        with self.lock:
            index = self._index()
            top = self._top
            changes = 0
            for delta in index.diff_to_workdir(flags=_SCAN).deltas:
                changes += 1
                if delta.status in _GONE:
                    index.remove(os.fsdecode(delta.old_file.raw_path))
                    continue
                raw = delta.new_file.raw_path.rstrip(b"/")
                remove(top + raw)           # what the index does not describe, it does now
                if delta.status not in _NEW:
                    index.remove(os.fsdecode(raw))
            target = self.repo[pygit2.Oid(hex=tree)]
            create, drop = [], []
            for delta in index.diff_to_tree(target).deltas:    # old: the tree, new: the index
                if delta.status == DeltaStatus.ADDED:
                    drop.append(delta.new_file.raw_path)
                else:
                    create.append(delta.old_file.raw_path)
            if create or drop:
                # Unlinked first, so the checkout creates every file anew: nothing is ever written
                # through a second hard link or into a nested repository.
                for raw in drop + create:
                    remove(top + raw)
                self._checkout(target, create + drop, full=len(index) == 0)
                for raw in drop:        # the folders it emptied (git records no folder)
                    with contextlib.suppress(OSError, KeyError):   # a gitlink's entry may be gone
                        index.remove(os.fsdecode(raw))
                    self._prune(raw)
                # libgit2's checkout put each file it wrote in the index, stat included (as
                # written), so the next scan reads none of them again
            self.unsaved += changes + len(create) + len(drop)
            return changes + len(create) + len(drop)

    def _checkout(self, target: pygit2.Tree, paths: list[bytes], *, full: bool) -> None:
        if not full:
            try:
                names = [p.decode("utf-8") for p in paths]
            except UnicodeDecodeError:
                full = True             # libgit2's path list takes UTF-8 only
        if full:
            self.repo.checkout_tree(target, strategy=_CHECKOUT_ALL)
        else:
            self.repo.checkout_tree(target, strategy=_CHECKOUT_PATHS, paths=names)

    def _prune(self, raw: bytes) -> None:
        """Remove the folders above ``raw`` that are now empty (git records no folder)."""
        parts = raw.split(b"/")[:-1]
        while parts:
            try:
                os.rmdir(self._top + b"/".join(parts))
            except OSError:
                return
            parts.pop()


def edit_tree(repo: pygit2.Repository, base: pygit2.Oid | None,
              edits: dict[str, tuple[pygit2.Oid, int] | None]) -> pygit2.Oid:
    """Tree ``base`` with each path of ``edits`` set to (object id, mode), or removed where the
    value is None (folders left empty go too: git records no folder); whatever is in the way (a
    file where a folder is needed, a folder where a file goes) is replaced. Writes only the trees
    on the edited paths."""
    found = _edit(repo, base, edits)
    return found if found is not None else repo.TreeBuilder().write()


def _edit(repo: pygit2.Repository, base: pygit2.Oid | None,
          edits: dict[str, tuple[pygit2.Oid, int] | None]) -> pygit2.Oid | None:
    builder = repo.TreeBuilder(repo[base]) if base is not None else repo.TreeBuilder()
    nested: dict[str, dict] = {}
    for path, entry in edits.items():
        head, sep, rest = path.partition("/")
        if sep:
            nested.setdefault(head, {})[rest] = entry
        elif entry is None:
            if builder.get(head) is not None:
                builder.remove(head)
        else:
            builder.insert(head, entry[0], entry[1])
    for head, sub in nested.items():
        current = builder.get(head)
        inner = current.id if current is not None and current.filemode == FileMode.TREE else None
        if inner is None and all(v is None for v in sub.values()):
            continue                    # removing below a folder that is not there: nothing to do
        tree = _edit(repo, inner, sub)
        if tree is None:
            if current is not None:
                builder.remove(head)
        else:
            builder.insert(head, tree, FileMode.TREE)
    return builder.write() if len(builder) else None


_FLAT: dict[pygit2.Oid, dict[str, tuple[int, pygit2.Oid]]] = {}
_FLAT_LOCK = threading.Lock()
_FLAT_KEPT = 4096


def files(repo: pygit2.Repository, tree: pygit2.Oid) -> dict[str, tuple[int, pygit2.Oid]]:
    """Every non-tree entry below ``tree``: path (``/``-separated) -> (mode, id). The result is
    shared: never mutate it. Listings are kept per subtree id (trees never change), so the
    listing of the next checkpoint reads only the subtrees that changed."""
    with _FLAT_LOCK:
        found = _FLAT.get(tree)
    if found is not None:
        return found
    out: dict[str, tuple[int, pygit2.Oid]] = {}
    for entry in repo[tree]:
        name = entry.raw_name.decode("utf-8", "surrogateescape")
        if entry.filemode == FileMode.TREE:
            for path, value in files(repo, entry.id).items():
                out[f"{name}/{path}"] = value
        else:
            out[name] = (int(entry.filemode), entry.id)
    with _FLAT_LOCK:
        if len(_FLAT) >= _FLAT_KEPT:
            _FLAT.clear()
        _FLAT[tree] = out
    return out


_SHADOWS: dict[tuple[str, str], Shadow] = {}
_SHADOWS_LOCK = threading.Lock()
_SHADOWS_KEPT = 96      # an eval-agent's: a history and a snapshot for each item it verifies in turn


def shadow_for(git_dir: Path, workdir: Path) -> Shadow:
    """The process-wide ``Shadow`` of ``git_dir`` with work tree ``workdir``: every history object
    of this process shares its index in memory (the loop's and the verifier's, in one process)."""
    key = (os.fspath(git_dir), os.fspath(workdir))
    with _SHADOWS_LOCK:
        found = _SHADOWS.pop(key, None)
        if found is None:
            if len(_SHADOWS) >= _SHADOWS_KEPT:
                del _SHADOWS[next(iter(_SHADOWS))]    # the longest unused: work items come and go
            found = Shadow(git_dir, workdir)
        _SHADOWS[key] = found
        return found


def forget(git_dir: Path) -> None:
    """Drop the shadows of ``git_dir`` and of repositories below it (it was deleted)."""
    top = os.fspath(git_dir)
    with _SHADOWS_LOCK:
        for key in [k for k in _SHADOWS if k[0] == top or k[0].startswith(top + os.sep)]:
            del _SHADOWS[key]
