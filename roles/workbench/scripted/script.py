"""Script files for the scripted model server, and how a request picks its step.

Format (JSON, UTF-8)::

    {
      "version": 1,
      "acts": [                                   # acts[i] serves iteration i + 1
        [                                         # one act = the model turns of one iteration
          {"text": "I will write the file.",
           "tool_uses": [{"name": "write_file", "input": {"path": "a.txt", "content": "hi\\n"}}],
           "usage": {"input_tokens": 120, "output_tokens": 30,
                     "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0},
           "stop_reason": "tool_use"},
          {"text": "Done."}
        ]
      ],
      "default": [ {"text": "Nothing more to do."} ],   # optional: act for iterations past "acts"
      "repeat_last": false,                             # optional: serve the last act again instead
      "reviews": [                                      # optional: reviews[i] answers the eval-agent's
        {"tool_uses": [{"name": "submit_review",        # review of iteration i + 1 (one turn)
                        "input": {"verdict": "reject", "reasons": ["..."]}}]}
      ],
      "when": [                                   # optional: variants chosen by the request's text
        {"prompt_contains": "Skill: retry-flaky", # the first variant whose text occurs anywhere in
         "acts": [...], "default": ...}           # the request (system prompt and messages) serves
      ]                                           # it, as a whole script of its own
    }

A variant holds ``prompt_contains`` (a non-empty string) and the fields of a script (``acts``,
``default``, ``repeat_last``, ``reviews``; no nested ``when``). It lets one script tell whether a
skill or a note reached the model's context, as a model would: the same task takes a shorter path
when the text that helps is in the prompt (skill replays are tested this way).

Turn fields: ``text`` (string) and/or ``tool_uses`` (list of ``{name, input}``; ``input`` any JSON
value, so a script can also feed malformed tool input); ``usage`` (optional; defaults
``input_tokens`` 100, ``output_tokens`` 20, cache fields 0); ``stop_reason`` (optional; default
``tool_use`` when the turn has tool uses, else ``end_turn``); ``delay_s`` (optional: the server
waits that long before answering, like a slow model). Unknown fields are errors (typos must
not pass silently). ``default`` and ``repeat_last`` exclude each other.

Step selection is stateless, so a crashed and re-attempted act is served exactly as before:

- the **iteration** is N from the first line ``Iteration: N`` in the first user message (the
  engine puts that line in every act's variable prompt, for every backend);
- the **turn** is the number of assistant messages in the request (0 for the act's first call).

A review request (the eval-agent's, ``roles/eval_agent/review.py``) is one whose first user
message starts with a line ``Review of iteration: N``: it is answered with ``reviews[N - 1]`` (a
``null`` entry, or none, is ``ScriptExhausted`` too).

A request for an iteration or turn beyond the script raises ``ScriptExhausted``; the server
answers it with an HTTP error and logs it — loudly, never by inventing a step.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from state_db.kernel.errors import OrgError

ITERATION_LINE = re.compile(r"^\s*Iteration:\s*(\d+)\s*$", re.MULTILINE)
REVIEW_LINE = re.compile(r"\A\s*Review of iteration:\s*(\d{1,9})\s*$", re.MULTILINE)
USAGE_FIELDS = ("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
DEFAULT_USAGE = {"input_tokens": 100, "output_tokens": 20,
                 "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
STOP_REASONS = ("end_turn", "tool_use", "max_tokens", "stop_sequence", "refusal", "pause_turn",
                "model_context_window_exceeded")


class ScriptError(OrgError):
    """A bad script file or an unserviceable request. ``code``: ``script_unreadable``,
    ``script_syntax``, ``script_field``, ``bad_request``, ``script_exhausted``; ``field`` and
    ``line`` locate the problem in the file when known."""

    def __init__(self, code: str, message: str, *, field: str | None = None, line: int | None = None) -> None:
        where = "".join([f" at line {line}" if line else "", f" in {field}" if field else ""])
        super().__init__(f"{message}{where}", code=code)
        self.field, self.line_no = field, line


class ScriptExhausted(ScriptError):
    def __init__(self, message: str) -> None:
        super().__init__("script_exhausted", message)


@dataclass(frozen=True)
class ToolUse:
    name: str
    input: Any


@dataclass(frozen=True)
class Turn:
    text: str | None
    tool_uses: tuple[ToolUse, ...]
    usage: dict[str, int]
    stop_reason: str
    delay_s: float = 0.0          # the server waits this long before answering (a slow model)


@dataclass(frozen=True)
class Script:
    acts: tuple[tuple[Turn, ...], ...]
    default: tuple[Turn, ...] | None = None
    repeat_last: bool = False
    reviews: tuple[Turn | None, ...] = ()
    variants: tuple[tuple[str, "Script"], ...] = ()

    def for_request(self, body: Any) -> "Script":
        """The script serving ``body``: the first variant whose ``prompt_contains`` occurs in the
        request's text (``request_text``), else this one."""
        if self.variants:
            text = request_text(body)
            for needle, variant in self.variants:
                if needle in text:
                    return variant
        return self

    def review_for(self, iteration: int) -> Turn:
        """The answer to the review of ``iteration``. Errors: ``ScriptExhausted``."""
        turn = self.reviews[iteration - 1] if 1 <= iteration <= len(self.reviews) else None
        if turn is None:
            raise ScriptExhausted(f"the script has no review answer for iteration {iteration} "
                                  f"({len(self.reviews)} in 'reviews')")
        return turn

    def act_for(self, iteration: int) -> tuple[Turn, ...]:
        """Turns of the act serving ``iteration`` (1-based). Errors: ``ScriptExhausted``."""
        if iteration < 1:
            raise ScriptExhausted(f"iteration {iteration} is not a valid iteration number (they start at 1)")
        if iteration <= len(self.acts):
            return self.acts[iteration - 1]
        if self.default is not None:
            return self.default
        if self.repeat_last and self.acts:
            return self.acts[-1]
        raise ScriptExhausted(f"the script has {len(self.acts)} act(s) and no act for iteration {iteration}; "
                              "add acts, a 'default' act or 'repeat_last': true")

    def step(self, iteration: int, turn: int) -> Turn:
        """Turn ``turn`` (0-based) of the act for ``iteration``. Errors: ``ScriptExhausted``."""
        act = self.act_for(iteration)
        if turn >= len(act):
            raise ScriptExhausted(f"the act for iteration {iteration} has {len(act)} turn(s) but the request "
                                  f"asks for turn {turn + 1}; end the act's last turn with end_turn")
        return act[turn]


