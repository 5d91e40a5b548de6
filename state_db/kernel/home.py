"""The org home: where state.db (or the name of the PostgreSQL store in its place) and every
runtime folder live.

Path rule: explicit argument > ``$ORG_HOME`` > ``.org/`` beside the project. The project is found
from the code's own location, resolved through git's common directory, so ``org`` run from a
subdirectory or from a git worktree of the project reaches the same database.
"""
from __future__ import annotations

import fcntl
import functools
import os
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

from state_db.kernel import tomlfile
from state_db.kernel.errors import ConfigError, HomeNotFound, StateError, UnsupportedPlatform

ENV_HOME = "ORG_HOME"
# Every org home holds this file: a sandbox's view builder and ``org submit`` find a home by it
# wherever it lies, registered or not (``roles/workbench/sandbox/homes.py``).
HOME_MARKER = ".loop-org-home"


def require_linux() -> None:
    """Raise UnsupportedPlatform anywhere but Linux (sockets, bubblewrap and signals assume it)."""
    if not sys.platform.startswith("linux"):
        raise UnsupportedPlatform(f"loop-org runs on Linux only (this is {sys.platform})",
                                  hint="run it on a Linux machine or in a Linux VM")


def project_root(start: Path | None = None) -> Path:
    """The main checkout of the project that contains ``start`` (default: this code).

    A git worktree's ``.git`` is a file pointing into the main repository's ``.git/worktrees``;
    following it (without spawning git) maps every worktree onto the main checkout.
    """
    here = (start or Path(__file__)).resolve()
    for d in [here, *here.parents]:
        dot_git = d / ".git"
        if dot_git.is_dir():
            return d
        if dot_git.is_file():
            text = dot_git.read_text(errors="replace").strip()
            if text.startswith("gitdir:"):
                gitdir = (d / text.split(":", 1)[1].strip()).resolve()
                common = gitdir / "commondir"
                if common.is_file():
                    main_git = (gitdir / common.read_text().strip()).resolve()
                    return main_git.parent
            return d
    return Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class OrgHome:
    """Paths inside one org home. Creating folders is explicit (``ensure``)."""

    root: Path

    @property
    def db_path(self) -> Path | str:
        """Where the org's truth is: ``state.db`` in the home, or the PostgreSQL store that
        org.toml's ``[state] url`` (or ``ORG_STATE_URL``) names, as its URL. Every reader and
        writer opens it through ``state_db.connection.connect``, which takes either."""
        return self.store_url or self.root / "state.db"

    @functools.cached_property
    def store_url(self) -> str:
        """The PostgreSQL store's URL, or "" for the home's own state.db. Read once per home
        object, straight from org.toml (``state_db.kernel.config`` checks the key when the org loads
        its configuration; a file that does not parse here is left for it to report)."""
        env = os.environ.get("ORG_STATE_URL")
        if env is not None and env.strip() and not env.strip().startswith(("postgresql://", "postgres://")):
            raise ConfigError(f"ORG_STATE_URL {env.strip()!r} is not a postgresql:// URL", key="state.url",
                              hint="unset it for state.db in the org home, or give postgresql://USER@HOST/DB")
        if env is not None:
            return env.strip()
        try:
            table = tomlfile.loads((self.root / "org.toml").read_bytes().decode()).get("state")
        except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError):
            return ""
        url = table.get("url") if isinstance(table, dict) else None
        url = url.strip() if isinstance(url, str) else ""
        if url and not url.startswith(("postgresql://", "postgres://")):
            raise ConfigError(f"[state] url {url!r} is not a postgresql:// URL", key="state.url",
                              hint="leave it empty for state.db in the org home, or give postgresql://USER@HOST/DB")
        return url

    @property
    def config_path(self) -> Path:
        return self.root / "org.toml"

    @property
    def run_dir(self) -> Path:
        return self.root / "run"

    @property
    def outbox_dir(self) -> Path:
        return self.root / "outbox"

    @property
    def logs_dir(self) -> Path:
        return self.root / "logs"

    @property
    def snapshots_dir(self) -> Path:
        return self.root / "snapshots"

    @property
    def history_dir(self) -> Path:
        return self.root / "history"

    @property
    def knowledge_dir(self) -> Path:
        return self.root / "knowledge"

    @property
    def skills_dir(self) -> Path:
        return self.root / "skills"

    @property
    def backups_dir(self) -> Path:
        return self.root / "backups"

    def exists(self) -> bool:
        """An org lives here: its state.db, or, with a PostgreSQL store, its org.toml."""
        if self.store_url:
            return self.config_path.is_file()
        return self.root.joinpath("state.db").is_file()

    def ensure(self) -> "OrgHome":
        """Create the home and its folders. The home and ``run/`` are owner-only (state.db, sockets,
        keys, pid files): when the org does not run as root, another org's sandbox — running as
        its own user — cannot read them. The home is registered (``register_home``) and marked
        (``HOME_MARKER``) so every org's sandbox on this machine hides it, wherever it lies.

        Raises: StateError ``bad_home`` when the path is a file or cannot be created or written."""
        if self.root.exists() and not self.root.is_dir():
            raise StateError(f"the org home {self.root} is a file, not a folder", code="bad_home",
                             hint="give --home (or ORG_HOME) a folder, new or existing")
        try:
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(self.root, 0o700)
            for d in (self.outbox_dir, self.logs_dir, self.snapshots_dir, self.history_dir,
                      self.knowledge_dir, self.skills_dir, self.backups_dir):
                d.mkdir(exist_ok=True)
            self.run_dir.mkdir(mode=0o700, exist_ok=True)
            os.chmod(self.run_dir, 0o700)
            marker = self.root / HOME_MARKER
            if not marker.is_file():
                marker.write_text("a loop-org home: every sandbox hides this folder\n")
        except OSError as exc:
            raise StateError(f"cannot make the org home {self.root}: {exc.strerror or exc}", code="bad_home",
                             hint="give --home (or ORG_HOME) a folder you may create and write") from None
        register_home(self.root)
        return self

    def require(self) -> "OrgHome":
        """Return self if state.db exists; never creates anything."""
        if not self.exists():
            raise HomeNotFound(f"no org at {self.root} (state.db missing)",
                               hint="start one with 'scripts/start-org', or set ORG_HOME / --home")
        return self


