"""The human's conversation with the org (``org chat``). It lives with the CLI, whose commands it
runs: every durable write it makes is the CLI's own, as the human.

Slash commands always work and map to the same operations as the CLI. Free text goes to the
coordinator's model when one is configured; the model acts only through those operations, as
tools, and says what it did: a tool that writes (submit, cancel, continue, decide, candidates)
calls the operation itself (roles/operations) and hands the model its result as data, what the
command's ``--json`` prints. Without a model, free text gets one line pointing to /help.
"""
from __future__ import annotations

import atexit
import io
import shlex
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any, Callable

import orjson

from roles.operations import Result, candidates as candidate_ops
from roles.operations.cancel import cancel as cancel_op
from roles.operations.continue_run import ContinueRequest, continue_run
from roles.operations.decide import decide as decide_op
from roles.operations.submit import SubmitRequest, submit as submit_op
from state_db.kernel.config import load_config
from state_db.kernel.errors import OrgError
from state_db.kernel.home import OrgHome, resolve_home
from state_db.queries.work import Caps

HELP = """commands (the same as the org CLI):
  /submit "GOAL" --workspace DIR --verify "CMD" [options]   give the org work
  /status                     the org at a glance
  /show ID                    one work item
  /cancel ID                  cancel a work item
  /continue ID [--max-iterations N …]   continue a run that ended on a cap, with raised caps
  /diff ID [--iteration N]    what a run changed
  /decisions                  actions waiting for you
  /decide ID approve|reject|edit|respond [TEXT]
  /candidates [show|approve|reject|defer|edit ID…]   skills the org proposes
  /skills [show NAME]         skills the org has learned, with their uses
  /discover [list|show|accept|dismiss ID] [--workspace DIR …]   work a scan proposes
  /schedules                  schedules and triggers: rule, state, next due, fired and skipped
  /schedule …  /trigger …     make, show, pause, resume or remove them (as 'org schedule', 'org trigger')
  /logs [--role R] [-n N]     the roles' recent log lines
  /suspend  /resume           suspend or resume the org
  /help  /quit (or Ctrl-D)    Ctrl-C clears the line; arrows edit it and walk the history"""

SLASH = {"submit", "status", "show", "cancel", "continue", "decisions", "decide", "suspend", "resume", "diff",
         "candidates", "skills", "logs", "discover", "schedule", "trigger"}
PROMPT = "org> "
HISTORY_LINES = 1000

# The operations the chat model may use: name -> (description, json schema of its input, argv builder)
TOOLS: dict[str, tuple[str, dict, Callable[[dict], list[str]]]] = {
    "status": ("Show the org: roles, work items, usage, waiting decisions.", {"type": "object", "properties": {}},
               lambda a: ["status"]),
    "show": ("Show one work item with its iterations and verdicts.",
             {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]},
             lambda a: ["show", a["id"]]),
    "submit": ("Submit work: a goal, a workspace directory and verify commands that exit 0 when the goal is met.",
               {"type": "object", "required": ["goal", "workspace", "verify"], "properties": {
                   "goal": {"type": "string"}, "workspace": {"type": "string"},
                   "verify": {"type": "array", "items": {"type": "string"}},
                   "max_iterations": {"type": "integer"}}},
               lambda a: ["submit", a["goal"], "--workspace", a["workspace"],
                          *[x for v in a.get("verify", []) for x in ("--verify", v)],
                          *(["--max-iterations", str(a["max_iterations"])] if a.get("max_iterations") else [])]),
    "cancel": ("Cancel a work item.", {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]},
               lambda a: ["cancel", a["id"]]),
    "continue": ("Continue a run that ended on a cap or a budget, with raised caps (only when the human said so).",
                 {"type": "object", "required": ["id"], "properties": {
                     "id": {"type": "string"}, "max_iterations": {"type": "integer"},
                     "budget_tokens": {"type": "integer"}, "budget_usd": {"type": "number"},
                     "timeout_s": {"type": "number"}}},
                 lambda a: ["continue", a["id"], *[x for k, f in (("max_iterations", "--max-iterations"),
                                                                  ("budget_tokens", "--budget-tokens"),
                                                                  ("budget_usd", "--budget-usd"),
                                                                  ("timeout_s", "--timeout"))
                                                   if a.get(k) is not None for x in (f, str(a[k]))]]),
    "candidates": ("Approve, reject or defer skill candidates the curator proposed (only when the human said so).",
                   {"type": "object", "required": ["action", "ids"], "properties": {
                       "action": {"type": "string", "enum": list(candidate_ops.ACTIONS)},
                       "ids": {"type": "array", "items": {"type": "string"}},
                       "reason": {"type": "string", "description": "why, in the human's words"}}},
                   lambda a: ["candidates", a["action"], *a["ids"], *(["--reason", a["reason"]] if a.get("reason") else [])]),
    "decisions": ("List actions waiting for a human decision.", {"type": "object", "properties": {}},
                  lambda a: ["decisions"]),
    "decide": ("Record the human's decision on a waiting action (only when the human said so).",
               {"type": "object", "required": ["id", "verdict"], "properties": {
                   "id": {"type": "string"}, "verdict": {"type": "string", "enum": ["approve", "reject", "edit", "respond"]},
                   "text": {"type": "string"}}},
               lambda a: ["decide", a["id"], a["verdict"], *([a["text"]] if a.get("text") else [])]),
    "schedules": ("List the standing orders: schedules (timers) and triggers (events, discovery scans), with each "
                  "one's rule, state, next due time and fired / skipped counts.",
                  {"type": "object", "properties": {}}, lambda a: ["status", "--orders"]),
    "proposals": ("List the work a discovery scan proposes (open proposals, the recommended first).",
                  {"type": "object", "properties": {}}, lambda a: ["discover", "list"]),
    "discover": ("Scan a workspace (read only) for work: failing verify commands, FIXME/TODO markers, an issue "
                 "list file. It only proposes; nothing starts.",
                 {"type": "object", "required": ["workspace"], "properties": {
                     "workspace": {"type": "string"}, "verify": {"type": "array", "items": {"type": "string"}},
                     "issues": {"type": "string"}}},
                 lambda a: ["discover", "--workspace", a["workspace"],
                            *[x for v in a.get("verify", []) for x in ("--verify", v)],
                            *(["--issues", a["issues"]] if a.get("issues") else [])]),
    "accept_proposal": ("Accept a discovery proposal: submits it as a work item (only when the human said so).",
                        {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]},
                        lambda a: ["discover", "accept", a["id"]]),
    "dismiss_proposal": ("Dismiss a discovery proposal (only when the human said so).",
                         {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]},
                         lambda a: ["discover", "dismiss", a["id"]]),
}


