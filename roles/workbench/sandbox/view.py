"""What a sandboxed command sees of the machine: an allow-list, read-only.

Shown read-only:

- the system folders programs need (``toolchains.SYSTEM``: ``/usr``, ``/bin``, ``/sbin``,
  ``/lib*``, ``/etc``, ``/opt``), with what only root may read hidden (``root_private_paths``);
- the submitter's toolchains (``toolchains.discover``: every folder on their PATH and what its
  tools need behind them);
- the project's code and the Python running the org (``default_visible``);
- the folders org.toml adds (``sandbox.readonly_binds``) and the caller adds for one command.

Everything else is absent — the real home's other contents, other users' homes, other projects,
``/srv``, ``/mnt``, ``/media``, ``/var/lib``, ``/run`` — and inside what is shown, these are
hidden whatever the allow-list says: every org home this machine has registered
(``state_db.kernel.home.known_homes``) plus this org's own, the deny-list below every home folder
(``DENY``: keys, credentials, shell histories), and every Unix socket a process of this machine
listens on (``host_sockets``) — in a shown folder or in the workspace. A read-only mount does
not stop ``connect()`` on a socket, and the sandbox's uid is the host user's: a PostgreSQL
store, a container engine or an agent whose socket sat in a shown folder would take the
sandbox's requests as the org's. Sockets are read from ``/proc/net/unix`` each time a view is
built; one bound after that is not hidden from the command already running.
"""
from __future__ import annotations

import functools
import os
import pwd
import stat
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

from roles.workbench.sandbox.environment import CACHES
from roles.workbench.sandbox.toolchains import SYSTEM, Exposure, Toolchain, discover, is_system

DENY = (
    ".ssh", ".gnupg", ".aws", ".azure", ".kube", ".config/gcloud", ".docker/config.json", ".netrc", ".npmrc",
    ".pypirc", ".git-credentials", ".config/git/credentials", ".config/gh", ".cargo/credentials",
    ".cargo/credentials.toml", ".local/share/keyrings", ".password-store", ".vault-token", ".pgpass",
    ".my.cnf", ".bash_history", ".zsh_history", ".zhistory", ".history", ".histfile", ".sh_history",
    ".python_history", ".node_repl_history", ".psql_history", ".mysql_history", ".sqlite_history",
    ".lesshst", ".local/share/fish/fish_history", ".viminfo",
)


@dataclass(frozen=True)
class View:
    """The file-system view of one command: ``readonly`` and ``hidden`` (path, reason) pairs,
    the PATH and variables that point tools at what is shown."""

    readonly: tuple[Exposure, ...]
    hidden: tuple[Exposure, ...]
    path: str
    env: dict[str, str] = field(default_factory=dict)


SOCKET = "a Unix socket a process of this machine listens on"
HOME = "an org home"


def _homes_below(places: Sequence[str], registered: tuple[str, ...], own: Path | None) -> list[str]:
    """The org homes inside ``places`` (the workspace, the folders org.toml shows): registered
    ones (this org's among them) and those a walk finds by their marker (``homes.homes_in``);
    each place itself aside."""
    from roles.workbench.sandbox.homes import homes_in
    named = [*registered, *([os.path.realpath(own)] if own is not None else [])]
    out: dict[str, None] = {}
    for place in places:
        below = os.path.join(place, "")
        out.update((h, None) for h in [*named, *homes_in(place)] if h.startswith(below))
    return list(out)


def host_sockets(table: str = "/proc/net/unix", skip_folder: Callable[[str], bool] | None = None) -> list[str]:
    """Real paths of the Unix sockets bound in this machine's network namespace (abstract and
    unnamed ones aside: the sandbox's own network namespace already keeps those out). ``build``
    keeps those inside what a command sees and within its reach (``_reachable``).
    ``skip_folder``: real folders whose sockets are not wanted (``build``'s: the hidden places,
    where every org's own sockets live: at a hundred loop-agents they are most of the table, and
    each would cost a look at its name)."""
    try:
        with open(table, "rb") as f:
            lines = f.read().splitlines()[1:]
    except OSError:
        return []
    bound: dict[bytes, None] = {}       # a listener's accepted connections repeat its path
    for line in lines:
        # Num RefCount Protocol Flags Type St Inode [Path]: the seven fields before the path are
        # numbers, so the first " /" starts a path name (abstract "@" and unnamed ones have none)
        at = line.find(b" /")
        if at >= 0:
            bound[line[at + 1:]] = None
    # many sockets share a folder (an org's run/s): each folder is resolved once, and a name is
    # resolved on its own only where it is a symbolic link
    folders: dict[str, str] = {}
    out: dict[str, None] = {}
    for raw in bound:
        folder, name = os.path.split(os.fsdecode(raw))
        real = folders.get(folder)
        if real is None:
            real = os.path.realpath(folder)
            if skip_folder is not None and skip_folder(real):
                real = ""
            folders[folder] = real
        if not real:
            continue
        path = os.path.join(real, name)
        out[os.path.realpath(path) if name in ("", ".", "..") or os.path.islink(path) else path] = None
    return list(out)


