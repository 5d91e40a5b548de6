"""What a trigger sees in a workspace: the one place the coordinator's triggers ask (they run no
check, read no history and hash no file themselves).

- ``files`` — the files of a workspace as git blob ids (content, not timestamps), as the shadow
  history records them, so the org's checkpoints compare; a file is hashed again only when its
  size or mtime changed (libgit2 hashes).
- ``org_files`` — what the org's latest runs on a workspace left there, checkpoint by checkpoint
  (read from their shadow histories, ``roles/workbench/workspace/history``).
- ``head`` / ``commit_files`` — a branch's commit and the files a commit records, read with
  libgit2 (``safegit``: nothing the repository configures runs).
- ``run_checks`` — the verify commands on a copy of the current tree, each through
  ``roles.workbench.sandbox.run_check_command``: the function the eval-agent's checks run through, in the
  sandbox org.toml asks for (``runner_from_config``).
"""
from __future__ import annotations

import hashlib
import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

import structlog

from roles.workbench.workspace.protect import match_paths
from state_db.kernel.config import Config
from state_db.kernel.errors import OrgError
from state_db.kernel.home import OrgHome
from state_db.queries import schedules as q

log = structlog.get_logger("operations.watch")
CANNOT_START = (126, 127)
CHECK_OUTPUT_BYTES = 200_000

__all__ = ["Head", "Observer", "Ran", "fingerprint", "matching"]


@dataclass(frozen=True)
class Head:
    """A branch's commit (``oid`` None: none to read — ``why``) and one line about it."""

    oid: str | None
    detail: str = ""
    why: str = ""


@dataclass(frozen=True)
class Ran:
    """One verify command run on a copy of the tree: ``cannot`` says why it could not run (the
    sandbox refused, it timed out, exit 126/127) — a machine's failure, not the tree's."""

    command: str
    exit_code: int | None
    output: str
    cannot: str = ""


def fingerprint(files: dict[str, str]) -> str:
    """One id for a set of files and their contents."""
    h = hashlib.sha256()
    for path in sorted(files):
        h.update(f"{path}\0{files[path]}\n".encode("utf-8", "surrogateescape"))
    return h.hexdigest()


def matching(paths: list[str], pattern: str) -> list[str]:
    """The ``paths`` a protect-style glob matches (``roles/workbench/workspace/protect``)."""
    return match_paths(paths, [pattern])


