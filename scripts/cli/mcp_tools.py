"""What ``org mcp`` offers as tools: each one's JSON schema and the library call behind it.

A tool calls the operation the CLI command of its name calls (roles/operations) and returns its
result as data: what that command's ``--json`` prints. Writes are actor ``human``, signed with
the OS user and ``via mcp:<client>``, under an idempotency key the client may give.
``mcp.tools`` in org.toml chooses which tools exist; the default is read-only.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable

from roles.operations import candidates as candidate_ops, skills as skill_ops
from roles.operations.cancel import cancel as cancel_op
from roles.operations.caps import given as caps_given
from roles.operations.continue_run import ContinueRequest, continue_run
from roles.operations.decide import decide as decide_op
from roles.operations.submit import SubmitRequest, submit as submit_op
from state_db.queries.work import Caps
from scripts.cli.commands.submit import check_scripted_backend
from state_db.kernel.config import Config
from state_db.kernel.errors import OrgError
from state_db.kernel.home import OrgHome

STATUSES = list(candidate_ops.STATUSES)


class ToolDisabled(OrgError):
    code = "tool_disabled"


@dataclass(frozen=True)
class Caller:
    """Who calls: the org home, its configuration, and the client (``mcp:claude-code``)."""

    home: OrgHome
    cfg: Config
    via: str


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    schema: dict
    run: Callable[[Caller, dict], Any]


def enabled(cfg: Config) -> set[str]:
    return set(cfg.mcp.tools)


def refuse(caller: Caller, what: str) -> ToolDisabled:
    return ToolDisabled(f"'{what}' is not enabled for MCP clients in this org",
                        hint=f"add \"{what}\" to tools in [mcp] of {caller.home.config_path}, then restart 'org mcp'")


def _args(caller: Caller, **kw) -> SimpleNamespace:
    return SimpleNamespace(home=str(caller.home.root), **kw)


def _read(caller: Caller, fn):
    from state_db.connection import connect
    conn = connect(caller.home.require().db_path, readonly=True)
    try:
        return fn(conn)
    finally:
        conn.close()


# -- reads ------------------------------------------------------------------------------------
def status(caller: Caller, a: dict) -> dict:
    from scripts.cli.commands.status import load
    return _read(caller, load)


def show(caller: Caller, a: dict) -> dict:
    from scripts.cli.commands.show import load
    return _read(caller, lambda conn: load(conn, a["id"]))


def transcript(caller: Caller, a: dict) -> dict:
    """What ``org show ID --transcript --json`` prints."""
    from state_db import queries
    from state_db.kernel.errors import NotFound
    from state_db.queries.transcript import of_work

    def read(conn):
        if queries.work_item(conn, a["id"]) is None:
            raise NotFound(f"no work item {a['id']}", hint="list them with 'org status'")
        return {"id": a["id"], "iteration": a.get("iteration"),
                "attempts": of_work(conn, a["id"], iteration=a.get("iteration"))}
    return _read(caller, read)


def cost(caller: Caller, a: dict) -> dict:
    """``org cost --json`` for each grouping (item, goal, model, day), over every call."""
    from state_db.queries.cost import BYS, rollup
    return _read(caller, lambda conn: {by: rollup(conn, by) for by in BYS})


def diff(caller: Caller, a: dict) -> dict:
    from scripts.cli.commands.diff import patch_of
    patch = patch_of(_args(caller, id=a["id"], iteration=a.get("iteration")))
    return {"id": a["id"], "iteration": a.get("iteration"), "patch": patch.decode("utf-8", "replace")}


def decisions(caller: Caller, a: dict) -> list:
    from state_db.queries import decisions as D
    from state_db.queries.base import plain
    if a.get("all"):
        return _read(caller, lambda c: plain(D.recent(c, 100)))
    return _read(caller, lambda c: plain(D.pending(c)))


def skills(caller: Caller, a: dict):
    home = caller.home.require()
    if a.get("action") == "show":
        return skill_ops.show(home, caller.cfg, a.get("name") or "").as_data()
    return skill_ops.listing(home, caller.cfg, include_retired=bool(a.get("all"))).as_data()


def candidates(caller: Caller, a: dict):
    home = caller.home.require()
    action = a.get("action") or "list"
    if action == "list":
        return candidate_ops.listing(home, a.get("status"), every=bool(a.get("all"))).as_data()
    if action == "show":
        return candidate_ops.show(home, _one(a)).as_data()
    if "review" not in enabled(caller.cfg):
        raise refuse(caller, "review")
    return candidate_ops.decide(home, caller.cfg, a.get("ids") or [_one(a)], action,
                                idempotency_key=a.get("idempotency_key"), via=caller.via,
                                reason=a.get("reason")).as_data()


def _one(a: dict) -> str:
    ref = a.get("id") or (a.get("ids") or [None])[0]
    if not ref:
        raise ToolBadArguments("this action needs 'id' (or 'ids')")
    return ref


class ToolBadArguments(OrgError):
    code = "bad_arguments"


# -- writes -----------------------------------------------------------------------------------
def submit(caller: Caller, a: dict) -> dict:
    home = caller.home.require()
    check_scripted_backend(a.get("backend"))
    return submit_op(home, caller.cfg, SubmitRequest(
        goal=a["goal"], workspace=a["workspace"], verify=a["verify"], protect=a.get("protect") or [],
        default_protect=a.get("default_protect", True),
        caps=caps_given({k: a.get(k) for k in CAPS}, a.get("no_caps") or ()), backend=a.get("backend"), worktree=bool(a.get("worktree")), review=a.get("review"),
        idempotency_key=a.get("idempotency_key"), via=caller.via), wait_s=float(a.get("wait_s", 60))).as_data()


def cancel(caller: Caller, a: dict) -> dict:
    return cancel_op(caller.home.require(), caller.cfg, a["id"], idempotency_key=a.get("idempotency_key"),
                     via=caller.via).as_data()


def continue_(caller: Caller, a: dict) -> dict:
    return continue_run(caller.home.require(), caller.cfg, ContinueRequest(
        a["id"], Caps.given({k: a.get(k) for k in CAPS}), idempotency_key=a.get("idempotency_key"),
        via=caller.via)).as_data()


def decide(caller: Caller, a: dict) -> dict:
    return decide_op(caller.home.require(), caller.cfg, a["id"], a["verdict"], a.get("text"),
                     stop=bool(a.get("stop")), idempotency_key=a.get("idempotency_key"), via=caller.via).as_data()


# -- schemas ----------------------------------------------------------------------------------
def _obj(required: list[str] | None = None, **props) -> dict:
    return {"type": "object", "properties": props, "required": required or [], "additionalProperties": False}


S = {"type": "string"}
ID = {"type": "string", "description": "work item id (w-MMDD-xxxxxx)"}
KEY = {"type": "string", "description": "the same key twice does it once (retry-safe); default: a fresh key"}
CAPS = {"max_iterations": {"type": "integer", "minimum": 1, "description": "hard cap on iterations"},
        "budget_tokens": {"type": "integer", "minimum": 1, "description": "hard cap on tokens"},
        "budget_usd": {"type": "number", "exclusiveMinimum": 0, "description": "hard cap on cost in USD"},
        "timeout_s": {"type": "number", "exclusiveMinimum": 0, "description": "hard cap on working time, seconds"}}

TOOLS = [
    Tool("submit", "Hand the org a goal: a workspace folder and verify commands that exit 0 when the goal is met. "
         "The org's loop-agent iterates until an independent eval-agent runs the checks green, or a cap ends it. "
         "Follow it with 'show' or the resource org://runs/ID.",
         _obj(["goal", "workspace", "verify"], goal={**S, "description": "what must be true when the work is done"},
              workspace={**S, "description": "absolute path of the folder the agent works in"},
              verify={"type": "array", "items": S, "minItems": 1,
                      "description": "commands that exit 0 when the goal is met, run by the eval-agent"},
              protect={"type": "array", "items": S, "description": "more globs the agent may not change"},
              default_protect={"type": "boolean", "description": "also protect the usual test files (default true)"},
              backend={**S, "description": "anthropic | command | scripted:FILE (default from org.toml)"},
              worktree={"type": "boolean", "description": "work in a new git worktree and branch"},
              review={**S, "description": "criteria a model reviews each passing change against; it may veto "
                                          "(default: [review] criteria in org.toml)"},
              wait_s={"type": "number", "minimum": 0, "maximum": 600,
                      "description": "seconds to wait for the verify preflight on the baseline (default 60; 0: none)"},
              no_caps={"type": "array", "items": {"type": "string", "enum": list(CAPS)}, "uniqueItems": True,
                       "description": "caps to remove instead of keeping their defaults; a cap not named here "
                                      "and not given keeps its default"},
              idempotency_key=KEY, **CAPS), submit),
    Tool("status", "The org at a glance: session, roles, active and recent runs with phase and caps, usage, "
         "pending decisions and candidate batches.", _obj(), status),
    Tool("show", "One run: status, stop reason, iterations with verdicts and evidence, usage, decisions.",
         _obj(["id"], id=ID), show),
    Tool("diff", "What a run changed since its baseline, as a unified patch (or one iteration's change).",
         _obj(["id"], id=ID, iteration={"type": "integer", "minimum": 1}), diff),
    Tool("cancel", "Cancel a run (stop reason 'cancelled'); a running act is cut and discarded.",
         _obj(["id"], id=ID, idempotency_key=KEY), cancel),
    Tool("continue", "Continue a run that ended on a cap, budget or loop detector, as the same run with raised caps.",
         _obj(["id"], id=ID, idempotency_key=KEY, **CAPS), continue_),
    Tool("decisions", "Gated actions waiting for a human (with all=true, recent decided ones too).",
         _obj(all={"type": "boolean"}), decisions),
    Tool("decide", "Answer a waiting decision: approve (runs the command once), edit (text: the command to run "
         "instead), reject (stop=true ends the run), respond (text: the answer).",
         _obj(["id", "verdict"], id={**S, "description": "decision id (see 'decisions')"},
              verdict={"type": "string", "enum": ["approve", "reject", "edit", "respond"]},
              text=S, stop={"type": "boolean"}, idempotency_key=KEY), decide),
    Tool("candidates", "Skill candidates the curator proposed: list, show one (SKILL.md text, score, evidence), "
         "or approve / reject / defer them (needs \"review\" in mcp.tools).",
         _obj(action={"type": "string", "enum": ["list", "show", "approve", "reject", "defer"]},
              id={**S, "description": "candidate id or name"}, ids={"type": "array", "items": S},
              all={"type": "boolean"},
              status={"type": "array", "items": {"type": "string", "enum": STATUSES}},
              reason={**S, "description": "approve / reject / defer: why, kept with the decision"},
              idempotency_key=KEY), candidates),
    Tool("skills", "Approved skills with use counts and last use (list), or one skill with its origin (show).",
         _obj(action={"type": "string", "enum": ["list", "show"]}, name=S, all={"type": "boolean"}), skills),
]
BY_NAME = {t.name: t for t in TOOLS}


def call(caller: Caller, name: str, arguments: dict) -> Any:
    """Run tool ``name``. Raises ToolDisabled (not in mcp.tools) or the operation's OrgError."""
    tool = BY_NAME.get(name)
    if tool is None:
        raise ToolBadArguments(f"no tool {name!r}", hint=f"tools: {', '.join(BY_NAME)}")
    if name not in enabled(caller.cfg):
        raise refuse(caller, name)
    return tool.run(caller, arguments)
