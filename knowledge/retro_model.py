"""The seam for a model-written retro: the prompt a model gets and how its answer becomes notes.

Nothing here calls a model. The curator may be given a ``model_call(system, user) -> text``
(for instance one built on the anthropic backend of roles/loop_agent); ``model_author`` turns it
into a retro author that falls back to the derived retro whenever the model fails or answers
something that is not four-part notes. The record is the only input: the model sees the same
facts the derived retro uses, nothing else.
"""
from __future__ import annotations

from typing import Callable

import orjson
import structlog

from knowledge.errors import NoteInvalid
from knowledge.notes import KINDS, NoteDraft
from knowledge.record import RunRecord
from knowledge.retro import RetroAuthor, derive

SYSTEM = """You write the retro of one ended run of loop-org, an organisation of agents that work in
bounded, verified loops. From the run's record (JSON) write what the org should learn, as notes
in four parts: fact (what happened, with iteration numbers and check names), judgment (what it
means; start with the verdict, e.g. "X helped:" or "X did not help:"), rationale (why, with the
evidence), applicability (when the lesson applies: name the check, error or file). Cover: was the
goal verifiable as stated; did the stop reason fit; which checks failed repeatedly and why; which
skills, knowledge and lessons the prompts carried and whether the run used them; the cost
against the budget. Answer with JSON only: {"notes": [{"fact": "...", "judgment": "...",
"rationale": "...", "applicability": "...", "kind": "outcome|failure|fix|context",
"iterations": [1, 2], "checks": ["..."]}]} — the first note of kind "outcome"."""

ModelCall = Callable[[str, str], str]


def prompt_for(rec: RunRecord) -> tuple[str, str]:
    """(system, user) texts for a model-written retro of ``rec``."""
    return SYSTEM, orjson.dumps(rec.encode(), option=orjson.OPT_INDENT_2).decode()


def parse_notes(text: str, rec: RunRecord) -> list[NoteDraft]:
    """Notes from a model's answer.

    Raises:
        NoteInvalid: the answer is not the JSON asked for, or a note misses a part.
    """
    start, end = text.find("{"), text.rfind("}")
    try:
        data = orjson.loads(text[start:end + 1]) if start >= 0 else None
    except orjson.JSONDecodeError:
        data = None
    if not isinstance(data, dict) or not isinstance(data.get("notes"), list) or not data["notes"]:
        raise NoteInvalid("notes", "is not a non-empty JSON list in the model's answer")
    out = []
    for item in data["notes"]:
        if not isinstance(item, dict):
            raise NoteInvalid("notes", "holds something that is not an object")
        kind = item.get("kind") if item.get("kind") in KINDS else "outcome"
        evidence = {"kind": kind, "iterations": [int(n) for n in item.get("iterations") or [] if str(n).isdigit()],
                    "checks": [str(c) for c in item.get("checks") or []]}
        out.append(NoteDraft(str(item.get("fact", "")), str(item.get("judgment", "")),
                             str(item.get("rationale", "")), str(item.get("applicability", "")),
                             evidence).validate())
    return out


def model_author(model_call: ModelCall) -> RetroAuthor:
    """A retro author that asks a model and falls back to ``derive`` on any failure."""
    log = structlog.get_logger("curator.retro")

    def author(rec: RunRecord) -> list[NoteDraft]:
        try:
            return parse_notes(model_call(*prompt_for(rec)), rec)
        except Exception as exc:  # noqa: BLE001 - a model failure never loses the retro
            log.warning("model_retro_failed", run=rec.id, error=str(exc), next="derive it deterministically")
            return derive(rec)

    author.model = True  # type: ignore[attr-defined]
    return author
