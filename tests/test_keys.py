"""Splitting a terminal's bytes into keys: a burst is every key in order, an escape sequence whole
even when it comes in two reads, a lone ESC is the Esc key."""
from __future__ import annotations

import os
import threading

import pytest

from scripts.cli.keys import KeyReader, split

pytestmark = pytest.mark.timeout(10)


def test_a_burst_splits_into_every_key_in_order():
    keys, rest = split(b"jjj\x1b[B\x1b[Ak\x1bOBq\x1b[6~\xc3\xa9\x1bx")
    assert keys == [b"j", b"j", b"j", b"\x1b[B", b"\x1b[A", b"k", b"\x1bOB", b"q", b"\x1b[6~", "é".encode(), b"\x1bx"]
    assert rest == b""


@pytest.mark.parametrize("tail", [b"\x1b", b"\x1b[", b"\x1b[1;5", b"\x1bO", b"\xe2\x82"])
def test_an_incomplete_sequence_waits_for_its_rest(tail):
    keys, rest = split(b"j" + tail)
    assert keys == [b"j"] and rest == tail


def test_the_reader_returns_a_whole_burst_and_joins_a_sequence_split_across_writes():
    r, w = os.pipe()
    try:
        reader = KeyReader(r, esc_wait_s=0.5)
        os.write(w, b"j" * 20)
        assert reader.read(1.0) == [b"j"] * 20
        os.write(w, b"k\x1b[")
        timer = threading.Timer(0.1, lambda: os.write(w, b"B"))
        timer.start()
        assert reader.read(1.0) == [b"k", b"\x1b[B"]
        timer.join()
        os.write(w, b"\x1b")                      # nothing follows: the Esc key
        assert reader.read(1.0) == [b"\x1b"]
        assert reader.read(0.05) == []
    finally:
        os.close(r)
        os.close(w)
