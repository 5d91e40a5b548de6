"""The trigger watcher: a thread of the coordinator that looks at every active trigger once per
tick (each kind's module says what it looks at), and starts its work item when the event fires
(``schedules.start``: single-flight, the daily cap, signed ``trigger:NAME``)."""
from __future__ import annotations

import threading
from pathlib import Path

import structlog

from roles.coordinator import schedules
from roles.coordinator.triggers import file_change, git_commit, verify_fails
from roles.coordinator.triggers.discover import discover
from roles.coordinator.triggers.mark import mark as _mark
from roles.coordinator.triggers.seen import PASSING, Seen
from roles.operations.watch import Observer
from state_db.kernel.config import Config
from state_db.kernel.home import OrgHome
from state_db.queries import schedules as q
from state_db.vocab import EVENT_KINDS, Actor, ScheduleKind
from state_db.writer import StateWriter

log = structlog.get_logger("coordinator.triggers")
PERIODIC = (ScheduleKind.VERIFY_FAILS, ScheduleKind.DISCOVER)
KINDS = {ScheduleKind.GIT_COMMIT: git_commit, ScheduleKind.FILE_CHANGE: file_change,
         ScheduleKind.VERIFY_FAILS: verify_fails}


def look(observer: Observer, order: q.Schedule) -> Seen:
    """One look at what ``order`` watches (its kind's ``look``), once its workspace is there."""
    ws = Path(order.request["workspace"])
    if not ws.is_dir():
        return Seen(None, why=f"the workspace {ws} is gone")
    return KINDS[order.kind].look(observer, order, ws)


def org_made(observer: Observer, conn, order: q.Schedule, seen: Seen) -> bool:
    """Is what ``seen`` shows a state one of the org's runs left in the workspace?"""
    states = observer.org_files(conn, order.request["workspace"])
    return bool(states) and KINDS[order.kind].org_made(observer, order, seen, states)


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
    seen = look(observer, order)
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
    if seen.fingerprint == PASSING or org_made(observer, conn, order, seen):
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
