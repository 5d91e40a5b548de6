"""The retro of an ended run, derived deterministically from its record (no model needed).

A retro is a list of four-part notes (fact / judgment / rationale / applicability), each with
the run id and its evidence (iteration numbers, failing check names, signatures):

- one **outcome** note, always: the stop reason and whether it fits, whether the goal was
  verifiable as stated, the cost against each cap, what became of the lessons;
- one **failure** note per check that failed repeatedly (≥ 2 iterations), with the steps taken;
- one **fix** note when the run reached ``goal_met`` after failing: what the passing iteration
  changed;
- one **context** note per skill the prompts carried (at most ``MAX_CONTEXT``), saying whether
  it was used and whether it helped (predicates in ``knowledge/findings.py``). Curated notes the
  prompts carried go into the outcome note's evidence, never into a note of their own: a note
  about a note would be curated into knowledge about knowledge.

Triggers are the failing check and ``findings.failure_why`` (test ids, error kinds), never a
timing or a count; checks that failed because of the environment are no note's subject, and a
run that failed only that way gets no notes at all (``findings.taught_nothing``).

A model-written retro produces the same ``NoteDraft`` list through the seam in
``knowledge/retro_model.py``; this module is the fallback and the default.
"""
from __future__ import annotations

from typing import Callable

from knowledge import findings as F
from knowledge.notes import NoteDraft
from knowledge.record import RunRecord

MAX_CONTEXT = 5

RetroAuthor = Callable[[RunRecord], list[NoteDraft]]


short = F.short_check


def derive(rec: RunRecord) -> list[NoteDraft]:
    """The retro notes of ``rec`` (outcome first), none when the run taught nothing about the work.
    Pure: the same record gives the same notes."""
    if F.taught_nothing(rec) is not None:
        return []
    notes = [outcome_note(rec)]
    failures = F.repeated_failures(rec)
    notes += [failure_note(rec, r) for r in failures]
    fix = fix_note(rec)
    if fix is not None:
        notes.append(fix)
    notes += [context_note(rec, c) for c in F.carried(rec, rec.terms) if c.section == "skills"][:MAX_CONTEXT]
    return notes


def outcome_note(rec: RunRecord) -> NoteDraft:
    fit, verifiable, cost, lessons = F.stop_fit(rec), F.verifiability(rec), F.budget(rec), F.lesson_use(rec)
    n = len(rec.iterations)
    return NoteDraft(
        fact=(f"Run {rec.id} ended with {rec.stop_reason} after {n} iteration(s) ({rec.attempts} attempt(s), "
              f"{rec.discarded_attempts} discarded); {rec.calls} model call(s), {rec.tokens} tokens, "
              f"${rec.cost_usd:.4f}."),
        judgment=f"The stop reason {'fits' if fit.ok else 'does not fit'}: {fit.why}.",
        rationale=(f"Goal verifiable as stated: {'yes' if verifiable.ok else 'no'} — {verifiable.why}. "
                   f"Budget: {cost.line()}" + (f" (near the cap: {', '.join(cost.near)})" if cost.near else "")
                   + f". Lessons: {lessons.line()}." + _handed_off(rec)),
        applicability=f"Runs that end with {rec.stop_reason}; goal of this one: {F.clip(rec.goal, 100)}",
        evidence={"kind": "outcome", "topic": f"runs ending {rec.stop_reason}", "subject": f"stop:{rec.stop_reason}",
                  "iterations": [it.n for it in rec.iterations], "stop_reason": rec.stop_reason,
                  "fits": fit.ok, "verifiable": verifiable.ok, "near_cap": list(cost.near),
                  "lessons": {"written": list(lessons.written), "heeded": list(lessons.heeded),
                              "ignored": list(lessons.ignored)},
                  "usage": {"calls": rec.calls, "tokens": rec.tokens, "cost_usd": round(rec.cost_usd, 6)},
                  "knowledge": [{"id": c.id, "iterations": list(c.iterations), "used": c.used, "helped": c.helped}
                                for c in F.carried(rec, rec.terms) if c.section == "knowledge"],
                  **({"handoff": {k: rec.handoff[k] for k in ("ending", "source", "done", "remains", "learned")}}
                     if rec.handoff else {})})


def _handed_off(rec: RunRecord) -> str:
    """What the run's hand-off note (its wrap-up when a budget tripped) says remains and was learned."""
    if not rec.handoff:
        return ""
    return (f" Hand-off ({'the wrap-up act' if rec.handoff['source'] == 'wrapup' else 'from the record'}): "
            f"remains — {F.clip(rec.handoff['remains'], 300)}; learned — {F.clip(rec.handoff['learned'], 300)}.")


def steps(rec: RunRecord, upto: int | None = None) -> str:
    """One sentence per iteration: what it changed and how its verdict came out."""
    out = []
    for it in rec.iterations:
        if upto is not None and it.n > upto:
            break
        changed = ", ".join(it.changed_paths[:3]) or "nothing"
        if it.outcome is None:
            verdict = "not verified"
        elif it.passed:
            verdict = "passed every check"
        else:
            verdict = "failed " + ", ".join(f"`{short(c.name)}` ({c.signature[:8]})" for c in it.failing[:2])
        out.append(f"Iteration {it.n} changed {changed} → {verdict}.")
    return " ".join(out)


