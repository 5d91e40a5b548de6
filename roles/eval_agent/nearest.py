"""The nearest existing program to one a verify command names but that does not exist, for the
hint of a ``verify_unrunnable`` ending (``.venv/bin/pytest`` for ``.venv/bin/pytset``).

A path is walked part by part from the workspace (or ``/``): a part that exists is kept, one that
does not is replaced by the closest entry of its folder (``difflib``'s ratio); a bare name is
matched against the executables on ``PATH``. Only names made of letters, digits and ``._+-`` are
offered: the folder may hold names the doer wrote, and the hint reaches a terminal.
"""
from __future__ import annotations

import difflib
import os
import re
import shlex
from pathlib import Path

_SAFE = re.compile(r"[A-Za-z0-9._+-]+")
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
_CUTOFF = 0.6              # difflib's own default: "bni" is near "bin"
_MAX_ENTRIES = 5000        # a folder bigger than this is not searched


def program_of(command: str) -> str | None:
    """The program ``command`` runs: its first word after ``NAME=value`` assignments (None: none)."""
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    for word in words:
        if not _ASSIGNMENT.match(word):
            return word
    return None


def _entries(folder: Path, *, executables: bool) -> list[str]:
    try:
        with os.scandir(folder) as it:
            names = []
            for n, entry in enumerate(it):
                if n >= _MAX_ENTRIES:
                    return []
                if not _SAFE.fullmatch(entry.name):
                    continue
                if executables and not (entry.is_file() and os.access(entry.path, os.X_OK)):
                    continue
                names.append(entry.name)
            return names
    except OSError:
        return []


def _closest(name: str, names: list[str]) -> str | None:
    found = difflib.get_close_matches(name, names, n=1, cutoff=_CUTOFF)
    return found[0] if found else None


def nearest(program: str, workspace: Path, path: str | None = None) -> str | None:
    """The existing executable nearest to ``program`` (None: it exists, or nothing is near).

    Args:
        program: as the command names it (relative to ``workspace``, absolute, or a bare name).
        workspace: the folder the command runs in.
        path: the ``PATH`` a bare name is looked up on (default the process's own).
    Returns: the suggestion, written as the command would name it.
    """
    if "/" not in program:
        dirs = [Path(d) for d in (path if path is not None else os.environ.get("PATH", "")).split(os.pathsep) if d]
        if any((d / program).is_file() and os.access(d / program, os.X_OK) for d in dirs):
            return None
        return _closest(program, sorted({n for d in dirs for n in _entries(d, executables=True)}))
    absolute = program.startswith("/")
    here = Path("/") if absolute else workspace
    parts = [p for p in program.split("/") if p not in ("", ".")]
    fixed, changed = [], False
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if part == ".." or (here / part).exists():
            chosen = part
        else:
            chosen = _closest(part, _entries(here, executables=last))
            if chosen is None:
                return None
            changed = True
        fixed.append(chosen)
        here = here / chosen
    if not changed or not (here.is_file() and os.access(here, os.X_OK)):
        return None
    lead = "/" if absolute else ("./" if program.startswith("./") else "")
    return lead + "/".join(fixed)
