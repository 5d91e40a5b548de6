"""The delivered tree is the verified tree: at ``goal_met`` the workspace holds, byte for byte, the
tree the checks ran on, and that is proved by reading every file.

Why no byte the user runs can differ from a byte the checks ran:

1. *Recording converts nothing.* The history records each file as the bytes the workspace holds
   and writes back the bytes recorded (``shadow.ATTRIBUTES``: no line-ending, keyword, filter or
   encoding conversion, whatever a ``.gitattributes`` says); links are recorded as links.
2. *The checks run on a recorded tree.* The eval-agent builds the tree it verifies from the
   history alone (the baseline plus the in-scope changes of checkpoint n, ``eval_agent.scope``),
   writes it as a commit (the verdict's ``verified``) and checks that commit out into its
   snapshot, which it repairs by content and stat before every verification.
3. *Nothing unrecorded survives delivery.* What the history does not record — compiled caches,
   special files, repositories nested by the doer, everything the doer changed outside the scope —
   is removed from the workspace by ``deliver``, which makes the workspace hold the verified
   commit (``WorkspaceHistory.reset_to``: everything the commit does not describe is removed,
   ignored files and build caches included). The doer's changes outside the scope are kept
   first, apart, as a commit of their own (``refs/held/<n>``: ``org export ID --held`` writes
   them as a patch, ``org apply ID --held`` applies it). What no commit could keep — a compiled
   cache, a fifo, the work tree of a repository the doer nested — is named in the proof
   (``Delivery.removed``, walked before the reset by name and type: ``unrecorded``), so the
   human sees what was taken out as well as what was kept.

   The allow-list is the verified tree itself, and nothing else. The environments a project
   keeps in its workspace (a ``.venv``, ``node_modules``, ignored as they are) are recorded
   like every other file, and are outside every default change scope, so the verified tree
   holds them as they were at the baseline — the environment the user made and the checks ran
   with — and delivery puts them back so, whatever the doer changed there. The one exception
   is below: a repository nested at the baseline, the user's own checkout.
4. *It is proved, not assumed.* ``differences`` then reads every file of the workspace and
   compares its git object id — a hash of its content, read without following links or blocking
   (``blob_id``) — and its mode with the verified tree's (not a stat: a file whose stat was kept
   while its content changed is caught). A workspace
   that holds anything else is not delivered: the difference is recorded, and it is what
   ``org show`` reports.

Before any of this, a pass needs the live workspace to hold what the checkpoint recorded, read
the same way (``eval_agent.verifier``): a file the history could not record (a fifo, a file
changed after the checkpoint was taken) makes the iteration fail instead of reaching goal_met.

The one part of a workspace the history does not record is the work tree of a repository nested
in it at the baseline (recorded as its ``HEAD``, as git records it): the user's own checkout,
which the checks never see either (a snapshot holds an empty folder there). Its files are not
compared by content; instead any of them changed after the baseline was recorded — by its
ctime, which an unprivileged process cannot set back — makes the pass fail (``touched_since``).
Its build caches are not looked at there (a test run makes them), so delivery removes them and
the proof finds none left (``caches_below``): compiled code in them is loaded before the source
it was compiled from, and may not have been compiled from it.
"""
from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import asdict, dataclass
from pathlib import Path

import pygit2
import structlog

from roles.workbench.workspace import shadow
from roles.workbench.workspace.errors import HistoryError

log = structlog.get_logger("workspace.delivered")

HELD_REF = "refs/held/{n}"


class VerifiedUnknown(HistoryError):
    """The verified commit is not in this host's history and cannot be made again here."""

    code = "verified_unknown"


@dataclass(frozen=True)
class Delivery:
    """What ``deliver`` did: the verified commit the workspace now holds, the commit that keeps the
    doer's changes outside the scope (None: there were none), the paths they touch, the paths
    where the workspace still differs from the verified tree (empty: proved), and what delivery
    took out that no commit records (``unrecorded``: a folder ends in ``/``)."""

    verified: str
    held: str | None
    held_paths: tuple[str, ...]
    differs: tuple[str, ...]
    removed: tuple[str, ...] = ()

    @property
    def proved(self) -> bool:
        return not self.differs

    def encode(self) -> dict:
        return {**asdict(self), "proved": self.proved}


