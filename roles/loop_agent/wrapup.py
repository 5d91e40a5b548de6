"""The wrap-up: when a token, cost or time budget trips, the run gets one bounded act that writes
a hand-off note — what was done, what remains, what was learned — before it ends.

Bounded three ways. Its slice is reserved (``[loop] wrapup_reserve`` of each budget, kept back
from the iterations by the stop policy), and the act may spend what is left of each budget up to
that slice (``StopPolicy.wrapup_allowance``): its requests are bounded by it like any act's, and
its prompt is cut to fit it, estimating a token as three characters (English runs nearer four), so
its input cannot eat the slice either. It runs with the tools that read only (``tools.read_only``),
at most ``MAX_TURNS`` model turns, and the workspace is reset to the run's last settled state after
it whatever it did. And it runs once per ending: its attempt is committed before the model is
called, so an act cut by a crash is not bought again — the note then comes from the record.

A backend whose agent brings its own tools (the ``command`` backend's CLI) cannot be held to the
reading tools or to the slice inside its session: it gets no wrap-up act.

The note's three parts are always derived from the record too (iteration summaries and changed
paths; the latest verdict's failing checks; the lessons), so a wrap-up the model could not do (no
slice left, a model error, an unparsable answer) still leaves a useful note. The stop reason stays
the budget's.
"""
from __future__ import annotations

import re

from roles.loop_agent.conditions import MIN_WRAPUP_TOKENS
from roles.loop_agent.context import IterationDigest
from roles.loop_agent.lessons import LessonBook
from state_db.ending import StopDecision

MAX_TURNS = 2
CHARS_PER_TOKEN = 3           # a conservative estimate: it overstates tokens, so the cut is safe
ANSWER_TOKENS = 200           # room kept in the slice for the note itself
_PARTS = ("done", "remains", "learned")
_HEADING = re.compile(r"^\s*(?:#+\s*|\*\*)?(done|what was done|remains|what remains|learned|what was learned)"
                      r"\s*(?:\*\*)?\s*:?\s*(?:\*\*)?\s*", re.IGNORECASE | re.MULTILINE)

INSTRUCTIONS = """You are a loop-agent of loop-org. The run you worked on has reached its budget and
ends now; nothing more will be changed. Write its hand-off note for the human or agent who takes it
up: three short sections headed exactly "Done:", "Remains:" and "Learned:" — what was done, what
remains to reach the goal (which checks still fail, and why), and what was learned that the next
attempt should know. You may read files; you cannot change anything. Be specific and brief.
"""


def record_parts(digests: list[IterationDigest], feedback: str, lessons: LessonBook) -> dict[str, str]:
    """The three parts as the record states them (no model involved)."""
    done = " ".join(f"Iteration {d.iteration}: {_clip(d.summary, 200)} (changed "
                    f"{', '.join(d.changed_paths[:4]) or 'nothing'}; {d.outcome or 'not verified'})."
                    for d in digests[-5:]) or "No iteration was committed."
    remains = _clip(feedback, 800) if feedback.strip() else "No verdict says what remains."
    learned = " ".join(f"{x.text}" for x in lessons.lessons) or "No lesson was recorded."
    return {"done": done, "remains": remains, "learned": learned}


def prompt(goal: str, iteration_no: int, decision: StopDecision, parts: dict[str, str], tokens_left: float | None) -> str:
    """The wrap-up act's first message, cut to fit ``tokens_left`` (None: no token budget).
    It starts with ``Iteration: N`` (the next iteration's number) like every act's prompt."""
    head = f"Iteration: {iteration_no}\nWrap-up: the run stops ({decision.reason}: {decision.detail}).\n"
    body = (f"\nGoal:\n{goal}\n\nFrom the record —\nDone: {parts['done']}\nRemains: {parts['remains']}\n"
            f"Learned: {parts['learned']}\n\nWrite the hand-off note now (Done: / Remains: / Learned:).")
    if tokens_left is None:
        return head + body
    room = int((tokens_left - ANSWER_TOKENS) * CHARS_PER_TOKEN) - len(head)
    return head + (body if len(body) <= room else body[:max(0, room)])


def fits(tokens_left: float | None) -> bool:
    """Whether a slice of ``tokens_left`` tokens leaves room for a prompt and a note."""
    return tokens_left is None or tokens_left >= MIN_WRAPUP_TOKENS


def parse(text: str) -> dict[str, str]:
    """The note's sections (``done``, ``remains``, ``learned``) as the model headed them; the
    ones it left out are missing."""
    marks = list(_HEADING.finditer(text))
    out: dict[str, str] = {}
    for i, m in enumerate(marks):
        name = m.group(1).lower().split()[-1]
        part = text[m.end(): marks[i + 1].start() if i + 1 < len(marks) else len(text)].strip()
        if name in _PARTS and part and name not in out:
            out[name] = _clip(part, 2000)
    return out


def _clip(text: str, cap: int) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= cap else text[: cap - 1] + "…"
