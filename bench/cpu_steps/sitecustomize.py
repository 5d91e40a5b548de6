"""CPU by step, inside a running org: ``bench/scale.py --cpu-steps`` puts this folder first on
the org's ``PYTHONPATH`` with ``ORG_CPU_STEPS_DIR`` set, so every interpreter of the org (the
supervisor, its role template) runs it at start-up and every role forked from them inherits it.

It wraps the functions named in ``STEPS`` (the steps of an iteration, by role) as their modules
are imported, so each call adds the calling thread's CPU time (``time.thread_time``: user +
system of that thread only, never time spent waiting) to its step, inclusive of what it calls;
with ``ORG_CPU_STEPS_SQL`` set, every SQLite statement's too. Each process (counting from zero
again in each forked child) writes its totals to ``$ORG_CPU_STEPS_DIR/<pid>.json`` every second
and at exit; ``bench/scale.py`` names each pid's role from state.db and divides by the
iterations committed. A wrapper costs about a microsecond a call; nothing is wrapped unless the
variable is set.
"""
from __future__ import annotations

import atexit
import functools
import importlib
import json
import os
import sys
import threading
import time

OUT = os.environ.get("ORG_CPU_STEPS_DIR")

# (module, qualified name, step): inclusive thread CPU, so a step holds the steps it calls
STEPS = (
    # loop-agent
    ("roles.loop_agent.process", "LoopAgentProcess._run_loop", "loop: the whole run (worker thread)"),
    ("roles.loop_agent.acting", "Acting.act", "loop: act (model calls, tools, checkpoint, commit)"),
    ("roles.loop_agent.backends.anthropic_backend", "AnthropicBackend._create", "loop: model client, per call"),
    ("roles.loop_agent.backends.anthropic_backend", "_Act._run_tool", "loop: tools"),
    ("roles.loop_agent.acting", "Acting._commit", "loop: commit (checkpoint + rows)"),
    ("roles.workbench.workspace.history", "WorkspaceHistory.checkpoint", "loop: checkpoint (git objects)"),
    ("roles.loop_agent.acting", "Acting.commit_usage", "loop: usage rows"),
    ("roles.loop_agent.engine", "LoopEngine.derive", "loop: derive the next step"),
    ("roles.loop_agent.engine", "LoopEngine._await", "loop: wait for the verdict"),
    ("roles.loop_agent.acting", "Acting.reflect", "loop: reflect"),
    ("roles.loop_agent.engine", "LoopEngine.resume", "loop: start of a run"),
    ("roles.loop_agent.engine", "LoopEngine._end", "loop: end of a run"),
    ("skills.select", "for_run", "loop: skills and knowledge for a run"),
    ("roles.loop_agent.process", "LoopAgentProcess.reconcile", "loop: reconcile"),
    ("roles.loop_agent.process", "LoopAgentProcess.handle", "loop: handle a message"),
    ("roles.loop_agent.process", "LoopAgentProcess._set_current", "loop: show the current work"),
    ("roles.loop_agent.backends.factory", "build", "loop: build the backend"),
    ("roles.loop_agent.engine", "LoopEngine.run", "loop: the engine's run"),
    ("roles.loop_agent.engine", "LoopEngine._await_verdict", "loop: wait for the verdict and reflect"),
    # the history (loop-agent and eval-agent)
    ("roles.workbench.workspace.history", "WorkspaceHistory.baseline", "history: record the baseline"),
    ("roles.workbench.workspace.history", "WorkspaceHistory.flush_pending", "history: write out at a run's end"),
    # the model double in a loop-agent (--model-double role)
    ("roles.workbench.scripted.server", "_Handler.do_POST", "model double: serving a call"),
    # eval-agent
    ("roles.workbench.workspace.views", "HistoryViews.materialize", "eval: write the snapshot"),
    ("roles.eval_agent.process", "EvalAgentProcess._verify_once", "eval: one verification or preflight"),
    ("roles.eval_agent.verifier", "Verifier.preflight", "eval: preflight"),
    ("roles.eval_agent.verifier", "Verifier._snapshot", "eval: snapshot"),
    ("roles.eval_agent.verifier", "Verifier._construct", "eval: construct the verified tree"),
    ("roles.eval_agent.verifier", "Verifier._run", "eval: checks (sandbox set-up and wait)"),
    ("roles.workbench.sandbox.bwrap", "BwrapRunner.view", "eval: sandbox view"),
    ("roles.workbench.sandbox.bwrap", "mount_args", "eval: sandbox mounts"),
    ("roles.eval_agent.verifier", "Verifier.record", "eval: record the verdict"),
    ("roles.eval_agent.process", "EvalAgentProcess._announce", "eval: announce"),
    ("roles.eval_agent.process", "EvalAgentProcess._show_busy", "eval: show busy"),
    # coordinator
    ("roles.coordinator.dispatch", "reconcile", "coordinator: dispatch pass"),
    ("roles.coordinator.announce", "announce", "coordinator: announcements"),
    ("roles.coordinator.schedules", "tick", "coordinator: standing orders"),
    ("roles.coordinator.process", "CoordinatorProcess.replays", "coordinator: skill replays"),
    ("roles.coordinator.process", "CoordinatorProcess.render_snapshot", "coordinator: status snapshot"),
    ("roles.coordinator.process", "CoordinatorProcess.reconcile", "coordinator: reconcile"),
    ("roles.coordinator.process", "CoordinatorProcess.handle", "coordinator: handle a message"),
    # every role
    ("roles.base.runtime", "RoleProcess.step", "role: main loop step"),
    ("roles.base.transport_link", "TransportLink.poll", "role: transport poll"),
    ("roles.base.runtime", "RoleProcess.heartbeat", "role: heartbeat"),
)

