"""Standing orders, the human's side: make, pause, resume and remove schedules and triggers, and
the timing rules both the coordinator (which ticks them) and ``org schedule show`` read.

An order's submit arguments pass every check ``org submit`` makes when the order is made
(``submit.check``), and are stored resolved (absolute workspace, the submitter's toolchain), so
every tick submits the same request as the coordinator, whatever its own directory and PATH.
Each change is a durable write as actor ``human`` under an idempotency key, then a wake.

Timing: an ``every`` schedule's ticks sit on a grid from its creation (``created_at + k·every``);
a ``cron`` schedule's are the expression's times in local time (croniter). The next tick is
computed from ``last_tick_at`` (the last tick handled, fired or skipped) and the rule, both in
state.db: a restarted coordinator finds the same next tick, and ticks missed while the org was
down are one tick, not many (``slots`` says how many it stands for).
"""
from __future__ import annotations

import re
import uuid
from dataclasses import replace
from datetime import datetime


from roles.operations import human_writer, signed
from roles.operations.submit import SubmitRequest, check
from state_db.kernel.config import Config
from state_db.kernel.errors import NotFound, StateError
from state_db.kernel.home import OrgHome
from state_db.queries import schedules as q
from state_db.vocab import EVENT_KINDS, TIMER_KINDS, ScheduleKind, ScheduleStatus

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd]?)")
_UNIT = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
MAX_SLOTS = 100_000          # a cron rule's missed ticks are counted up to this many


class ScheduleError(StateError):
    code = "bad_schedule"


def parse_duration(text: str, flag: str = "--every") -> float:
    """Seconds in ``30m``, ``2s``, ``1h30m``, ``1d`` or a bare number of seconds.

    Raises ScheduleError ``bad_every`` (not a duration, or not above zero)."""
    raw = str(text).strip().lower()
    parts = _DURATION.findall(raw)
    if not raw or "".join(n + u for n, u in parts) != raw:
        raise ScheduleError(f"{flag} {text!r} is not a duration", code="bad_every",
                            hint="write it like 30s, 10m, 1h30m or 1d")
    seconds = sum(float(n) * _UNIT[u] for n, u in parts)
    if seconds <= 0:
        raise ScheduleError(f"{flag} {text!r} is not above zero: it would tick without end", code="bad_every",
                            hint="give a period of at least 1s, e.g. --every 30m")
    return seconds


def check_cron(expr: str) -> str:
    """The cron expression, checked (five fields, or six with seconds). Raises ScheduleError ``bad_cron``."""
    from croniter import croniter               # only cron orders need it (~15 ms to import)
    if not expr or not expr.strip() or not croniter.is_valid(expr.strip()):
        raise ScheduleError(f"--cron {expr!r} is not a cron expression", code="bad_cron",
                            hint='five fields: minute hour day-of-month month day-of-week, e.g. "0 9 * * 1-5"')
    return expr.strip()


def check_name(name: str) -> str:
    if not _NAME.match(name or ""):
        raise ScheduleError(f"the name {name!r} is not a plain name", code="bad_name",
                            hint="use letters, digits, '-', '_' and '.', up to 64 characters, e.g. nightly-tests")
    return name


# -- timing ------------------------------------------------------------------------------------------

def _cron_after(expr: str, t: float) -> float:
    from croniter import croniter
    start = datetime.fromtimestamp(t).astimezone()          # local time, so "0 9 * * 1-5" is 9 o'clock here
    return croniter(expr, start).get_next(datetime).timestamp()


