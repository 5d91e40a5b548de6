"""Bounded context assembly: what one iteration's prompt contains.

The prompt has two parts:

- the **stable prefix** — instructions and the chosen skills. It depends on nothing that changes
  between iterations, so it is byte-identical across a run and can be cached by the provider.
- the **variable part** — ``Iteration: N`` (first line, exact format), the goal, curated
  knowledge, one rolling summary of older iterations, the last K iterations in detail, the
  latest verdict feedback and the current lessons. Knowledge stays out of the prefix because
  the curator may consolidate notes while a run goes on.

Every variable section has a size cap, so the variable part is bounded whatever the run's
length. Older iterations become one line each, oldest dropped first beyond the summary's room.
The recent details and the summary share one history budget (``history_cap_chars``): the
summary takes what the details leave (at least a quarter, at most ``summary_cap_chars``) and
the details share the rest equally, so once a run has more than K iterations its history stops
growing. Growth from an early iteration to a late one is therefore at most the unused part of
the history budget plus the unused part of the lessons cap; with realistic digests (act summaries
of a few hundred characters, test output as feedback) that keeps iteration 30 within 1.3x of
iteration 3. The manifest records sizes, the ids of what was included and a hash.
"""
from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from functools import cached_property
from typing import Any, Sequence

from roles.loop_agent.lessons import Lesson, LessonBook, clip
from state_db.text import clean

SUMMARY_LINE_CHARS = 100


@dataclass(frozen=True)
class IterationDigest:
    """What a committed iteration leaves for later prompts.

    Args:
        iteration: its number.
        summary: what the act did (the model's closing text or the engine's act summary).
        outcome: the verdict in one line, e.g. ``fail: pytest (AssertionError: 2 != 3)``.
        tool_calls: short descriptions of the tool calls (``edit calc.py``, ``run pytest``).
        changed_paths: paths the iteration changed.
    """

    iteration: int
    summary: str
    outcome: str = ""
    tool_calls: tuple[str, ...] = ()
    changed_paths: tuple[str, ...] = ()

    def one_line(self, max_chars: int = SUMMARY_LINE_CHARS) -> str:
        """``#N | outcome | changed paths | summary`` on one line of at most ``max_chars``."""
        return self._summary_line if max_chars == SUMMARY_LINE_CHARS else self._line(max_chars)

    @cached_property
    def _summary_line(self) -> str:
        # every later gather shows this line again: a long run renders it once
        return self._line(SUMMARY_LINE_CHARS)

    def _line(self, max_chars: int) -> str:
        parts = [f"#{self.iteration}", clip(self.outcome, 50) or "no verdict"]
        paths = self.changed_paths
        if paths:
            parts.append(", ".join(paths[:2]) + (f" +{len(paths) - 2}" if len(paths) > 2 else ""))
        if self.summary.strip():
            parts.append(self.summary)
        return clip(" | ".join(parts), max_chars)

    def detail(self) -> str:
        lines = [f"### Iteration {self.iteration}" + (f": {self.outcome}" if self.outcome else "")]
        if self.summary.strip():
            lines.append(self.summary.strip())
        if self.tool_calls:
            lines.append("Tools: " + "; ".join(self.tool_calls))
        if self.changed_paths:
            lines.append("Changed: " + ", ".join(self.changed_paths))
        return "\n".join(lines)

    def encode(self) -> dict[str, Any]:
        return {**asdict(self), "tool_calls": list(self.tool_calls),
                "changed_paths": list(self.changed_paths)}

    @classmethod
    def decode(cls, data: dict[str, Any]) -> IterationDigest:
        return cls(int(data["iteration"]), str(data["summary"]), str(data.get("outcome", "")),
                   tuple(data.get("tool_calls", ())), tuple(data.get("changed_paths", ())))


@dataclass(frozen=True)
class Prompt:
    """An assembled prompt: the cacheable ``system_prefix``, the ``variable`` part, and the
    ``manifest`` recorded with the iteration (sizes, ids included, sha256)."""

    system_prefix: str
    variable: str
    manifest: dict[str, Any]


