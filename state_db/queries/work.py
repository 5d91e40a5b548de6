"""Work items as typed data: ``WorkItem`` with its ``Caps``, workspace locks, stop history, and
the questions the coordinator's reconcile, the operations and the sandbox ask about them.

``Caps`` is the one type a run's caps have from the command that sets them to the stop condition
that ends the run: the CLI, MCP and chat build one from their flags, the operations (submit,
continue, a proposal's accept) resolve it against org.toml's ``[caps]`` (``Caps.from_config``),
the ``caps`` JSON column is written by ``to_json`` and read by ``from_json`` (``{"max_iterations":
5, ..., "from": {"max_iterations": "flag", ...}}``), and the loop-agent's stop policy is built
from it (``roles.loop_agent.policy.policy_from_caps``), so a cap's name is spelled once. ``from``
says where each cap came from (``CAP_SOURCES``); a cap with a source and no value was removed on
purpose.
"""
from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field, fields
from typing import Any, Iterable, Mapping

from state_db.queries.base import columns, loads, marks, scalar
from state_db.vocab import DecisionStatus, WorkStatus


#: Where a cap came from: a flag of the command that set it (``--max-iterations``, ``--no-timeout``,
#: or ``org continue``'s), ``[caps]`` in org.toml, or the built-in default.
FLAG, ORG_TOML, DEFAULT = "flag", "org.toml", "default"
CAP_SOURCES = (FLAG, ORG_TOML, DEFAULT)


