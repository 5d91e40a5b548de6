"""Waits that hold on a busy machine.

A test waits on observable state with a timeout; the timeout is a bound on how long the state may
take to appear, and on a host whose cores are shared (other test runs, other orgs, a build) that
takes longer, without anything being wrong. So every bound a test states is stretched by ``scale()``:
the host's load per core (``os.getloadavg()``'s last minute over the usable cores), never below 1
and at most ``MAX_SCALE``, or ``ORG_TEST_TIMEOUT_SCALE`` when that is larger (a CI runner known to
be slow). The figure is read when a wait starts, so a wait that starts while the load is high gets
the longer bound. Per-test ``pytest-timeout`` bounds are stretched the same way at collection
(tests/conftest.py). A wait that runs out still says what it saw last.
"""
from __future__ import annotations

import os

ENV = "ORG_TEST_TIMEOUT_SCALE"
MAX_SCALE = 6.0


def cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def scale() -> float:
    """How much longer than on an idle host a wait may take now (≥ 1)."""
    try:
        explicit = float(os.environ.get(ENV) or 1.0)
    except ValueError:
        explicit = 1.0
    try:
        load = os.getloadavg()[0] / cores()
    except OSError:
        load = 1.0
    return max(1.0, explicit, min(load, MAX_SCALE))


def scaled(seconds: float) -> float:
    """``seconds`` as a bound on the host as it is now."""
    return seconds * scale()
