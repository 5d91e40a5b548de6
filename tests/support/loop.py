"""Engine test helpers: a workspace with a failing check, a scripted in-process backend, and
the eval-agent's verifier as the verify seam."""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from roles.eval_agent.verifier import Verifier
from roles.loop_agent.backends.base import ActOutcome, Usage
from roles.loop_agent.engine import LoopEngine, LoopSettings
from roles.workbench.workspace.history import WorkspaceHistory
from state_db.vocab import Actor, WorkStatus
from state_db.writer import StateWriter

BUGGY = "def add(a, b):\n    return a - b\n"
FIXED = "def add(a, b):\n    return a + b\n"
CHECK = f"{sys.executable} -c 'import calc; assert calc.add(2, 3) == 5, calc.add(2, 3)'"


def commit_iteration(home, work_id: str, checkpoint: str, n: int = 1) -> None:
    """Record iteration ``n`` of ``work_id`` with ``checkpoint``, as its loop-agent would."""
    lw = StateWriter(home.db_path, Actor.LOOP_AGENT, "loop-agent-1")
    with lw.transaction() as tx:
        tx.insert("iterations", {"work_id": work_id, "n": n, "attempt": 1, "act_status": "ok", "act_summary": "",
                                 "checkpoint": checkpoint, "committed_at": tx.now})
    lw.close()


def make_workspace(root: Path) -> Path:
    ws = root / "ws"
    ws.mkdir(parents=True)
    (ws / "calc.py").write_text(BUGGY)
    (ws / "tests").mkdir()
    (ws / "tests" / "test_calc.py").write_text("import calc\n\ndef test_add():\n    assert calc.add(2, 3) == 5\n")
    return ws


def submit(home, ws: Path, work_id="w1", caps=None, verify=(CHECK,), instance="loop-agent-1", scope=()) -> str:
    human = StateWriter(home.db_path, Actor.HUMAN)
    with human.transaction() as tx:
        tx.insert("work_items", {"id": work_id, "goal": "make add() add", "workspace": str(ws),
                                 "verify": list(verify), "caps": caps or {"max_iterations": 6}, "scope": list(scope),
                                 "backend": "anthropic", "status": WorkStatus.QUEUED, "created_by": "human",
                                 "created_at": time.time(), "updated_at": time.time()})
    human.close()
    co = StateWriter(home.db_path, Actor.COORDINATOR)
    with co.transaction() as tx:
        tx.set_status("work_items", work_id, WorkStatus.DISPATCHED, assigned_to=instance)
    co.close()
    return work_id


def eval_agent_in_process(home, make_verifier=None, instance="eval-agent"):
    """An eval-agent role in this process on a ``StubTransport``, its row written as the supervisor
    writes it, started: ``(process, stub)``. ``make_verifier``: the role's seam (writer →
    verifier); ``instance``: its name. The caller stops it (``request_stop``, ``close``)."""
    from roles.eval_agent.process import EvalAgentProcess
    from transport.stub import StubTransport
    sup = StateWriter(home.db_path, Actor.SUPERVISOR)
    with sup.transaction() as tx:
        tx.insert("role_instances", {"instance": instance, "role": "eval-agent", "status": "starting",
                                     "updated_at": tx.now})
    sup.close()
    stub = StubTransport(instance)
    proc = EvalAgentProcess(home, instance, transport=stub, make_verifier=make_verifier)
    proc.start()
    return proc, stub


class ScriptedActs:
    """A backend that replays per-iteration acts in-process (for engine semantics tests).

    acts[i] is a list of calls for iteration i+1 (the last one repeats); each call may write files
    ({"write": {path: text}}), has token counts, and may ``crash`` (raise) after its usage.
    """

    name = "anthropic"

    def __init__(self, acts, tokens=(100, 20), cost=0.001, cache=(0, 0)):
        self.acts = acts
        self.tokens = tokens
        self.cache = cache          # (cache-write, cache-read) tokens of every call
        self.cost = cost
        self.calls = []

    def act(self, ctx, *, on_usage, budget_left):
        calls = self.acts[min(ctx.iteration, len(self.acts)) - 1]
        requests = tuple(c["request"] for c in calls if "request" in c)
        self.prompts = getattr(self, "prompts", []) + [ctx.variable_prompt]
        for i, call in enumerate(calls):
            stop = budget_left()
            if stop:
                return ActOutcome("budget_exhausted", "cut", error_code=stop, turns=i)
            rid = f"req-{ctx.work_id}-{ctx.iteration}-{ctx.attempt}-{i}"
            self.calls.append(rid)
            on_usage(Usage(rid, "m", self.tokens[0], self.tokens[1], *self.cache, cost_usd=self.cost))
            for path, text in call.get("write", {}).items():
                p = ctx.workspace / path
                p.parent.mkdir(parents=True, exist_ok=True)
                p.write_text(text)
            if call.get("crash"):
                if call["crash"] == "kill":
                    os.kill(os.getpid(), 9)
                raise RuntimeError("simulated crash mid-act")
            if call.get("error"):
                return ActOutcome("model_error", "", error_code=call["error"], error="scripted error", turns=i + 1)
        return ActOutcome("ok", f"iteration {ctx.iteration} done", tool_calls=({"name": "write", "input": {}},),
                          turns=len(calls), requests=requests)


def engine(home, work_id, backend, instance="loop-agent-1", settings=None, interrupt=None, pause=None):
    work = StateWriter(home.db_path, Actor.LOOP_AGENT, instance)
    ws = Path(work.conn.execute("SELECT workspace FROM work_items WHERE id=?", (work_id,)).fetchone()[0])
    history = WorkspaceHistory(home.history_dir / f"{work_id}.git", ws, defer=True)
    verifier = Verifier(home, StateWriter(home.db_path, Actor.EVAL_AGENT, "eval-agent"), timeout_s=30)
    return LoopEngine(work, work_id, backend, lambda w, n: verifier.verify(w, n), history,
                      settings or LoopSettings(), interrupt=interrupt, pause=pause)


def acts_json(acts) -> str:
    return json.dumps(acts)


def record_iteration(home, work_id: str, checkpoint: str, n: int = 1) -> None:
    """Record iteration ``n`` of ``work_id`` with a ``checkpoint`` the test made, as its loop-agent would."""
    lw = StateWriter(home.db_path, Actor.LOOP_AGENT, "loop-agent-1")
    with lw.transaction() as tx:
        tx.insert("iterations", {"work_id": work_id, "n": n, "attempt": 1, "act_status": "ok", "act_summary": "",
                                 "checkpoint": checkpoint, "committed_at": tx.now})
    lw.close()


def commit_iteration(home, ws: Path, work_id: str = "w1", n: int = 1) -> str:
    """Checkpoint ``ws`` as iteration ``n`` of ``work_id`` and commit the iteration as its
    loop-agent would (for verifier tests that act on the workspace themselves)."""
    from roles.workbench.workspace.history import WorkspaceHistory
    checkpoint = WorkspaceHistory(home.history_dir / f"{work_id}.git", ws).checkpoint(n)
    writer = StateWriter(home.db_path, Actor.LOOP_AGENT, "loop-agent-1")
    with writer.transaction() as tx:
        tx.insert("iterations", {"work_id": work_id, "n": n, "attempt": 1, "act_status": "ok", "act_summary": "",
                                 "checkpoint": checkpoint, "committed_at": tx.now})
    writer.close()
    return checkpoint