@dataclass(frozen=True)
class Caps:
    """A run's hard caps; ``None`` is no cap of that kind. ``sources``: ``(name, source)`` pairs
    saying where each cap came from (empty for caps stored before sources were).

    As a request (what a command was given: ``SubmitRequest.caps``, ``ContinueRequest.caps``), a
    cap with a value was given and a cap with the ``flag`` source and no value was removed."""

    max_iterations: int | None = None
    budget_tokens: int | None = None
    budget_usd: float | None = None
    timeout_s: float | None = None
    sources: tuple[tuple[str, str], ...] = ()

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The caps' names, as stored and as the operations' parameters are called."""
        return tuple(f.name for f in fields(cls) if f.name != "sources")

    @classmethod
    def given(cls, values: Mapping[str, Any] | None = None, removed: Iterable[str] = ()) -> "Caps":
        """The caps a command's flags give: ``values`` (name -> value; None and unknown names are
        not given) set theirs, ``removed`` (names) have none; each is sourced ``flag``. Values are
        not checked here (``roles.operations.caps`` does)."""
        values = {k: v for k, v in (values or {}).items() if k in cls.names() and v is not None}
        gone = [k for k in cls.names() if k in set(removed) and k not in values]
        return cls(**values, sources=tuple((k, FLAG) for k in cls.names() if k in values or k in gone))

    @classmethod
    def from_config(cls, section: Any) -> "Caps":
        """The default caps of org.toml's ``[caps]`` section (``cfg.caps``), each sourced
        ``org.toml`` when the file sets it, else ``default``."""
        in_file = getattr(section, "model_fields_set", set())
        return cls(**{k: getattr(section, k) for k in cls.names()},
                   sources=tuple((k, ORG_TOML if k in in_file else DEFAULT) for k in cls.names()))

    @classmethod
    def from_json(cls, raw: Any) -> "Caps":
        """Caps from their stored JSON (text or a dict; unknown keys are ignored), None or Caps."""
        if isinstance(raw, Caps):
            return raw
        data = loads(raw, {}) or {}
        came = data.get("from") if isinstance(data.get("from"), dict) else {}
        sources = tuple((k, str(came[k])) for k in cls.names() if came.get(k) in CAP_SOURCES)
        return cls(**{k: data[k] for k in cls.names() if data.get(k) is not None}, sources=sources)

    def to_json(self) -> dict[str, Any]:
        """The stored form ``from_json`` reads: the caps set and, when known, where each came
        from (``from``)."""
        return {**self.encode(), **({"from": dict(self.sources)} if self.sources else {})}

    def encode(self) -> dict[str, Any]:
        """The caps that are set, by name (as shown: ``--json``, a journal event)."""
        return {k: v for k in self.names() if (v := getattr(self, k)) is not None}

    def source(self, name: str) -> str | None:
        """Where cap ``name`` came from (``CAP_SOURCES``), None when not recorded."""
        return dict(self.sources).get(name)

    def removed(self) -> tuple[str, ...]:
        """The caps removed on purpose: a source and no value."""
        return tuple(k for k, _ in self.sources if getattr(self, k) is None)

    def over(self, base: "Caps") -> "Caps":
        """``base`` with these caps applied: each cap given or removed here (a value, or a
        source) replaces ``base``'s, with its source; the others stay ``base``'s."""
        mine, theirs = dict(self.sources), dict(base.sources)
        values, sources = {}, []
        for k in self.names():
            here = getattr(self, k) is not None or k in mine
            values[k] = getattr(self if here else base, k)
            came = mine.get(k) if here else theirs.get(k)
            if came is not None:
                sources.append((k, came))
        return Caps(**values, sources=tuple(sources))

    def __bool__(self) -> bool:
        return bool(self.encode())


@dataclass(frozen=True)
class Ladder:
    """A run's model ladder (``work_items.ladder``): ``models`` weakest first, the ``rung`` it is
    on (an index), the iterations committed when it climbed to it (``since``) and why (``why``)."""

    models: tuple[str, ...] = ()
    rung: int = 0
    since: int = 0
    why: str = ""

    @classmethod
    def parse(cls, raw: Any) -> "Ladder":
        data = loads(raw, {}) or {}
        if not isinstance(data, dict):
            return cls()
        models = tuple(str(m) for m in data.get("models") or () if isinstance(m, str) and m)
        rung = data.get("rung") if isinstance(data.get("rung"), int) else 0
        return cls(models, max(0, min(rung, len(models) - 1)) if models else 0, int(data.get("since") or 0),
                   str(data.get("why") or ""))

    def encode(self) -> dict[str, Any]:
        return {"models": list(self.models), "rung": self.rung, "since": self.since, "why": self.why} \
            if self.models else {}

    @property
    def model(self) -> str | None:
        """The model of the rung it is on (None: no ladder)."""
        return self.models[self.rung] if self.models else None

    def can_climb(self) -> bool:
        return self.rung + 1 < len(self.models)

    def label(self) -> str:
        """``rung 2 of 3: claude-opus-4`` (empty without a ladder)."""
        return f"rung {self.rung + 1} of {len(self.models)}: {self.model}" if self.models else ""


@dataclass(frozen=True)
class WorkItem:
    """One ``work_items`` row, its JSON columns decoded."""

    id: str
    goal: str
    workspace: str
    backend: str
    status: str
    created_by: str
    created_at: float
    updated_at: float
    verify: tuple[str, ...] = ()
    protect: tuple[str, ...] = ()
    caps: Caps = field(default_factory=Caps)
    stop_reason: str | None = None
    stop_detail: str | None = None
    assigned_to: str | None = None
    attempt: int = 0
    cancel_requested: bool = False
    worktree: bool = False
    branch: str | None = None
    elapsed_s: float = 0.0
    ended_at: float | None = None
    default_protect: bool = True
    toolchain: dict = field(default_factory=dict)
    discarded_s: float = 0.0
    review: dict = field(default_factory=dict)        # the review criteria it was submitted with
    next_step: str | None = None     # a paused or parked run's next step, as stored (roles/loop_agent/steps.py)
    scope: tuple[str, ...] = ()      # globs that widen its change scope (roles/eval_agent/scope.py)
    delivered: dict | None = None    # at goal_met: the verified tree delivered (roles/workbench/workspace/delivered.py)
    verify_hidden: str = ""          # the held-out checks folder copied into each snapshot ('' none)
    ladder: "Ladder" = field(default_factory=lambda: Ladder())

    @classmethod
    def from_row(cls, row: sqlite3.Row | dict) -> "WorkItem":
        """A ``work_items`` row (a ``sqlite3.Row`` or a dict of its columns) as typed data."""
        v = columns(cls, row)
        v["verify"] = tuple(loads(v.get("verify"), []))
        v["protect"] = tuple(loads(v.get("protect"), []))
        v["scope"] = tuple(loads(v.get("scope"), []))
        v["delivered"] = loads(v.get("delivered"))
        v["caps"] = Caps.from_json(v.get("caps"))
        v["toolchain"] = loads(v.get("toolchain"), {}) or {}
        v["review"] = loads(v.get("review"), {}) or {}
        v["ladder"] = Ladder.parse(v.get("ladder"))
        for flag in ("cancel_requested", "worktree", "default_protect"):
            if flag in v:
                v[flag] = bool(v[flag])
        return cls(**v)

    @property
    def ended(self) -> bool:
        return self.status == WorkStatus.ENDED


@dataclass(frozen=True)
class StopRecord:
    """One ending of a run that ``org continue`` reopened (``stop_history``)."""

    work_id: str
    seq: int
    stop_reason: str
    stop_detail: str | None
    ended_at: float | None
    iterations: int
    caps: Caps
    new_caps: Caps
    continued_by: str
    continued_at: float

    @classmethod
    def from_row(cls, row) -> "StopRecord":
        v = columns(cls, row)
        v["caps"], v["new_caps"] = Caps.from_json(v["caps"]), Caps.from_json(v["new_caps"])
        return cls(**v)


def item(conn: sqlite3.Connection, work_id: str) -> WorkItem | None:
    """The work item ``work_id``, or None."""
    row = conn.execute("SELECT * FROM work_items WHERE id = ?", (work_id,)).fetchone()
    return WorkItem.from_row(row) if row else None


def items(conn: sqlite3.Connection, ids: list[str] | tuple[str, ...]) -> list[WorkItem]:
    """The work items among ``ids`` that exist, in no particular order."""
    listed = marks(ids)
    return [WorkItem.from_row(r) for r in conn.execute(f"SELECT * FROM work_items WHERE id IN ({listed})", tuple(ids))]


def with_status(conn: sqlite3.Connection, *statuses: str) -> list[WorkItem]:
    """Work items in any of ``statuses``, oldest first."""
    listed = marks(statuses)
    return [WorkItem.from_row(r) for r in conn.execute(
        f"SELECT * FROM work_items WHERE status IN ({listed}) ORDER BY created_at", statuses)]


def assigned_to(conn: sqlite3.Connection, instance: str, *statuses: str) -> WorkItem | None:
    """The oldest work item assigned to ``instance`` in one of ``statuses``, or None."""
    listed = marks(statuses)
    row = conn.execute(f"""SELECT * FROM work_items WHERE assigned_to = ? AND status IN ({listed})
                           ORDER BY created_at LIMIT 1""", (instance, *statuses)).fetchone()
    return WorkItem.from_row(row) if row else None


def busy_agents(conn: sqlite3.Connection, *statuses: str) -> set[str]:
    """Instances holding a work item in one of ``statuses``."""
    listed = marks(statuses)
    return {r[0] for r in conn.execute(
        f"SELECT assigned_to FROM work_items WHERE status IN ({listed}) AND assigned_to IS NOT NULL", statuses)}


def parked_and_decided(conn: sqlite3.Connection) -> list[str]:
    """Parked runs (paused, assigned to nobody) with no pending decision, oldest first."""
    return [r[0] for r in conn.execute(
        """SELECT w.id FROM work_items w WHERE w.status = ? AND w.assigned_to IS NULL
             AND NOT EXISTS (SELECT 1 FROM decisions d WHERE d.work_id = w.id AND d.status = ?)
           ORDER BY w.created_at""", (WorkStatus.PAUSED, DecisionStatus.PENDING))]


def status_counts(conn: sqlite3.Connection) -> dict[str, int]:
    """Work items by status: ``{status: count}`` (statuses with none are absent)."""
    return {r[0]: r[1] for r in conn.execute("SELECT status, COUNT(*) FROM work_items GROUP BY status")}


# -- workspace locks ---------------------------------------------------------------------------

def lock_holder(conn: sqlite3.Connection, workspace: str) -> str | None:
    """The work item holding ``workspace``'s lock, or None."""
    return scalar(conn, "SELECT work_id FROM workspace_locks WHERE workspace = ?", (str(workspace),))


