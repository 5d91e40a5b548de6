"""A run's own record, read from state.db: what a retro is written from.

Everything comes from committed rows — the work item, its iterations (with their prompt
manifests), the eval-agent's verdicts (checks, signatures), model calls and attempts — so a
retro written after a crash or a restart says the same as one written at once.
"""
from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass, field
from typing import Any

from knowledge.errors import RunNotEnded
from state_db.queries import knowledge as Q
from state_db.queries import skills as S
from state_db.queries import loop as loop_queries, verdicts, work
from state_db.queries.iterations import attempts as attempts_of, of_work as iterations_of
from state_db.queries.usage import of_work as usage_of
from state_db.vocab import WorkStatus
from state_db.text import clean


@dataclass(frozen=True)
class Check:
    """One check of one verdict."""

    name: str
    passed: bool
    signature: str
    exit_code: int | None
    timed_out: bool
    output_tail: str
    code: str | None = None            # why the verifier could not run it, when it could not
    junit: dict | None = None          # the runner's own report ({"counts", "ids", "truncated"})
    # the failing test ids the eval-agent recorded; () in a record written before it recorded them
    tests: tuple[str, ...] = ()

    @classmethod
    def decode(cls, data: dict) -> "Check":
        tests = data.get("failing_tests")
        return cls(str(data.get("name") or data.get("command") or "?"), bool(data.get("passed")),
                   str(data.get("signature") or ""), data.get("exit_code"), bool(data.get("timed_out")),
                   clean(str(data.get("output_tail") or "")), data.get("code") or None,
                   data.get("junit") if isinstance(data.get("junit"), dict) else None,
                   tuple(str(t) for t in tests) if isinstance(tests, list) else ())


@dataclass(frozen=True)
class Iteration:
    """A committed iteration with its eval-agent verdict (``outcome`` is None if unverified)."""

    n: int
    act_status: str
    act_summary: str
    tool_calls: tuple[dict, ...]
    changed_paths: tuple[str, ...]
    lesson: str | None
    feedback: str
    manifest: dict[str, Any]
    tokens: int
    cost_usd: float
    fingerprint: str
    outcome: str | None
    checks: tuple[Check, ...]
    protected_changed: tuple[str, ...]

    @property
    def passed(self) -> bool:
        return self.outcome == "pass"

    @property
    def failing(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if not c.passed)

    def ids(self, section: str) -> list[str]:
        """Ids the prompt carried in ``section`` (``skills``, ``knowledge``, ``lessons``)."""
        return [str(x) for x in self.manifest.get(section) or []]


@dataclass(frozen=True)
class RunRecord:
    """Everything a retro needs about one ended run."""

    id: str
    goal: str
    verify: tuple[str, ...]
    caps: dict[str, Any]
    status: str
    stop_reason: str | None
    stop_detail: str
    elapsed_s: float
    iterations: tuple[Iteration, ...]
    calls: int
    tokens: int
    cost_usd: float
    models: tuple[str, ...]
    attempts: int
    discarded_attempts: int
    ended_at: float | None
    terms: dict[str, tuple[str, ...]] = field(default_factory=dict)
    handoff: dict[str, Any] | None = None    # the latest hand-off note (a budget's wrap-up), if any

    @property
    def goal_met(self) -> bool:
        return self.stop_reason == "goal_met"

    def encode(self) -> dict[str, Any]:
        """Plain data (for a model-written retro's prompt)."""
        return {"id": self.id, "goal": self.goal, "verify": list(self.verify), "caps": self.caps,
                "stop_reason": self.stop_reason, "stop_detail": self.stop_detail, "elapsed_s": self.elapsed_s,
                "usage": {"calls": self.calls, "tokens": self.tokens, "cost_usd": round(self.cost_usd, 6),
                          "models": list(self.models)},
                "attempts": {"total": self.attempts, "discarded": self.discarded_attempts},
                "iterations": [{"n": it.n, "act_status": it.act_status, "summary": it.act_summary[:500],
                                "changed_paths": list(it.changed_paths[:20]), "lesson": it.lesson,
                                "verdict": it.outcome, "tokens": it.tokens,
                                "prompt": {k: it.manifest.get(k, []) for k in ("skills", "knowledge", "lessons")},
                                "failing_checks": [{"name": c.name, "signature": c.signature,
                                                    "exit_code": c.exit_code, "timed_out": c.timed_out,
                                                    "output_tail": c.output_tail[-400:]} for c in it.failing]}
                               for it in self.iterations],
                "handoff": self.handoff}