def load_script(path: Path) -> Script:
    """Read and parse a script file. Errors: ``ScriptError`` naming the line or field."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ScriptError("script_unreadable", f"cannot read script {path}: {exc}") from None
    return parse_script(text)


def parse_script(text: str) -> Script:
    """Parse script JSON text. Errors: ``ScriptError`` (``script_syntax`` with the line,
    ``script_field`` with the field path)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ScriptError("script_syntax", f"invalid JSON ({exc.msg}, column {exc.colno})", line=exc.lineno) from None
    except RecursionError:
        raise ScriptError("script_syntax", "the JSON is nested too deeply to be a script") from None
    _require(isinstance(data, dict), "the script must be a JSON object", "$")
    _known(data, {"version", "acts", "default", "repeat_last", "reviews", "when"}, "$")
    _require(data.get("version", 1) == 1, "unsupported script version (this server reads version 1)", "version")
    when = data.get("when", [])
    _require(isinstance(when, list), "'when' must be a list of variants", "when")
    variants = tuple(_variant(v, f"when[{i}]") for i, v in enumerate(when))
    return _script(data, "$", variants)


def _variant(value: Any, where: str) -> tuple[str, Script]:
    _require(isinstance(value, dict), "a variant must be an object", where)
    _known(value, {"prompt_contains", "acts", "default", "repeat_last", "reviews"}, where)
    needle = value.get("prompt_contains")
    _require(isinstance(needle, str) and bool(needle), "'prompt_contains' must be a non-empty string",
             f"{where}.prompt_contains")
    return needle, _script(value, where, ())


def _script(data: dict, where: str, variants: tuple) -> Script:
    at = (lambda name: name) if where == "$" else (lambda name: f"{where}.{name}")
    acts = data.get("acts") if where == "$" else data.get("acts", [])    # a variant may serve 'default' only
    _require(isinstance(acts, list), "'acts' must be a list of acts", at("acts"))
    default = data.get("default")
    repeat_last = data.get("repeat_last", False)
    _require(isinstance(repeat_last, bool), "'repeat_last' must be true or false", at("repeat_last"))
    _require(not (default is not None and repeat_last), "'default' and 'repeat_last' exclude each other",
             at("default"))
    reviews = data.get("reviews", [])
    _require(isinstance(reviews, list), "'reviews' must be a list of turns (or null)", at("reviews"))
    return Script(acts=tuple(_act(a, at(f"acts[{i}]")) for i, a in enumerate(acts)),
                  default=None if default is None else _act(default, at("default")), repeat_last=repeat_last,
                  reviews=tuple(None if r is None else _turn(r, at(f"reviews[{i}]")) for i, r in enumerate(reviews)),
                  variants=variants)


