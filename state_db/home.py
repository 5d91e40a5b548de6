"""The org home: where state.db and every runtime folder live.

Path rule: explicit argument > ``$ORG_HOME`` > ``.org/`` beside the project. The project is found
from the code's own location, resolved through git's common directory, so ``org`` run from a
subdirectory or from a git worktree of the project reaches the same database.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from state_db.errors import HomeNotFound, StateError, UnsupportedPlatform

ENV_HOME = "ORG_HOME"


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
    def db_path(self) -> Path:
        return self.root / "state.db"

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
        return self.db_path.is_file()

    def ensure(self) -> "OrgHome":
        """Create the home and its folders; ``run/`` is owner-only (sockets, keys, pid files)."""
        self.root.mkdir(parents=True, exist_ok=True)
        for d in (self.outbox_dir, self.logs_dir, self.snapshots_dir, self.history_dir,
                  self.knowledge_dir, self.skills_dir, self.backups_dir):
            d.mkdir(exist_ok=True)
        self.run_dir.mkdir(mode=0o700, exist_ok=True)
        os.chmod(self.run_dir, 0o700)
        return self

    def require(self) -> "OrgHome":
        """Return self if state.db exists; never creates anything."""
        if not self.exists():
            raise HomeNotFound(f"no org at {self.root} (state.db missing)",
                               hint="start one with 'scripts/start-org', or set ORG_HOME / --home")
        return self


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