def next_due(kind: str, rule: dict, after: float) -> float:
    """The first tick of the rule strictly after ``after`` (for ``every``: on the grid from
    ``rule["anchor"]``). Triggers' periodic checks (verify-fails) use ``every_s`` from ``after``."""
    if kind == ScheduleKind.CRON:
        return _cron_after(rule["cron"], after)
    every = float(rule["every_s"])
    anchor = float(rule.get("anchor", after))
    if after < anchor:
        return anchor + every
    return anchor + (int((after - anchor) // every) + 1) * every


def slots(kind: str, rule: dict, after: float, now: float) -> tuple[float | None, int]:
    """(the latest tick in (after, now], how many ticks fell in that span): one tick is taken for
    all of them (missed ticks are coalesced, not replayed)."""
    first = next_due(kind, rule, after)
    if first > now:
        return None, 0
    if kind == ScheduleKind.CRON:
        latest, count = first, 1
        while count < MAX_SLOTS:
            nxt = _cron_after(rule["cron"], latest)
            if nxt > now:
                break
            latest, count = nxt, count + 1
        return latest, count
    every = float(rule["every_s"])
    count = int((now - first) // every) + 1
    return first + (count - 1) * every, count


def describe(kind: str, rule: dict) -> str:
    """The rule in a few words, for listings."""
    if kind == ScheduleKind.EVERY:
        return f"every {_seconds(rule['every_s'])}"
    if kind == ScheduleKind.CRON:
        return f"cron {rule['cron']}"
    if kind == ScheduleKind.GIT_COMMIT:
        return f"new commit on {rule['branch']}" + _debounce(rule)
    if kind == ScheduleKind.FILE_CHANGE:
        return f"change in {rule['glob']}" + _debounce(rule)
    if kind == ScheduleKind.DISCOVER:
        return f"discovery scan every {_seconds(rule['every_s'])}" + (f", issues from {rule['issues']}"
                                                                       if rule.get("issues") else "")
    return f"verify fails (checked every {_seconds(rule['every_s'])})"


def due(order: q.Schedule) -> float | None:
    """When an active order acts next: a schedule's next tick; a periodic trigger's next check
    (verify-fails, discover; before its first check, when it was made or resumed: at once); None
    for a trigger that waits on an event (git-commit, file-change) and for an order not active."""
    if order.status != ScheduleStatus.ACTIVE:
        return None
    since = order.last_tick_at or order.created_at
    if order.kind in TIMER_KINDS:
        return next_due(order.kind, order.rule, since)
    if order.kind in (ScheduleKind.VERIFY_FAILS, ScheduleKind.DISCOVER):
        checked = order.watch.get("checked_at")
        return since if checked is None else float(checked) + float(order.rule["every_s"])
    return None


def overview(conn, *, removed: bool = False) -> list[dict]:
    """Every schedule and trigger, oldest first, as ``org status``, chat and the dashboard show
    them: {id, name, what (schedule | trigger), kind, rule (in words), status, next_due, fired,
    skipped_busy, skipped_spend, coalesced, last_skip, last_work_id, last_work_status}."""
    out = []
    for o in q.listing(conn, TIMER_KINDS + EVENT_KINDS, removed=removed):
        out.append({"id": o.id, "name": o.name, "what": "schedule" if o.kind in TIMER_KINDS else "trigger",
                    "kind": o.kind, "rule": describe(o.kind, o.rule), "status": o.status, "next_due": due(o),
                    "fired": o.fired, "skipped_busy": o.skipped_busy, "skipped_spend": o.skipped_spend,
                    "coalesced": o.coalesced, "last_skip": o.last_skip, "last_work_id": o.last_work_id,
                    "last_work_status": q.work_status(conn, o.last_work_id)})
    return out


def _debounce(rule: dict) -> str:
    return f", quiet for {_seconds(rule['debounce_s'])}" if rule.get("debounce_s") else ""


def _seconds(s: float) -> str:
    s = float(s)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size and s % size == 0:
            return f"{int(s // size)}{unit}"
    return f"{s:g}s"


# -- the human's writes ------------------------------------------------------------------------------

def add(home: OrgHome, cfg: Config, *, name: str, kind: str, rule: dict, req: SubmitRequest,
        argv: list[str], idempotency_key: str | None = None) -> dict:
    """Make a standing order after checking its submit request as ``org submit`` would.

    ``rule``: ``{"every_s"}`` | ``{"cron"}`` for a schedule; ``{"branch"}``, ``{"glob",
    "debounce_s"}``, ``{"every_s"}``, ``{"every_s", "issues"}`` (discover) for a trigger. Returns {"id", "name", "kind", "next_due",
    "wake", "replayed"}. Raises ScheduleError (bad name, a live order of that name), SubmitError.
    """
    check_name(name)
    if kind not in ScheduleKind._value2member_map_:
        raise ScheduleError(f"unknown kind {kind!r}", code="bad_kind",
                            hint="use " + ", ".join(map(str, EVENT_KINDS)))
    if req.idempotency_key:
        raise ScheduleError("--idempotency-key cannot be given to a standing order", code="bad_submit",
                            hint="each tick makes its own key; drop the flag")
    checked = check(home, cfg, req)
    stored = replace(req, workspace=str(checked.workspace), backend=checked.backend, toolchain=checked.toolchain,
                     via=None, idempotency_key=None)
    key = idempotency_key or uuid.uuid4().hex
    order_id = "s-" + uuid.uuid4().hex[:8]
    writer = human_writer(home.db_path)

    def do(tx):
        existing = q.find(tx.conn, name)
        if existing is not None and existing.name == name and existing.status != ScheduleStatus.REMOVED:
            raise ScheduleError(f"a schedule or trigger named {name!r} exists already", code="name_taken",
                                hint=f"pick another name, or remove it first ('org schedule remove {name}')")
        full_rule = {**rule, "anchor": tx.now} if kind == ScheduleKind.EVERY else dict(rule)
        tx.insert("schedules", {"id": order_id, "name": name, "kind": kind, "rule": full_rule,
                                "request": stored.encode(), "argv": list(argv), "status": ScheduleStatus.ACTIVE,
                                "created_by": signed(writer), "created_at": tx.now, "updated_at": tx.now,
                                "last_tick_at": tx.now})
        due = next_due(kind, full_rule, tx.now) if kind in TIMER_KINDS else None
        return {"id": order_id, "name": name, "kind": kind, "next_due": due}

    try:
        result, replayed = writer.run_once(key, "schedule add", do,
                                           args={"name": name, "kind": str(kind), "rule": rule,
                                                 "request": stored.encode(), "argv": list(argv)})
    finally:
        writer.close()
    return {**result, "replayed": replayed, "wake": _wake(home, cfg, result["id"])}


# what each verb moves an order to, and from where
_MOVES = {"pause": ScheduleStatus.PAUSED, "resume": ScheduleStatus.ACTIVE, "remove": ScheduleStatus.REMOVED}


def change(home: OrgHome, cfg: Config, name: str, verb: str, *, kinds: tuple[str, ...] = TIMER_KINDS + EVENT_KINDS,
           idempotency_key: str | None = None) -> dict:
    """Pause, resume or remove the order named ``name`` (or with that id). A resumed schedule
    does not make up the ticks it missed while paused; a resumed trigger starts from what it sees
    then. Returns {"id", "name", "status", "from", "wake"}.
    Raises NotFound (``no_such_schedule``), IllegalTransition (e.g. resume of an active one)."""
    new = _MOVES[verb]
    writer = human_writer(home.db_path)

    def do(tx):
        order = q.find(tx.conn, name)
        if order is None or order.kind not in kinds or (order.status == ScheduleStatus.REMOVED and verb != "remove"):
            what = "schedule" if set(kinds) <= set(TIMER_KINDS) else "trigger" if set(kinds) <= set(EVENT_KINDS) else "order"
            raise NotFound(f"no {what} named {name!r}", code="no_such_schedule",
                           hint=f"'org {what if what != 'order' else 'schedule'} list' shows them")
        if order.status == new:
            return {"id": order.id, "name": order.name, "status": str(new), "from": order.status, "unchanged": True}
        fields = {"updated_at": tx.now}
        if new == ScheduleStatus.ACTIVE:
            fields.update(last_tick_at=tx.now, watch={})
        old = tx.set_status("schedules", order.id, new, **fields)
        return {"id": order.id, "name": order.name, "status": str(new), "from": old, "unchanged": False}

    try:
        result, _ = writer.run_once(idempotency_key or uuid.uuid4().hex, f"schedule {verb}", do,
                                    args={"name": name, "kinds": list(kinds)})
    finally:
        writer.close()
    return {**result, "wake": _wake(home, cfg, result["id"])}


def _wake(home: OrgHome, cfg: Config, order_id: str) -> str:
    from roles.operations.wake import wake_coordinator
    return wake_coordinator(home, cfg, {"schedule": order_id})


def request_of(order: q.Schedule) -> SubmitRequest:
    """The submit request an order starts its work with. Raises NotFound when the stored request
    no longer fits (a field this code does not know)."""
    try:
        return SubmitRequest.decode(order.request)
    except TypeError as exc:
        raise NotFound(f"the stored request of {order.name} does not fit this version: {exc}",
                       code="bad_stored_request", hint="remove it and add it again") from None


def current_branch(workspace: str) -> str:
    """The branch checked out in ``workspace``'s repository, which a ``git-commit`` trigger
    watches when no ``--branch`` is named (read with libgit2: nothing the repository configures
    runs); "" when the workspace is not a folder (the submit arguments' check says so).

    Raises:
        ScheduleError: not a repository, or no branch checked out."""
    from pathlib import Path

    from roles.workbench.workspace import safegit
    from roles.workbench.workspace.errors import RepositoryError
    if not Path(workspace).expanduser().is_dir():
        return ""                       # the submit arguments' check says what is wrong with it
    try:
        repo = safegit.open_repository(Path(workspace).expanduser().resolve())
    except RepositoryError as exc:
        raise ScheduleError(f"--on git-commit: {exc.message}", code=exc.code, hint=exc.hint) from None
    if repo.head_is_detached or repo.head_is_unborn:
        raise ScheduleError(f"--on git-commit: {workspace} has no branch checked out", code="no_branch",
                            hint="name one with --branch NAME")
    return repo.head.shorthand
