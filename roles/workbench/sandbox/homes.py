"""Finding org homes inside a folder, registered or not: every home is hidden from every sandbox.

The registry (``state_db.kernel.home.known_homes``) lists the homes this user's orgs made; a home made
by another user, with another ``XDG_STATE_HOME``, or copied into place, is not in it. So a home
also carries a marker (``state_db.kernel.home.HOME_MARKER``), and a folder holding ``state.db`` beside
``org.toml`` counts as one too (homes made before the marker existed). ``homes_within`` walks a
folder for them — a workspace, before it is accepted (``org submit`` refuses one that contains a
home) and before each sandbox shows it writable, and each folder org.toml shows (the view hides
what it finds). The toolchains' and system folders are not walked (too large to walk for every
command): there the registered homes are hidden.

The walk never follows a link (a link to a home elsewhere is shown as a dangling link: what it
names is not mounted) and stops after ``max_entries`` entries, saying so: past that bound the
registered homes are still hidden, and submit has already refused a workspace it could not clear.
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

import structlog

from state_db.kernel.home import HOME_MARKER

log = structlog.get_logger("sandbox.homes")

MAX_ENTRIES = 200_000          # for submit's walk
SHOWN_MAX_ENTRIES = 50_000     # for each sandbox's view: a repository with its virtual environment is ~20,000
FRESH_S = 60.0                 # a walk of such a folder costs ~0.25 s: once a minute per process


@dataclass(frozen=True)
class Found:
    """The org homes found below a folder (real paths) and whether the walk saw everything."""

    homes: tuple[str, ...]
    complete: bool


def is_home(names) -> bool:
    """Whether a folder whose entries are ``names`` is an org home."""
    return HOME_MARKER in names or ("state.db" in names and "org.toml" in names)


def homes_within(folder: str | os.PathLike, *, max_entries: int = MAX_ENTRIES) -> Found:
    """Every org home at or below ``folder`` (see the module docstring); a home's own contents
    are not walked."""
    top = os.path.realpath(folder)
    found, stack, seen = [], [top], 0
    while stack:
        path = stack.pop()
        try:
            with os.scandir(path) as it:
                entries = list(it)
        except OSError:
            continue
        seen += len(entries)
        if is_home({e.name for e in entries}):
            found.append(path)
            continue
        for e in entries:
            try:
                if e.is_dir(follow_symlinks=False):
                    stack.append(e.path)
            except OSError:
                continue
        if seen > max_entries:
            return Found(tuple(sorted(found)), False)
    return Found(tuple(sorted(found)), True)


_CACHE: dict[str, tuple[float, Found]] = {}
_LOCK = threading.Lock()


def homes_in(folder: str | os.PathLike) -> tuple[str, ...]:
    """``homes_within(folder)``, kept for ``FRESH_S`` seconds: each sandboxed command asks (for its
    workspace and the folders org.toml shows), and a home appearing there is a person's act
    between commands, not the doer's (a marker the doer writes only hides its own folder)."""
    key = os.path.realpath(folder)
    now = time.monotonic()
    with _LOCK:
        got = _CACHE.get(key)
    if got is not None and now < got[0]:
        return got[1].homes
    found = homes_within(key, max_entries=SHOWN_MAX_ENTRIES)
    new = [h for h in found.homes if h != key and (got is None or h not in got[1].homes)]
    if new:                                  # the user is told, once per home and process
        log.warning("org_home_in_sandbox_reach", folder=key, homes=new,
                    next="hidden from every sandboxed command; move it out of the folder")
    with _LOCK:
        _CACHE[key] = (now + FRESH_S, found)
        if len(_CACHE) > 256:
            _CACHE.pop(next(iter(_CACHE)))
    return found.homes