def locks_of_ended(conn: sqlite3.Connection) -> list[str]:
    """Workspaces whose lock is still held by an ended run."""
    return [r[0] for r in conn.execute("""SELECT l.workspace FROM workspace_locks l JOIN work_items w
                                            ON w.id = l.work_id WHERE w.status = ?""", (WorkStatus.ENDED,))]


def waiting_on_free_workspace(conn: sqlite3.Connection) -> list[WorkItem]:
    """Waiting items whose workspace nobody holds, oldest first (the first of each may take it)."""
    return [WorkItem.from_row(r) for r in conn.execute(
        """SELECT * FROM work_items WHERE status = ? AND workspace NOT IN (SELECT workspace FROM workspace_locks)
           ORDER BY created_at""", (WorkStatus.WAITING,))]


def toolchain_of_workspace(conn: sqlite3.Connection, workspace: str) -> dict | None:
    """The toolchain recorded with the work item holding ``workspace`` (the one with its lock,
    else the latest), or None."""
    raw = scalar(conn, """SELECT w.toolchain FROM work_items w LEFT JOIN workspace_locks l ON l.work_id = w.id
                          WHERE w.workspace = ? ORDER BY l.work_id IS NULL, w.created_at DESC LIMIT 1""",
                 (str(workspace),))
    return None if raw is None else loads(raw, {})


