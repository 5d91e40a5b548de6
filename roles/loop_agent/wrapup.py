"""The wrap-up: when a token, cost or time budget trips, the run gets one bounded act that writes
a hand-off note — what was done, what remains, what was learned — before it ends.

Bounded three ways. Its slice is reserved (``[loop] wrapup_reserve`` of each budget, kept back
from the iterations by the stop policy), and the act may spend what is left of each budget up to
that slice (``StopPolicy.wrapup_allowance``): its requests are bounded by it like any act's, and
its prompt is cut to fit it, estimating a token as three characters (English runs nearer four), so
its input cannot eat the slice either. It runs with the tools that read only (``tools.read_only``),
at most ``MAX_TURNS`` model turns, and the workspace is reset to the run's last settled state after
it whatever it did. And it runs once per ending: its attempt is committed before the model is
called, so an act cut by a crash is not bought again — the note then comes from the record.

A backend whose agent brings its own tools (the ``command`` backend's CLI) cannot be held to the
reading tools or to the slice inside its session: it gets no wrap-up act.

``hand_off`` makes the act with the run's ``Acting`` (its writer, history and transcript) and returns
the decision and the hand-off row the engine ends the run with.

The note's three parts are always derived from the record too (iteration summaries and changed
paths; the latest verdict's failing checks; the lessons), so a wrap-up the model could not do (no
slice left, a model error, an unparsable answer) still leaves a useful note. The stop reason stays
the budget's.
"""
from __future__ import annotations

import re
import time
from dataclasses import replace

from roles.base import telemetry
from roles.loop_agent import progress as prog
from roles.loop_agent.acting import INTERRUPTED, Acting, feedback, input_of, outcome_entry
from roles.loop_agent.backends.base import ActContext, Remaining, Usage
from roles.loop_agent.conditions import MIN_WRAPUP_SECONDS, MIN_WRAPUP_TOKENS
from roles.loop_agent.context import IterationDigest
from roles.loop_agent.lessons import LessonBook
from roles.loop_agent.steps import RunView
from roles.loop_agent.stop import RunProgress
from roles.loop_agent.tools import read_only
from state_db.ending import StopDecision
from state_db.queries import loop as loopq, work as work_q
from state_db.queries.usage import of_doer
from state_db.vocab import ActStatus, AttemptOutcome, StopReason, TranscriptKind

# Backends whose agent brings its own tools (an agent CLI): a wrap-up cannot be held to the reading
# tools there, nor within its slice inside the CLI's session, so their hand-off note is the record's.
OWN_TOOLS = frozenset({"command"})

MAX_TURNS = 2
CHARS_PER_TOKEN = 3           # a conservative estimate: it overstates tokens, so the cut is safe
ANSWER_TOKENS = 200           # room kept in the slice for the note itself
_PARTS = ("done", "remains", "learned")
_HEADING = re.compile(r"^\s*(?:#+\s*|\*\*)?(done|what was done|remains|what remains|learned|what was learned)"
                      r"\s*(?:\*\*)?\s*:?\s*(?:\*\*)?\s*", re.IGNORECASE | re.MULTILINE)

INSTRUCTIONS = """You are a loop-agent of loop-org. The run you worked on has reached its budget and
ends now; nothing more will be changed. Write its hand-off note for the human or agent who takes it
up: three short sections headed exactly "Done:", "Remains:" and "Learned:" — what was done, what
remains to reach the goal (which checks still fail, and why), and what was learned that the next
attempt should know. You may read files; you cannot change anything. Be specific and brief.
"""


def record_parts(digests: list[IterationDigest], feedback: str, lessons: LessonBook) -> dict[str, str]:
    """The three parts as the record states them (no model involved)."""
    done = " ".join(f"Iteration {d.iteration}: {_clip(d.summary, 200)} (changed "
                    f"{', '.join(d.changed_paths[:4]) or 'nothing'}; {d.outcome or 'not verified'})."
                    for d in digests[-5:]) or "No iteration was committed."
    remains = _clip(feedback, 800) if feedback.strip() else "No verdict says what remains."
    learned = " ".join(f"{x.text}" for x in lessons.lessons) or "No lesson was recorded."
    return {"done": done, "remains": remains, "learned": learned}