# The tools that write call the operation itself: (home, its config, the tool's input) -> its result
OPERATIONS: dict[str, Callable[[OrgHome, Any, dict], Result]] = {
    "submit": lambda home, cfg, a: submit_op(home, cfg, SubmitRequest(
        goal=a["goal"], workspace=a["workspace"], verify=list(a["verify"]),
        caps=Caps.given({"max_iterations": a.get("max_iterations")})), wait_s=120.0),
    "cancel": lambda home, cfg, a: cancel_op(home, cfg, a["id"]),
    "continue": lambda home, cfg, a: continue_run(home, cfg, ContinueRequest(
        a["id"], Caps.given({k: a.get(k) for k in Caps.names()}))),
    "decide": lambda home, cfg, a: decide_op(home, cfg, a["id"], a["verdict"], a.get("text")),
    "candidates": lambda home, cfg, a: candidate_ops.decide(home, cfg, list(a["ids"]), a["action"],
                                                            reason=a.get("reason")),
}


def run_operation(name: str, arguments: dict, home: str | None) -> tuple[bool, str]:
    """Call the operation behind tool ``name``; returns (failed, its result as JSON, or the
    error's one line)."""
    org_home = resolve_home(home)
    try:
        org_home.require()
        result = OPERATIONS[name](org_home, load_config(org_home), arguments)
    except OrgError as exc:
        return True, exc.line()
    return False, orjson.dumps(result.as_data(), option=orjson.OPT_NON_STR_KEYS, default=str).decode()


def run_cli(argv: list[str], home: str | None) -> tuple[int, str]:
    """Run an org CLI command in-process; returns (exit code, combined output)."""
    from scripts.cli.main import main
    raw = io.BytesIO()               # with a binary side: diff and export write bytes to stdout
    out = io.TextIOWrapper(raw, encoding="utf-8", errors="replace", write_through=True)
    with redirect_stdout(out), redirect_stderr(out):
        code = main((["--home", home] if home else []) + argv)
    out.flush()
    return code, raw.getvalue().decode("utf-8", errors="replace").rstrip()


def handle_slash(line: str, home: str | None) -> str:
    try:
        parts = shlex.split(line[1:])
    except ValueError as exc:
        return f"error[bad_arguments]: {exc} — check the quotes"
    if not parts or parts[0] == "help":
        return HELP
    if parts[0] not in SLASH and parts != ["schedules"]:
        return f"error[unknown_command]: /{parts[0]} — /help lists the commands"
    if parts == ["schedules"]:
        parts = ["status", "--orders"]
    if parts[0] == "logs" and {"-f", "--follow"} & set(parts):
        # its output is collected and shown when the command ends, which a follow never does
        return "error[bad_arguments]: /logs cannot follow inside chat — run 'org logs -f' in another terminal"
    _, text = run_cli(parts, home)
    return text


