"""Event-triggered loops: a watcher the coordinator owns looks at each active trigger's workspace
and starts its work item when the event fires (``schedules.start``: single-flight, the daily cap,
signed ``trigger:NAME``), with the event's details in the goal's context.

Events, each a *fingerprint* of what the trigger watches, compared with the one it last saw
(``watch.seen`` in state.db, so a restarted org compares with what it saw before it stopped, and
many changes while it was down are one event):

- ``git-commit``: the commit a branch points at, read with libgit2 (``safegit``: nothing the
  repository configures runs);
- ``file-change``: the git blob ids of the files matching a glob (content, not timestamps; a
  file's id is recomputed only when its size or mtime changed). Polled on the watcher's tick
  rather than watchdog-driven: the same input gives the same events, and a burst of changes is
  one event once the files are quiet for ``debounce_s``;
- ``verify-fails``: every ``every_s`` the verify commands run on a copy of the current tree in
  the sandbox the eval-agent uses (``runner_from_config``); the state is the tree plus which
  commands failed, so one failing state fires once. A command that cannot start (exit 126/127, a
  timeout, the sandbox refusing) is not a failure: it is recorded on the trigger, nothing fires;
- ``discover``: every ``every_s`` a discovery scan (``discover.scan_all``: the verify commands'
  failures, TODO/FIXME markers, the ``issues`` file) runs on the workspace and its candidates are
  recorded as proposals (``proposals.record``, signed ``trigger:NAME``). Nothing starts unless
  org.toml's ``discover.auto_start`` names the kind and ``limits.daily_spend_usd`` has room
  (``proposals.auto_start``, with the trigger's submit options); a start is the trigger's firing,
  a cap that has no room a skip. A scan whose verify commands cannot start records why on the
  trigger and records no proposal (it would expire the open ones it cannot see).

Single-flight and coalescing as for timers: while the work a trigger started is still queued or
running, an event is skipped and counted; periods missed while the org was down are one check.

Never for the org's own changes: while a run of the org is changing the workspace (dispatched,
running, or paused mid-act) the trigger does not look, and a state equal to what the org's runs
left there — their last iteration checkpoints and approved actions' checkpoints, read from the
shadow histories — is taken as seen without firing. A commit is the org's when every file it
records is as one of those checkpoints has it (e.g. an approved ``git commit`` of the run's work).
"""
from __future__ import annotations

import hashlib
import os
import shutil
import stat
import threading
from dataclasses import dataclass
from pathlib import Path

import structlog

from roles.coordinator import schedules
from roles.operations import schedules as rules
from roles.operations.discover import scan_all
from roles.operations.proposals import Edits, auto_start, record
from roles.workbench.workspace.protect import match_paths
from state_db.kernel.config import Config
from state_db.kernel.errors import OrgError
from state_db.kernel.home import OrgHome
from state_db.queries import schedules as q
from state_db.vocab import EVENT_KINDS, Actor, ScheduleKind, ScheduleStatus, WorkStatus
from state_db.writer import StateWriter

log = structlog.get_logger("coordinator.triggers")
PASSING = "pass"
SCANNED = "scanned"            # a discover trigger's scan that started nothing (no kind the policy names)
PERIODIC = (ScheduleKind.VERIFY_FAILS, ScheduleKind.DISCOVER)


@dataclass(frozen=True)
class Seen:
    """One look at what a trigger watches: its fingerprint (None: nothing to compare — the
    workspace or branch is gone, or a check could not start: ``why``) and the event's details."""

    fingerprint: str | None
    detail: str = ""
    why: str = ""
    tree: str | None = None         # verify-fails: the tree's fingerprint (to tell the org's trees)