def load(conn: sqlite3.Connection, run_id: str) -> RunRecord:
    """Read the record of ended run ``run_id``: its work item, its committed iterations each with
    its latest eval-agent verdict, its usage (summarised calls included), models and attempts.

    Raises:
        RunNotEnded: the run does not exist or has not ended.
    """
    run = work.item(conn, run_id)
    if run is None or run.status != WorkStatus.ENDED:
        raise RunNotEnded(run_id, None if run is None else run.status)
    judged = verdicts.latest_eval_verdicts(conn, run_id)
    its = []
    for it in iterations_of(conn, run_id):
        v = judged.get(it.n)
        its.append(Iteration(
            n=it.n, act_status=it.act_status, act_summary=it.act_summary or "", tool_calls=it.tool_calls,
            changed_paths=it.changed_paths, lesson=it.lesson, feedback=it.feedback or "", manifest=it.prompt,
            tokens=it.tokens, cost_usd=it.cost_usd, fingerprint=it.fingerprint or "",
            outcome=None if v is None else v.outcome,
            checks=tuple(Check.decode(c) for c in v.checks if isinstance(c, dict)) if v is not None else (),
            protected_changed=v.protected_changed if v is not None else ()))
    used = usage_of(conn, run_id)
    attempts = attempts_of(conn, run_id)
    carried = {(section, x) for it in its for section in ("skills", "knowledge") for x in it.ids(section)}
    return RunRecord(
        id=run_id, goal=run.goal, verify=run.verify, caps=run.caps.encode(), status=run.status,
        stop_reason=run.stop_reason, stop_detail=run.stop_detail or "", elapsed_s=run.elapsed_s,
        iterations=tuple(its), calls=used.calls, tokens=used.tokens, cost_usd=float(used.cost_usd),
        models=Q.models_of_run(conn, run_id), attempts=len(attempts),
        discarded_attempts=sum(1 for a in attempts if a.outcome == "discarded"),
        ended_at=run.ended_at, terms=item_terms(conn, carried),
        handoff=_handoff(conn, run_id))


def _handoff(conn: sqlite3.Connection, run_id: str) -> dict[str, Any] | None:
    note = loop_queries.latest_handoff(conn, run_id)
    return None if note is None else note.encode()


_CODEISH = re.compile(r"`([^`]{2,80})`|(\b[\w./-]+\.(?:py|js|ts|json|toml|ya?ml|md|txt|sh|cfg|ini)\b)"
                      r"|(\b[A-Z]\w*(?:Error|Exception)\b)")


def terms_of(text: str) -> list[str]:
    """Code-ish tokens of ``text`` (backticked spans, file names, error class names), in order."""
    out = []
    for m in _CODEISH.finditer(text or ""):
        term = next(g for g in m.groups() if g)
        if term not in out:
            out.append(term)
    return out


def item_terms(conn: sqlite3.Connection, items: set[tuple[str, str]]) -> dict[str, tuple[str, ...]]:
    """Trigger terms of carried items: a skill's name plus the code-ish tokens of its description;
    a curated note's code-ish tokens of its topic (its id when it has none)."""
    out: dict[str, tuple[str, ...]] = {}
    for section, item in sorted(items):
        if section == "skills":
            skill = S.skill(conn, item)
            out[item] = tuple([item] + terms_of(skill.description if skill else ""))
        else:
            note = Q.curated_note(conn, item)
            out[item] = tuple(terms_of(note.topic) if note else []) or (item,)
    return out
