"""A skill candidate drafted from a scored pattern: name, description and a SKILL.md body with
the four sections (when to use, steps, criteria and thresholds, pitfalls), all derived from the
pattern's notes — and, for a failure pattern, from the fix notes that share its trigger."""
from __future__ import annotations

from dataclasses import dataclass

from knowledge.findings import clip, short_check
from knowledge.patterns import Pattern
from knowledge.signals import states_criteria
from knowledge.similarity import dot, normalize, polarity, vectorize
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


#: cosine (the curator's TF-IDF over character n-grams) at or above which two steps say the same
#: thing: they become one step naming the evidence of both. Higher than the topic threshold
#: (``knowledge.thresholds.SIMILARITY``): same topic is not the same step.
NEAR_DUPLICATE = 0.5


def merge_near(items: list[tuple[str, list[str]]]) -> list[tuple[str, list[str]]]:
    """``[(text, evidence)]`` with near-duplicates (``NEAR_DUPLICATE``) merged into the first of
    them, their evidence joined in order; deterministic."""
    if not items:
        return []
    vecs = vectorize([t for t, _ in items])
    kept: list[tuple[int, list[str]]] = []
    for i, (_, evidence) in enumerate(items):
        for j, joined in kept:
            if dot(vecs[i], vecs[j]) >= NEAR_DUPLICATE:
                joined.extend(e for e in evidence if e not in joined)
                break
        else:
            kept.append((i, list(dict.fromkeys(evidence))))
    return [(items[j][0], joined) for j, joined in kept]


def _cite(evidence: list[str]) -> str:
    shown = ", ".join(evidence[:6]) + (f" and {len(evidence) - 6} more" if len(evidence) > 6 else "")
    return f"(run{'s' if len(evidence) > 1 else ''} {shown})"


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

    # each step names the runs it came from; steps that say the same thing are one step
    steps = []
    if triggers:
        check, why = triggers[0].split("|", 1)
        seen_in = list(dict.fromkeys(n.run_id for n in notes if n.evidence.get("trigger") == triggers[0]))
        steps.append(f"Run `{short_check(check, 80)}` and find the line that says \"{why}\" {_cite(seen_in)}.")
    fixed = [(f"Look at {', '.join(f.evidence.get('changed_paths', [])[:3]) or 'the code'} first: changing it "
              f"resolved this failure ({clip(f.fact.split(':', 1)[-1], 120)})", [f.run_id]) for f in fixes]
    advised = [(clip(t, 240).rstrip("."), [n.run_id for n in notes if n.judgment == t]) for t in positive]
    for text, cited in merge_near(fixed)[:3] + merge_near(advised)[:3]:
        steps.append(f"{text} {_cite(cited)}.")
    steps = [t for t, _ in merge_near([(t, []) for t in steps])]
    if triggers:
        steps.append("Re-run the check after each change; if it fails with the same signature again, change the "
                     "approach instead of repeating it (the org stops a run that repeats a failure).")

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