class Observer:
    """Looks at workspaces; keeps per-process caches (file ids by stat, the org's checkpoints)."""

    def __init__(self, home: OrgHome, cfg: Config):
        self.home, self.cfg = home, cfg
        self._ids: dict[str, tuple[int, int, str]] = {}         # path -> (size, mtime_ns, blob id)
        self._org: dict[tuple[str, str], dict[str, str]] = {}   # (work id, commit) -> path -> blob id

    # -- files ------------------------------------------------------------------------------------
    def files(self, ws: Path, pattern: str | None = None) -> dict[str, str]:
        """The files of ``ws`` but ``.git`` (only those matching ``pattern`` when given): relative
        path -> git blob id, as the shadow history records them, so the org's checkpoints compare.
        Names are matched before anything is read; a file is hashed again only when its size or
        mtime changed."""
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

    # -- the three kinds ----------------------------------------------------------------------------
    def look(self, order: q.Schedule) -> Seen:
        ws = Path(order.request["workspace"])
        if not ws.is_dir():
            return Seen(None, why=f"the workspace {ws} is gone")
        if order.kind == ScheduleKind.GIT_COMMIT:
            return self.commit(ws, order.rule["branch"])
        if order.kind == ScheduleKind.FILE_CHANGE:
            return self.glob(ws, order.rule["glob"])
        return self.verify(order, ws)

    def commit(self, ws: Path, branch: str) -> Seen:
        from roles.workbench.workspace import safegit
        from roles.workbench.workspace.errors import RepositoryError
        try:
            repo = safegit.open_repository(ws)
        except RepositoryError as exc:
            return Seen(None, why=exc.message)
        ref = repo.references.get(f"refs/heads/{branch}")
        if ref is None:
            return Seen(None, why=f"no branch {branch} in {ws}")
        commit = repo[ref.resolve().target]
        return Seen(str(commit.id), detail=f"commit {str(commit.id)[:12]} on {branch}: "
                                           f"{commit.message.strip().splitlines()[0][:200] if commit.message.strip() else ''}"
                                           f" (by {commit.author.name})")

    def commit_files(self, ws: Path, oid: str) -> dict[str, str]:
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

    def glob(self, ws: Path, pattern: str) -> Seen:
        files = self.files(ws, pattern)
        return Seen(fingerprint(files), detail=f"files matching {pattern} changed ({len(files)} now match)")

    def verify(self, order: q.Schedule, ws: Path) -> Seen:
        tree = fingerprint(self.files(ws))
        failing, ran = [], []
        snapshot = self.home.root / "triggers" / order.id
        shutil.rmtree(snapshot, ignore_errors=True)
        try:
            shutil.copytree(ws, snapshot, symlinks=True, ignore=shutil.ignore_patterns(".git"))
            from roles.workbench.sandbox import runner_from_config
            runner = runner_from_config(self.cfg, self.home, snapshot, present_at=ws)
            for command in order.request["verify"]:
                try:
                    res = runner.execute(command, cwd=snapshot, timeout_s=float(self.cfg.sandbox.cpu_seconds),
                                         max_output=200_000)
                except Exception as exc:  # noqa: BLE001 - the sandbox refused: the machine's fault
                    return Seen(None, why=f"`{command}` cannot run: {exc.code if isinstance(exc, OrgError) else type(exc).__name__}: {exc}",
                                tree=tree)
                if res.timed_out or res.exit_code in (126, 127):
                    said = " / ".join(res.output.strip().splitlines()[-2:])[:300]
                    why = "timed out" if res.timed_out else f"exit {res.exit_code}"
                    return Seen(None, why=f"`{command}` cannot run ({why}): {said}", tree=tree)
                ran.append(command)
                if res.exit_code != 0:
                    tail = "\n".join(res.output.strip().splitlines()[-15:])
                    failing.append((command, res.exit_code, tail))
        finally:
            shutil.rmtree(snapshot, ignore_errors=True)
        if not failing:
            return Seen(PASSING, detail="every verify command passes", tree=tree)
        detail = "; ".join(f"`{c}` failed (exit {code}):\n{tail}" for c, code, tail in failing)
        return Seen(f"fail:{tree}:" + hashlib.sha256("\n".join(c for c, _, _ in failing).encode()).hexdigest()[:16],
                    detail=f"{len(failing)} of {len(ran)} verify commands fail on the current tree: {detail}", tree=tree)

    # -- the org's own changes ----------------------------------------------------------------------
    def org_made(self, conn, order: q.Schedule, seen: Seen) -> bool:
        """Is what ``seen`` shows a state one of the org's runs left in the workspace?"""
        ws = order.request["workspace"]
        states = self.org_files(conn, ws)
        if not states:
            return False
        if order.kind == ScheduleKind.FILE_CHANGE:
            return any(fingerprint({p: s[p] for p in match_paths(sorted(s), [order.rule["glob"]])}) == seen.fingerprint
                       for s in states)
        if order.kind == ScheduleKind.VERIFY_FAILS:
            return any(fingerprint(s) == seen.tree for s in states)
        files = self.commit_files(Path(ws), seen.fingerprint)
        return any(all(s.get(p) == oid for p, oid in files.items()) for s in states)


def _fixed_prefix(pattern: str) -> str:
    """The folders a glob names before its first wildcard (``src/app/**/*.py`` -> ``src/app``)."""
    fixed = []
    for part in pattern.split("/")[:-1]:
        if any(c in part for c in "*?[{"):
            break
        fixed.append(part)
    return "/".join(fixed)


def fingerprint(files: dict[str, str]) -> str:
    """One id for a set of files and their contents."""
    h = hashlib.sha256()
    for path in sorted(files):
        h.update(f"{path}\0{files[path]}\n".encode("utf-8", "surrogateescape"))
    return h.hexdigest()


