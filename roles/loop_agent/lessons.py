"""Lessons (Reflexion-style): after a failed verdict, one short lesson for the next gather.

A lesson says what failed and what to do differently. The default is derived deterministically
from the failing checks, their signatures and the verdict feedback; a model-written lesson can
be added the same way. The ``LessonBook`` keeps the current ones: capped in number and size,
de-duplicated on normalised text, most recent first. It is an immutable value: ``add`` returns
a new book, so the engine stores exactly what it fed to the next gather.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any, Sequence

DEFAULT_MAX_LESSONS = 5
DEFAULT_MAX_CHARS = 300

_PUNCT = re.compile(r"[^\w\s]")


def normalize(text: str) -> str:
    """Text as compared for duplicates: case-folded, punctuation dropped, spaces collapsed."""
    return " ".join(_PUNCT.sub(" ", text.casefold()).split())


def clip(text: str, max_chars: int) -> str:
    """``text`` on one line, cut to ``max_chars`` with an ellipsis when longer."""
    flat = " ".join(text.split())
    if len(flat) <= max_chars:
        return flat
    return flat[:max_chars] if max_chars < 8 else flat[: max_chars - 3].rstrip() + "..."


@dataclass(frozen=True)
class Lesson:
    text: str
    iteration: int
    source: str = "derived"  # "derived" (deterministic) or "model"

    @cached_property
    def key(self) -> str:
        """The text as compared for duplicates."""
        return normalize(self.text)

    @property
    def id(self) -> str:
        """Stable id of the lesson's content (recorded in prompt manifests)."""
        return "L" + hashlib.sha256(self.key.encode()).hexdigest()[:10]

    def encode(self) -> dict[str, Any]:
        return {"text": self.text, "iteration": self.iteration, "source": self.source}

    @classmethod
    def decode(cls, data: dict[str, Any]) -> Lesson:
        return cls(str(data["text"]), int(data["iteration"]), str(data.get("source", "derived")))


_SALIENT = re.compile(r"(Error|error:|assert|FAIL|Exception|expected)")


def derive_lesson(
    failing: Sequence[tuple[str, str]],
    feedback: str = "",
    *,
    max_chars: int = DEFAULT_MAX_CHARS,
) -> str:
    """A deterministic lesson from a failed verdict.

    Args:
        failing: ``(check name, failure signature)`` pairs of the failed verdict.
        feedback: the verdict's feedback text; its first meaningful line is quoted.
        max_chars: size cap of the lesson.
    Returns: one line of at most ``max_chars`` characters.
    """
    if failing:
        shown = "; ".join(f"{check} ({sig})" if sig else check for check, sig in failing[:3])
        more = f" and {len(failing) - 3} more" if len(failing) > 3 else ""
        head = f"Failed: {shown}{more}."
        advice = "Fix this cause directly; do not repeat the approach that led here."
    else:
        head = "Verification failed without a named check."
        advice = "Read the feedback and change approach."
    lines = [ln.strip() for ln in feedback.splitlines() if ln.strip()]
    # quote what the failure says (an assertion or error line) rather than the check's heading
    first = next((ln for ln in lines if _SALIENT.search(ln) and not ln.startswith("Check `")),
                 lines[0] if lines else "")
    hint = f" Feedback: {first}" if first else ""
    # Keep the advice whole: cut the quoted feedback first, then the head.
    budget = max_chars - len(advice) - 1
    body = clip(head + hint, budget) if budget >= 40 else clip(head, max_chars)
    return clip(f"{body} {advice}", max_chars)[:max_chars]


@dataclass(frozen=True)
class LessonBook:
    """The current lessons, most recent first; immutable."""

    lessons: tuple[Lesson, ...] = ()
    max_lessons: int = DEFAULT_MAX_LESSONS
    max_chars: int = DEFAULT_MAX_CHARS

    def __post_init__(self) -> None:
        if self.max_lessons < 1 or self.max_chars < 20:
            raise ValueError("a lesson book keeps at least 1 lesson of at least 20 characters")

    @cached_property
    def _keys(self) -> frozenset[str]:
        return frozenset(x.key for x in self.lessons)

    def add(self, text: str, iteration: int, *, source: str = "derived") -> LessonBook:
        """A new book with ``text`` first (clipped to ``max_chars``).

        A lesson equal after normalisation to a kept one replaces it (moving it first with the
        new iteration); the oldest beyond ``max_lessons`` is dropped. Blank text adds nothing.
        """
        text = clip(text, self.max_chars)
        key = normalize(text)
        if not key:
            return self
        kept = tuple(x for x in self.lessons if x.key != key)
        new = (Lesson(text, iteration, source),) + kept
        return replace(self, lessons=new[: self.max_lessons])

    @classmethod
    def latest(cls, entries, max_lessons: int = DEFAULT_MAX_LESSONS,
               max_chars: int = DEFAULT_MAX_CHARS) -> LessonBook:
        """The book that ``add``-ing ``entries`` ((text, iteration), oldest first) would give,
        built from the newest end: the cost grows with the entries read until the book is full,
        not with every ``add`` of a long run."""
        empty = cls(max_lessons=max_lessons, max_chars=max_chars)
        kept: list[Lesson] = []
        seen: set[str] = set()
        for text, iteration in reversed(entries):
            text = clip(text, max_chars)
            key = normalize(text)
            if key and key not in seen:
                seen.add(key)
                kept.append(Lesson(text, iteration))
                if len(kept) == max_lessons:
                    break
        return replace(empty, lessons=tuple(kept)) if kept else empty

    def __contains__(self, text: str) -> bool:
        return normalize(clip(text, self.max_chars)) in self._keys

    def __len__(self) -> int:
        return len(self.lessons)

    def texts(self) -> list[str]:
        return [x.text for x in self.lessons]

    def ids(self) -> list[str]:
        return [x.id for x in self.lessons]

    def encode(self) -> str:
        """JSON text (stored by the engine with each iteration)."""
        return json.dumps({"max_lessons": self.max_lessons, "max_chars": self.max_chars,
                           "lessons": [x.encode() for x in self.lessons]},
                          ensure_ascii=False, separators=(",", ":"))

    @classmethod
    def decode(cls, text: str) -> LessonBook:
        data = json.loads(text)
        return cls(tuple(Lesson.decode(d) for d in data["lessons"]),
                   int(data["max_lessons"]), int(data["max_chars"]))
