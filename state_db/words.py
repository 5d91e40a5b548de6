"""Counts in words people read: ``1 iteration``, ``2 iterations``, ``0 iterations``.

One helper, so no message built from a count says "1 iterations"; the plural is the noun plus
``s`` unless given.
"""
from __future__ import annotations


def counted(n: int | float, noun: str, plural: str | None = None) -> str:
    """``n`` and ``noun`` in agreement: ``counted(1, "iteration")`` → ``1 iteration``."""
    return f"{n} {noun if n == 1 else (plural or noun + 's')}"