class Observer:
    """Looks at workspaces; keeps per-process caches (file ids by stat, the org's checkpoints)."""

    def __init__(self, home: OrgHome, cfg: Config):
        self.home, self.cfg = home, cfg
        self._ids: dict[str, tuple[int, int, str]] = {}         # path -> (size, mtime_ns, blob id)
        self._org: dict[tuple[str, str], dict[str, str]] = {}   # (work id, commit) -> path -> blob id

    # -- files ------------------------------------------------------------------------------------
    def files(self, ws: Path, pattern: str | None = None) -> dict[str, str]:
        """The files of ``ws`` but ``.git`` (only those matching ``pattern`` when given): relative
        path -> git blob id. Names are matched before anything is read."""
        names = []
        start = ws / _fixed_prefix(pattern) if pattern else ws     # only where the pattern can match
        for top, dirs, files in os.walk(start):
            dirs[:] = [d for d in dirs if d != ".git"]
            rel_top = os.path.relpath(top, ws)
            names.extend(name if rel_top == "." else f"{rel_top}/{name}" for name in files)
        if pattern is not None:
            names = match_paths(names, [pattern])
        out = {}
        for rel in sorted(names):
            oid = self._blob_id(os.path.join(ws, rel))
            if oid is not None:
                out[rel] = oid
        return out

    def _blob_id(self, full: str) -> str | None:
        import pygit2
        try:
            st = os.lstat(full)
        except OSError:
            return None
        cached = self._ids.get(full)
        if cached and cached[:2] == (st.st_size, st.st_mtime_ns):
            return cached[2]
        try:
            if stat.S_ISLNK(st.st_mode):
                oid = str(pygit2.hash(os.fsencode(os.readlink(full))))
            elif stat.S_ISREG(st.st_mode):
                oid = str(pygit2.hashfile(full))
            else:
                return None                     # sockets, fifos: git records none
        except (OSError, pygit2.GitError):
            return None
        self._ids[full] = (st.st_size, st.st_mtime_ns, oid)
        return oid

    def org_files(self, conn, ws: str) -> list[dict[str, str]]:
        """What the org's latest runs on ``ws`` left there, checkpoint by checkpoint."""
        from roles.workbench.workspace.history import WorkspaceHistory
        out = []
        for work_id, commit in q.org_checkpoints(conn, ws):
            key = (work_id, commit)
            if key not in self._org:
                try:
                    ids = WorkspaceHistory(self.home.history_dir / f"{work_id}.git", Path(ws)).file_ids(commit)
                except Exception as exc:  # noqa: BLE001 - a pruned history: that run is no help
                    log.warning("checkpoint_unreadable", work_id=work_id, commit=commit, error=str(exc),
                                next="its changes cannot be told from a human's")
                    ids = {}
                self._org[key] = {p: v.split(" ", 1)[1] for p, v in ids.items()}
            out.append(self._org[key])
        return out

    # -- git --------------------------------------------------------------------------------------
    def head(self, ws: Path, branch: str) -> Head:
        """The commit ``branch`` of the repository at ``ws`` points at, and one line about it."""
        from roles.workbench.workspace import safegit
        from roles.workbench.workspace.errors import RepositoryError
        try:
            repo = safegit.open_repository(ws)
        except RepositoryError as exc:
            return Head(None, why=exc.message)
        ref = repo.references.get(f"refs/heads/{branch}")
        if ref is None:
            return Head(None, why=f"no branch {branch} in {ws}")
        commit = repo[ref.resolve().target]
        return Head(str(commit.id), detail=f"commit {str(commit.id)[:12]} on {branch}: "
                                           f"{commit.message.strip().splitlines()[0][:200] if commit.message.strip() else ''}"
                                           f" (by {commit.author.name})")

    def commit_files(self, ws: Path, oid: str) -> dict[str, str]:
        """The files commit ``oid`` of the repository at ``ws`` records: path -> blob id."""
        from roles.workbench.workspace import safegit
        repo = safegit.open_repository(ws)
        out: dict[str, str] = {}

        def walk(tree, prefix: str) -> None:
            for entry in tree:
                path = f"{prefix}{entry.name}"
                if entry.type_str == "tree":
                    walk(repo[entry.id], path + "/")
                elif entry.type_str == "blob":
                    out[path] = str(entry.id)
        walk(repo[oid].tree, "")
        return out

    # -- checks -----------------------------------------------------------------------------------
    def run_checks(self, name: str, ws: Path, commands: list[str]) -> list[Ran]:
        """Run ``commands`` in turn on a copy of ``ws`` (``.git`` left out) in the sandbox, under
        the org home's ``triggers/NAME``; stops at the first that cannot run (its ``cannot``)."""
        from roles.workbench.sandbox import run_check_command, runner_from_config
        out: list[Ran] = []
        snapshot = self.home.root / "triggers" / name
        shutil.rmtree(snapshot, ignore_errors=True)
        try:
            shutil.copytree(ws, snapshot, symlinks=True, ignore=shutil.ignore_patterns(".git"))
            runner = runner_from_config(self.cfg, self.home, snapshot, present_at=ws)
            for command in commands:
                try:
                    res = run_check_command(runner, command, snapshot, timeout_s=float(self.cfg.sandbox.cpu_seconds),
                                            max_output=CHECK_OUTPUT_BYTES)
                except Exception as exc:  # noqa: BLE001 - the sandbox refused: the machine's fault
                    code = exc.code if isinstance(exc, OrgError) else type(exc).__name__
                    out.append(Ran(command, None, "", cannot=f"cannot run: {code}: {exc}"))
                    break
                if res.timed_out or res.exit_code in CANNOT_START:
                    said = " / ".join(res.output.strip().splitlines()[-2:])[:300]
                    why = "timed out" if res.timed_out else f"exit {res.exit_code}"
                    out.append(Ran(command, res.exit_code, res.output, cannot=f"cannot run ({why}): {said}"))
                    break
                out.append(Ran(command, res.exit_code, res.output))
        finally:
            shutil.rmtree(snapshot, ignore_errors=True)
        return out


def _fixed_prefix(pattern: str) -> str:
    """The folders a glob names before its first wildcard (``src/app/**/*.py`` -> ``src/app``)."""
    fixed = []
    for part in pattern.split("/")[:-1]:
        if any(c in part for c in "*?[{"):
            break
        fixed.append(part)
    return "/".join(fixed)
