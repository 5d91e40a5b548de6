"""A skill candidate drafted from a scored pattern: name, description and a SKILL.md body with
the four sections (when to use, steps, criteria and thresholds, pitfalls), all derived from the
pattern's notes — and, for a failure pattern, from the fix notes that share its trigger."""
from __future__ import annotations

from dataclasses import dataclass

from knowledge.findings import clip, short_check
from knowledge.patterns import Pattern
from knowledge.signals import states_criteria
from knowledge.similarity import normalize, polarity
from skills.names import name_for
from skills.skillmd import MAX_DESCRIPTION
from state_db.queries.knowledge import fix_notes_about


@dataclass(frozen=True)
class CandidateDraft:
    """What the curator proposes for one pattern."""

    name: str
    description: str
    body: str
    score: int
    signals: dict
    notes: tuple[tuple[str, str], ...]     # (raw note id, run id)
    curated_id: str

    @property
    def source_notes(self) -> list[str]:
        return [n for n, _ in self.notes]


def _distinct(texts) -> list[str]:
    seen, out = set(), []
    for t in texts:
        key = normalize(t)
        if key and key not in seen:
            seen.add(key)
            out.append(t)
    return out


def draft(conn, pattern: Pattern) -> CandidateDraft:
    """The candidate for a scored pattern (see the module docstring); deterministic."""
    notes = list(pattern.notes)
    kind = notes[0].kind if notes else ""
    triggers = list(dict.fromkeys(n.evidence["trigger"] for n in notes if n.evidence.get("trigger")))
    curated = pattern.note
    name = name_for(kind, curated.topic, triggers[0] if triggers else None)
    subjects = list(dict.fromkeys(str(n.evidence["subject"]) for n in notes
                                  if str(n.evidence.get("subject", "")).startswith("check:")))
    # fix notes (any status) about the same checks: what made that check pass in some run
    fixes = [f for f in fix_notes_about(conn, subjects) if f.id not in {n.id for n in notes}]
    when = _distinct(n.applicability.rstrip(".") for n in notes)[:3]
    advice = _distinct(n.judgment for n in notes)
    positive = [t for t in advice if polarity(t) > 0]
    negative = [t for t in advice if polarity(t) < 0]
    runs = pattern.score.runs

    steps = []
    if triggers:
        check, why = triggers[0].split("|", 1)
        steps.append(f"Run `{short_check(check, 80)}` and find the line that says \"{why}\".")
    for f in fixes[:3]:
        paths = ", ".join(f.evidence.get("changed_paths", [])[:3]) or "the code"
        steps.append(f"Look at {paths} first: in run {f.run_id}, changing it resolved this failure "
                     f"({clip(f.fact.split(':', 1)[-1], 120)}).")
    steps += [clip(t, 240) for t in positive[:3]]
    if triggers:
        steps.append("Re-run the check after each change; if it fails with the same signature again, change the "
                     "approach instead of repeating it.")

    crit = [f"Seen in {len(runs)} independent run(s): {', '.join(runs[:6])}."]
    crit += [clip(t, 240) for t in advice if states_criteria(t)][:3]
    if triggers:
        crit.append("The org stops a run when the same check fails with the same signature twice in a row "
                    "(repeated_failure).")
    pits = [clip(t, 240) for t in negative[:3] if clip(t, 240) not in crit]
    stuck = list(dict.fromkeys(n.run_id for n in notes
                               if n.kind == "failure" and n.evidence.get("resolved_at") is None))
    if stuck:
        pits.append("Repeating the same change after the same failure: it did not help in run(s) "
                    f"{', '.join(stuck[:6])}.")
    for c in curated.contradicts:
        pits.append(f"Notes disagree on {c.get('subject') or 'this'}: {len(c['positive'])} for, "
                    f"{len(c['negative'])} against — check which case applies.")
    if not pits:
        pits.append("Do not apply this outside the trigger above; the notes say nothing about other cases.")

    body = "\n".join(
        [f"# {name}", "", "## When to use"] + [f"- {t}." for t in when] +
        ["", "## Steps"] + [f"{i}. {t}" for i, t in enumerate(steps or [clip(advice[0], 240)], 1)] +
        ["", "## Criteria and thresholds"] + [f"- {t}" for t in crit] +
        ["", "## Pitfalls"] + [f"- {t}" for t in pits]) + "\n"
    description = clip(f"Use for {when[0][0].lower() + when[0][1:]}" if when else curated.topic, 400)
    if advice:
        description = clip(f"{description}. {advice[0]}", MAX_DESCRIPTION - 24)
    return CandidateDraft(name, description, body, pattern.score.score, pattern.score.encode(),
                          tuple((n.id, n.run_id) for n in notes), curated.id)