def tick(writer: StateWriter, home: OrgHome, cfg: Config, observer: Observer,
         now: float | None = None) -> list[schedules.Outcome]:
    """Look at every active trigger once; start work for those whose event fired."""
    now = writer.clock() if now is None else now
    out = []
    for order in q.active(writer.conn, EVENT_KINDS):
        try:
            result = _one(writer, home, cfg, observer, order, now)
        except Exception as exc:  # noqa: BLE001 - one trigger's trouble never stops the others
            log.warning("trigger_failed", trigger=order.name, error=f"{type(exc).__name__}: {exc}",
                        next="looks again on the next tick")
            continue
        if result is not None:
            out.append(result)
    return out


def _one(writer, home, cfg, observer: Observer, order: q.Schedule, now: float) -> schedules.Outcome | None:
    conn = writer.conn
    watch = dict(order.watch)
    if q.at_work(conn, order.request["workspace"]):
        return None                               # the org is changing it: what it leaves is looked at after
    if order.kind in PERIODIC and watch.get("checked_at") is not None \
            and now < watch["checked_at"] + float(order.rule["every_s"]):
        return None
    if order.kind == ScheduleKind.DISCOVER:
        return discover(writer, home, cfg, order, watch, now)
    seen = observer.look(order)
    if order.kind == ScheduleKind.VERIFY_FAILS:
        watch["checked_at"] = now
    if seen.fingerprint is None:
        if seen.why != watch.get("why"):
            log.info("trigger_cannot_look", trigger=order.name, why=seen.why, next="looks again on the next tick")
        if {**watch, "why": seen.why} != order.watch:       # written when it changes, not on every look
            _mark(writer, order, {**watch, "why": seen.why}, last_skip=f"cannot look: {seen.why}"[:500])
        return None
    watch.pop("why", None)
    # verify-fails fires on the first failing look; the others take their first look as the start
    if order.kind == ScheduleKind.VERIFY_FAILS:
        watch.setdefault("seen", PASSING)
    if "seen" not in watch or seen.fingerprint == watch["seen"]:
        if watch.get("seen") != seen.fingerprint or watch.get("pending") or watch != order.watch:
            _mark(writer, order, {**watch, "seen": seen.fingerprint, "pending": None})
        return None
    if seen.fingerprint == PASSING or observer.org_made(conn, order, seen):
        ignored = watch.get("ignored", 0) + (seen.fingerprint != PASSING)
        _mark(writer, order, {**watch, "seen": seen.fingerprint, "pending": None, "ignored": ignored})
        return None
    pending = watch.get("pending") or {}
    if pending.get("fingerprint") != seen.fingerprint:
        pending = {"fingerprint": seen.fingerprint, "since": now, "changes": pending.get("changes", 0) + 1}
        watch["pending"] = pending
    if now - pending["since"] < float(order.rule.get("debounce_s", 0)):
        _mark(writer, order, watch)               # still changing: wait for it to be quiet
        return None
    mark = {"watch": {**watch, "seen": seen.fingerprint, "pending": None}, "last_tick_at": now}
    return schedules.start(writer, home, cfg, order, now=now, mark=mark, coalesced=pending["changes"] - 1,
                           key=f"event-{now:.6f}-{seen.fingerprint[-12:]}", note=seen.detail)


