"""CPU by step, inside a running org: ``bench/scale.py --cpu-steps`` puts this folder first on
the org's ``PYTHONPATH``, so the interpreter of the supervisor's role template
(``roles/supervisor/forkserver.py``) runs it at start-up and every role forked from the template
inherits it.

In each forked role it wraps the functions named in ``STEPS`` (the steps of an iteration, by
role) so each call adds the calling thread's CPU time (``time.thread_time``: user + system of
that thread only, never time spent waiting) to its step, inclusive of what it calls, and writes
the totals to ``$ORG_CPU_STEPS_DIR/<pid>.json`` every second and at exit. ``bench/scale.py``
names each pid's role from state.db and divides by the iterations committed. A wrapper costs
about a microsecond a call; nothing is wrapped unless the variable is set.
"""
from __future__ import annotations

import atexit
import functools
import importlib
import json
import os
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
    ("roles.workbench.scripted.server", "_Handler.do_POST", "model double: serving a call"),
    # eval-agent
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


def _install() -> None:
    if os.environ.get("ORG_CPU_STEPS_SQL"):
        _sql_meter()
    for module, qualname, step in STEPS:
        try:
            owner = importlib.import_module(module)
        except Exception:  # noqa: BLE001 - a module this org does not have: not measured
            continue
        *path, name = qualname.split(".")
        for part in path:
            owner = getattr(owner, part, None)
        if owner is not None and callable(getattr(owner, name, None)):
            setattr(owner, name, _wrap(getattr(owner, name), step))


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


_wrapped = False


def _in_role() -> None:
    """In a process just forked from the template: wrap once (a grandchild inherits the
    wrappers), count from zero, write the totals every second."""
    global _wrapped
    _totals.clear()
    _sql.clear()
    if not _wrapped:
        _install()
        _wrapped = True
    threading.Thread(target=_every_second, name="cpu-steps", daemon=True).start()
    atexit.register(_dump)


def _is_template() -> bool:
    try:
        with open("/proc/self/cmdline", "rb") as f:
            return b"roles.supervisor.forkserver" in f.read()
    except OSError:
        return False


if OUT and _is_template():
    os.register_at_fork(after_in_child=_in_role)