def line_reader(history: Path | None, interactive: bool) -> Callable[[], str | None]:
    """A function that returns the next line typed, or None at the end of the input.

    On a terminal it shows ``PROMPT`` and edits lines with readline, whose history is loaded
    from and saved to ``history`` (best effort); Ctrl-C raises KeyboardInterrupt, Ctrl-D ends.
    Elsewhere (a pipe, a file) lines are read plainly, without a prompt."""
    if not interactive:
        def read_plain() -> str | None:
            line = sys.stdin.readline()
            return line if line else None
        return read_plain
    try:
        import readline
    except ImportError:              # a Python built without it: input() still works, unedited
        readline = None
    if readline is not None and history is not None:
        readline.set_history_length(HISTORY_LINES)
        try:
            readline.read_history_file(history)
        except OSError:
            pass                     # the first chat: no history yet

        def save() -> None:
            try:
                readline.write_history_file(history)
            except OSError:
                pass
        atexit.register(save)

    def read_typed() -> str | None:
        # input() edits the line with readline only while sys.stdout is the terminal itself: the
        # prompt is ours, so it is read with the real streams, and what is printed stays neutralised
        shown_out, shown_err = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
        try:
            return input(PROMPT)
        except EOFError:
            print()
            return None
        finally:
            sys.stdout, sys.stderr = shown_out, shown_err
    return read_typed


def converse(read_line: Callable[[], str | None], say: Callable[[str], None],
             respond: Callable[[str], str]) -> None:
    """The chat loop: each line read goes to ``respond`` and its answer to ``say``, until the
    input ends or ``/quit``. Ctrl-C clears the line being typed, or abandons a slow answer, and
    the chat goes on."""
    while True:
        try:
            line = read_line()
        except KeyboardInterrupt:
            say("")                  # the typed line is dropped; a fresh prompt follows
            continue
        if line is None:
            return
        line = line.strip()
        if not line:
            continue
        if line in ("/quit", "/exit"):
            return
        try:
            answer = respond(line)
        except KeyboardInterrupt:
            answer = "(interrupted)"
        if answer:
            say(answer)


class ChatModel:
    """Free text → the coordinator's model with the operations as tools.

    Args:
        client_factory: returns an ``anthropic.Anthropic``-like client.
        model: model name.
        home: org home (passed to the operations).
    """

    SYSTEM = ("You are the coordinator of loop-org, an organisation of agents. You talk with the human and act "
              "only through the tools given (they are the org's own commands). Never claim to have done something "
              "you did not do with a tool; after acting, say in one or two sentences what you did and its result. "
              "Decide a waiting action only when the human clearly told you their decision.")

    def __init__(self, client_factory, model: str, home: str | None, max_turns: int = 6):
        self.client_factory = client_factory
        self.model = model
        self.home = home
        self.max_turns = max_turns
        self.history: list[dict] = []
        self._client = None

    def tools(self) -> list[dict]:
        return [{"name": n, "description": d, "input_schema": s} for n, (d, s, _) in TOOLS.items()]

    def ask(self, text: str) -> tuple[str, list[str]]:
        """Returns (reply text, the operations run as CLI lines)."""
        if self._client is None:
            self._client = self.client_factory()
        self.history.append({"role": "user", "content": text})
        done: list[str] = []
        for _ in range(self.max_turns):
            msg = self._client.messages.create(model=self.model, max_tokens=1024, system=self.SYSTEM,
                                               tools=self.tools(), messages=self.history)
            blocks = [b.model_dump() if hasattr(b, "model_dump") else dict(b) for b in msg.content]
            self.history.append({"role": "assistant", "content": blocks})
            uses = [b for b in blocks if b.get("type") == "tool_use"]
            if not uses:
                return "".join(b.get("text", "") for b in blocks if b.get("type") == "text").strip(), done
            results = []
            for use in uses:
                spec = TOOLS.get(use["name"])
                if spec is None or not isinstance(use.get("input"), dict):
                    out, err = f"unknown tool or bad input: {use['name']}", True
                else:
                    try:
                        argv = spec[2](use["input"])
                        if use["name"] in OPERATIONS:
                            err, out = run_operation(use["name"], use["input"], self.home)
                        else:
                            code, out = run_cli(argv, self.home)
                            err = code != 0
                        done.append("org " + shlex.join(argv))
                    except (KeyError, TypeError) as exc:
                        out, err = f"bad input: missing {exc}", True
                results.append({"type": "tool_result", "tool_use_id": use["id"], "content": out or "(no output)",
                                "is_error": err})
            self.history.append({"role": "user", "content": results})
        return "I stopped after several steps without finishing; see /status.", done