def _reachable(path: str) -> bool:
    """Whether this process's user could reach ``path`` by its permission bits alone, as the
    sandbox's (mapped to it, without capabilities) would: every folder above it searchable. A
    socket behind a folder it may not enter is out of the sandbox's reach already, and bubblewrap
    could not mount over it."""
    uid, groups = os.geteuid(), {os.getegid(), *os.getgroups()}
    parent = os.path.dirname(path)
    while True:
        try:
            st = os.stat(parent)
        except OSError:
            return False
        bit = stat.S_IXUSR if st.st_uid == uid else stat.S_IXGRP if st.st_gid in groups else stat.S_IXOTH
        if not st.st_mode & bit:
            return False
        if parent == "/":
            return True
        parent = os.path.dirname(parent)


def every_home() -> list[str]:
    """Home folders of this machine's users and of this process."""
    homes = {str(Path.home())}
    try:
        homes.update(p.pw_dir for p in pwd.getpwall() if p.pw_dir.startswith("/") and p.pw_dir != "/")
    except OSError:
        pass
    return sorted(h for h in homes if h not in ("/", ""))


# The registered homes, resolved, as last read: (the registry's signature, when to read again
# regardless, the homes). Each sandboxed command needs them, and resolving every home of a
# machine that has run many orgs costs tens of milliseconds (a stat per path component).
REGISTRY_FRESH_S = 2.0
_registered: tuple[tuple | None, float, tuple[str, ...]] | None = None


def registered_homes() -> tuple[str, ...]:
    """The machine's registered org homes, resolved. Read again whenever the registry file
    changes (a new org registers itself before it runs anything) and at least every
    ``REGISTRY_FRESH_S`` otherwise, so a home's folder changing under it is seen within that.
    A home removed meanwhile stays listed until then: hiding a path that is gone is a no-op
    (``bwrap.mount_args`` covers only what exists)."""
    global _registered
    from state_db.kernel.home import known_homes, registry_path
    signature = _signature(str(registry_path()))
    now = time.monotonic()
    seen = _registered
    if seen is not None and seen[0] == signature and now < seen[1]:
        return seen[2]
    homes = tuple(dict.fromkeys(os.path.realpath(p) for p in known_homes()))
    if seen is not None and seen[2] == homes:
        homes = seen[2]             # the same tuple: views made from it (``_Shown``) still hold
    _registered = (signature, now + REGISTRY_FRESH_S, homes)
    return homes


def org_homes(own: Path | None, registered: tuple[str, ...] | None = None) -> list[str]:
    """Every org home to hide: this org's, the machine's registered ones (``registered``, default
    read now), ``$ORG_HOME`` and the project's default ``.org``."""
    from state_db.kernel.home import ENV_HOME, project_root
    found = [str(project_root() / ".org")]
    if own is not None:
        found.insert(0, str(own))
    if os.environ.get(ENV_HOME):
        found.append(os.environ[ENV_HOME])
    registered = registered_homes() if registered is None else registered
    return list(dict.fromkeys([*(os.path.realpath(p) for p in found), *registered]))


def default_visible() -> list[Path]:
    """The project's code and the Python running it (verify commands and the endpoint relay
    need them), shown even where nothing else would be."""
    from state_db.kernel.home import project_root

    seen: list[Path] = []
    for p in (project_root(), Path(sys.prefix), Path(sys.base_prefix)):
        real = Path(os.path.realpath(p))
        if real.exists() and real not in seen:
            seen.append(real)
    return seen


