"""Replays: a skill proves its value before a human reviews it.

A subject (a pending candidate, or any skill on demand with ``org skills eval``) is measured on
ended work items: the items its evidence came from (the runs of its source notes) and similar
ended items it did not come from (TF-IDF cosine of the item's goal and verify commands against
the skill's text, ``knowledge/similarity.py``). Each item is run twice from its baseline, in the
org's own loop with the item's own caps: once ``with`` the skill as the only skill in context,
once ``without`` any skill. Both arms carry the same curated knowledge, so the skill is the one
difference.

What a human sees per subject (``summarise``): per arm, the goal rate, the mean iterations to
goal (over the runs that met it) and the mean tokens, and the difference with − without. A
difference is only called measured when both arms of at least one item ended.

Whether replays run at all (``enabled``) is the ``[learning]`` section of org.toml: ``auto``
runs them when the org's model costs nothing (a local or scripted server) or when a replay
budget is set, so a paid model never spends on replays the user did not ask for.
"""
from __future__ import annotations

from dataclasses import dataclass

from knowledge.similarity import Index
from skills import select
from state_db.queries import replays as R
from state_db.queries import skills as Q
from state_db.queries.replays import WITH, WITHOUT, Replay

#: below this cosine an ended item is not "similar" to a skill
SIMILAR_THRESHOLD = 0.10


@dataclass(frozen=True)
class Subject:
    """What a replay measures: its id (a candidate id, or an evaluation id for a skill), its kind
    (``candidate`` | ``skill``), the skill's name and the text the ``with`` arm carries."""

    id: str
    kind: str
    name: str
    text: str
    source_notes: tuple[str, ...] = ()


def enabled(cfg) -> tuple[bool, str]:
    """Whether replays run, and why (for logs and ``org candidates show``)."""
    learning = cfg.learning
    if learning.replay == "off":
        return False, "replays are off ([learning] replay = 'off')"
    if learning.replay == "on":
        return True, "replays are on ([learning] replay = 'on')"
    if cfg.model.backend == "scripted":
        return True, "the model is a scripted server (it costs nothing)"
    price = cfg.prices.get(cfg.model.name) or {}
    if cfg.model.backend == "anthropic" and price and not any(price.values()):
        return True, f"the model {cfg.model.name} costs nothing ([prices])"
    if learning.replay_budget_tokens or learning.replay_budget_usd:
        return True, "a replay budget is set ([learning])"
    return False, ("the model is paid and no replay budget is set: set [learning] replay_budget_usd "
                   "or replay_budget_tokens (or replay = 'on') to measure candidates")


def candidate_subject(conn, candidate_id: str) -> Subject | None:
    c = Q.candidate(conn, candidate_id)
    if c is None:
        return None
    return Subject(c.id, "candidate", c.name, f"{c.description}\n\n{c.body.strip()}", tuple(c.source_notes))


def skill_subject(conn, name: str, eval_id: str) -> Subject | None:
    s = Q.skill(conn, name)
    if s is None:
        return None
    notes: tuple[str, ...] = ()
    if s.candidate_id:
        c = Q.candidate(conn, s.candidate_id)
        notes = tuple(c.source_notes) if c is not None else ()
    return Subject(eval_id, "skill", name, select.skill_text(s), notes)


def choose_items(conn, subject: Subject, n: int, has_history) -> list[tuple[str, str]]:
    """Up to ``n`` ended items to replay as ``[(work id, 'source' | 'similar')]``: the runs the
    subject's notes came from first, then the most similar other ended items. ``has_history(id)``
    says whether an item's baseline can still be read (retention may have pruned it)."""
    ended = R.ended_items(conn)
    usable = {e.id: e for e in ended if has_history(e.id)}
    out: list[tuple[str, str]] = []
    for run in R.source_runs(conn, subject.source_notes):
        if run in usable and len(out) < n:
            out.append((run, "source"))
    rest = [e for e in ended if e.id in usable and all(e.id != o for o, _ in out)]
    if len(out) < n and rest:
        index = Index([select.context_of({"goal": e.goal, "verify": list(e.verify)}) for e in rest])
        for i, _ in index.query(f"{subject.name.replace('-', ' ')}\n{subject.text}", k=n - len(out),
                                threshold=SIMILAR_THRESHOLD):
            out.append((rest[i].id, "similar"))
    return out


