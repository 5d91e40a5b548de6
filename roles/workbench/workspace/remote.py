"""A workspace history on a worker host, kept in step with the coordinator host's through git.

A loop-agent on a worker host shares no file system with the coordinator host, which keeps every
work item's history at ``<coordinator home>/history/<work_id>.git`` and serves it
(``roles.workbench.serve.gitserve``: ``git daemon``; or ssh:// through sshd's forced command ``org
git-shell``, ``roles.workbench.serve.gitshell``). ``RemoteHistory`` is a
``WorkspaceHistory`` in the worker's own home that

- takes its baseline from there: the coordinator's eval-agent records it (from the real
  workspace, in its preflight); the worker fetches it and checks it out into its own workspace;
- pushes every checkpoint back as git objects before returning, so the iteration row the caller
  commits next names a commit the coordinator's eval-agent can read;
- fetches once when it is asked for a commit it does not hold (a fresh worker home resuming a run
  that another worker began);
- on a joined host's eval-agent, fetches the checkpoint it is to verify and the baseline
  (``ensure_held``), with no workspace at all: it writes only snapshots.

Transport is the git executable (``git --git-dir=<local history> fetch|push``), one process per
exchange, each with a timeout (its whole process group is killed then), no prompt
(``GIT_TERMINAL_PROMPT=0``, ssh in batch mode), no user or system git configuration and no hook.
Over ssh:// the system's ``ssh`` is run as git runs it: its key and the coordinator's host key come
from the user's ``~/.ssh/config`` and ``known_hosts``, or from ``GIT_SSH_COMMAND`` (``GIT_SSH``,
``GIT_SSH_VARIANT``) in the environment, the only ``GIT_*`` settings kept; without either, ``ssh
-o BatchMode=yes -o ConnectTimeout=<timeout>``.
Git only ever touches the local history's object store and refs, never the workspace: checking
the baseline out goes through ``shadow`` like any reset. The local history is the org's own
(created by ``shadow.create``, in the org home), never a doer-writable repository, so running git
on it is safe (``safegit``). Objects the git executable writes are seen by the libgit2 repository
already open on the same folder: libgit2 reads the pack folder again when an object is missing.

Refs. Fetched: ``refs/iterations/*``, ``refs/actions/*``, ``refs/discarded/*`` to the same names,
and the coordinator's ``refs/loop-org/*`` to ``refs/fetched/loop-org/*``. The local baseline ref is
written only once its tree is checked out, so a worker killed in between fetches and checks out
again, and the local folder as it stood is never recorded as a baseline. Pushed:
``refs/iterations/<n>`` (forced: a later attempt of an iteration replaces it), with
``refs/discarded/<n>/<old>`` in the same atomic push when it replaced one; ``refs/actions/<name>``;
``refs/heads/checkpoints`` when the run stops (best effort).

Trust model. Objects are content-addressed: what a commit id names cannot change in transit or on
either side. The coordinator's eval-agent verifies the commit state.db names, by id, against the
baseline the coordinator recorded; the server's ``pre-receive`` hook refuses any push to
``refs/loop-org/*``, so no worker can move the baseline that protected files are restored from.

Errors: a failed exchange (remote unreachable, repository refused, push rejected, timeout) raises
``HistoryError`` with code ``git_remote_failed``: one line with what failed, the URL, git's last
telling stderr line and what to do.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Callable

import structlog

from roles.workbench.workspace.errors import HistoryError
from roles.workbench.workspace.history import WorkspaceHistory, iteration_ref
from roles.workbench.workspace.views import BASELINE_REF, HEAD_REF

log = structlog.get_logger("loop_agent.history")

FETCHED_BASELINE = "refs/fetched/loop-org/baseline"
FETCH_REFSPECS = (
    "+refs/loop-org/*:refs/fetched/loop-org/*",
    "+refs/iterations/*:refs/iterations/*",
    "+refs/actions/*:refs/actions/*",
    "+refs/discarded/*:refs/discarded/*",
)
_COMMIT_ID = re.compile(r"[0-9a-f]{40}([0-9a-f]{24})?")
# What git (and git daemon with --informative-errors, or ssh) says when the repository is not there.
_NO_REPOSITORY = ("no such repository", "does not appear to be a git repository",
                  "not a git repository", "repository not found")
# What git adds below the reason when a transport fails (ssh's own line says what happened).
_BOILERPLATE = frozenset({"fatal: Could not read from remote repository.",
                          "Please make sure you have the correct access rights",
                          "and the repository exists."})
_KEEP_ENV = ("GIT_SSH", "GIT_SSH_COMMAND", "GIT_SSH_VARIANT")


class RemoteMissing(HistoryError):
    """The remote repository does not exist (yet)."""

    code = "git_remote_missing"


def git_env(timeout_s: float) -> dict[str, str]:
    """The environment of every git process: no prompt, no user or system configuration, no
    inherited ``GIT_*`` setting but how to run ssh, ssh never asking and giving up connecting in
    ``timeout_s``, messages in English (they are parsed)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_") or k in _KEEP_ENV}
    env.update(GIT_TERMINAL_PROMPT="0", GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull,
               GIT_ALLOW_PROTOCOL="git:ssh:file:https:http", LC_ALL="C")
    env.pop("LANGUAGE", None)
    if not any(k in env for k in ("GIT_SSH", "GIT_SSH_COMMAND")):
        env["GIT_SSH_COMMAND"] = f"ssh -o BatchMode=yes -o ConnectTimeout={max(1, int(timeout_s))}"
    return env


