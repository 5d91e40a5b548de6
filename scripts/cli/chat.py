"""The human's conversation with the org (``org chat``). It lives with the CLI, whose commands it
runs: every durable write it makes is the CLI's own, as the human.

Slash commands always work and map to the same operations as the CLI. Free text goes to the
coordinator's model when one is configured; the model acts only through those operations, as
tools, and says what it did. Without a model, free text gets one line pointing to /help.
"""
from __future__ import annotations

import io
import shlex
from contextlib import redirect_stderr, redirect_stdout
from typing import Callable

HELP = """commands (the same as the org CLI):
  /submit "GOAL" --workspace DIR --verify "CMD" [options]   give the org work
  /status                     the org at a glance
  /show ID                    one work item
  /cancel ID                  cancel a work item
  /decisions                  actions waiting for you
  /decide ID approve|reject|edit|respond [TEXT]
  /suspend  /resume           suspend or resume the org
  /help  /quit"""

SLASH = {"submit", "status", "show", "cancel", "decisions", "decide", "suspend", "resume", "diff"}

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
    "decisions": ("List actions waiting for a human decision.", {"type": "object", "properties": {}},
                  lambda a: ["decisions"]),
    "decide": ("Record the human's decision on a waiting action (only when the human said so).",
               {"type": "object", "required": ["id", "verdict"], "properties": {
                   "id": {"type": "string"}, "verdict": {"type": "string", "enum": ["approve", "reject", "edit", "respond"]},
                   "text": {"type": "string"}}},
               lambda a: ["decide", a["id"], a["verdict"], *([a["text"]] if a.get("text") else [])]),
}


def run_cli(argv: list[str], home: str | None) -> tuple[int, str]:
    """Run an org CLI command in-process; returns (exit code, combined output)."""
    from scripts.cli.main import main
    out = io.StringIO()
    with redirect_stdout(out), redirect_stderr(out):
        code = main((["--home", home] if home else []) + argv)
    return code, out.getvalue().rstrip()


def handle_slash(line: str, home: str | None) -> str:
    try:
        parts = shlex.split(line[1:])
    except ValueError as exc:
        return f"error[bad_arguments]: {exc} — check the quotes"
    if not parts or parts[0] == "help":
        return HELP
    if parts[0] not in SLASH:
        return f"error[unknown_command]: /{parts[0]} — /help lists the commands"
    _, text = run_cli(parts, home)
    return text


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
                        code, out = run_cli(argv, self.home)
                        err = code != 0
                        done.append("org " + shlex.join(argv))
                    except (KeyError, TypeError) as exc:
                        out, err = f"bad input: missing {exc}", True
                results.append({"type": "tool_result", "tool_use_id": use["id"], "content": out or "(no output)",
                                "is_error": err})
            self.history.append({"role": "user", "content": results})
        return "I stopped after several steps without finishing; see /status.", done
