"""A run's transcript as lines of text, for ``org show --transcript`` and ``org watch``'s pane.

Everything in a transcript was written by the model, a tool or a test run: it is shown through
``state_db.text.visible`` (no control sequence reaches the terminal). ``full`` shows every
output whole as stored (each is bounded when recorded); otherwise outputs are cut to a few lines
for a pane.
"""
from __future__ import annotations

import orjson

from state_db.text import one_line, visible

_SHORT_LINES = 6


def _json(value) -> str:
    return orjson.dumps(value, default=str).decode()


def _block(text: str, indent: str, full: bool) -> list[str]:
    rows = visible(text).splitlines() or [""]
    if not full and len(rows) > _SHORT_LINES:
        rows = rows[:2] + [f"… {len(rows) - _SHORT_LINES + 2} more lines …"] + rows[-(_SHORT_LINES - 3):]
    return [indent + r for r in rows]


def attempt_title(a: dict) -> str:
    """``iteration 2 · attempt 3 (discarded: interrupted)``."""
    state = ("wrap-up" if a["wrapup"] else f"discarded: {a['outcome']}" if a["discarded"]
             else "acting" if a["outcome"] is None else a["outcome"])
    return f"iteration {a['iteration']} · attempt {a['attempt']} ({one_line(state)})"


def entry_lines(e: dict, full: bool = True) -> list[str]:
    """One transcript entry as lines."""
    d, kind = e["data"], e["kind"]
    if kind == "prompt":
        head = "wrap-up prompt" if d.get("wrapup") else "prompt"
        text = str(d.get("text", ""))
        return [f"{head} ({len(text)} chars):", *_block(text, "  ", full)] if full else [f"{head}: {len(text)} chars"]
    if kind == "turn":
        counts = " ".join(f"{label} {d[k]}" for label, k in (("in", "input_tokens"), ("out", "output_tokens"),
                                                          ("cache-w", "cache_write_tokens"),
                                                          ("cache-r", "cache_read_tokens")) if k in d)
        return [f"turn {d.get('turn', '?')}: {one_line(str(d.get('model') or '?'))}"
                + (f"  {counts}" if counts else "") + (f"  stop {one_line(str(d['stop_reason']))}"
                                                       if d.get("stop_reason") else "")]
    if kind == "text":
        return ["  model:", *_block(str(d.get("text", "")), "    ", full)]
    if kind == "tool_call":
        return [f"  → {one_line(str(d.get('name')))} {one_line(_json(d.get('input')))}"]
    if kind == "tool_result":
        state = "ok" if d.get("ok", True) else f"error{(' ' + str(d['code'])) if d.get('code') else ''}"
        return [f"  ← {one_line(str(d.get('name') or ''))} {one_line(state)}:",
                *_block(str(d.get("output", "")), "    ", full)]
    if kind == "outcome":
        tail = f" — {d.get('error_code')}: {d.get('error')}" if d.get("error_code") else ""
        return [f"act {one_line(str(d.get('status')))} after {d.get('turns', 0)} turn(s){one_line(tail)}"]
    if kind == "cut":
        return [f"(transcript cut: {one_line(str(d.get('note', '')))})"]
    return [f"{one_line(kind)}: {one_line(_json(d))}"]


def verdict_lines(v: dict | None, full: bool = True) -> list[str]:
    """The verdict of a committed iteration with the failing checks' output."""
    if v is None:
        return ["verdict: pending"]
    lines = [f"verdict: {v['outcome']}"]
    for f in v["failing"]:
        why = f"could not run ({f['code']})" if f.get("code") else ("timed out" if f["timed_out"]
                                                                     else f"exit {f['exit_code']}")
        lines.append(f"  failing: {one_line(str(f['command'] or f['name']))} — {why}")
        lines += _block(f["output"], "    ", full)
    return lines


def lines(attempts: list[dict], full: bool = True) -> list[str]:
    """The whole transcript: each attempt's title, entries, usage total, verdict, lesson, decisions."""
    out: list[str] = []
    for a in attempts:
        out.append(f"── {attempt_title(a)} " + "─" * 8)
        for e in a["entries"]:
            out += entry_lines(e, full)
        if not a["entries"]:
            out.append("(no transcript recorded for this attempt)")
        if a["usage"]:
            tokens = sum(u["input_tokens"] + u["output_tokens"] + u["cache_write_tokens"] for u in a["usage"])
            out.append(f"usage: {len(a['usage'])} model call(s), {tokens} budget tokens, "
                       f"${sum(u['cost_usd'] for u in a['usage']):.4f}")
        if "verdict" in a:
            out += verdict_lines(a["verdict"], full)
            if a.get("lesson"):
                out.append(f"lesson: {one_line(a['lesson'])}")
            for d in a.get("decisions", []):
                out.append(f"decision {d['id']} ({d['kind']}, {d['status']}): {one_line(d['command'] or d['question'])}")
        out.append("")
    return out
