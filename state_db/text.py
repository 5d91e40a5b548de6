"""Agent-written text made safe: one place that strips terminal control sequences before text is
stored or sent to a model, and one that makes them visible before text is shown to a person.

Everything a doer, a test runner or a model wrote is data. Two uses, two functions:

- ``clean(text)`` — for what is *stored* (feedback, lessons, notes, knowledge) or *sent to a
  model*: escape sequences (CSI, OSC, DCS, SOS/PM/APC, and the two-byte ESC forms) are removed
  whole, line endings become ``\\n``, and every other control character except ``\\n`` and
  ``\\t`` is dropped. Colour codes from a project that forces colour vanish; the words stay.
- ``visible(text)`` — for what is *shown* (a terminal, ``org watch``, logs rendered for a human,
  notifications, webhooks): nothing reaches the output as a control. Every C0 and C1 control other
  than ``\\n`` and ``\\t``, DEL, and the Unicode bidirectional overrides are replaced by a visible
  stand-in, so an OSC 52 clipboard write or a title change shows as text and does nothing.

Built as an allow-list of what passes (printable text, newline, tab), not a list of known bad
sequences: a sequence no terminal documents yet is neutralised all the same.
"""
from __future__ import annotations

import re

# ESC followed by: CSI (ESC [ ... final byte), OSC/DCS/SOS/PM/APC (ESC ] P X ^ _ ... ended by BEL
# or ST, or unterminated to the end), or one two-byte form (ESC + one byte in 0x20-0x7e). The C1
# single-byte introducers (0x9b CSI, 0x9d OSC, 0x90 DCS, 0x98 SOS, 0x9e PM, 0x9f APC) likewise.
_SEQUENCE = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]?"                         # CSI ... final
    r"|(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])"                  # string introducers
    r"(?:[^\x07\x1b\x9c]*)(?:\x07|\x1b\\|\x9c)?"                 # ... BEL | ST | end of text
    r"|\x1b[ -~]?",                                              # two-byte forms, lone ESC
    re.S)
# What may never be shown or stored as-is: C0 but \t and \n, DEL, C1, and the bidi overrides.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def clean(text: str | None) -> str:
    """``text`` without terminal control sequences or control characters (``\\n`` and ``\\t``
    kept; ``\\r\\n`` and a lone ``\\r`` become ``\\n``). For what is stored or sent to a model.
    ``None`` gives ``""``."""
    if not text:
        return ""
    text = _SEQUENCE.sub("", text)
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return _CONTROL.sub("", text)


def _stand_in(match: re.Match) -> str:
    char = match.group(0)
    code = ord(char)
    if code < 0x20:
        return chr(0x2400 + code)            # U+2400.. CONTROL PICTURES: ␛ for ESC, ␇ for BEL
    if code == 0x7f:
        return "\u2421"                      # ␡
    return f"<U+{code:04X}>"                 # C1 and the bidi overrides have no picture


def visible(text: str | None) -> str:
    """``text`` with every control character other than ``\\n`` and ``\\t`` replaced by a visible
    stand-in (``␛]52;c;…␇`` instead of a clipboard write). For what is shown to a person; the
    text's length can grow, never its effect. ``None`` gives ``""``."""
    if not text:
        return ""
    return _CONTROL.sub(_stand_in, text)


def one_line(text: str | None) -> str:
    """``visible(text)`` on one line: newlines and tabs shown as ``⏎`` and ``⇥`` — for a column
    of a table or a notification title, where a newline from agent text would forge a new row."""
    return visible(text).replace("\n", "\u23ce").replace("\t", "\u21e5")


_WHITESPACE_RUN = re.compile(r"[ \t]{4,}")
LONG_COMMAND = 200


def command_shown(command: str | None) -> str:
    """A command as a person approving it must see it: whole (never cut), every control character
    visible (``visible``), each run of four or more spaces or tabs written as ``⟨N spaces⟩`` (1,200
    spaces cannot push a ``; curl … | sh`` out of sight), each newline shown as ``⏎`` and kept,
    and a warning first when it is long. ``None`` gives ``""``."""
    if not command:
        return ""

    def run(m: re.Match) -> str:
        text = m.group(0)
        tabs = text.count("\t")
        parts = [f"{len(text) - tabs} spaces"] if len(text) > tabs else []
        return "\u27e8" + " and ".join([*parts, *([f"{tabs} tabs"] if tabs else [])]) + "\u27e9"

    shown = _WHITESPACE_RUN.sub(run, visible(command)).replace("\t", "\u21e5").replace("\n", "\u23ce\n")
    if len(command) > LONG_COMMAND:
        shown = f"[a long command: {len(command)} characters, shown whole — read all of it]\n{shown}"
    return shown
