"""The caps a new run is held to: each flag sets the cap it names, ``--no-*`` removes one, and
every other cap keeps its default — ``[caps]`` in org.toml, else the built-in one.

One flag never drops the others: "only 4 iterations" must not remove the dollar budget. Removing
a cap is a flag of its own, recorded with the cap (``Caps.sources``) so that every view can say
where each cap came from; a run left with no hard cap at all is refused (``no_cap``).
"""
from __future__ import annotations

import math
from typing import Mapping

from state_db.kernel.config import Config
from state_db.kernel.errors import StateError
from state_db.queries.work import FLAG, Caps

# each cap and the flags that set and remove it (named in errors and in `org show`)
CAP_FLAGS = dict(zip(Caps.names(), ("--max-iterations", "--budget-tokens", "--budget-usd", "--timeout")))
NO_FLAGS = {k: "--no-" + flag[2:] for k, flag in CAP_FLAGS.items()}
WHOLE = frozenset({"max_iterations", "budget_tokens"})


class CapsError(StateError):
    """A cap given is not a usable one (``bad_caps``), or none is left (``no_cap``)."""

    code = "bad_caps"


def check_value(name: str, value) -> None:
    """Raise CapsError unless ``value`` is a positive finite number (whole for iterations and
    tokens): NaN or infinity would be a cap that never fires."""
    whole = name in WHOLE
    ok = isinstance(value, int) if whole else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok or not math.isfinite(value) or value <= 0:
        flag = CAP_FLAGS[name]
        raise CapsError(f"{flag} must be positive: a {'whole ' if whole else ''}number above 0 (got {value!r})",
                        hint=f"give a number above 0, leave {flag} out for the default, or remove the cap "
                             f"with {NO_FLAGS[name]}")


def given(values: Mapping[str, float | None], removed=()) -> Caps:
    """The caps a command's flags give (``values``: cap name -> value, None: not given;
    ``removed``: cap names), as the request's ``Caps``.

    Raises CapsError: an unknown cap, a bad value, or a cap both given and removed (``bad_caps``).
    """
    removed = set(removed)
    unknown = (set(values) | removed) - set(Caps.names())
    if unknown:
        raise CapsError(f"unknown caps {sorted(unknown)}", hint=f"caps are {', '.join(Caps.names())}")
    both = sorted(k for k in removed if values.get(k) is not None)
    if both:
        raise CapsError(f"{CAP_FLAGS[both[0]]} and {NO_FLAGS[both[0]]} were both given",
                        hint="give the cap a value or remove it, not both")
    for name, value in values.items():
        if value is not None:
            check_value(name, value)
    return Caps.given(values, removed)


def resolve(cfg: Config, request: Caps) -> Caps:
    """The caps of a new run: the caps ``request`` gives set theirs (sourced ``flag``), the
    ones it removes have none, the rest come from org.toml's ``[caps]`` or the defaults.

    Raises CapsError: a bad value (``bad_caps``) or no hard cap left (``no_cap``).
    """
    flags = given(request.encode(), request.removed())
    caps = flags.over(Caps.from_config(cfg.caps))
    if not caps:
        raise CapsError("every cap was removed: nothing would bound the run", code="no_cap",
                        hint="keep at least one of " + ", ".join(CAP_FLAGS.values()))
    return caps


def shown(caps: Caps) -> list[tuple[str, str, str]]:
    """``(name, value, source)`` for each cap, for people: a removed cap is ``none``; a source is
    ``flag`` (the flag named), ``org.toml``, ``default`` or ``''`` when not recorded."""
    out = []
    for name in Caps.names():
        value, source = getattr(caps, name), caps.source(name)
        if value is None and source is None:
            continue
        label = {FLAG: NO_FLAGS[name] if value is None else CAP_FLAGS[name]}.get(source, source or "")
        out.append((name, "none" if value is None else _num(value), label))
    return out


def line(caps: Caps) -> str:
    """One line for a run's caps with where each came from, e.g.
    ``max_iterations=4 (--max-iterations), budget_usd=5.0 (default), timeout_s=none (--no-timeout)``."""
    return ", ".join(f"{n}={v}" + (f" ({s})" if s else "") for n, v, s in shown(caps)) or "none"


def _num(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)