def clip_block(text: str, max_chars: int) -> str:
    """Multi-line ``text`` cut to ``max_chars``, keeping its head and tail (test output tells
    the first failure at the top and the totals at the bottom)."""
    text = text.strip()
    if len(text) <= max_chars:
        return text
    marker = f"\n[... {len(text) - max_chars} characters cut ...]\n"
    room = max_chars - len(marker)
    if room < 20:
        return clip(text, max_chars)
    head = room * 2 // 3
    return text[:head].rstrip() + marker + text[len(text) - (room - head):].lstrip()


def _fit(blocks: Sequence[tuple[str, str]], cap: int, sep: str = "\n\n") -> tuple[str, list[str]]:
    """Join ``(id, text)`` blocks in order while they fit in ``cap``; the first that does not
    fit whole is clipped, the rest are left out. Returns the text and the ids included."""
    out, ids, used = [], [], 0
    for block_id, text in blocks:
        room = cap - used - (len(sep) if out else 0)
        if room < 40:
            break
        piece = text if len(text) <= room else clip_block(text, room)
        out.append(piece)
        ids.append(block_id)
        used += len(piece) + (len(sep) if len(out) > 1 else 0)
    return sep.join(out), ids


def _share(blocks: Sequence[tuple[str, str]], cap: int, sep: str = "\n\n") -> str:
    """Join all ``blocks`` within ``cap``, clipping the longest first: each gets an equal share,
    and what a short block leaves over goes to the longer ones."""
    room = cap - len(sep) * max(0, len(blocks) - 1)
    alloc: dict[int, int] = {}
    for rank, (i, (_, text)) in enumerate(sorted(enumerate(blocks), key=lambda x: len(x[1][1]))):
        alloc[i] = min(len(text), max(0, room) // (len(blocks) - rank))
        room -= alloc[i]
    return sep.join(clip_block(text, alloc[i]) for i, (_, text) in enumerate(blocks))


def rolling_summary(older: Sequence[IterationDigest], cap: int) -> tuple[str, int]:
    """One line per older iteration, oldest dropped first to fit ``cap`` characters.

    Returns: the summary text and how many iterations it had to leave out.
    """
    lines = [d.one_line() for d in sorted(older, key=lambda d: d.iteration)]
    total = len("\n".join(lines))
    dropped = 0

    def marker() -> str:
        return f"(... {dropped} earlier iterations left out)"

    while lines and total + (len(marker()) + 1 if dropped else 0) > cap:
        total -= len(lines.pop(0)) + (1 if lines else 0)
        dropped += 1
    text = "\n".join(([marker()] if dropped else []) + lines)
    return text[:cap], dropped  # a cap smaller than the marker itself still holds


def _lessons(lessons: LessonBook | Sequence[Lesson | str]) -> list[Lesson]:
    items = lessons.lessons if isinstance(lessons, LessonBook) else lessons
    return [x if isinstance(x, Lesson) else Lesson(str(x), 0) for x in items]


def _utf8(text: str) -> bytes:
    # Workspace text may carry undecodable bytes (surrogate escapes); sizes and hashes must
    # not fail on them.
    return text.encode("utf-8", "replace")


def assemble(
    goal: str,
    instructions: str,
    skills: Sequence[tuple[str, str]],
    knowledge: Sequence[tuple[str, str]],
    iterations: Sequence[IterationDigest],
    lessons: LessonBook | Sequence[Lesson | str],
    feedback: str,
    iteration_no: int,
    k_recent: int = 3,
    summary_cap_chars: int = 2000,
    *,
    history_cap_chars: int = 2000,
    detail_cap_chars: int = 800,
    feedback_cap_chars: int = 4000,
    knowledge_cap_chars: int = 4000,
    lessons_cap_chars: int = 600,
    goal_cap_chars: int = 8000,
) -> Prompt:
    """Assemble the prompt of iteration ``iteration_no``.

    Args:
        goal: the work item's goal.
        instructions: the loop-agent's instructions (stable prefix).
        skills: chosen skills as ``(id, text)`` (stable prefix, in the given order).
        knowledge: curated notes as ``(id, text)``, most relevant first.
        iterations: digests of committed iterations (any order; only those before
            ``iteration_no`` are used).
        lessons: the current lessons, most recent first.
        feedback: the latest verdict's feedback.
        iteration_no: the iteration being gathered (printed as ``Iteration: N``).
        k_recent: how many latest iterations appear in detail.
        summary_cap_chars: cap of the rolling summary of older iterations.
        history_cap_chars: cap of recent details plus summary together.
        detail_cap_chars, feedback_cap_chars, knowledge_cap_chars, lessons_cap_chars,
        goal_cap_chars: caps of the other sections.
    Returns: a ``Prompt``; ``manifest`` keys: ``iteration``, ``prefix_bytes``,
        ``variable_bytes``, ``skills``, ``knowledge``, ``lessons`` (ids included),
        ``recent_iterations``, ``summarized_iterations``, ``omitted_iterations``,
        ``section_bytes`` (per section of the variable part), ``sha256``.
    """
    prefix_parts = [instructions.strip()]
    prefix_parts += [f"## Skill: {sid}\n{text.strip()}" for sid, text in skills]
    # what reaches the model carries no terminal control sequences (a project's forced colour)
    system_prefix = clean("\n\n".join(p for p in prefix_parts if p) + "\n")

    past = sorted((d for d in iterations if d.iteration < iteration_no), key=lambda d: d.iteration)
    recent = past[-k_recent:] if k_recent > 0 else []
    older = past[: len(past) - len(recent)]

    # Recent details and the summary share one history budget: the summary gets what the
    # details leave (at least a quarter of the budget), the details share the rest.
    blocks = [(str(d.iteration), clip_block(d.detail(), detail_cap_chars))
              for d in reversed(recent)]
    summary, dropped = "", len(older)
    if older:
        wanted = sum(len(text) + 2 for _, text in blocks)
        room = min(summary_cap_chars, max(history_cap_chars // 4, history_cap_chars - wanted))
        summary, dropped = rolling_summary(older, room)
    details = _share(blocks, history_cap_chars - len(summary))
    knowledge_text, knowledge_ids = _fit(
        [(kid, f"[{kid}] {text.strip()}") for kid, text in knowledge], knowledge_cap_chars)
    lesson_text, lesson_ids = _fit(
        [(x.id, f"- {x.text}") for x in _lessons(lessons)], lessons_cap_chars, sep="\n")

    sections = {"header": f"Iteration: {iteration_no}",
                "goal": "## Goal\n" + clip_block(goal, goal_cap_chars)}
    if knowledge_text:
        sections["knowledge"] = "## Knowledge\n" + knowledge_text
    if summary:
        sections["summary"] = "## Earlier iterations (one line each)\n" + summary
    if details:
        sections["recent"] = "## Recent iterations (latest first)\n" + details
    if feedback.strip():
        sections["feedback"] = ("## Latest verdict feedback\n"
                                + clip_block(feedback, feedback_cap_chars))
    if lesson_text:
        sections["lessons"] = "## Lessons from failed iterations (latest first)\n" + lesson_text
    sections = {name: clean(text) for name, text in sections.items()}
    variable = "\n\n".join(sections.values()) + "\n"

    prefix_bytes, variable_bytes = _utf8(system_prefix), _utf8(variable)
    manifest = {
        "iteration": iteration_no,
        "prefix_bytes": len(prefix_bytes),
        "variable_bytes": len(variable_bytes),
        "skills": [sid for sid, _ in skills],
        "knowledge": knowledge_ids,
        "lessons": lesson_ids,
        "recent_iterations": [d.iteration for d in reversed(recent)],
        "summarized_iterations": len(older) - dropped,
        "omitted_iterations": dropped,
        "section_bytes": {name: len(_utf8(text)) for name, text in sections.items()},
        "sha256": hashlib.sha256(prefix_bytes + b"\0" + variable_bytes).hexdigest(),
    }
    return Prompt(system_prefix, variable, manifest)
