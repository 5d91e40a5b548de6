"""The history's steps done by git processes, for what the in-process path refuses.

Nested repositories, ``.gitattributes``, special files, packed objects or refs, revisions in
git's own syntax: git stages, checks out and resolves them exactly as it always did, through a
private index in the git dir (``GIT_WORK_TREE`` is the workspace or the snapshot).
"""
from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Sequence

import structlog

from roles.workspace.errors import NoBaseline
from roles.workspace.gitcli import GitCli
from roles.workspace.protect import DEFAULT_PROTECTED_PATTERNS, match_paths

log = structlog.get_logger("loop_agent.history")

_ZERO = "0" * 40


# build caches are not recorded (as ``scan.CACHE_DIRS`` on the in-process path)
CACHE_EXCLUDES = tuple(f":(exclude,glob)**/{d}/**" for d in ("__pycache__", ".pytest_cache", ".mypy_cache",
                                                            ".ruff_cache"))


class GitPath:
    """Git-process implementations of the history's steps (see ``WorkspaceHistory``)."""

    def __init__(self, cli: GitCli, head_ref: str, baseline_ref: str) -> None:
        self.cli = cli
        self.head_ref = head_ref
        self.baseline_ref = baseline_ref

    def resolve(self, rev: str) -> str | None:
        proc = self.cli.run(["rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"], ok=(0, 1))
        return proc.stdout.decode().strip() or None

    def tree_id(self, commit: str) -> str:
        return self.cli.out(["rev-parse", f"{commit}^{{tree}}"])

    def changed(self, a: str, b: str) -> list[bytes]:
        raw = self.cli.run(["diff", "--name-only", "-z", "--no-renames", a, b]).stdout
        return [p for p in raw.split(b"\0") if p]

    def ls_tree(self, commit: str) -> dict[str, bytes]:
        """Map path -> raw ``ls-tree`` entry (``mode type oid\\tpath``) for every file."""
        raw = self.cli.run(["ls-tree", "-r", "-z", "--full-tree", commit]).stdout
        entries = {}
        for entry in raw.split(b"\0"):
            if entry:
                path = entry.split(b"\t", 1)[1].decode("utf-8", "surrogateescape")
                entries[path] = entry
        return entries

    def stage(self, ws: Path, last_tree: str | None) -> str:
        """Stage the whole workspace into the private index and return its tree id.

        ``last_tree``: the last state recorded in-process; git's index is given it first, as it
        always had it, so git's own rules (a nested repository already tracked as files, say)
        apply exactly as before.
        """
        if last_tree:
            self.cli.run(["read-tree", "-m", last_tree], work_tree=ws)
        self._forget_gitlinks(ws)
        self.cli.run(["add", "--all", "--force", "--", ".", *CACHE_EXCLUDES], work_tree=ws)
        return self.cli.out(["write-tree"], work_tree=ws)

    def _forget_gitlinks(self, ws: Path) -> None:
        """Drop nested repositories from the private index; ``add`` records each one again.

        For a nested repository already in the index, ``add`` runs ``git status`` inside it,
        under that repository's own configuration: a filter driver the doer named there would
        run on the host, and no ``-c`` setting can close a driver by a name it does not know
        (``safegit``). A nested repository ``add`` finds new is only read (its ``HEAD``).
        """
        staged = self.cli.run(["ls-files", "--stage", "-z"], work_tree=ws).stdout
        gitlinks = [entry.split(b"\t", 1)[1] for entry in staged.split(b"\0")
                    if entry.startswith(b"160000 ")]
        if gitlinks:
            self.cli.run(["update-index", "--force-remove", "-z", "--stdin"], work_tree=ws,
                         input=b"\0".join(gitlinks) + b"\0")

    def baseline(self, ws: Path, last_tree: str | None) -> str:
        tree = self.stage(ws, last_tree)
        commit = self.cli.out(["commit-tree", tree, "-m", "loop-org baseline"])
        self.cli.run(
            ["update-ref", "--stdin"],
            input=f"create {self.baseline_ref} {commit}\nupdate {self.head_ref} {commit}\n".encode(),
        )
        return commit

    def checkpoint(self, iteration: int, ref: str, ws: Path, last_tree: str | None) -> str:
        heads = self.cli.out(["for-each-ref", "--format=%(refname) %(objectname) %(tree)",
                              ref, self.head_ref])
        known = {name: (oid, tree) for name, oid, tree in map(str.split, heads.splitlines())}
        if self.head_ref not in known:
            raise NoBaseline("no baseline recorded; call baseline() before checkpoint()")
        tree = self.stage(ws, last_tree)
        old, old_tree = known.get(ref, (None, None))
        parent = known[self.head_ref][0]
        if old_tree == tree:
            if parent != old:  # same step again after a reset: continue from it
                self.cli.run(["update-ref", self.head_ref, old])
            return old
        message = f"loop-org checkpoint\n\niteration: {iteration}"
        commit = self.cli.out(["commit-tree", tree, "-p", parent, "-m", message])
        updates = [f"update {ref} {commit} {old or _ZERO}", f"update {self.head_ref} {commit}"]
        if old:
            updates.append(f"create refs/discarded/{iteration}/{old} {old}")
            log.warning("checkpoint_replaced", workspace=str(ws), iteration=iteration,
                        discarded=old, commit=commit)
        self.cli.run(["update-ref", "--stdin"], input=("\n".join(updates) + "\n").encode())
        return commit

    def checkpoint_ref(self, ref: str, message: str, ws: Path, last_tree: str | None) -> str:
        """A commit of the workspace on top of HEAD, written to ``ref`` (new) and HEAD."""
        parent = self.cli.out(["rev-parse", "--verify", "-q", self.head_ref])
        tree = self.stage(ws, last_tree)
        commit = self.cli.out(["commit-tree", tree, "-p", parent, "-m", message])
        self.cli.run(["update-ref", "--stdin"],
                     input=f"create {ref} {commit}\nupdate {self.head_ref} {commit}\n".encode())
        return commit

    def reset(self, target: str, ws: Path) -> None:
        self.cli.run(["read-tree", "--reset", "-u", target], work_tree=ws)
        # -ff also removes git repositories the agent created in subdirectories.
        self.cli.run(["clean", "-ffdxq"], work_tree=ws)
        self.cli.run(["update-ref", self.head_ref, target])

    def materialize(self, target: str, source: str, dest: Path, index: Path,
                    paths: Sequence[str] | None, fresh: bool) -> list[str]:
        """Write ``target`` into ``dest`` through the private index ``index`` (see
        ``WorkspaceHistory.materialize``); ``fresh``: ``dest`` is absent or empty."""
        if fresh:
            index.unlink(missing_ok=True)
        dest.mkdir(parents=True, exist_ok=True)
        index.parent.mkdir(exist_ok=True)
        source_entries = self.ls_tree(source)
        wanted = set(match_paths(source_entries, DEFAULT_PROTECTED_PATTERNS)
                     if paths is None else paths) & source_entries.keys()
        changed = {p.decode("utf-8", "surrogateescape") for p in self.changed(source, target)}
        differing = sorted(wanted & changed)
        tree = self._restored_tree(target, source_entries, differing) if differing else target
        env = dict(self.cli.env, GIT_INDEX_FILE=str(index))
        # --reset overwrites whatever is in the way, also files an in-process write left.
        self.cli.run(["read-tree", "--reset", "-u", tree], work_tree=dest, env=env)
        if not fresh:
            self.cli.run(["clean", "-ffdxq"], work_tree=dest, env=env)
        return differing

    def _restored_tree(self, target: str, source_entries: dict[str, bytes],
                       paths: Sequence[str]) -> str:
        """Tree of ``target`` with ``paths`` taken from ``source_entries`` (a private index)."""
        index = self.cli.git_dir / f"restore-{os.getpid()}-{uuid.uuid4().hex[:8]}.index"
        env = dict(self.cli.env, GIT_INDEX_FILE=str(index))
        try:
            self.cli.run(["read-tree", target], env=env)
            # --replace drops entries in the way (a file where a directory was, or back).
            self.cli.run(["update-index", "-z", "--replace", "--index-info"], env=env,
                         input=b"".join(source_entries[p] + b"\0" for p in paths))
            return self.cli.out(["write-tree"], env=env)
        finally:
            index.unlink(missing_ok=True)