def prompt(goal: str, iteration_no: int, decision: StopDecision, parts: dict[str, str], tokens_left: float | None) -> str:
    """The wrap-up act's first message, cut to fit ``tokens_left`` (None: no token budget).
    It starts with ``Iteration: N`` (the next iteration's number) like every act's prompt."""
    head = f"Iteration: {iteration_no}\nWrap-up: the run stops ({decision.reason}: {decision.detail}).\n"
    body = (f"\nGoal:\n{goal}\n\nFrom the record —\nDone: {parts['done']}\nRemains: {parts['remains']}\n"
            f"Learned: {parts['learned']}\n\nWrite the hand-off note now (Done: / Remains: / Learned:).")
    if tokens_left is None:
        return head + body
    room = int((tokens_left - ANSWER_TOKENS) * CHARS_PER_TOKEN) - len(head)
    return head + (body if len(body) <= room else body[:max(0, room)])


def fits(tokens_left: float | None) -> bool:
    """Whether a slice of ``tokens_left`` tokens leaves room for a prompt and a note."""
    return tokens_left is None or tokens_left >= MIN_WRAPUP_TOKENS


def parse(text: str) -> dict[str, str]:
    """The note's sections (``done``, ``remains``, ``learned``) as the model headed them; the
    ones it left out are missing."""
    marks = list(_HEADING.finditer(text))
    out: dict[str, str] = {}
    for i, m in enumerate(marks):
        name = m.group(1).lower().split()[-1]
        part = text[m.end(): marks[i + 1].start() if i + 1 < len(marks) else len(text)].strip()
        if name in _PARTS and part and name not in out:
            out[name] = _clip(part, 2000)
    return out


def _clip(text: str, cap: int) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= cap else text[: cap - 1] + "…"


def hand_off(acting: Acting, view: RunView, decision: StopDecision, backend, policy) -> tuple[StopDecision, dict]:
    """A budget tripped: one bounded act (with ``backend``, within what ``policy`` keeps
    back) writes the hand-off note (``wrapup``). Returns the decision the run ends with (its
    detail says what was used, the wrap-up included) and the hand-off row, for the engine's
    ``end_run`` transaction."""
    work, progress, its, verdicts = view.work, view.progress, view.iterations, view.verdicts
    conn = acting.w.conn
    continued, since = loopq.endings(conn, acting.work_id)
    parts = record_parts(prog.digests(its, verdicts, acting.reflected), feedback(conn, acting.work_id, its, verdicts),
                         prog.lessons(its, acting.settings.lessons_max, acting.reflected))
    allowance = policy.wrapup_allowance(progress)
    attempt, note, elapsed = loopq.wrapup_attempt(conn, acting.work_id, since), "", 0.0
    why_not = ("a wrap-up act was begun before and cut; it is not bought twice" if attempt is not None
               else "the command backend's CLI brings its own tools, which cannot be held to the slice"
               if backend.name in OWN_TOOLS else _why_not(allowance, progress))
    if why_not is None:
        attempt, note, elapsed = _act(acting, view, decision, parts, allowance, backend)
    said = parse(note)
    tokens, cost = loopq.attempt_usage(conn, acting.work_id, attempt) if attempt else (0, 0.0)
    act = (f"not made: {why_not}" if why_not is not None
           else f"ran (attempt {attempt}) and wrote the note" if said
           else f"ran (attempt {attempt}) but its answer held no Done/Remains/Learned note")
    handoff = {"work_id": acting.work_id, "ending": continued + 1, **parts, **said, "note": note[:4000],
               "source": "wrapup" if said else "record", "allowance": allowance, "attempt": attempt,
               "tokens": tokens, "cost_usd": cost, "elapsed_s": round(elapsed, 4), "act": act,
               "written_by": acting.w.instance, "at": time.time()}
    acting.log.info("handed_off", source=handoff["source"], tokens=tokens, allowance=allowance, act=act,
                    next=f"the run ends {decision.reason}")
    if why_not is None:
        # the detail says what was really used, the wrap-up included
        total = of_doer(conn, acting.work_id)
        decision = replace(decision, detail=f"{decision.detail}; with the wrap-up's {tokens} tokens and "
                                            f"${cost:.4f}: {total.budget_tokens} tokens, ${total.cost_usd:.4f} in all")
    return decision, handoff