def discover(writer: StateWriter, home: OrgHome, cfg: Config, order: q.Schedule, watch: dict,
             now: float) -> schedules.Outcome | None:
    """One period of a discover trigger: scan, record the proposals, apply the auto-start policy.
    Returns None when the scan could not run (why is recorded on the trigger), else the outcome:
    ``scanned`` (nothing started), ``fired`` (the policy started one), ``skipped_spend`` (the
    daily cap had no room), ``skipped_busy`` (what it started before is still queued or running),
    ``failed`` (the start was refused, e.g. the proposal has no verify command)."""
    every = float(order.rule["every_s"])
    missed = 0 if watch.get("checked_at") is None else max(0, int((now - watch["checked_at"]) // every) - 1)
    watch = {**watch, "checked_at": now}
    previous = q.work_status(writer.conn, order.last_work_id)
    if previous is not None and previous != WorkStatus.ENDED:
        return _discovered(writer, order, watch, schedules.BUSY, f"{order.last_work_id} is still {previous}",
                           coalesced=missed)
    req = rules.request_of(order)
    try:
        found = scan_all(req.workspace, req.verify, order.rule.get("issues"), cfg=cfg, home=home)
        cannot = [n for n in found.notes if any(n.startswith(f"`{c}`") for c in req.verify)]
    except OrgError as exc:
        cannot = [exc.line()]
    if cannot:
        why = "; ".join(cannot)[:500]
        if why != watch.get("why"):
            log.info("trigger_cannot_scan", trigger=order.name, why=why, next="scans again next period")
        _mark(writer, order, {**watch, "why": why}, last_skip=f"cannot scan: {why}"[:500],
              coalesced=order.coalesced + missed)
        return None
    watch.pop("why", None)
    signer = StateWriter(writer.db_path, Actor.COORDINATOR, order.actor, clock=writer.clock)
    try:
        shown = record(home, cfg, req.workspace, found, writer=signer)
    finally:
        signer.close()
    watch["scan"] = {"at": now, "found": shown["found"], "proposed": [p["id"] for p in shown["proposals"]],
                     "expired": len(shown["expired"]), "held_back": shown["held_back"], "notes": shown["notes"]}
    watch["scans"] = watch.get("scans", 0) + 1
    try:
        started = auto_start(home, cfg, shown["proposals"], edits=_edits(req))
    except OrgError as exc:
        log.warning("trigger_start_failed", trigger=order.name, error=exc.line(), next="scans again next period")
        return _discovered(writer, order, watch, schedules.FAILED, exc.line(), coalesced=missed)
    if started is None:
        return _discovered(writer, order, watch, SCANNED, "", coalesced=missed)
    if not started["started"]:
        return _discovered(writer, order, watch, schedules.SPEND, f"{started['proposal']}: {started['why']}",
                           coalesced=missed)
    log.info("standing_order_fired", order=order.name, work_id=started["work_id"], proposal=started["proposal"],
             next="dispatch on the coordinator's next reconcile")
    return _discovered(writer, order, watch, schedules.FIRED, started["why"], coalesced=missed,
                       work_id=started["work_id"])


def _edits(req) -> Edits:
    """The trigger's submit options a started proposal takes (its goal and verify stay the proposal's)."""
    return Edits(protect=list(req.protect) or None, default_protect=req.default_protect,
                 max_iterations=req.max_iterations, budget_tokens=req.budget_tokens, budget_usd=req.budget_usd,
                 timeout_s=req.timeout_s, backend=req.backend, worktree=req.worktree, review=req.review)


_COUNTED = {schedules.BUSY: "skipped_busy", schedules.SPEND: "skipped_spend", schedules.FIRED: "fired"}


def _discovered(writer: StateWriter, order: q.Schedule, watch: dict, result: str, reason: str, *,
                coalesced: int, work_id: str | None = None) -> schedules.Outcome:
    """Record one period of a discover trigger on its row: the scan, the count, why nothing started."""
    with writer.transaction() as tx:
        row = tx.get("schedules", order.id)
        if row is None or row["status"] != ScheduleStatus.ACTIVE:
            return schedules.Outcome(order.id, order.name, result, work_id, reason="the order changed meanwhile")
        fields = {"updated_at": tx.now, "watch": watch, "coalesced": row["coalesced"] + coalesced}
        if result in _COUNTED:
            fields[_COUNTED[result]] = row[_COUNTED[result]] + 1
        if result == schedules.FIRED:
            fields.update(last_fired_at=tx.now, last_work_id=work_id, last_skip=None)
        elif result != SCANNED:
            fields["last_skip"] = f"{result}: {reason}"[:500]
        elif (row["last_skip"] or "").startswith("cannot scan"):
            fields["last_skip"] = None              # it scans again
        tx.update("schedules", order.id, **fields)
    return schedules.Outcome(order.id, order.name, result, work_id, coalesced, reason)


def _mark(writer: StateWriter, order: q.Schedule, watch: dict, **fields) -> None:
    with writer.transaction() as tx:
        tx.update("schedules", order.id, watch=watch, **fields)


class Watcher:
    """The coordinator's trigger watcher: a thread that ticks every ``interval_s`` with its own
    connection (a verify-fails check may take minutes; dispatch never waits for it)."""

    def __init__(self, home: OrgHome, cfg: Config, instance: str, interval_s: float = 1.0, clock=None):
        self.home, self.cfg, self.instance, self.interval_s = home, cfg, instance, interval_s
        self.clock = clock
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="trigger-watcher", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        self._thread.join(timeout_s)

    def _run(self) -> None:
        writer = StateWriter(self.home.db_path, Actor.COORDINATOR, self.instance,
                             **({"clock": self.clock} if self.clock is not None else {}))
        observer = Observer(self.home, self.cfg)
        try:
            while not self._stop.is_set():
                try:
                    tick(writer, self.home, self.cfg, observer)
                except Exception as exc:  # noqa: BLE001 - the watcher outlives one bad pass
                    log.warning("trigger_watch_failed", error=f"{type(exc).__name__}: {exc}",
                                next="looks again on the next tick")
                self._stop.wait(self.interval_s)
        finally:
            writer.close()
