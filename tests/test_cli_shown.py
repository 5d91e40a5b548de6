"""The one stream every ``org`` command prints through: text and bytes alike reach the terminal
with their controls shown, never obeyed; the streams are put back after the command."""
from __future__ import annotations

import io
import sys

from scripts.cli.output import shown, table


def _captured(body) -> str:
    raw = io.BytesIO()
    out = io.TextIOWrapper(raw, encoding="utf-8", write_through=True)
    saved = sys.stdout
    sys.stdout = out
    try:
        with shown():
            body()
        assert sys.stdout is out
    finally:
        sys.stdout = saved
    return raw.getvalue().decode()


def test_text_and_bytes_are_shown_with_visible_controls():
    got = _captured(lambda: (print("a\x1b]52;c;eA==\x07b\u202e"), sys.stdout.buffer.write(b"\x1b[2J\xc2\x9b6n\xff\n")))
    assert got == "a␛]52;c;eA==␇b<U+202E>\n␛[2J<U+009B>6n\ufffd\n"


def test_raw_leaves_the_bytes_as_they_are():
    raw = io.BytesIO()
    out = io.TextIOWrapper(raw, encoding="utf-8", write_through=True)
    saved, sys.stdout = sys.stdout, out
    try:
        with shown(raw=True):
            sys.stdout.buffer.write(b"\x1b]52;c;eA==\x07")
    finally:
        sys.stdout = saved
    assert raw.getvalue() == b"\x1b]52;c;eA==\x07"


def test_a_table_cell_with_a_newline_stays_in_its_row():
    lines = table([["w1", "goal\nw2  forged row"]], ["ID", "GOAL"]).splitlines()
    assert len(lines) == 2 and "⏎" in lines[1]
