"""The org's approved skills as the human sees them (``org skills``): list, show, retire, export.

The reads are pure over state (skills/); a skill no run has carried for
``knowledge.skill_unused_days`` is shown as proposed for retirement, and only a human retires it
(one durable write as actor ``human``). ``export`` writes ``DIR/NAME/SKILL.md`` in the Agent
Skills layout, ready for a Claude Code project's ``.claude/skills/``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from roles.operations import Result, human_writer
from skills import registry, review
from skills.errors import SkillError
from skills.skillmd import render, write_folder
from skills import replay
from state_db.kernel.config import Config
from state_db.queries import replays as replays_q
from state_db.connection import connect
from state_db.kernel.home import OrgHome


@dataclass(frozen=True)
class SkillList(Result):
    """Skills with use counts, last use, idle days and whether retirement is proposed
    (``skills.registry.listing``); ``unused_days`` is the idle time that proposes it."""

    unused_days: int
    rows: tuple[dict, ...]

    def as_data(self) -> list[dict]:
        return list(self.rows)


@dataclass(frozen=True)
class SkillView(Result):
    """One skill: its row, origin, text, use and whether its retirement is proposed."""

    skill: dict

    def as_data(self) -> dict:
        return dict(self.skill)

    @property
    def skill_md(self) -> str:
        return render(registry.text_of(self.skill))


@dataclass(frozen=True)
class Retired(Result):
    name: str
    changed: bool
    by: str


@dataclass(frozen=True)
class Exported(Result):
    """Where the skill's SKILL.md was written, and the skill's status (a retired one exports too)."""

    name: str
    file: str
    status: str


def _read(home: OrgHome, fn):
    conn = connect(home.require().db_path, readonly=True)
    try:
        return fn(conn)
    finally:
        conn.close()


def listing(home: OrgHome, cfg: Config, *, include_retired: bool = False) -> SkillList:
    days = cfg.knowledge.skill_unused_days
    rows = _read(home, lambda conn: registry.listing(conn, time.time(), days, include_retired=include_retired))
    return SkillList(days, tuple(rows))


def show(home: OrgHome, cfg: Config, name: str) -> SkillView:
    """Raises SkillNotFound."""
    days = cfg.knowledge.skill_unused_days

    def one(conn) -> dict:
        row = registry.skill(conn, name)
        row.update(next((d for d in registry.listing(conn, time.time(), days, include_retired=True)
                         if d["name"] == row["name"]), {}))
        row["replays"] = [{"subject": p.subject, **replay.of_subject(conn, p.subject)}
                          for p in replays_q.plans_named(conn, row["name"])]
        return row
    return SkillView(_read(home, one))


def retire(home: OrgHome, name: str, *, idempotency_key: str | None = None, via: str | None = None) -> Retired:
    """Retire a skill: loop-agents stop carrying it. Raises SkillNotFound."""
    writer = human_writer(home.require().db_path, via)
    try:
        out = review.retire(writer, name, key=idempotency_key)
    finally:
        writer.close()
    return Retired(out["name"], out["changed"], out["by"])


def export(home: OrgHome, name: str, to: str | Path) -> Exported:
    """Write ``to/<name>/SKILL.md``. Raises SkillNotFound, SkillError ``export_failed``."""
    row = _read(home, lambda conn: registry.skill(conn, name))
    try:
        path = write_folder(registry.text_of(row), Path(to).expanduser())
    except OSError as exc:
        raise SkillError(f"cannot write {name} into {to}: {exc.strerror or exc}", code="export_failed",
                         hint="give --to a folder you can write to") from None
    return Exported(row["name"], str(path), row["status"])