# -- stop history and idempotency ----------------------------------------------------------------

def stop_history(conn: sqlite3.Connection, work_id: str) -> list[StopRecord]:
    """The endings of ``work_id`` that ``org continue`` reopened, oldest first."""
    return [StopRecord.from_row(r) for r in conn.execute(
        "SELECT * FROM stop_history WHERE work_id = ? ORDER BY seq", (work_id,))]


def next_stop_seq(conn: sqlite3.Connection, work_id: str) -> int:
    """The number the next ending of ``work_id`` kept in ``stop_history`` takes (1 for the first)."""
    return scalar(conn, "SELECT MAX(seq) FROM stop_history WHERE work_id = ?", (work_id,), 0) + 1


def continued_after(conn: sqlite3.Connection, work_id: str) -> int:
    """The iterations committed when the run was last continued (0: never continued)."""
    return scalar(conn, "SELECT MAX(iterations) FROM stop_history WHERE work_id = ?", (work_id,), 0)


def command_result(conn: sqlite3.Connection, key: str, command: str) -> dict | None:
    """What the command ``command`` did under idempotency ``key`` (its stored result), or None."""
    row = conn.execute("SELECT result FROM idempotency WHERE key = ? AND command = ?", (key, command)).fetchone()
    return None if row is None else loads(row[0], {})


#: The journal event of a human setting an ended run's workspace to one of its commits.
WORKSPACE_SET = "work_items.workspace_set"


def workspace_set(conn: sqlite3.Connection, work_id: str) -> str | None:
    """The commit a human last set ``work_id``'s workspace to (``org revert`` / ``org apply``),
    or None."""
    raw = scalar(conn, "SELECT data FROM events WHERE kind = ? AND subject = ? ORDER BY id DESC LIMIT 1",
                 (WORKSPACE_SET, work_id))
    data = loads(raw, {}) or {}
    return data.get("commit") if isinstance(data, dict) else None