@dataclass(frozen=True)
class Arm:
    """One arm's figures over its ended runs."""

    runs: int
    ended: int
    goals: int
    goal_rate: float | None
    iterations_to_goal: float | None
    tokens: float | None

    def encode(self) -> dict:
        return {"runs": self.runs, "ended": self.ended, "goals": self.goals, "goal_rate": self.goal_rate,
                "iterations_to_goal": self.iterations_to_goal, "tokens": self.tokens}


def _mean(values: list[float]) -> float | None:
    return round(sum(values) / len(values), 2) if values else None


def _arm(runs: list[Replay]) -> Arm:
    ended = [r for r in runs if r.ended]
    goals = [r for r in ended if r.goal_met]
    return Arm(len(runs), len(ended), len(goals), round(len(goals) / len(ended), 3) if ended else None,
               _mean([r.iterations for r in goals]), _mean([r.tokens for r in ended]))


def _delta(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round(a - b, 3)


def summarise(replays: list[Replay]) -> dict:
    """Per arm the goal rate, iterations to goal and tokens; the difference (with − without);
    ``measured``: both arms of at least one item ended; the runs, linked by work id."""
    pairs: dict[str, dict[str, Replay]] = {}
    for r in replays:
        pairs.setdefault(r.source_id, {})[r.arm] = r
    complete = {s: p for s, p in pairs.items() if WITH in p and WITHOUT in p and p[WITH].ended and p[WITHOUT].ended}
    w = _arm([p[WITH] for p in complete.values()])
    wo = _arm([p[WITHOUT] for p in complete.values()])
    return {
        "measured": bool(complete), "items": len(pairs), "items_measured": len(complete),
        "running": sum(1 for r in replays if not r.ended),
        "with": w.encode(), "without": wo.encode(),
        "delta": {"goal_rate": _delta(w.goal_rate, wo.goal_rate),
                  "iterations_to_goal": _delta(w.iterations_to_goal, wo.iterations_to_goal),
                  "tokens": _delta(w.tokens, wo.tokens)},
        "runs": [{"work_id": r.work_id, "arm": r.arm, "source": r.source_id, "relation": r.relation,
                  "status": r.status, "stop_reason": r.stop_reason, "iterations": r.iterations, "tokens": r.tokens}
                 for r in replays],
    }


def of_subject(conn, subject_id: str) -> dict:
    """``summarise`` of a subject's replays, with its plan (what was chosen, or why nothing)."""
    plan = R.plan(conn, subject_id)
    out = summarise(R.of_subject(conn, subject_id))
    out["plan"] = None if plan is None else {"status": plan.status, "items": list(plan.items), "reason": plan.reason}
    return out


def line(summary: dict) -> str:
    """One line for a human: ``with 2/2 goals in 1.0 iterations, without 1/2 in 2.0 (Δ …)``."""
    plan = summary.get("plan")
    if not summary["items"]:
        if plan and plan["status"] == "skipped":
            return f"not replayed: {plan['reason']}"
        return "not replayed yet"
    if not summary["measured"]:
        return f"replaying: {summary['running']} run(s) going, no item measured yet"
    w, wo, d = summary["with"], summary["without"], summary["delta"]

    def fmt(arm):
        its = "—" if arm["iterations_to_goal"] is None else f"{arm['iterations_to_goal']:g}"
        toks = "—" if arm["tokens"] is None else f"{arm['tokens']:,.0f}"
        return f"{arm['goals']}/{arm['ended']} goals, {its} iterations to goal, {toks} tokens"

    def sign(v, fmtv="{:+g}"):
        return "—" if v is None else fmtv.format(v)
    more = f"; {summary['running']} run(s) still going" if summary["running"] else ""
    return (f"with: {fmt(w)} · without: {fmt(wo)} · Δ goal rate {sign(d['goal_rate'])}, "
            f"iterations {sign(d['iterations_to_goal'])}, tokens {sign(d['tokens'], '{:+,.0f}')}"
            f" ({summary['items_measured']} item(s) measured{more})")