def _act(acting: Acting, view: RunView, decision, parts, allowance, backend) -> tuple[int, str, float]:
    """Run the wrap-up act; returns (its attempt, the model's text or '', its time)."""
    work, progress, its = view.work, view.progress, view.iterations
    n, attempt = progress.iterations + 1, work.attempt + 1
    t0 = acting.clock()                       # before started_at: the counted time covers the span
    with acting.w.transaction() as tx:        # committed first: a crash never buys a second one
        acting.write_reflection(tx)
        tx.update("work_items", acting.work_id, attempt=attempt, updated_at=tx.now)
        tx.insert("attempts", {"work_id": acting.work_id, "attempt": attempt, "iteration": n, "wrapup": 1,
                               "instance": acting.w.instance, "started_at": tx.now})
    # the wrap-up's own largest call; its first call's input is taken to be the run's largest
    spent = {"tokens": 0, "cost": 0.0, "largest_input": 0, "largest_cost": 0.0}

    def remaining() -> Remaining:
        def left(cap, used):
            return None if cap is None else max(0, cap - used)
        ahead = spent["largest_input"] or progress.largest_input
        return Remaining(tokens=left(allowance["tokens"], spent["tokens"] + ahead),
                         cost_usd=left(allowance["cost_usd"], spent["cost"]),
                         seconds=left(allowance["seconds"], acting.clock() - t0))

    def on_usage(u: Usage) -> None:
        acting.commit_usage(u, n, attempt)
        spent["tokens"] += u.budget_tokens
        spent["cost"] += u.cost_usd
        spent["largest_input"] = max(spent["largest_input"], input_of(u))
        spent["largest_cost"] = max(spent["largest_cost"], u.cost_usd)

    def budget_left() -> str | None:
        """A second call only if one with an input the size of its largest so far still fits the slice."""
        if acting.interrupt.is_set():
            return INTERRUPTED
        if spent["tokens"] and allowance["tokens"] is not None \
                and spent["tokens"] + spent["largest_input"] >= allowance["tokens"]:
            return str(StopReason.TOKEN_BUDGET)
        if spent["cost"] and allowance["cost_usd"] is not None \
                and spent["cost"] + spent["largest_cost"] > allowance["cost_usd"]:
            return str(StopReason.COST_BUDGET)
        return None

    text = prompt(work.goal, n, decision, parts, allowance["tokens"])
    record = acting.new_transcript(n, attempt)
    record.record(TranscriptKind.PROMPT, {"text": text, "wrapup": True})
    ctx = ActContext(acting.work_id, n, attempt, acting.history.workspace, INSTRUCTIONS, text,
                     max_turns=MAX_TURNS, remaining=remaining, record=record.record)
    outcome = None
    try:
        with read_only(), telemetry.current().step("wrap_up"):
            outcome = backend.act(ctx, on_usage=on_usage, budget_left=budget_left)
    except Exception as exc:  # noqa: BLE001 - the note then comes from the record; the run ends all the same
        acting.log.warning("wrapup_failed", error=str(exc), next="a hand-off note from the record")
    if outcome is not None:
        record.record(TranscriptKind.OUTCOME, outcome_entry(outcome))
    with acting.w.transaction() as tx:
        elapsed = acting.clock() - t0
        wrapped = outcome is not None and outcome.status == ActStatus.OK
        record.flush(tx)
        tx.update("attempts", (acting.work_id, attempt), ended_at=tx.now,
                  outcome=AttemptOutcome.WRAPPED_UP if wrapped else AttemptOutcome.WRAPUP_FAILED,
                  detail=None if wrapped else (outcome.status if outcome else "error"))
        tx.update("work_items", acting.work_id, elapsed_s=work_q.item(tx.conn, acting.work_id).elapsed_s + elapsed,
                  updated_at=tx.now)
    acting.history.reset_to(acting.settled(its))   # whatever the act did, the run ends where it stood
    ok = outcome is not None and outcome.status in ("ok", "failed") and outcome.turns > 0
    return attempt, (outcome.summary if ok else ""), elapsed



def _why_not(allowance: dict, progress: RunProgress) -> str | None:
    """Why the wrap-up's slice leaves no room for a call the size of the run's largest (or for a
    prompt and a note) on some budget; None when it does."""
    tokens, cost, seconds = allowance["tokens"], allowance["cost_usd"], allowance["seconds"]
    if cost is not None and (cost <= 0 or cost < progress.largest_cost):
        return f"${max(0.0, cost):.4f} was left, and a call of this run has cost up to ${progress.largest_cost:.4f}"
    if seconds is not None and seconds < MIN_WRAPUP_SECONDS:
        return f"{max(0.0, seconds):.1f} s was left, under the {MIN_WRAPUP_SECONDS:g} s a wrap-up needs"
    if not fits(tokens):
        return f"{tokens:g} tokens were left, under the {MIN_WRAPUP_TOKENS} a prompt and a note need"
    if tokens is not None and tokens < progress.largest_input + MIN_WRAPUP_TOKENS:
        return (f"{tokens:g} tokens were left, and a call of this run has taken up to {progress.largest_input} "
                "of input before its answer")
    return None