def review_of_request(body: Any) -> int | None:
    """The iteration a review request asks about (its first line ``Review of iteration: N``), or
    None for any other request."""
    match = REVIEW_LINE.search(first_user_text(body))
    return int(match.group(1)) if match else None


def step_of_request(body: Any) -> tuple[int, int]:
    """``(iteration, turn)`` a Messages API request body asks for (see the module docstring).
    Errors: ``ScriptError`` code ``bad_request``."""
    messages = body.get("messages") if isinstance(body, dict) else None
    if not isinstance(messages, list) or not messages or not isinstance(messages[0], dict):
        raise ScriptError("bad_request", "the request has no messages")
    match = ITERATION_LINE.search(first_user_text(body))
    if match is None:
        raise ScriptError("bad_request", "the first user message has no line 'Iteration: N'; the scripted "
                          "server picks its step from it")
    turn = sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "assistant")
    digits = match.group(1)
    if len(digits) > 9:
        raise ScriptError("bad_request", f"iteration number with {len(digits)} digits is not an iteration")
    return int(digits), turn


def request_text(body: Any) -> str:
    """All the text a request shows the model: its system prompt and every message's text."""
    if not isinstance(body, dict):
        return ""
    system = body.get("system")
    parts = [_text_of(system)]
    messages = body.get("messages")
    if isinstance(messages, list):
        parts.extend(_text_of(m.get("content")) for m in messages if isinstance(m, dict))
    return "\n".join(parts)


def first_user_text(body: Any) -> str:
    """The text of a request's first user message ('' when it has none)."""
    messages = body.get("messages") if isinstance(body, dict) else None
    if not isinstance(messages, list) or not messages or not isinstance(messages[0], dict):
        return ""
    return _text_of(messages[0].get("content"))


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(b["text"] for b in content
                         if isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str))
    return ""


def _act(value: Any, where: str) -> tuple[Turn, ...]:
    _require(isinstance(value, list) and value, "an act must be a non-empty list of turns", where)
    return tuple(_turn(t, f"{where}[{i}]") for i, t in enumerate(value))


def _turn(value: Any, where: str) -> Turn:
    _require(isinstance(value, dict), "a turn must be an object", where)
    _known(value, {"text", "tool_uses", "usage", "stop_reason", "delay_s"}, where)
    delay = value.get("delay_s", 0)
    _require(isinstance(delay, (int, float)) and not isinstance(delay, bool) and 0 <= delay <= 600,
             "'delay_s' must be a number of seconds from 0 to 600", f"{where}.delay_s")
    text = value.get("text")
    _require(text is None or isinstance(text, str), "'text' must be a string", f"{where}.text")
    raw_uses = value.get("tool_uses", [])
    _require(isinstance(raw_uses, list), "'tool_uses' must be a list", f"{where}.tool_uses")
    uses = tuple(_tool_use(u, f"{where}.tool_uses[{i}]") for i, u in enumerate(raw_uses))
    _require(bool(text) or bool(uses), "a turn needs 'text' or 'tool_uses'", where)
    stop = value.get("stop_reason", "tool_use" if uses else "end_turn")
    _require(stop in STOP_REASONS, f"'stop_reason' must be one of {', '.join(STOP_REASONS)}", f"{where}.stop_reason")
    return Turn(text=text, tool_uses=uses, usage=_usage(value.get("usage", {}), f"{where}.usage"), stop_reason=stop,
                delay_s=float(delay))


def _tool_use(value: Any, where: str) -> ToolUse:
    _require(isinstance(value, dict), "a tool use must be an object with 'name' and 'input'", where)
    _known(value, {"name", "input"}, where)
    _require(isinstance(value.get("name"), str) and value["name"], "'name' must be a non-empty string", f"{where}.name")
    _require("input" in value, "'input' is required (any JSON value)", f"{where}.input")
    return ToolUse(name=value["name"], input=value["input"])


def _usage(value: Any, where: str) -> dict[str, int]:
    _require(isinstance(value, dict), "'usage' must be an object", where)
    _known(value, set(USAGE_FIELDS), where)
    usage = dict(DEFAULT_USAGE)
    for name, n in value.items():
        _require(isinstance(n, int) and not isinstance(n, bool) and n >= 0,
                 "token counts must be non-negative integers", f"{where}.{name}")
        usage[name] = n
    return usage


def _known(value: dict, allowed: set[str], where: str) -> None:
    extra = sorted(set(value) - allowed)
    _require(not extra, f"unknown field(s) {extra}; allowed: {sorted(allowed)}", where)


def _require(ok: bool, message: str, field: str) -> None:
    if not ok:
        raise ScriptError("script_field", message, field=field)
