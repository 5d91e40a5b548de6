"""Five signals that say whether a pattern (the notes of one curated note) is worth a skill.

Each signal is a stated predicate over note fields; a signal is worth one point:

1. **recurrence** — the notes come from ≥ ``notes_per_pattern`` distinct runs (one run's notes
   count once).
2. **multi_step** — some note's rationale has ≥ ``MIN_STEPS`` steps (sentences of ≥ 12
   characters, CJK characters counting twice, split at ``. ``, ``。``, ``;`` or line ends)
   *and* some note's judgment makes a conditional decision (``if``, ``when``, ``unless``,
   ``instead``, ``rather than``, ``before``, ``after``, ``なら``, ``場合``, ``とき``,
   ``代わりに`` …).
3. **trigger** — at least half of the notes (rounded up) name a concrete, searchable trigger in
   their applicability: a backticked span, a file name with an extension, an error class name, a
   quoted string or a command flag.
4. **criteria** — some note's judgment states a threshold or a classification rule:
   ``once``/``twice``, ``N times``, ``N %``, a comparison with a number (``≥ 3``, ``at least``,
   ``more than``), ``after the first/second …``, ``either … or``, ``回以上``, ``以上``, ``以下``,
   ``未満``, ``いずれか``.
5. **reusable_output** — some note's fact or rationale names an artefact another run can
   reuse: a backticked command or code, a file name with an extension, or a format word
   (template, checklist, schema, script, fixture, テンプレート, 手順, 形式, スクリプト).

Criteria are read in judgments and artefacts in facts and rationales on purpose: an outcome
note's numbers (``2/6 iterations``) are facts, not a rule someone could follow.

Score ≥ 3 → ``recommended`` (a skill candidate), 2 → ``queued`` (kept on the curated note and
re-scored whenever the pattern gains notes; never shown for review on its own), ≤ 1 →
``curated`` only.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

from knowledge.notes import RawNote
from state_db.vocab import NoteTier

MIN_STEPS = 3
MIN_STEP_CHARS = 12
RECOMMENDED, QUEUED, CURATED = NoteTier.RECOMMENDED, NoteTier.QUEUED, NoteTier.CURATED
NAMES = ("recurrence", "multi_step", "trigger", "criteria", "reusable_output")

_STEP_SPLIT = re.compile(r"(?<=[.!?])\s+|[。;\n]")
_CONDITIONAL = re.compile(r"\b(if|when|whenever|unless|otherwise|instead|rather than|before|after|only if)\b"
                          r"|なら|場合|とき|代わりに|前に|後に|ないと", re.IGNORECASE)
_TRIGGER = re.compile(r"`[^`]{2,}`|\b[\w./-]+\.(?:py|js|ts|json|toml|ya?ml|md|txt|sh|csv|cfg|ini)\b"
                      r"|\b[A-Z]\w*(?:Error|Exception|Warning)\b|\"[^\"]{3,}\"|「[^」]{2,}」|(?<!\w)--?[a-z][\w-]+")
_CRITERIA = re.compile(r"\b(once|twice|thrice)\b|\b\d+\s*(?:%|(?:times|x|percent|iterations?|runs?|failures?|tries)\b)"
                       r"|[≥≤<>]=?\s*\d|\bat (?:least|most)\b|\b(?:more|fewer|less) than\b"
                       r"|\bafter the (?:first|second|third)\b|\beither\b.+\bor\b"
                       r"|\d+\s*回|回以上|以上|以下|未満|いずれか", re.IGNORECASE)
_REUSABLE = re.compile(r"`[^`]{2,}`|\b[\w./-]+\.(?:py|js|ts|json|toml|ya?ml|md|txt|sh|csv|cfg|ini)\b"
                       r"|\b(?:template|checklist|schema|script|fixture)s?\b|テンプレート|手順|形式|スクリプト",
                       re.IGNORECASE)


@dataclass(frozen=True)
class Signal:
    ok: bool
    why: str
    notes: tuple[str, ...] = ()

    def encode(self) -> dict:
        return {"ok": self.ok, "why": self.why, "notes": list(self.notes)}


@dataclass(frozen=True)
class Score:
    score: int
    tier: str
    signals: dict[str, Signal]
    runs: tuple[str, ...]

    def encode(self) -> dict:
        return {"score": self.score, "tier": self.tier, "runs": list(self.runs),
                **{name: s.encode() for name, s in self.signals.items()}}


def runs_of(notes: Sequence[RawNote]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(n.run_id for n in notes))


def _weight(text: str) -> int:
    """Length with CJK characters counted twice (a kanji says about what two letters do)."""
    return len(text) + sum(1 for c in text if "\u3040" <= c <= "\u9fff")


def steps_in(text: str) -> list[str]:
    return [s.strip() for s in _STEP_SPLIT.split(text) if _weight(s.strip()) >= MIN_STEP_CHARS]


def recurrence(notes: Sequence[RawNote], notes_per_pattern: int) -> Signal:
    runs = runs_of(notes)
    return Signal(len(runs) >= notes_per_pattern,
                  f"{len(runs)} distinct run(s) (needs {notes_per_pattern}): {', '.join(runs[:6])}",
                  tuple(dict.fromkeys(n.id for n in notes))[:6])


def multi_step(notes: Sequence[RawNote]) -> Signal:
    stepped = [n for n in notes if len(steps_in(n.rationale)) >= MIN_STEPS]
    judged = [n for n in notes if _CONDITIONAL.search(n.judgment)]
    ok = bool(stepped) and bool(judged)
    why = (f"{len(stepped)} note(s) with ≥ {MIN_STEPS} steps, {len(judged)} with a conditional judgment"
           + (f" (e.g. {_CONDITIONAL.search(judged[0].judgment).group(0)!r})" if judged else ""))
    return Signal(ok, why, tuple(n.id for n in (stepped[:2] + judged[:2])))


def trigger(notes: Sequence[RawNote]) -> Signal:
    hits = [(n, m.group(0)) for n in notes if (m := _TRIGGER.search(n.applicability))]
    need = (len(notes) + 1) // 2
    terms = list(dict.fromkeys(t for _, t in hits))[:3]
    return Signal(len(hits) >= need, f"{len(hits)} of {len(notes)} applicability statements name a concrete "
                                      f"trigger (needs {need}): {', '.join(terms) or 'none'}",
                  tuple(n.id for n, _ in hits[:4]))


def states_criteria(text: str) -> bool:
    """True if ``text`` states a threshold or a classification rule (the criteria predicate)."""
    return _CRITERIA.search(text) is not None


def criteria(notes: Sequence[RawNote]) -> Signal:
    for n in notes:
        m = _CRITERIA.search(n.judgment)
        if m:
            return Signal(True, f"judgment of {n.id} states {m.group(0)!r}", (n.id,))
    return Signal(False, "no threshold or classification rule stated")


def reusable_output(notes: Sequence[RawNote]) -> Signal:
    for n in notes:
        for part in ("fact", "rationale"):
            m = _REUSABLE.search(getattr(n, part))
            if m:
                return Signal(True, f"{part} of {n.id} names {m.group(0)!r}", (n.id,))
    return Signal(False, "no reusable artefact named")


def tier_of(points: int) -> str:
    return RECOMMENDED if points >= 3 else QUEUED if points == 2 else CURATED


def score(notes: Sequence[RawNote], notes_per_pattern: int) -> Score:
    """Score a pattern on the five signals (see the module docstring)."""
    signals = {"recurrence": recurrence(notes, notes_per_pattern), "multi_step": multi_step(notes),
               "trigger": trigger(notes), "criteria": criteria(notes), "reusable_output": reusable_output(notes)}
    points = sum(s.ok for s in signals.values())
    return Score(points, tier_of(points), signals, runs_of(notes))
