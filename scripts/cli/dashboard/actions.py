"""What the dashboard writes: the human's answers, through the same operations as the CLI.

A decision goes through ``roles.operations.decide.decide`` (``org decide``); candidates through
``skills.review`` (``org candidates approve|reject|defer|edit``). Each is one durable write as
actor ``human`` under the idempotency key the page sends (the same click twice writes once),
then a wake to the coordinator.
"""
from __future__ import annotations

from contextlib import contextmanager

from roles.operations.decide import VERDICTS, decide as decide_op
from scripts.cli.dashboard.errors import BadRequest
from state_db import config as config_mod
from state_db.home import OrgHome
from state_db.vocab import Actor

CANDIDATE_ACTIONS = ("approve", "reject", "defer")


def _config(home: OrgHome):
    return config_mod.load_config(home)


def _text(body: dict, key: str) -> str | None:
    value = body.get(key)
    if value is not None and not isinstance(value, str):
        raise BadRequest(f"{key} must be a string", hint="send JSON like {\"%s\": \"...\"}" % key)
    return value


def decide(home: OrgHome, decision_id: str, body: dict) -> dict:
    """Answer a decision: body {verdict, text?, stop?, idempotency_key}.

    Raises: BadRequest, and what ``org decide`` raises (NotFound, DecideError, IllegalTransition).
    Returns what ``org decide --json`` prints."""
    verdict = _text(body, "verdict")
    if verdict not in VERDICTS:
        raise BadRequest(f"unknown verdict {verdict!r}", hint=f"use one of {', '.join(VERDICTS)}")
    return decide_op(home, _config(home), decision_id, verdict, _text(body, "text"), stop=bool(body.get("stop")),
                     idempotency_key=_key(body))


def candidates(home: OrgHome, action: str, body: dict) -> dict:
    """Approve, reject or defer candidates: body {ids: [...], idempotency_key}.

    Raises: BadRequest, CandidateNotFound, CandidateClosed. Returns what ``org candidates ACTION
    --json`` prints."""
    from skills import review

    ids = body.get("ids")
    if action not in CANDIDATE_ACTIONS:
        raise BadRequest(f"unknown candidate action {action!r}", hint=f"use one of {', '.join(CANDIDATE_ACTIONS)}")
    if not ids or not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise BadRequest("ids must be a non-empty list of candidate ids", hint="send {\"ids\": [\"c-...\"]}")
    with _writer(home) as writer:
        out = review.decide(writer, ids, action, home.skills_dir, key=_key(body))
    _wake(home)
    return out


def edit_candidate(home: OrgHome, candidate_id: str, body: dict) -> dict:
    """Edit a candidate: body {name?, description?, body?, idempotency_key}. Returns {id, changed}."""
    from skills import review

    fields = {k: _text(body, k) for k in ("name", "description", "body")}
    with _writer(home) as writer:
        out = review.edit(writer, candidate_id, key=_key(body), **fields)
    _wake(home)
    return out


def _key(body: dict) -> str:
    key = _text(body, "idempotency_key")
    if not key or len(key) > 200:
        raise BadRequest("idempotency_key is missing or longer than 200 characters",
                         hint="send one key per click; the same key twice writes once")
    return key


@contextmanager
def _writer(home: OrgHome):
    from state_db.writer import StateWriter
    writer = StateWriter(home.db_path, Actor.HUMAN)
    try:
        yield writer
    finally:
        writer.close()


def _wake(home: OrgHome) -> None:
    from roles.operations.wake import wake_coordinator
    wake_coordinator(home, _config(home))