def registry_path(env=os.environ) -> Path:
    """The list of org homes this user created (``$XDG_STATE_HOME/loop-org/homes``)."""
    base = env.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "loop-org" / "homes"


def register_home(root: Path) -> None:
    """Add ``root`` to the registry (one absolute path a line; homes that no longer exist are
    dropped). Best effort: a registry that cannot be written leaves this home unlisted, which
    only matters when another org's sandbox shows the folder it is in."""
    path = registry_path()
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with os.fdopen(os.dup(fd), "r+") as f:
            listed = [ln.strip() for ln in f if ln.strip().startswith("/")]
            keep = [p for p in dict.fromkeys([*listed, str(root)]) if os.path.isdir(p)]
            if keep != listed:
                f.seek(0)
                f.truncate()
                f.write("".join(p + "\n" for p in keep))
    except OSError:
        pass
    finally:
        os.close(fd)


def known_homes() -> list[str]:
    """The org homes in the registry that still exist."""
    try:
        lines = registry_path().read_text().splitlines()
    except OSError:
        return []
    return [ln.strip() for ln in lines if ln.strip().startswith("/") and os.path.isdir(ln.strip())]


def resolve_home(explicit: str | os.PathLike | None = None, *, env=os.environ) -> OrgHome:
    """Apply the path rule. Pure: touches no file system state.

    Raises: StateError ``bad_home`` for a path no file system can hold (a NUL byte)."""
    for given, source in ((explicit, "--home"), (env.get(ENV_HOME), ENV_HOME)):
        if given:
            if "\0" in os.fspath(given):
                raise StateError(f"{source} holds a NUL byte, which no path can contain", code="bad_home",
                                 hint="give the org home as a plain path")
            return OrgHome(Path(given).expanduser().resolve())
    return OrgHome(project_root() / ".org")
