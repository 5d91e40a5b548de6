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

import orjson

from knowledge.errors import RunNotEnded
from state_db.vocab import Actor, WorkStatus


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

    @classmethod
    def decode(cls, data: dict) -> "Check":
        return cls(str(data.get("name") or data.get("command") or "?"), bool(data.get("passed")),
                   str(data.get("signature") or ""), data.get("exit_code"), bool(data.get("timed_out")),
                   str(data.get("output_tail") or ""), data.get("code") or None,
                   data.get("junit") if isinstance(data.get("junit"), dict) else None)


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
                               for it in self.iterations]}


def _json(text: str | None, default):
    if not text:
        return default
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return default


def load(conn: sqlite3.Connection, run_id: str) -> RunRecord:
    """Read the record of ended run ``run_id``.

    Raises:
        RunNotEnded: the run does not exist or has not ended.
    """
    work = conn.execute("SELECT * FROM work_items WHERE id = ?", (run_id,)).fetchone()
    if work is None or work["status"] != WorkStatus.ENDED:
        raise RunNotEnded(run_id, None if work is None else work["status"])
    verdicts: dict[int, sqlite3.Row] = {}
    for v in conn.execute("SELECT * FROM verdicts WHERE work_id = ? AND written_by LIKE ? ORDER BY iteration, at",
                          (run_id, f"{Actor.EVAL_AGENT}%")):
        verdicts[v["iteration"]] = v          # the latest eval-agent verdict of each iteration
    its = []
    for r in conn.execute("SELECT * FROM iterations WHERE work_id = ? ORDER BY n", (run_id,)):
        v = verdicts.get(r["n"])
        its.append(Iteration(
            n=r["n"], act_status=r["act_status"], act_summary=r["act_summary"] or "",
            tool_calls=tuple(_json(r["tool_calls"], [])), changed_paths=tuple(_json(r["changed_paths"], [])),
            lesson=r["lesson"], feedback=r["feedback"] or "", manifest=_json(r["prompt"], {}),
            tokens=r["input_tokens"] + r["output_tokens"] + r["cache_write_tokens"] + r["cache_read_tokens"],
            cost_usd=r["cost_usd"], fingerprint=r["fingerprint"] or "",
            outcome=None if v is None else v["outcome"],
            checks=tuple(Check.decode(c) for c in _json(v["checks"], [])) if v is not None else (),
            protected_changed=tuple(_json(v["protected_changed"], [])) if v is not None else ()))
    usage = conn.execute("""SELECT COUNT(*), COALESCE(SUM(input_tokens + output_tokens + cache_write_tokens
                                   + cache_read_tokens), 0), COALESCE(SUM(cost_usd), 0)
                              FROM model_calls WHERE work_id = ?""", (run_id,)).fetchone()
    models = tuple(r[0] for r in conn.execute("SELECT DISTINCT model FROM model_calls WHERE work_id = ? ORDER BY model",
                                              (run_id,)))
    att = conn.execute("""SELECT COUNT(*), COALESCE(SUM(outcome = 'discarded'), 0) FROM attempts
                           WHERE work_id = ?""", (run_id,)).fetchone()
    carried = {(section, x) for it in its for section in ("skills", "knowledge") for x in it.ids(section)}
    return RunRecord(
        id=run_id, goal=work["goal"], verify=tuple(_json(work["verify"], [])), caps=_json(work["caps"], {}),
        status=work["status"], stop_reason=work["stop_reason"], stop_detail=work["stop_detail"] or "",
        elapsed_s=work["elapsed_s"], iterations=tuple(its), calls=usage[0], tokens=int(usage[1]),
        cost_usd=float(usage[2]), models=models, attempts=att[0], discarded_attempts=int(att[1]),
        ended_at=work["ended_at"], terms=item_terms(conn, carried))


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
            row = conn.execute("""SELECT c.description FROM skills s LEFT JOIN skill_candidates c
                                    ON c.id = s.candidate_id WHERE s.name = ?""", (item,)).fetchone()
            out[item] = tuple([item] + terms_of(row[0] if row and row[0] else ""))
        else:
            row = conn.execute("SELECT topic FROM curated_notes WHERE id = ?", (item,)).fetchone()
            out[item] = tuple(terms_of(row[0]) if row else []) or (item,)
    return out