def build(toolchain: Toolchain | None, *, own_home: Path | None, readonly: Sequence[Exposure] = (),
          workspace: Path | None = None) -> View:
    """The view for a command of ``toolchain`` (None: this process's PATH and HOME).

    ``readonly``: more (path, reason) pairs (org.toml's, the caller's); ``workspace`` is the
    folder the caller binds writable: the host sockets inside it are hidden as in what is shown.

    What does not depend on the host's sockets is kept from the last build with the same
    arguments while nothing it was made from has changed (``_Shown.current``); the sockets are
    read for every view."""
    toolchain = toolchain or Toolchain(os.environ.get("PATH", ""), str(Path.home()))
    key = (toolchain, str(own_home) if own_home is not None else None, tuple(readonly))
    shown = _SHOWN.get(key)
    if shown is None or not shown.current():
        shown = _Shown.make(toolchain, own_home, readonly)
        with _SHOWN_LOCK:
            _SHOWN[key] = shown
            while len(_SHOWN) > _SHOWN_MAX:
                del _SHOWN[next(iter(_SHOWN))]
    reach = _Tops([os.path.realpath(workspace)]) if workspace is not None else None
    # a socket under a hidden place is covered with it (the filter below would drop it): its
    # folder is left out before each of its names is looked at
    hidden = [*shown.hidden, *(Exposure(p, SOCKET) for p in host_sockets(skip_folder=shown.covered.cover)
                               if (shown.kept.cover(p) or (reach is not None and reach.cover(p)))
                               and not shown.covered.cover(p) and _reachable(p))]
    places = [*([os.path.realpath(workspace)] if workspace is not None else []), *(e.path for e in readonly)]
    hidden += [Exposure(h, HOME) for h in _homes_below(places, shown.registered, own_home)
               if not shown.covered.cover(h) and (shown.kept.cover(h) or (reach is not None and reach.cover(h)))]
    hidden_tops = _Tops([h.path for h in hidden]) if len(hidden) > len(shown.hidden) else shown.covered
    inside = [p for p in shown.visible if not hidden_tops.cover(p)]
    return View(shown.keep, tuple(hidden), os.pathsep.join(inside) or "/usr/local/bin:/usr/bin:/bin",
                dict(shown.env))


# What a view shows and hides apart from the sockets, by build's arguments: each command of a
# role builds a view, and making this part again costs milliseconds (a realpath per org home,
# listings of homes), while checking that it still holds costs a few stat calls.
_SHOWN: dict[tuple, "_Shown"] = {}
_SHOWN_LOCK = threading.Lock()
_SHOWN_MAX = 64
SHOWN_FRESH_S = 2.0


@dataclass
class _Shown:
    """The socket-independent part of a view, and what it was made from: the registered homes
    as read then (``registered_homes`` reads the registry again when its file changes), the
    users' database (``/etc/passwd``: which home folders exist), and every folder whose listing
    said which deny-list entries exist (a name added to or removed from a folder changes its
    modification time). It is made again when any of those changed, and at least every
    ``SHOWN_FRESH_S`` (a system folder or a toolchain's link changing meanwhile)."""

    keep: tuple[Exposure, ...]
    hidden: tuple[Exposure, ...]
    kept: _Tops                      # the shown folders' tops
    covered: _Tops                   # the hidden paths' tops
    visible: tuple[str, ...]         # the PATH's folders that are shown and not hidden
    env: dict[str, str]
    registered: tuple[str, ...]
    looked_in: tuple[tuple[str, tuple | None], ...]
    until: float

    @classmethod
    def make(cls, toolchain: Toolchain, own_home: Path | None, readonly: Sequence[Exposure]) -> _Shown:
        until = time.monotonic() + SHOWN_FRESH_S
        looked_in: tuple[tuple[str, tuple | None], ...] = ((_PASSWD, _signature(_PASSWD)),)
        homes = every_home()
        tools, env = _discover(toolchain, tuple(homes))
        shown = [Exposure(p, "system folder") for p in SYSTEM if os.path.isdir(p) and not os.path.islink(p)]
        shown += [Exposure(str(p), "the org's code and Python") for p in default_visible()]
        shown += list(tools)
        registered = registered_homes()
        org = org_homes(own_home, registered)   # read once: every org home hides, and hides what is in it
        folders = [e.path for e in (*shown, *readonly)]
        consulted: list[tuple[str, tuple | None]] = []
        denied = _denied(homes + [toolchain.home] + folders, folders, consulted)
        looked_in += tuple(dict.fromkeys(consulted))
        never = _Tops([*org, *(d.path for d in denied)])
        # nothing discovered inside an org home or a denied path is shown; what the org asks for
        # by name (org.toml, a CLI's own folder) is shown unless denied
        keep = [e for e in shown if not never.cover(e.path)]
        denied_tops = _Tops([d.path for d in denied])
        keep += [e for e in readonly if not denied_tops.cover(e.path)]
        kept = _Tops([e.path for e in keep])
        hidden = [Exposure(h, HOME) for h in org if kept.cover(h)]
        hidden += [d for d in denied if kept.cover(d.path)]
        hidden += [Exposure(str(p), "only root may read it") for p in root_private_in(kept.tops)]
        covered = _Tops([h.path for h in hidden])
        visible = [os.path.realpath(e) for e in toolchain.path.split(os.pathsep) if e.startswith("/")]
        visible = [p for p in dict.fromkeys(visible) if kept.cover(p) and not covered.cover(p)]
        return cls(tuple(keep), tuple(hidden), kept, covered, tuple(visible), env, registered, looked_in, until)

    def current(self) -> bool:
        return (time.monotonic() < self.until and registered_homes() is self.registered
                and all(_signature(f) == sig for f, sig in self.looked_in))


