"""Key presses from a terminal, every one of them, in the order they came.

A terminal in cbreak mode hands over bytes, not keys: ``jj`` typed fast, key repeat, a paste or
an ssh link catching up arrive in one read, and an arrow key is three bytes (``ESC [ B``) that
may even be split across two reads. Reading "one key per read" loses the rest of a burst, so
``KeyReader`` drains everything the terminal has, splits it into whole keys (``split``: CSI and
SS3 escape sequences, Alt+key, a UTF-8 character, any other single byte), and keeps an
incomplete sequence for the next read. A lone ESC is a key of its own once ``esc_wait_s`` passes
with nothing after it. Hand-written: curses would take over the screen rich draws on, and no
small library splits a raw byte stream into keys.
"""
from __future__ import annotations

import os
import select

ESC = 0x1B
_READ = 4096


def _utf8_length(lead: int) -> int:
    return 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4


def split(buf: bytes) -> tuple[list[bytes], bytes]:
    """``buf`` as whole keys, and the incomplete tail (the start of an escape sequence or of a
    UTF-8 character) left for more bytes."""
    keys: list[bytes] = []
    i, n = 0, len(buf)
    while i < n:
        b = buf[i]
        if b == ESC:
            if i + 1 >= n:
                break                              # maybe the start of a sequence
            nxt = buf[i + 1]
            if nxt == ord("["):                    # CSI: parameters and intermediates, then a final byte
                j = i + 2
                while j < n and 0x20 <= buf[j] <= 0x3F:
                    j += 1
                if j >= n:
                    break
                keys.append(buf[i:j + 1])
                i = j + 1
            elif nxt == ord("O"):                  # SS3: one more byte (F1-F4, arrows in application mode)
                if i + 2 >= n:
                    break
                keys.append(buf[i:i + 3])
                i += 3
            elif nxt == ESC:                       # ESC ESC: the first is a lone ESC
                keys.append(buf[i:i + 1])
                i += 1
            else:                                  # Alt+key
                keys.append(buf[i:i + 2])
                i += 2
        elif b >= 0xC0:
            size = _utf8_length(b)
            if i + size > n:
                break
            keys.append(buf[i:i + size])
            i += size
        else:
            keys.append(buf[i:i + 1])
            i += 1
    return keys, buf[i:]


class KeyReader:
    """Whole keys from the file descriptor ``fd`` (a terminal in cbreak or raw mode)."""

    def __init__(self, fd: int, *, esc_wait_s: float = 0.05) -> None:
        self.fd = fd
        self.esc_wait_s = esc_wait_s
        self._pending = b""

    def _drain(self) -> bool:
        """Read all the terminal has now; False at end of input."""
        while True:
            chunk = os.read(self.fd, _READ)
            if not chunk:
                return False
            self._pending += chunk
            if not select.select([self.fd], [], [], 0)[0]:
                return True

    def read(self, timeout: float) -> list[bytes]:
        """Wait up to ``timeout`` seconds for input, then return every whole key it holds, in
        order (an empty list when nothing came). An incomplete sequence waits ``esc_wait_s`` for
        its rest; what is still incomplete then is returned as typed (a lone ESC is the Esc key)."""
        if not select.select([self.fd], [], [], timeout)[0]:
            return []
        if not self._drain():
            keys, self._pending = ([self._pending] if self._pending else []), b""
            return keys
        keys, self._pending = split(self._pending)
        if self._pending and select.select([self.fd], [], [], self.esc_wait_s)[0] and self._drain():
            more, self._pending = split(self._pending)
            keys += more
        if self._pending:
            keys.append(self._pending)
            self._pending = b""
        return keys
