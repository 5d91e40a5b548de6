"""Shared output helpers for CLI commands: JSON or aligned text, home resolution, and the one
stream every command prints through.

Everything the org shows may hold text an agent wrote (a goal, a question, test output, a file
of the workspace). ``shown()`` puts ``Shown`` in front of ``sys.stdout`` and ``sys.stderr`` for the
whole command, so no renderer has to remember it: every character passes ``state_db.text.visible``
(controls other than newline and tab become visible stand-ins; an escape sequence prints as text
and does nothing), bytes written to ``.buffer`` included. Only the commands whose output is a
protocol or a screen of their own (``RAW_COMMANDS``) and ``--raw`` opt out.
"""
from __future__ import annotations

import codecs
import contextlib
import io
import sys
from typing import Any, Iterator

import orjson

from state_db.connection import connect
from state_db.kernel.home import OrgHome, resolve_home
from state_db.text import one_line, visible

# mcp speaks JSON-RPC on stdout; watch draws its own screen and neutralises each line itself;
# git-shell never reaches here (sshd's forced command is served before the parser is built)
RAW_COMMANDS = ("mcp", "watch", "git-shell")


class _ShownBytes(io.RawIOBase):
    """The ``.buffer`` side of ``Shown``: bytes decoded as UTF-8 (an invalid byte becomes U+FFFD,
    never a raw C1 control), made visible, written to the text side."""

    def __init__(self, text: "Shown"):
        self._text = text
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self._text.write(self._decoder.decode(bytes(data)))
        return len(data)

    def flush(self) -> None:
        self._text.flush()

    def finish(self) -> None:
        """What an incomplete UTF-8 sequence at the very end left behind, shown (as U+FFFD)."""
        self._text.write(self._decoder.decode(b"", final=True))


class Shown(io.TextIOBase):
    """A text stream that writes ``visible(text)`` to ``stream``; everything else is the stream's."""

    def __init__(self, stream):
        self._stream = stream
        self.buffer = _ShownBytes(self)

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self._stream.write(visible(text))
        return len(text)

    def flush(self) -> None:
        self._stream.flush()

    def isatty(self) -> bool:
        return self._stream.isatty()

    def fileno(self) -> int:
        return self._stream.fileno()

    @property
    def encoding(self):
        return getattr(self._stream, "encoding", "utf-8")


@contextlib.contextmanager
def shown(raw: bool = False) -> Iterator[None]:
    """For the duration of a command, ``sys.stdout`` and ``sys.stderr`` neutralise what they print
    (``raw``: they are left as they are). The streams are put back afterwards."""
    if raw:
        yield
        return
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = Shown(saved[0]), Shown(saved[1])
    try:
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.buffer.finish()
                stream.flush()
        sys.stdout, sys.stderr = saved


def home_of(args) -> OrgHome:
    return resolve_home(getattr(args, "home", None))


def read_conn(args):
    """A read-only connection to an existing state.db (never creates one)."""
    home = home_of(args).require()
    return connect(home.db_path, readonly=True)


def emit_json(value: Any) -> None:
    sys.stdout.write(orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS,
                                  default=str).decode() + "\n")


def table(rows: list[list[Any]], headers: list[str]) -> str:
    # one_line: a newline in a goal or a question would otherwise forge a row of its own
    cells = [headers] + [["" if c is None else one_line(str(c)) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells)


def add_json(parser) -> None:
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")


def print_unsent(wake: str, then: str, as_json: bool = False) -> None:
    """One line when a command's wake to the coordinator was not sent (stderr beside JSON)."""
    from roles.operations.wake import unsent_note

    note = unsent_note(wake, then)
    if note:
        print(f"  {note}", file=sys.stderr if as_json else sys.stdout)
