"""What comes next in a run, as a value: the loop engine advances from one step to the next.

``LoopEngine.advance(step)`` does what ``step`` names and returns the step after it, so a run
that pauses or parks is plain data: ``encode`` gives a JSON object the engine stores on the work
item (``work_items.next_step``), and a later engine — another process, after a restart — decodes
it and resumes from there.

- ``AwaitPreflight``: the eval-agent runs the verify commands on the baseline (verdict 0);
- ``ActAgain(n)``: the next attempt at iteration ``n``;
- ``AwaitVerdict(n)``: iteration ``n`` is committed; wait for the eval-agent's verdict;
- ``Reflect(n)``: the verdict of ``n`` is in; derive the lesson and the fingerprint;
- ``WrapUp(decision)``: a budget tripped; one bounded act writes the hand-off note, then the run
  ends with ``decision``;
- ``AwaitHuman(decisions)``: decisions wait for a human; approved actions run first;
- ``Parked(decisions)``: the run waits for a human and no loop-agent holds it;
- ``Paused(next)``: stopped at a safe boundary (suspend, shutdown); ``next`` is where it goes on;
- ``Ended(decision)``: the run ended with ``decision`` (a ``StopDecision``).

A step the engine derives carries what its move needs: ``view``, the ``RunView`` it was derived
from (the work item, its progress, the committed iterations and their verdicts, as
``state_db.queries`` read them), so ``advance`` acts on the step's own data — ``Reflect`` on the
verdict in its view, ``ActAgain`` on the iterations and progress in its view. The view is never
stored and never compared: a step decoded from the work item has none, and ``advance`` derives
it again from state.db first.

Every step is safe to take again: a stored step is never ahead of state.db (it is written with,
or after, the state it describes), and a step that finds the run moved on (a verdict already
written, an iteration already committed) derives the next one from state.db instead.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Mapping

import orjson

from roles.loop_agent.stop import RunProgress
from state_db.ending import StopDecision
from state_db.queries.verdicts import Verdict
from state_db.queries.work import WorkItem


@dataclass(frozen=True)
class RunView:
    """A run as state.db said when a step was derived (``progress.load``): the work item, its
    progress as the stop policy sees it, its committed iterations (rows, oldest first) and the
    eval-agent's verdict of each (by iteration)."""

    work: WorkItem
    progress: RunProgress
    iterations: tuple[dict, ...] = ()
    verdicts: Mapping[int, Verdict] = field(default_factory=dict)

    @property
    def last(self) -> dict | None:
        """The latest committed iteration's row (None: none yet)."""
        return self.iterations[-1] if self.iterations else None

    def iteration(self, n: int) -> dict:
        """The row of committed iteration ``n``. Raises KeyError when it is not in the view."""
        for row in reversed(self.iterations):
            if row["n"] == n:
                return row
        raise KeyError(n)


@dataclass(frozen=True)
class Step:
    kind: ClassVar[str]
    #: the run as derived for this step (None for a step decoded from storage): not stored, not compared
    view: RunView | None = field(default=None, compare=False, repr=False, kw_only=True)

    def encode(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind}
        for f in fields(self):
            if f.name == "view":
                continue
            value = getattr(self, f.name)
            out[f.name] = value.encode() if isinstance(value, (StopDecision, Step)) else \
                list(value) if isinstance(value, tuple) else value
        return out


@dataclass(frozen=True)
class AwaitPreflight(Step):
    kind = "preflight"


@dataclass(frozen=True)
class ActAgain(Step):
    kind = "act_again"
    n: int


@dataclass(frozen=True)
class AwaitVerdict(Step):
    kind = "await_verdict"
    n: int


@dataclass(frozen=True)
class Reflect(Step):
    kind = "reflect"
    n: int


@dataclass(frozen=True)
class WrapUp(Step):
    kind = "wrap_up"
    decision: StopDecision


@dataclass(frozen=True)
class AwaitHuman(Step):
    kind = "await_human"
    decisions: tuple[str, ...] = ()


@dataclass(frozen=True)
class Parked(Step):
    kind = "parked"
    decisions: tuple[str, ...] = ()


@dataclass(frozen=True)
class Paused(Step):
    kind = "paused"
    next: Step | None = None


@dataclass(frozen=True)
class Ended(Step):
    kind = "ended"
    decision: StopDecision


_KINDS: dict[str, type[Step]] = {c.kind: c for c in (AwaitPreflight, ActAgain, AwaitVerdict, Reflect, WrapUp,
                                                     AwaitHuman, Parked, Paused, Ended)}


def decode(data: dict[str, Any] | str | None) -> Step | None:
    """The step ``encode`` (or its JSON text) describes; None for None. Raises ValueError for a
    kind this code does not know."""
    if data is None:
        return None
    if isinstance(data, (str, bytes)):
        data = orjson.loads(data)
    kind = data.get("kind")
    cls = _KINDS.get(kind)
    if cls is None:
        raise ValueError(f"unknown next step {kind!r}; known: {sorted(_KINDS)}")
    args: dict[str, Any] = {}
    for f in fields(cls):
        if f.name == "view":
            continue
        value = data.get(f.name)
        if f.name == "decision":
            value = StopDecision.decode(value)
        elif f.name == "next":
            value = decode(value)
        elif f.name == "decisions":
            value = tuple(value or ())
        args[f.name] = value
    return cls(**args)


def dumps(step: Step | None) -> str | None:
    return None if step is None else orjson.dumps(step.encode()).decode()
