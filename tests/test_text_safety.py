"""Agent text is data: ``clean`` strips control sequences for storage and models, ``visible``
shows them as text for people (state_db/text.py)."""
from __future__ import annotations

import pytest

from state_db.text import clean, one_line, visible

HOSTILE = [
    "\x1b]52;c;ZWNobyBwd25lZA==\x07",          # OSC 52 clipboard write, BEL-terminated
    "\x1b]0;owned title\x1b\\",                  # window title, ST-terminated
    "\x1b[31mred\x1b[0m",                        # colour
    "\x1bP+q544e\x1b\\",                         # DCS request
    "\x9b2J",                                    # C1 CSI: clear screen
    "\x9d0;title\x9c",                           # C1 OSC
    "a\rb",                                      # carriage return overwrite
    "\u202eevil\u202c",                          # bidi override
    "\x1b",                                      # lone ESC
    "\x1b_apc payload",                          # unterminated APC
]


@pytest.mark.parametrize("text", HOSTILE)
def test_neither_form_lets_a_control_character_through(text):
    for out in (clean(text), visible(text), one_line(text)):
        assert not any(ord(c) < 0x20 and c not in "\n\t" for c in out), repr(out)
        assert not any(0x7f <= ord(c) <= 0x9f for c in out), repr(out)
        assert not any(c in "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069" for c in out)


def test_clean_keeps_the_words_and_drops_the_colour():
    assert clean("\x1b[1m\x1b[32m5 passed\x1b[0m in 0.1s\r\n") == "5 passed in 0.1s\n"
    assert clean("\x1b]0;t\x07ok") == "ok"
    assert clean(None) == ""


def test_visible_shows_what_would_have_run():
    shown = visible("\x1b]52;c;eA==\x07")
    assert shown.startswith("\u241b]52;")          # ␛ then the sequence as plain text
    assert "\u2407" in shown                        # ␇
    assert visible("line\n\tindent") == "line\n\tindent"
    assert "\n" not in one_line("a\nb")
