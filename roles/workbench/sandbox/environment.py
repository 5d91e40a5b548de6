"""The environment an agent command gets: an allow-list, never the org's own environment.

Only locale, terminal, time zone and PATH pass through; HOME and TMPDIR point at private places.
Org keys (``ORG_*``), API keys and anything else are absent unless the caller adds them on
purpose through ``extra`` (e.g. the command backend's placeholder key).
"""
from __future__ import annotations

import os
from typing import Mapping

PASSED = ("PATH", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "LC_MESSAGES", "TERM", "TZ")
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
SANDBOX_HOME = "/tmp/home"
# The package tools whose caches land in the private /tmp (under SANDBOX_HOME, by each tool's own
# default): what ``org doctor`` and the README name; tests/test_newcomer_truths.py asks each tool.
CACHES = ("pip", "npm", "uv")


def clean_env(extra: Mapping[str, str] | None = None, *, home: str = SANDBOX_HOME,
              environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The allow-listed variables of ``environ`` (default: this process), HOME=``home``,
    TMPDIR=/tmp, then ``extra`` on top (``extra`` may override PATH or HOME)."""
    source = os.environ if environ is None else environ
    env = {k: source[k] for k in PASSED if source.get(k)}
    env.setdefault("PATH", DEFAULT_PATH)
    env["HOME"] = home
    env["TMPDIR"] = "/tmp"
    env.update(extra or {})
    return env
