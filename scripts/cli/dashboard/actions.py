"""What the dashboard writes: the human's answers, through the same operations as the CLI.

A decision goes through ``roles.operations.decide.decide`` (``org decide``); candidates through
``roles.operations.candidates`` (``org candidates approve|reject|defer|edit``). Each is one
durable write as actor ``human`` under the idempotency key the page sends (the same click twice
writes once), then a wake to the coordinator; the page gets the operation's result as data.
"""
from __future__ import annotations

from roles.operations import candidates as candidate_ops
from roles.operations.decide import VERDICTS, decide as decide_op
from scripts.cli.dashboard.errors import BadRequest, ConfirmNeeded
from state_db.kernel import config as config_mod
from state_db.kernel.home import OrgHome

CANDIDATE_ACTIONS = ("approve", "reject", "defer")
RUNS_A_COMMAND = ("approve", "edit")      # the verdicts that let a gated command run


def _confirmed(home: OrgHome, decision_id: str, body: dict) -> None:
    """A decision that lets a command run outside the sandbox's limits (network, outside the
    workspace) is answered from the page only with ``confirm`` naming it: the page asks again,
    showing the whole command, before it sends that. Raises ConfirmNeeded otherwise."""
    from state_db.connection import connect
    from state_db.queries.decisions import decision
    conn = connect(home.db_path, readonly=True)
    try:
        row = decision(conn, decision_id)
    finally:
        conn.close()
    if row is not None and row.command and body.get("confirm") != decision_id:
        raise ConfirmNeeded(decision_id, row.kind)


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
    if verdict in RUNS_A_COMMAND:
        _confirmed(home, decision_id, body)
    return decide_op(home, _config(home), decision_id, verdict, _text(body, "text"), stop=bool(body.get("stop")),
                     idempotency_key=_key(body)).as_data()


def candidates(home: OrgHome, action: str, body: dict) -> dict:
    """Approve, reject or defer candidates: body {ids: [...], idempotency_key}.

    Raises: BadRequest, CandidateNotFound, CandidateClosed. Returns what ``org candidates ACTION
    --json`` prints."""
    ids = body.get("ids")
    if action not in CANDIDATE_ACTIONS:
        raise BadRequest(f"unknown candidate action {action!r}", hint=f"use one of {', '.join(CANDIDATE_ACTIONS)}")
    if not ids or not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise BadRequest("ids must be a non-empty list of candidate ids", hint="send {\"ids\": [\"c-...\"]}")
    return candidate_ops.decide(home, _config(home), ids, action, idempotency_key=_key(body)).as_data()


def edit_candidate(home: OrgHome, candidate_id: str, body: dict) -> dict:
    """Edit a candidate: body {name?, description?, body?, idempotency_key}. Returns {id, changed}."""
    fields = {k: _text(body, k) for k in ("name", "description", "body")}
    return candidate_ops.edit(home, _config(home), candidate_id, idempotency_key=_key(body), **fields).as_data()


def _key(body: dict) -> str:
    key = _text(body, "idempotency_key")
    if not key or len(key) > 200:
        raise BadRequest("idempotency_key is missing or longer than 200 characters",
                         hint="send one key per click; the same key twice writes once")
    return key