_totals: dict[str, list] = {}
_sql: dict[str, list] = {}
_lock = threading.Lock()


def _wrap(fn, step: str):
    @functools.wraps(fn)
    def timed(*args, **kwargs):
        t0 = time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            spent = time.thread_time() - t0
            with _lock:
                acc = _totals.setdefault(step, [0.0, 0])
                acc[0] += spent
                acc[1] += 1
    return timed


def _sql_meter() -> None:
    """Each statement's thread CPU, by its text (whitespace folded; a long one by its first 100
    and last 80 characters), for every
    SQLite connection the role opens from now on (``sqlite3.connect``'s ``factory``)."""
    import re
    import sqlite3

    space = re.compile(r"\s+")

    def note(sql: str, spent: float) -> None:
        key = space.sub(" ", sql).strip()
        if len(key) > 184:
            key = f"{key[:100]} … {key[-80:]}"
        with _lock:
            acc = _sql.setdefault(key, [0.0, 0])
            acc[0] += spent
            acc[1] += 1

    class Metered(sqlite3.Connection):
        def execute(self, sql, *args):
            t0 = time.thread_time()
            try:
                return super().execute(sql, *args)
            finally:
                note(sql, time.thread_time() - t0)

        def executemany(self, sql, *args):
            t0 = time.thread_time()
            try:
                return super().executemany(sql, *args)
            finally:
                note(sql, time.thread_time() - t0)

    connect = sqlite3.connect

    @functools.wraps(connect)
    def metered(*args, **kwargs):
        kwargs.setdefault("factory", Metered)
        return connect(*args, **kwargs)
    sqlite3.connect = metered


def _wrap_module(module) -> None:
    """Wrap the steps ``module`` holds (once: a wrapped function is left as it is)."""
    for name, qualname, step in STEPS:
        if name != module.__name__:
            continue
        owner = module
        *path, attr = qualname.split(".")
        for part in path:
            owner = getattr(owner, part, None)
        fn = getattr(owner, attr, None) if owner is not None else None
        if callable(fn) and not getattr(fn, "_cpu_step", False):
            wrapped = _wrap(fn, step)
            wrapped._cpu_step = True
            setattr(owner, attr, wrapped)


class _WrapOnImport:
    """A meta-path finder that wraps a module's steps as soon as it has been executed (roles
    import some of their code lazily: the verifier at the first verification)."""

    wanted = frozenset(m for m, _, _ in STEPS)

    def find_spec(self, name, path, target=None):
        if name not in self.wanted:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                run = spec.loader.exec_module

                def exec_module(module, run=run):
                    run(module)
                    _wrap_module(module)
                spec.loader.exec_module = exec_module
                return spec
            if spec is not None:
                return spec
        return None


def _dump() -> None:
    t = os.times()
    with _lock:
        data = {"pid": os.getpid(), "cpu_s": t.user + t.system, "steps": {k: list(v) for k, v in _totals.items()},
                "sql": {k: list(v) for k, v in _sql.items()}}
    tmp = os.path.join(OUT, f".{os.getpid()}.json")
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, os.path.join(OUT, f"{os.getpid()}.json"))


def _every_second() -> None:
    while True:
        time.sleep(1.0)
        try:
            _dump()
        except OSError:
            return


def _start() -> None:
    """In this process (and again in each child forked from it): count from zero, write the
    totals every second and at exit."""
    _totals.clear()
    _sql.clear()
    threading.Thread(target=_every_second, name="cpu-steps", daemon=True).start()


if OUT:
    # every process of the org: the supervisor, its role template and each role forked from it
    # (a role's pid names it; the others' files are left aside by bench/scale.py)
    for _name in list(sys.modules):
        if _name in _WrapOnImport.wanted:
            _wrap_module(sys.modules[_name])
    sys.meta_path.insert(0, _WrapOnImport())
    if os.environ.get("ORG_CPU_STEPS_SQL"):
        _sql_meter()
    _start()
    atexit.register(_dump)
    os.register_at_fork(after_in_child=_start)
