"""Honest exits for an agent CLI (the ``command`` backend): a tool it calls through its shell.

The anthropic backend offers the model ``declare_impossible`` and ``request_action`` as tools; an
agent CLI brings its own tools, so it gets one more command on its PATH instead:
``loop-org-exit impossible "why"`` (the goal cannot be met as stated) and ``loop-org-exit
needs_human "question"`` (it needs a human's answer to go on). The command appends a line to a
file in the CLI's private folder; after the act the backend reads it and turns each line into
what the anthropic backend's tools record — a ``declare_impossible`` call, which the eval-agent
reviews, or a ``needs_human`` request, which becomes a decision for a human — so everything after
the act is the same whichever backend ran it.

The file is written by code the doer controls: it is read without following links, as a regular
file only, never blocking, bounded in size, each line's kind from the allow-list and its text
bounded; anything else is ignored. It is removed after each act, and the command is written anew
before each one (the CLI may have changed it: it is only ever its own tool).
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

from state_db.text import clean

TOOL = "loop-org-exit"
KINDS = ("impossible", "needs_human")
MAX_BYTES = 16_384
MAX_TEXT = 2000
ENV = "LOOP_ORG_EXITS"

SCRIPT = f"""#!/bin/sh
# {TOOL} impossible "why" | needs_human "question": tell loop-org, then end your turn.
case "$1" in impossible|needs_human) ;; *) echo "usage: {TOOL} impossible|needs_human TEXT" >&2; exit 2;; esac
[ -n "$2" ] || {{ echo "{TOOL}: say why (or what you ask)" >&2; exit 2; }}
printf '%s\\t%s\\n' "$1" "$(printf '%s' "$2" | tr '\\n\\t' '  ')" >> "${ENV}" || exit 1
echo "recorded: {TOOL} $1. End your turn now; it is answered after this iteration."
"""

INSTRUCTIONS = (f"\n\nIf the goal cannot be met as stated, run `{TOOL} impossible \"why\"` and end your turn: "
                f"the eval-agent reviews the claim and a human decides. If you need a human's answer to go on, "
                f"run `{TOOL} needs_human \"your question\"` and end your turn.")


def prepare(private: Path) -> tuple[Path, Path]:
    """Write the command into ``private`` (the CLI's own folder, bound writable into the sandbox)
    and clear the previous act's file. Returns (the folder to put on PATH, the exits file)."""
    folder = private / ".loop-org"
    bin_dir = folder / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / TOOL
    script.unlink(missing_ok=True)
    script.write_text(SCRIPT)
    script.chmod(0o755)
    exits = folder / "exits"
    exits.unlink(missing_ok=True)
    return bin_dir, exits


def read(exits: Path) -> list[tuple[str, str]]:
    """The exits the CLI recorded, ``(kind, text)`` in order (each kind once: its last text), then
    the file is removed. Never raises for what the file holds or is."""
    try:
        raw = read_bounded(exits)
    finally:
        try:
            exits.unlink()
        except OSError:
            pass
    found: dict[str, str] = {}
    for line in raw.decode("utf-8", "replace").splitlines():
        kind, _, text = line.partition("\t")
        text = clean(text).strip()[:MAX_TEXT]
        if kind in KINDS and text:
            found.pop(kind, None)
            found[kind] = text
    return list(found.items())


def read_bounded(path: Path, limit: int = MAX_BYTES, *, tail: bool = False) -> bytes:
    """The first (``tail``: the last) ``limit`` bytes of ``path`` if it is a regular file, not
    followed through a link, never blocking; b"" otherwise. For files a sandboxed process wrote."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return b""
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return b""
        if tail and st.st_size > limit:
            os.lseek(fd, st.st_size - limit, os.SEEK_SET)
        return os.read(fd, limit)
    except OSError:
        return b""
    finally:
        os.close(fd)


def recorded(said: list[tuple[str, str]]) -> tuple[tuple[dict, ...], tuple[dict, ...]]:
    """What ``said`` adds to an act's outcome: ``(tool calls, requests)`` as the anthropic
    backend's ``declare_impossible`` and a ``needs_human`` request record them."""
    calls, requests = [], []
    for kind, text in said:
        if kind == "impossible":
            calls.append({"name": "declare_impossible", "input": {"reason": text}, "ok": True, "code": None,
                          "result": "recorded for the eval-agent's review"})
        else:
            requests.append({"kind": "needs_human", "command": "", "reason": text})
    return tuple(calls), tuple(requests)