_PASSWD = "/etc/passwd"


def _signature(path: str) -> tuple | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size)


@functools.lru_cache(maxsize=32)
def _discover(toolchain: Toolchain, homes: tuple[str, ...]):
    """Cached per process: a PATH's folders are listed and their scripts' first lines read once."""
    exposures, env = discover(toolchain, homes)
    return tuple(exposures), env


def _within(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def _under_any(path: str, tops: Iterable[str]) -> bool:
    return any(_within(path, t) for t in tops)


class _Tops:
    """``_under_any`` against one list of folders, asked many times: the folders themselves and
    their ``top/`` prefixes are made once, and each question is one set lookup and one
    ``str.startswith`` over all prefixes (the same answer as ``_under_any``)."""

    __slots__ = ("tops", "_exact", "_prefixes")

    def __init__(self, tops: Iterable[str]) -> None:
        self.tops = list(tops)
        self._exact = frozenset(self.tops)
        self._prefixes = tuple(dict.fromkeys(t.rstrip("/") + "/" for t in self.tops))

    def cover(self, path: str) -> bool:
        return path in self._exact or path.startswith(self._prefixes)


_FIRST = frozenset(rel.split("/", 1)[0] for rel in DENY)


def _names(folder: str) -> frozenset[str] | None:
    """The names in ``folder`` that a deny-list entry starts with; None if it cannot be listed
    (then each entry is looked up on its own)."""
    try:
        return _FIRST.intersection(os.listdir(folder))
    except OSError:
        return None


def _denied(homes: Iterable[str], shown: Sequence[str],
            consulted: list[tuple[str, tuple | None]] | None = None) -> list[Exposure]:
    """Deny-list entries below each home (and each shown folder, in case it is one) that are
    inside something shown. Only an entry inside something shown is looked up, and a home is
    listed once instead of looking up every entry whose first name it lacks (a path that
    exists has its first component listed in the home). ``consulted`` is given every folder
    whose contents the answer depends on, with its signature (``_signature``) from before it was
    read."""
    out: dict[str, Exposure] = {}
    inside = _Tops(shown)
    for home in dict.fromkeys(h for h in homes if h):
        base = os.path.join(home, "")           # ends with "/": a path below it is base + rel
        # a path below the home is inside something shown only if the home is, or something
        # shown lies below the home
        if not inside.cover(base) and not any(t.startswith(base) for t in inside.tops):
            continue
        names: frozenset[str] | None = frozenset()
        listed = False
        for rel in DENY:
            path = base + rel
            if not inside.cover(path):
                continue
            if not listed:
                if consulted is not None:       # taken before the listing: a change after it is seen
                    consulted.append((home, _signature(home)))
                names, listed = _names(home), True
            if names is not None and rel.split("/", 1)[0] not in names:
                continue
            if consulted is not None and "/" in rel:
                folder = os.path.dirname(path)
                consulted.append((folder, _signature(folder)))
            if os.path.lexists(path):
                out.setdefault(path, Exposure(path, "deny-list: keys, credentials or history"))
    return list(out.values())


def root_private_in(folders: Sequence[str]) -> list[Path]:
    """Files only root may read (``root_private_paths``) inside the shown folders: only the roots
    a shown folder reaches are walked (``shown_private_roots``)."""
    from roles.workbench.sandbox.mode import root_private_paths, shown_private_roots
    tops = _Tops(folders)
    return [p for p in root_private_paths(shown_private_roots(folders)) if tops.cover(str(p))]


def exposed(cfg, org_home, toolchain: Toolchain | None = None) -> list[tuple[str, str]]:
    """(path, reason) pairs: what a sandboxed command of this org sees, then what it does not
    although it lies inside (``org doctor``). ``toolchain``: default this process's."""
    extra = [Exposure(p, "org.toml sandbox.readonly_binds") for p in cfg.sandbox.readonly_binds]
    root = Path(org_home if isinstance(org_home, (str, os.PathLike)) else org_home.root)
    view = build(toolchain, own_home=root, readonly=extra)
    return ([(e.path, e.reason) for e in view.readonly]
            + [(e.path, f"hidden: {e.reason}") for e in view.hidden]
            + [("/tmp", f"private and empty, writable (caches: {', '.join(CACHES)})")])