def telling_line(stderr: str) -> str:
    """git's last stderr line, or the rejection above a closing ``failed to push`` line."""
    lines = [ln.strip() for ln in stderr.replace("\r", "\n").splitlines()
             if ln.strip() and not ln.startswith("hint:")]   # git's advice, never the reason
    lines = [ln for ln in lines if ln not in _BOILERPLATE] or lines[-1:]
    if not lines:
        return "no message"
    last = lines[-1]
    if last.startswith("error: failed to push"):
        for marks in (("loop-org:",), ("rejected", "fatal")):   # the server's reason first
            for line in reversed(lines[:-1]):
                if any(m in line for m in marks):
                    return " ".join(line.split())
    return " ".join(last.split())


class RemoteHistory(WorkspaceHistory):
    """A worker host's history of one workspace, kept in step with the coordinator's.

    Args:
        git_dir: the local history (``<worker home>/history/<work_id>.git``); made on first use.
        workspace: the worker's workspace; made when the baseline is checked out into it.
        remote: the URL of the coordinator's history of this work item
            (``git://<coordinator>:9418/<work_id>.git``, or ``ssh://[user@]host[:port]/<work_id>.git``).
        defer, on_step: as ``WorkspaceHistory``; ``on_step`` also hears ``fetched`` and
            ``pushed:<ref>``.
        timeout_s: the longest one git exchange may take; it is killed then.
    """

    def __init__(self, git_dir: Path, workspace: Path, *, remote: str, defer: bool = False,
                 on_step: Callable[[str], None] | None = None, timeout_s: float = 60.0) -> None:
        super().__init__(git_dir, workspace, on_step=on_step, defer=defer)
        if not remote or remote.startswith("-"):
            raise HistoryError(f"not a remote URL: {remote!r}", code="git_remote_failed",
                               hint="give the coordinator's git://host:port/<work_id>.git")
        self.remote = remote
        self.timeout_s = float(timeout_s)
        self._fetched_for: set[str] = set()   # commit ids a fetch was made for (once each)

    # -- the git executable ---------------------------------------------------------------------

    def _git(self, what: str, args: list[str], *, missing: bool = False) -> str:
        """Run ``git --git-dir=<local> <args>``; return its stderr.

        Raises: RemoteMissing if ``missing`` and the remote repository is not there;
        HistoryError(code="git_remote_failed") for any other failure, or a timeout (the git
        process is killed with whatever it started).
        """
        cmd = ["git", f"--git-dir={self.git_dir}", "-c", "core.hooksPath=/dev/null", *args]
        try:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.PIPE, env=git_env(self.timeout_s),
                                    start_new_session=True, text=True, errors="replace")
        except OSError as exc:
            raise self._failure(what, f"cannot run git: {exc.strerror}", "install git on this host")
        try:
            _, err = proc.communicate(timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            _kill(proc)
            raise self._failure(what, f"no answer within {self.timeout_s:g}s",
                                "check the coordinator host is up and reachable from here") from None
        if proc.returncode != 0:
            line = telling_line(err)
            if missing and any(m in line.lower() for m in _NO_REPOSITORY):
                raise RemoteMissing(f"{what} {self.remote} failed: {line}",
                                    hint="the coordinator makes it with the baseline; try again later")
            raise self._failure(what, line, _hint_for(what, line))
        return err

    def _failure(self, what: str, line: str, hint: str) -> HistoryError:
        return HistoryError(f"{what} {self.remote} failed: {line}", code="git_remote_failed", hint=hint)

    def _fetch(self) -> None:
        """Fetch the coordinator's refs (``FETCH_REFSPECS``) and their objects; the local
        history is made if missing. Raises: RemoteMissing, HistoryError(git_remote_failed)."""
        self._ensure_repo()
        started = time.monotonic()
        self._git("fetch from", ["fetch", "--quiet", "--no-tags", "--no-write-fetch-head",
                                 "--no-recurse-submodules", "--no-auto-gc", self.remote, *FETCH_REFSPECS],
                  missing=True)
        self._step("fetched")
        log.info("history_fetched", remote=self.remote, ms=round((time.monotonic() - started) * 1000, 1))

    def _push(self, refspecs: list[str]) -> None:
        """Push ``refspecs`` in one atomic push; return once the remote took them all.
        Raises: HistoryError(git_remote_failed)."""
        started = time.monotonic()
        self._git("push to", ["push", "--quiet", "--atomic", "--no-verify", "--no-recurse-submodules",
                              self.remote, *refspecs])
        for spec in refspecs:
            self._step(f"pushed:{spec.lstrip('+').partition(':')[2]}")
        log.debug("history_pushed", remote=self.remote, refs=len(refspecs),
                  ms=round((time.monotonic() - started) * 1000, 1))

    # -- resolving: fetch once on a miss ---------------------------------------------------------

    def _resolve(self, rev: str) -> str | None:
        """As ``WorkspaceHistory._resolve``; a whole commit id not held here is fetched for
        once (the first time it is asked for) and resolved again."""
        found = super()._resolve(rev)
        if found is not None or not isinstance(rev, str) or not _COMMIT_ID.fullmatch(rev):
            return found
        if rev in self._fetched_for:
            return None
        try:
            self._fetch()
        except RemoteMissing:
            return None
        self._fetched_for.add(rev)
        return super()._resolve(rev)

    # -- recording ---------------------------------------------------------------------------------

    def baseline(self) -> str | None:  # type: ignore[override]
        """The baseline: the local one if recorded; else the coordinator's, fetched and checked
        out into the workspace (made if missing; anything in it not in the baseline is removed).
        Never records the local workspace.

        Returns: the baseline commit id, or None when the coordinator has none yet (no repository,
        or a repository without a baseline): call again later.
        Raises: HistoryError(git_remote_failed), RefLocked.
        """
        self._clear_stale_locks()
        existing = self.baseline_commit()
        if existing:
            if self._ref(HEAD_REF) is None:
                self._set_ref(HEAD_REF, existing, "loop-org: baseline")
            return existing
        try:
            self._fetch()
        except RemoteMissing:
            log.info("remote_baseline_missing", remote=self.remote, reason="no repository yet")
            return None
        commit = self._ref(FETCHED_BASELINE)
        if commit is None:
            log.info("remote_baseline_missing", remote=self.remote, reason="no baseline yet")
            return None
        if self._ref(HEAD_REF) is None:
            # Not checked out yet (HEAD moves once a reset's checkout is done: a worker killed in
            # it checks out again). A HEAD already there is a reset's (a resumed run reset to its
            # last checkpoint first): the workspace holds that, which must stay.
            self.reset_to(commit)
        self._set_ref(BASELINE_REF, commit, "loop-org: baseline of the coordinator", expect=None)
        log.info("workspace_baseline_fetched", workspace=str(self.workspace), commit=commit,
                 remote=self.remote)
        return commit

    def ensure_held(self, commit: str) -> None:
        """For an eval-agent on a joined host: fetch ``commit`` (a checkpoint the store names) and
        the coordinator's baseline when either is not held here, and record that baseline as
        this history's (protected files are restored from it). No workspace is touched. A
        baseline already recorded here never moves.

        Raises: RemoteMissing; HistoryError(git_remote_failed): the coordinator cannot be
        reached in ``timeout_s``, or its history has no baseline, another one, or not ``commit``.
        """
        base = self.baseline_commit()
        if base is not None and WorkspaceHistory._resolve(self, commit) is not None:
            return
        self._fetch()
        fetched = self._ref(FETCHED_BASELINE)
        if fetched is None:
            raise self._failure("fetch from", "the coordinator's history has no baseline yet",
                                "its eval-agent records it in the preflight; try again later")
        if base is None:
            self._set_ref(BASELINE_REF, fetched, "loop-org: baseline of the coordinator", expect=None)
        elif base != fetched:
            raise self._failure("fetch from", f"the coordinator's baseline is {fetched}, not {base} as fetched before",
                                "a baseline never moves: remove this host's copy (history/<id>.git) and verify again")
        if WorkspaceHistory._resolve(self, commit) is None:
            raise self._failure("fetch from", f"commit {commit} is not in the coordinator's history",
                                "the loop-agent pushes each checkpoint before committing it; check the "
                                "coordinator host's git server")
        log.info("checkpoint_fetched", remote=self.remote, commit=commit)

    def reset_to(self, commit: str) -> None:
        """``WorkspaceHistory.reset_to``; a commit not held here is fetched first (once), and a
        missing workspace is made: on a worker host it is a copy the history rebuilds.

        Raises: UnknownCommit (not here nor on the remote), HistoryError(git_remote_failed),
        RefLocked.
        """
        self._commit_of(commit)   # fetches on a miss, before anything is made
        self.workspace.mkdir(parents=True, exist_ok=True)
        super().reset_to(commit)

    def checkpoint(self, iteration: int) -> str:
        """``WorkspaceHistory.checkpoint``, then push the commit to the remote as
        ``refs/iterations/<n>`` (forced), with ``refs/discarded/<n>/<old>`` when it replaced one;
        returns once the remote has it all. The same step again pushes again (a no-op when the
        remote has it), so a push cut by a crash is made by the retry.

        Raises: as ``WorkspaceHistory.checkpoint``; HistoryError(git_remote_failed).
        """
        before = self._ref(iteration_ref(iteration)) if self._exists() else None
        commit = super().checkpoint(iteration)
        ref = iteration_ref(iteration)
        specs = [f"+{ref}:{ref}"]
        if before is not None and before != commit:
            discarded = f"refs/discarded/{iteration}/{before}"
            specs.append(f"{discarded}:{discarded}")
        self._push(specs)
        return commit

    def checkpoint_action(self, name: str) -> str:
        """``WorkspaceHistory.checkpoint_action``, then push ``refs/actions/<name>`` (never forced:
        an approved action's checkpoint is made once). Raises: as the parent;
        HistoryError(git_remote_failed)."""
        commit = super().checkpoint_action(name)
        ref = f"refs/actions/{name}"
        self._push([f"{ref}:{ref}"])
        return commit

    def flush_pending(self) -> None:
        """``WorkspaceHistory.flush_pending``, then push ``refs/heads/checkpoints`` (forced: a reset
        moves it back). Best effort: a failure is logged, never raised (the iterations are pushed
        already; this ref only says where the run stood)."""
        super().flush_pending()
        if not self._exists() or self._ref(HEAD_REF) is None:
            return
        try:
            self._push([f"+{HEAD_REF}:{HEAD_REF}"])
        except HistoryError as exc:
            log.warning("history_push_checkpoints_failed", remote=self.remote, error=str(exc))


def _hint_for(what: str, line: str) -> str:
    text = line.lower()
    if any(m in text for m in _NO_REPOSITORY):
        return "the coordinator holds no history of this work item (cancelled or deleted): stop the run"
    if "fetch first" in text or "non-fast-forward" in text or "already exists" in text:
        return "another worker recorded this ref first: run one loop-agent per work item"
    if "loop-org:" in text or "rejected" in text or "declined" in text:
        return "the coordinator refused the refs; a worker pushes only checkpoints, never the baseline"
    if what.startswith("push"):
        return "check the coordinator's git server is running and reachable, then run the step again"
    return "check the coordinator's git server is running and reachable from this host"


def _kill(proc: subprocess.Popen) -> None:
    """Kill a git process that ran out of time, with whatever it started (its own session), and
    reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.communicate()