def _trigger(check: str, why: str) -> str:
    return f"Work items verified by `{short(check)}` whose check output shows \"{why}\"."


def failure_note(rec: RunRecord, r: F.Repeated) -> NoteDraft:
    k, total = len(r.iterations), len(rec.iterations)
    sigs = "with the same signature" if len(r.signatures) == 1 else f"with {len(r.signatures)} different signatures"
    if r.resolved_at is not None:
        changed = next((", ".join(it.changed_paths[:3]) for it in rec.iterations if it.n == r.resolved_at), "")
        judgment = (f"Repeating the approach did not help until iteration {r.resolved_at} changed "
                    f"{changed or 'the approach'}: when `{short(r.check)}` fails with \"{r.why}\", change the "
                    f"approach after the first failure instead of retrying it.")
    elif r.consecutive_same:
        judgment = (f"Retrying did not help: the same failure came back {k} times, so when `{short(r.check)}` "
                    f"fails with \"{r.why}\" twice, stop and change the approach instead of repeating it.")
    else:
        judgment = (f"The approach did not converge: `{short(r.check)}` kept failing in {len(r.signatures)} "
                    f"different ways; if it fails {k} times, re-read the check and the goal before the next change.")
    return NoteDraft(
        fact=(f"Check `{short(r.check)}` failed in iterations {F.span(r.iterations)} of run {rec.id} "
              f"({k} of {total}) {sigs}: {r.why}."),
        judgment=judgment,
        rationale=f"{steps(rec, r.iterations[-1])} Lessons: {F.lesson_use(rec).line()}.",
        applicability=_trigger(r.check, r.why),
        evidence={"kind": "failure", "topic": f"{short(r.check)} fails: {r.why}", "subject": f"check:{r.check}",
                  "trigger": f"{r.check}|{r.why}", "tests": r.tests, "iterations": list(r.iterations), "checks": [r.check],
                  "signatures": list(r.signatures), "resolved_at": r.resolved_at})


def fix_note(rec: RunRecord) -> NoteDraft | None:
    """The fix, when the run reached goal_met after at least one failed iteration."""
    failed = [it for it in rec.iterations if it.outcome is not None and not it.passed]
    passing = [it for it in rec.iterations if it.passed]
    if not rec.goal_met or not failed or not passing:
        return None
    last_fail, win = failed[-1], passing[-1]
    check = next((c for c in last_fail.failing if F.environment_failure(c) is None), None)
    if check is None and last_fail.failing:
        return None                     # what was fixed was the environment, not the work
    name = check.name if check else "the checks"
    why = F.failure_why(check) if check else "no named check"
    changed = ", ".join(win.changed_paths[:3]) or "nothing"
    return NoteDraft(
        fact=(f"Run {rec.id} reached goal_met in iteration {win.n} after {len(failed)} failed iteration(s); "
              f"iteration {win.n} changed {changed}: {F.clip(win.act_summary, 160) or 'no summary'}."),
        judgment=(f"Changing {changed} resolved the failure of `{short(name)}` (\"{why}\"): if the same failure "
                  f"appears, start from that change."),
        rationale=f"{steps(rec, win.n)} Lessons: {F.lesson_use(rec).line()}.",
        applicability=_trigger(name, why),
        evidence={"kind": "fix", "topic": f"fix for {short(name)}: {why}", "subject": f"check:{name}",
                  "trigger": f"{name}|{why}", "iterations": [it.n for it in failed] + [win.n],
                  "checks": [name], "changed_paths": list(win.changed_paths[:20]),
                  "tests": F.test_ids(check) if check else []})


def context_note(rec: RunRecord, c: F.Carried) -> NoteDraft:
    label = "Skill" if c.section == "skills" else "Curated note"
    if c.helped:
        judgment = f"{label} {c.id} helped: the run reached goal_met with it in the prompt ({c.evidence})."
    elif c.used:
        judgment = f"{label} {c.id} did not help: it was used ({c.evidence}) but the run ended {rec.stop_reason}."
    else:
        judgment = f"{label} {c.id} was not used: {c.evidence}, and the run ended {rec.stop_reason}."
    terms = ", ".join(rec.terms.get(c.id, (c.id,))[:4])
    return NoteDraft(
        fact=(f"{label} {c.id} was in the prompts of iterations {F.span(c.iterations)} of run {rec.id}; "
              f"the run ended {rec.stop_reason}."),
        judgment=judgment,
        rationale=(f"Used means carried in a prompt and referred to by an act's summary or tool calls "
                   f"(terms: {terms}), or carried in a run that reached goal_met; helped means used in a run "
                   f"that reached goal_met."),
        applicability=f"Runs whose prompts carry {label.lower()} `{c.id}`.",
        evidence={"kind": "context", "topic": f"{label.lower()} {c.id}", "subject": f"{c.section}:{c.id}",
                  "iterations": list(c.iterations), "used": c.used, "helped": c.helped, "section": c.section,
                  "item": c.id})
