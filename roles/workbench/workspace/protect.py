"""Protected paths: files present at the baseline that the doer may not change to pass.

The eval-agent verifies in a snapshot where these files are restored from the baseline and
reports changes to them, so editing a test to make it pass never reaches ``goal_met``.
Patterns are globs matched against the whole workspace-relative path (``/``-separated):
``*`` and ``?`` stay within one directory, ``**`` spans directories (``**/`` also matches
none), ``[abc]``/``[!abc]`` are classes and ``{a,b}`` alternatives.
"""
from __future__ import annotations

import functools
import re
from typing import Iterable, Sequence

# Files present at the baseline that match these are "protected": the eval-agent verifies with
# them restored from the baseline. Conservative on purpose: restoring a file the goal legitimately
# asks to change would make the goal unreachable.
DEFAULT_PROTECTED_PATTERNS: tuple[str, ...] = (
    "**/tests/**",
    "**/test/**",
    "**/__tests__/**",
    "**/test_*.py",
    "**/*_test.py",
    "**/conftest.py",
    "**/*_test.go",
    "**/*.test.{js,jsx,ts,tsx,mjs,cjs}",
    "**/*.spec.{js,jsx,ts,tsx,mjs,cjs}",
    "**/*_spec.rb",
    "**/*Test.java",
    "**/*Test.kt",
)


def _glob_regex(pattern: str) -> str:
    """Translate a path glob (``**`` spans directories, ``{a,b}`` alternatives) to a regex."""
    out, i, n = [], 0, len(pattern)
    while i < n:
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "{" and "}" in pattern[i:]:
            end = pattern.index("}", i)
            alts = pattern[i + 1 : end].split(",")
            out.append("(?:" + "|".join(re.escape(a) for a in alts) + ")")
            i = end + 1
        elif c == "[" and "]" in pattern[i + 1 :]:
            end = pattern.index("]", i + 1)
            body = pattern[i + 1 : end]
            if body.startswith("!"):
                body = "^" + body[1:]
            out.append("[" + body.replace("\\", "\\\\") + "]")
            i = end + 1
        else:
            out.append(re.escape(c))
            i += 1
    return "".join(out)


@functools.lru_cache(maxsize=256)
def _compiled(patterns: tuple[str, ...]) -> re.Pattern:
    """One regex for a set of globs, compiled once (the verifier asks every iteration)."""
    return re.compile("|".join(f"(?:{_glob_regex(p)})" for p in patterns))


def match_paths(paths: Iterable[str], patterns: Sequence[str]) -> list[str]:
    """Return the paths (workspace-relative, ``/``-separated) matching any glob, sorted."""
    if not patterns:
        return []
    rx = _compiled(tuple(patterns))
    return sorted(p for p in paths if rx.fullmatch(p))