def blob_id(path: bytes) -> str | None:
    """The git object id of the regular file at ``path``, read from its content (opened without
    following a link and without blocking: a sandboxed process may have put anything there);
    None when it is not a regular file by the time it is opened."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        digest = hashlib.sha1(b"blob %d\0" % st.st_size)
        left = st.st_size
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                return None                     # shrank while read: not the file that was there
            digest.update(chunk)
            left -= len(chunk)
        return digest.hexdigest() if not os.read(fd, 1) else None
    finally:
        os.close(fd)


def differences(workspace: Path, repo: pygit2.Repository, tree: pygit2.Oid | str, *,
                skip_caches: bool = False, limit: int = 50) -> list[str]:
    """Paths where ``workspace`` and ``tree`` differ in content, mode or presence, read file by
    file (a content hash each: never a stat). The workspace's own top ``.git`` is not part of it;
    a gitlink's folder is compared by presence only. ``skip_caches``: ignore build caches
    (``shadow.CACHE_DIRS``), which delivery removes. At most ``limit`` paths are returned."""
    want = shadow.files(repo, pygit2.Oid(hex=str(tree)))
    gitlinks = {p for p, (mode, _) in want.items() if mode == 0o160000}
    found: list[str] = []
    seen: set[str] = set()
    top = os.fsencode(workspace)

    def walk(rel: bytes) -> None:
        path = top + b"/" + rel if rel else top
        try:
            entries = list(os.scandir(path))
        except (FileNotFoundError, NotADirectoryError):
            return
        for entry in entries:
            if len(found) >= limit:
                return
            name = entry.name
            if not rel and name == b".git":
                continue
            sub = rel + b"/" + name if rel else name
            text = os.fsdecode(sub)
            st = os.lstat(entry.path)
            if stat.S_ISDIR(st.st_mode):
                if text in gitlinks:
                    seen.add(text)
                    if not skip_caches:       # compiled code the runtime would load before the source
                        found.extend(p + "/" for p in caches_below(workspace, text))
                elif skip_caches and name in shadow.CACHE_DIRS:
                    continue
                else:
                    walk(sub)
                continue
            seen.add(text)
            entry_want = want.get(text)
            if entry_want is None:
                found.append(text)
                continue
            mode, oid = entry_want
            if stat.S_ISLNK(st.st_mode):
                same = mode == 0o120000 and pygit2.hash(os.readlink(entry.path)) == oid
            elif stat.S_ISREG(st.st_mode):
                executable = bool(st.st_mode & stat.S_IXUSR)
                same = mode == (0o100755 if executable else 0o100644) and blob_id(entry.path) == str(oid)
            else:
                same = False                    # a fifo, a socket, a device: never part of a tree
            if not same:
                found.append(text)

    walk(b"")
    if len(found) < limit:
        found += sorted(p for p in want if p not in seen)[: limit - len(found)]
    return sorted(found)


def caches_below(workspace: Path, folder: str) -> list[str]:
    """The build caches (``shadow.CACHE_DIRS``) below ``folder`` of ``workspace`` (a repository
    nested at the baseline, whose work tree the history does not record), its ``.git`` aside;
    links are not followed."""
    found: list[str] = []
    top = os.fsencode(workspace)
    stack = [os.fsencode(folder)]
    while stack:
        rel = stack.pop()
        try:
            entries = list(os.scandir(top + b"/" + rel))
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            continue
        for entry in entries:
            if entry.name == b".git" or not entry.is_dir(follow_symlinks=False):
                continue
            sub = rel + b"/" + entry.name
            if entry.name in shadow.CACHE_DIRS:
                found.append(os.fsdecode(sub))
            else:
                stack.append(sub)
    return sorted(found)


def touched_since(workspace: Path, folders: list[str], since_ns: int, *, limit: int = 20) -> list[str]:
    """Files below ``folders`` (of ``workspace``; their ``.git`` aside) whose inode changed after
    ``since_ns`` (ctime: set by the kernel on every write, rename or chmod, and not settable by
    the process that wrote). Links are not followed."""
    found: list[str] = []
    top = os.fsencode(workspace)
    stack = [os.fsencode(f) for f in folders]
    while stack and len(found) < limit:
        rel = stack.pop()
        try:
            entries = list(os.scandir(top + b"/" + rel))
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            continue
        for entry in entries:
            if entry.name == b".git" or entry.name in shadow.CACHE_DIRS:
                continue                        # build caches are removed at delivery
            sub = rel + b"/" + entry.name
            st = os.lstat(entry.path)
            if stat.S_ISDIR(st.st_mode):
                stack.append(sub)               # a folder's ctime moves with its caches: its files say more
            elif st.st_ctime_ns > since_ns:
                found.append(os.fsdecode(sub))
    return sorted(found)[:limit]


def unrecorded(workspace: Path, repo: pygit2.Repository, verified: str, held: str | None, *,
               limit: int = 200) -> list[str]:
    """What the workspace holds that neither the verified tree nor the held commit records as a
    file: build caches, special files, and each repository the doer nested, named once as its
    folder (``dir/``: its work tree is recorded as a commit id at most, which delivery does not
    keep). A repository nested at the baseline and still in the verified tree is the user's and
    is left alone. Read by name and type only, without following links; at most ``limit``."""
    want = shadow.files(repo, repo[pygit2.Oid(hex=verified)].tree_id)
    kept = {p for p, (mode, _) in want.items() if mode != 0o160000}
    theirs = {p for p, (mode, _) in want.items() if mode == 0o160000}
    if held:
        kept |= {p for p, (mode, _) in shadow.files(repo, repo[pygit2.Oid(hex=held)].tree_id).items()
                 if mode != 0o160000}
    found: list[str] = []
    top = os.fsencode(workspace)
    stack = [b""]
    while stack and len(found) < limit:
        rel = stack.pop()
        try:
            entries = sorted(os.scandir(top + b"/" + rel if rel else top), key=lambda e: e.name)
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            continue
        for entry in entries:
            if not rel and entry.name == b".git":
                continue
            sub = rel + b"/" + entry.name if rel else entry.name
            text = os.fsdecode(sub)
            if entry.is_dir(follow_symlinks=False):
                if text in theirs:
                    continue
                if os.path.lexists(entry.path + b"/.git"):
                    found.append(text + "/")
                else:
                    stack.append(sub)
            elif text not in kept:
                found.append(text)
    return sorted(found)[:limit]


def _nested_left(paths: list[str], tree: set[str]) -> list[str]:
    """The folders of repositories the doer nested that are not part of ``tree`` (their ``.git``
    is what is left of them after a reset)."""
    folders = {p.split("/.git/", 1)[0] for p in paths if "/.git/" in p}
    return sorted(f for f in folders if f not in tree and not any(t.startswith(f + "/") for t in tree))


# how a verdict says a held path was put in the verified tree (``eval_agent.held``'s treatments)
_RESTORED, _REMOVED = "restored from the baseline", "left out (added by the doer)"


def rebuild(history, checkpoint: str, held: list[dict], n: int) -> str | None:
    """The verified commit of ``checkpoint`` made again from the verdict's list of what was held
    (each path back to the baseline's version, or left out), for a host whose history lacks the
    commit the eval-agent made on another. None when a held path was rewritten in part (test
    sections of a mixed file): that cannot be made again here. Raises: UnknownCommit."""
    base = history.entries(None)
    edits: dict = {}
    for h in held:
        if h.get("treatment") == _RESTORED and h["path"] in base:
            edits[h["path"]] = base[h["path"]]
        elif h.get("treatment") == _REMOVED:
            edits[h["path"]] = None
        else:
            return None
    return history.derive(checkpoint, edits, f"loop-org verified tree\n\niteration: {n}")


def deliver(history, verified: str, n: int) -> Delivery:
    """Make the workspace of ``history`` hold the verified commit ``verified`` of iteration ``n``
    and prove it: the doer's other changes are kept first as ``refs/held/<n>`` (idempotent: a
    second call finds the workspace delivered and keeps what the first kept).
    Raises: UnknownCommit, WorkspaceMissing, HistoryError."""
    ref = HELD_REF.format(n=n)
    held = history.record_apart(ref, verified, f"loop-org changes held outside the scope\n\niteration: {n}")
    held_paths = tuple(history.changed_paths(verified, held)) if held else ()
    removed = tuple(history.unrecorded(verified, held))
    history.reset_to(verified)
    differs = history.workspace_differences(verified)
    leftovers = _nested_left(differs, set(history.entries(verified)))
    for folder in leftovers:                # a repository the doer nested: libgit2 leaves its .git
        shadow.remove(os.fsencode(Path(history.workspace) / folder))
    # a repository nested at the baseline is the user's, left as it is but for its build caches,
    # which nothing records: compiled code there is what the runtime would load before the source
    theirs = [p for p, (mode, _) in history.entries(verified).items() if mode == 0o160000]
    caches = [c for folder in theirs for c in caches_below(Path(history.workspace), folder)]
    for cache in caches:
        shadow.remove(os.fsencode(Path(history.workspace) / cache))
    removed = (*removed, *(c + "/" for c in caches))
    if leftovers or caches:
        differs = history.workspace_differences(verified)
    differs = tuple(differs)
    result = Delivery(verified, held, held_paths, differs, removed)
    log.info("workspace_delivered", workspace=str(history.workspace), verified=verified, held=held,
             held_paths=len(held_paths), removed=list(removed[:5]), proved=result.proved, differs=list(differs[:5]))
    return result
