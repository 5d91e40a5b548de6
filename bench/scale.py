"""The ceiling of one host: a real org with N = 1, 2, 4, 8, 16, 32 loop-agents, then N = 10, 30,
100 at a real model's latency.

Usage: ``bench/scale.py --json [--ns 1,2,4,8,16,32] [--latency 0.3] [--items-per-agent 2]
[--iterations 3] [--startups 5] [--real-ns 10,30,100] [--real-latency 3]``.

Each N gets a fresh org (supervisor, coordinator, eval-agent, curator and N loop-agents on
ipc://, with org.toml's default heartbeats and outbox sweeps, as a user's org runs) and
``items-per-agent × N`` work items whose scripted model answers every call after a fixed
``latency`` (``--model-double process``, the default: one server process of its own that every
loop-agent reaches through the SDK over HTTP, as a hosted model is, its CPU reported apart as
``model_double_cpu_ms_per_iteration`` and left out of the org's; ``role``: the scripted
backend's own server inside each loop-agent, as ``scripted:FILE`` runs it) (two calls an iteration: the act's tool turn and its closing turn) and never meets
the goal, so every item runs exactly ``iterations`` iterations; the verify command is trivial
(``cat`` and a comparison). Per N it reports:

- ``iterations_per_s``: committed iterations ÷ the time from the first submit to the last
  commit; ``bound_per_s``: what the model latency alone allows (N ÷ the model time of one
  iteration); ``ratio``: the first over the second.
- ``overhead_ms_p50`` / ``_p99``: per iteration, the time between one attempt's start and the
  next minus the act (model and tools) and minus the verify command (as ``bench/org.py``).
- ``dispatch_ms_p50`` / ``_p99``: submit commit → the item's first attempt starts, minus the
  preflight's own verify command, over the first N items (each finds an idle loop-agent);
  ``handoff_ms_p50`` / ``_p99``: for the later ones, a loop-agent's run ended → its next item's
  first attempt starts, minus that item's preflight command.
- ``submit_ms_per_item``: the wall time of submitting every item (one ``submit`` call each, as
  a user's client makes them, while the org already works on the first ones) ÷ items; the
  ratio's span starts at the first submit, so the last of the first N items starts that much
  later.
- ``sqlite_write_wait_ms_p50`` / ``_p99``: a probe takes the write lock (``BEGIN IMMEDIATE``;
  rollback) every 50 ms during the run: how long a writer waits for the lock.
- ``eval_agent_busy``: the share of the run the busiest eval-agent spent verifying, from
  state.db (each verification starts at its iteration's commit or that eval-agent's previous
  verdict); ``--eval-agents K`` runs K of them side by side (``[org] eval_agents``; by default
  one per 16 loop-agents: 1 up to N = 16, 2 at N = 32).
- ``cpu_ms_per_iteration``: CPU time (user + system, children included) of every process of the
  org during the run ÷ committed iterations; ``host_cpu_busy``: the share of both cores busy.
  ``cpu_ms_per_iteration_by_role``: the same per kind of role (each role with its child
  processes); ``cpu_ms_per_iteration_children_by_role``: the part of it spent in the child
  processes (bubblewrap and the commands that start it). What runs inside a sandbox is not in
  them: bubblewrap leaves its sandbox's first process, which reaps every command inside, as an
  orphan, adopted by the role template (``roles/supervisor/forkserver.py``), so it is counted
  under ``supervisor`` (the template is the supervisor's child). ``machine_cpu_ms_per_iteration``
  is the whole machine's busy time during the run, less this benchmark's own process
  (submitting, the lock probe), ÷ committed iterations: what fits on the host, read by
  ``binding_limit``. The workspaces are copied before the run is timed.
- ``pss_mb``: proportional set size per role (``/proc/PID/smaps_rollup``) with the org idle,
  so pages shared between processes are counted once, split fairly; ``org_pss_mb``: their sum
  over every process of the org (the supervisor and the role template included).
- ``added_latency_ms_p50`` / ``_p99``: per iteration, what the org adds to the model's time: the
  time from one attempt's start to the next less the model time of one iteration (the verify
  command included: a ``cat``). ``step_ms_p50`` / ``step_ms_p99`` split it by step, from the
  timestamps state.db keeps: ``act`` (the act's own time beyond the model's: the model client,
  the tools, the checkpoint: an iteration's ``elapsed_s`` ends at its commit), ``verify``
  (commit → verdict written, less the check commands: the request's delivery, the eval-agent's
  snapshot, its fresh sandbox, the verdict's write), ``checks`` (the verify commands), ``next``
  (verdict → the next attempt starts: the wake, the loop-agent reading the verdict, the next
  gather).
- ``startup_ms``: start-org to every role ready; ``warm_ms``: to every loop-agent forked from the
  template after it imported the model SDK (the idle org as it stays; PSS is measured then).

The closing figures: ``throughput_ratio_n32`` (``ratio`` at the largest N), ``overhead_ms_p99_n32``,
``pss_mb_idle_loop_agent`` (mean over the idle loop-agents at the largest N), ``startup_ms`` (the
median of ``--startups`` cold starts of the default org, 2 loop-agents, each a fresh home; every
start in ``startup_ms_runs``) and ``binding_limit``, in words: what binds first.
``machine_cpu_ms_per_iteration_n32`` and ``added_latency_ms_p50_n32`` are those of the N = 32
row (None when N = 32 did not run). Targets: ratio ≥ 0.8, machine CPU ≤ 35 ms and added latency
p50 ≤ 50 ms per iteration at N = 32, PSS per idle loop-agent ≤ 15 MB, start-up ≤ 300 ms; the p99
overhead at a saturated N = 32 is reported but is no target (queueing on a busy host).

``--cpu-steps`` also measures, inside every role, the CPU of each step of an iteration
(``bench/cpu_steps/sitecustomize.py``: each step's thread CPU, inclusive of what it calls):
``cpu_ms_per_iteration_by_step``, per kind of role, ms and calls per committed iteration, beside
the role processes' own CPU (``process_ms``).

The real-latency sweep (``--real-ns``, default 10, 30, 100; ``--real-ns ''`` skips it) runs the
same org and items with a model that answers each call in ``--real-latency`` seconds (default 3,
as a hosted model's turn), one eval-agent per 16 loop-agents, every iteration verified in a fresh
sandbox of its own (as always: nothing a doer started outlives its act into a verification). Per
N, in ``per_n_real``: the ratio to the bound, dispatch p50 / p99, SQLite write wait p99, the
org's total PSS, the host's CPU busy, the added latency by step and ``binds`` (what binds at that
N). Closing figures: ``throughput_ratio_n100_real``, ``dispatch_ms_p99_n100_real`` and
``org_pss_mb_n100`` (at the largest real N; targets ≥ 0.9, ≤ 500 ms, ≤ 2,000 MB), and
``added_latency_ms_p50_n32`` from the first sweep's N = 32, when it ran (target ≤ 50 ms).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import workload  # noqa: E402
from bench.common import BenchError, finish, quiet_logs  # noqa: E402

TARGETS_MIN = {"throughput_ratio_n32": 0.8}
# the p99 overhead at a saturated N = 32 is reported, not a target (queueing on a busy host)
TARGETS_MAX = {"machine_cpu_ms_per_iteration_n32": 35.0, "added_latency_ms_p50_n32": 50.0,
               "pss_mb_idle_loop_agent": 15.0, "startup_ms": 300.0}
TARGETS_REAL_MIN = {"throughput_ratio_n100_real": 0.9}
TARGETS_REAL_MAX = {"dispatch_ms_p99_n100_real": 500.0, "org_pss_mb_n100": 2000.0}
STEPS = ("act", "verify", "checks", "next")
CLK = os.sysconf("SC_CLK_TCK")
CALLS_PER_ITERATION = 2


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return round(values[min(len(values) - 1, int(round(q * (len(values) - 1))))], 2)


def script(path: Path, iterations: int, latency: float) -> Path:
    """Every iteration writes a different wrong answer (the verify fails, never the same way
    twice) after two model calls of ``latency`` seconds each."""
    acts = []
    for i in range(1, iterations + 1):
        answer = workload._wrong(i)
        acts.append([
            {"text": f"Iteration {i}: writing the answer.", "delay_s": latency,
             "tool_uses": [{"name": "write_file", "input": {"path": "answer.txt", "content": answer + "\n"}}]},
            {"text": f"Wrote {answer}.", "delay_s": latency},
        ])
    path.write_text(json.dumps({"version": 1, "acts": acts}))
    return path


# -- processes -----------------------------------------------------------------------------------

def _children(pid: int) -> list[int]:
    out = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                out += [int(c) for c in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
            except OSError:
                pass
    except OSError:
        pass
    return out


def org_pids(home) -> dict[str, int]:
    """instance → pid of every live role, plus the supervisor."""
    from roles.supervisor import procs
    pids = {r["instance"]: r["pid"] for r in workload.query(home, "SELECT instance, pid FROM role_instances "
                                                                  "WHERE pid IS NOT NULL AND status = 'ready'")}
    sup = procs.read_pidfile(home.run_dir / "supervisor.pid")
    if sup:
        pids["supervisor"] = sup[0]
    return pids


def procs_template(home) -> int | None:
    """The role template's pid (roles/supervisor/forkserver.py), None when roles are exec'd."""
    from roles.supervisor import procs
    found = procs.read_pidfile(home.run_dir / "forkserver.pid")
    return found[0] if found and procs.is_alive(*found) else None


def _cpu_s(pid: int) -> float:
    """User + system time of ``pid`` and its reaped children, in seconds (0 if gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(fields[i]) for i in (11, 12, 13, 14)) / CLK


def tree_cpu_s(root_pids, skip=()) -> float:
    """CPU seconds of the processes under ``root_pids`` (each counted once), not descending into
    ``skip`` (the other roles: the supervisor's children are counted as themselves)."""
    seen, stack, total = set(skip), list(root_pids), 0.0
    while stack:
        pid = stack.pop()
        if pid in seen:
            continue
        seen.add(pid)
        total += _cpu_s(pid)
        stack += _children(pid)
    return total


def host_cpu() -> tuple[float, float]:
    """(busy, total) jiffies of the whole host, from /proc/stat."""
    parts = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = parts[3] + parts[4]
    return sum(parts) - idle, sum(parts)


def pss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


class LockProbe(threading.Thread):
    """Takes SQLite's write lock every ``every_s`` and records how long it waited for it."""

    def __init__(self, db_path: Path, every_s: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.db_path, self.every_s = db_path, every_s
        self.waits_ms: list[float] = []
        self.stop = threading.Event()

    def run(self) -> None:
        conn = sqlite3.connect(self.db_path, timeout=30, isolation_level=None)
        try:
            while not self.stop.wait(self.every_s):
                t0 = time.perf_counter()
                conn.execute("BEGIN IMMEDIATE")
                self.waits_ms.append((time.perf_counter() - t0) * 1000)
                conn.execute("ROLLBACK")
        finally:
            conn.close()


# -- one N -----------------------------------------------------------------------------------------

def run_n(root: Path, n: int, *, latency: float, items_per_agent: int, iterations: int,
          eval_agents: int = 1, cpu_steps: bool = False, double: str = "process", history: int = 0) -> dict:
    from roles.operations.submit import SubmitRequest, submit
    from scripts import control
    from state_db.queries.work import Caps

    spec = script(root / "scale.json", iterations, latency)
    server, extra, backend = None, "", f"scripted:{spec}"
    if double == "process":
        # the model double off the org, as a hosted model is: one server process every loop-agent
        # calls through the SDK ([model] base_url), its CPU measured apart; no review (as with
        # scripted:FILE, whose script answers none)
        server, url = model_double(spec, root / "model.jsonl")
        extra, backend = f'[model]\nname = "scripted"\nbase_url = "{url}"\n[review]\ndefault_on = false\n', "anthropic"
    try:
        return _run_n(root, n, latency=latency, items_per_agent=items_per_agent, iterations=iterations,
                      eval_agents=eval_agents, cpu_steps=cpu_steps, spec=spec, extra=extra, backend=backend,
                      server=server, history=history)
    finally:
        if server is not None:
            server.terminate()
            server.wait(10)


def model_double(spec: Path, log: Path):
    """Start the scripted model server (``python -m roles.workbench.scripted.server``) in a
    process of its own; returns it and its URL."""
    import subprocess
    proc = subprocess.Popen([sys.executable, "-m", "roles.workbench.scripted.server", "--script", str(spec),
                             "--log", str(log)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            cwd=str(Path(__file__).resolve().parents[1]))
    url = proc.stdout.readline().strip()
    if not url.startswith("http://127.0.0.1:"):
        proc.kill()
        proc.wait()
        raise BenchError("model_double", f"the scripted model server did not start (it printed {url!r})",
                         "run python -m roles.workbench.scripted.server --script FILE --log FILE to see why")
    return proc, url


def _run_n(root: Path, n: int, *, latency: float, items_per_agent: int, iterations: int, eval_agents: int,
           cpu_steps: bool, spec: Path, extra: str, backend: str, server, history: int) -> dict:
    from roles.operations.submit import SubmitRequest, submit
    from scripts import control
    from state_db.queries.work import Caps

    # the org as a user runs it: org.toml's heartbeats and outbox sweeps, not a chaos run's
    home, cfg = workload.new_org(root, n, extra_config=extra, eval_agents=eval_agents, quick=False)
    if history:
        workload.add_history(home, history)
    steps_dir = root / "cpu-steps"
    env = None
    if cpu_steps:
        steps_dir.mkdir()
        env = {"ORG_CPU_STEPS_DIR": str(steps_dir), "ORG_CPU_STEPS_SQL": "1",
               "PYTHONPATH": os.pathsep.join(p for p in (str(STEPS_SITE), os.environ.get("PYTHONPATH")) if p)}
    t0 = time.monotonic()
    control.start_background(home, timeout_s=180, env=env)
    startup_ms = round((time.monotonic() - t0) * 1000, 1)
    try:
        settled_ms = _settle(home, n, t0)
        pids = org_pids(home)
        pss = {inst: pss_mb(pid) for inst, pid in pids.items()}
        template = procs_template(home)
        org_pss = round(sum(v for v in [*pss.values(), pss_mb(template) if template else None] if v), 1)
        template = workload.make_template(root / "template")
        spaces = []          # the bench's own setup, made before anything is timed
        for k in range(items_per_agent * n):
            spaces.append(root / "ws" / f"i{k:03d}")
            shutil.copytree(template, spaces[-1])
        steps0 = read_steps(steps_dir) if cpu_steps else {}
        cpu0, own0, (busy0, total0) = _cpu_by_role(pids), _own_cpu_by_role(pids), host_cpu()
        bench0 = _cpu_s(os.getpid())
        model0 = _cpu_s(server.pid) if server is not None else 0.0
        probe = LockProbe(home.db_path)
        probe.start()
        w0 = time.time()
        # one submit at a time, as a user's client does (the MCP tool, a script calling submit):
        # submit_many's batch reaches the org faster, which only moves queueing from the client
        # into the org (at N = 100: the same ratio, dispatch p50 / p99 twice as long from each
        # item's own submit)
        ids = [submit(home, cfg, SubmitRequest(
            goal="make answer.txt say right", workspace=str(ws), verify=[workload.VERIFY],
            scope=list(workload.SCOPE), caps=Caps(max_iterations=iterations), backend=backend)).id for ws in spaces]
        submitted_s = time.time() - w0
        workload.wait(lambda: not workload.unfinished(home, ids), 60 + 3 * iterations * items_per_agent * n,
                      f"{len(ids)} items to end", interval=0.1)
        probe.stop.set()
        probe.join()
        require_iterations(home, ids, n)
        pids1 = org_pids(home)
        cpu1, own1 = _cpu_by_role(pids1), _own_cpu_by_role(pids1)
        cpu_by = {k: round(cpu1.get(k, 0.0) - cpu0.get(k, 0.0), 2) for k in cpu1}
        cpu_s = sum(cpu_by.values())
        kids_by = {k: max(0.0, v - (own1.get(k, 0.0) - own0.get(k, 0.0))) for k, v in cpu_by.items()}
        busy1, total1 = host_cpu()
        bench_s = _cpu_s(os.getpid()) - bench0
        model_s = (_cpu_s(server.pid) - model0) if server is not None else None
        if cpu_steps:
            time.sleep(1.2)             # each role writes its totals every second
            steps1 = read_steps(steps_dir)
    finally:
        control.request(home, "stop", force=True, timeout_s=60)
        workload.kill_everything(home)
    figures = _figures(home, n, ids, w0, latency, iterations, startup_ms, settled_ms, pss, probe.waits_ms, cpu_s,
                       (busy1 - busy0) / max(1, total1 - total0))
    figures["org_pss_mb"] = org_pss
    figures["submit_ms_per_item"] = round(submitted_s * 1000 / len(ids), 1)
    its = figures["iterations"]           # at least one: require_iterations
    # the whole machine's busy time, less this benchmark's own: what fits on the host, with what
    # no role's process tree holds (the kernel's own work for the sandboxes' namespaces)
    machine_s = (busy1 - busy0) / CLK - bench_s - (model_s or 0.0)
    figures["machine_cpu_ms_per_iteration"] = round(machine_s * 1000 / its, 1)
    figures["model_double"] = "process" if server is not None else "in each loop-agent"
    figures["history_items"] = history
    figures["model_double_cpu_ms_per_iteration"] = round(model_s * 1000 / its, 1) if model_s is not None else None
    figures["cpu_ms_per_iteration_by_role"] = {k: round(v * 1000 / its, 1) for k, v in sorted(cpu_by.items())}
    figures["cpu_ms_per_iteration_children_by_role"] = {k: round(v * 1000 / its, 1) for k, v in sorted(kids_by.items())}
    if cpu_steps:
        figures["cpu_ms_per_iteration_by_step"] = steps_by_role(steps0, steps1, pids1, its)
    return figures


STEPS_SITE = Path(__file__).resolve().parent / "cpu_steps"


def read_steps(folder: Path) -> dict[int, dict]:
    """pid → the totals ``bench/cpu_steps/sitecustomize.py`` last wrote for that role process."""
    out = {}
    for f in folder.glob("[0-9]*.json"):
        try:
            data = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        out[data["pid"]] = data
    return out


def steps_by_role(before: dict[int, dict], after: dict[int, dict], pids: dict[str, int], iterations: int) -> dict:
    """Per kind of role, the thread CPU of each step during the run, in ms per committed
    iteration (with calls per iteration), and the role processes' own CPU beside it."""
    kinds = {pid: (inst.rsplit("-", 1)[0] if inst[-1:].isdigit() else inst) for inst, pid in pids.items()}
    out: dict[str, dict] = {}
    for pid, data in after.items():
        kind = kinds.get(pid)
        if kind is None:
            continue
        old = before.get(pid, {"cpu_s": 0.0, "steps": {}})
        role = out.setdefault(kind, {"process_ms": 0.0, "steps": {}, "sql": {}})
        role["process_ms"] += (data["cpu_s"] - old["cpu_s"]) * 1000 / iterations
        for part in ("steps", "sql"):
            for step, (spent, calls) in data.get(part, {}).items():
                was = old.get(part, {}).get(step, [0.0, 0])
                acc = role.setdefault(part, {}).setdefault(step, [0.0, 0.0])
                acc[0] += (spent - was[0]) * 1000 / iterations
                acc[1] += (calls - was[1]) / iterations

    def table(rows: dict, top: int | None = None) -> dict:
        ranked = [(s, ms, c) for s, (ms, c) in sorted(rows.items(), key=lambda kv: -kv[1][0]) if c]
        return {s: {"ms": round(ms, 2), "calls": round(c, 2)} for s, ms, c in ranked[:top]}
    return {kind: {"process_ms": round(r["process_ms"], 2), "steps": table(r["steps"]),
                   **({"sql_ms": round(sum(ms for ms, _ in r["sql"].values()), 2), "sql_top": table(r["sql"], 40)}
                      if r.get("sql") else {})}
            for kind, r in sorted(out.items())}


def default_startups(root: Path, runs: int) -> list[float]:
    """Start-up of the default org (org.toml's defaults: 2 loop-agents), ``runs`` times, each a
    fresh home started cold and stopped: start-org to every role ready, in ms."""
    from scripts import control
    from state_db.bootstrap import init_home
    from state_db.kernel.home import OrgHome

    out = []
    for k in range(runs):
        home = OrgHome(root / f"s{k}")
        home.root.mkdir(parents=True)
        init_home(home)
        try:
            t0 = time.monotonic()
            control.start_background(home, timeout_s=60)
            out.append(round((time.monotonic() - t0) * 1000, 1))
            control.request(home, "stop", timeout_s=30)
        finally:                    # a start that failed or timed out leaves nothing running either
            workload.kill_everything(home)
    return out


def require_iterations(home, ids: list[str], n: int) -> None:
    """Raise BenchError when the items ended without one committed iteration: the figures would
    be of nothing (e.g. a machine without bubblewrap ends every run ``verify_unrunnable``)."""
    marks = ",".join("?" * len(ids))
    if workload.query(home, f"SELECT 1 FROM iterations WHERE work_id IN ({marks}) LIMIT 1", ids):
        return
    rows = workload.query(home, f"SELECT stop_reason, stop_detail FROM work_items WHERE id IN ({marks})", ids)
    said = ", ".join(f"{k} ×{v}" for k, v in Counter(str(r["stop_reason"]) for r in rows).most_common())
    detail = next((r["stop_detail"] for r in rows if r["stop_detail"]), "")
    raise BenchError("no_iterations", f"at N={n} all {len(ids)} items ended without an iteration ({said}): "
                                      f"{detail.splitlines()[0][:300] if detail else 'no detail recorded'}",
                     "fix what the stop reason names ('org doctor' checks the machine), then run again")


def _settle(home, n: int, t0: float) -> float | None:
    """Wait until the loop-agents forked before the template imported the model SDK have been
    replaced by forks of the warm template (roles/supervisor/forkserver.py), so PSS is measured
    on the org as it runs; returns when that was, in ms after start-up began."""
    time.sleep(0.5)
    if os.environ.get("ORG_SPAWN") == "exec":
        return None
    try:
        workload.wait(lambda: len(workload.query(
            home, "SELECT 1 FROM role_instances WHERE role = 'loop-agent' AND status = 'ready' "
                  "AND last_exit LIKE 'replaced%'")) == n, 120, "the loop-agents forked from the warm template",
            interval=0.1)
    except TimeoutError:
        return None
    time.sleep(0.3)
    return round((time.monotonic() - t0) * 1000, 1)


def _cpu_by_role(pids: dict[str, int]) -> dict[str, float]:
    """CPU seconds per kind of role (loop-agents summed), each process with its children."""
    out: dict[str, float] = {}
    for inst, pid in pids.items():
        kind = inst.rsplit("-", 1)[0] if inst[-1:].isdigit() else inst
        out[kind] = out.get(kind, 0.0) + tree_cpu_s([pid], skip=set(pids.values()) - {pid})
    return out


def _own_cpu_by_role(pids: dict[str, int]) -> dict[str, float]:
    """CPU seconds per kind of role of the role processes themselves (user + system, without
    their children: what ``_cpu_by_role`` adds on top is the roles' child processes, e.g. the
    sandboxed verify commands)."""
    out: dict[str, float] = {}
    for inst, pid in pids.items():
        kind = inst.rsplit("-", 1)[0] if inst[-1:].isdigit() else inst
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[kind] = out.get(kind, 0.0) + (int(fields[11]) + int(fields[12])) / CLK
    return out


def _figures(home, n, ids, w0, latency, iterations, startup_ms, settled_ms, pss, waits, cpu_s, busy) -> dict:
    q = workload.query
    marks = ",".join("?" * len(ids))
    its = q(home, f"SELECT work_id, n, elapsed_s, committed_at FROM iterations WHERE work_id IN ({marks})", ids)
    attempts = q(home, f"SELECT work_id, attempt, iteration, instance, started_at FROM attempts WHERE work_id IN ({marks}) "
                       "AND outcome = 'committed' ORDER BY work_id, attempt", ids)
    checks = {(r["work_id"], r["iteration"]): sum(c["duration_ms"] for c in json.loads(r["checks"]))
              for r in q(home, f"SELECT work_id, iteration, checks FROM verdicts WHERE work_id IN ({marks})", ids)}
    elapsed = {(r["work_id"], r["n"]): r["elapsed_s"] for r in its}
    # an eval-agent verifies one iteration at a time: each verification starts when its
    # iteration is committed or when that eval-agent's previous verdict was written, whichever
    # is later; the busiest eval-agent is reported
    asked = {(r["work_id"], r["n"]): r["committed_at"] for r in its}
    by_eval: dict[str, list] = {}
    for r in q(home, f"SELECT work_id, iteration, at, written_by FROM verdicts WHERE iteration > 0 "
                     f"AND work_id IN ({marks})", ids):
        by_eval.setdefault(r["written_by"], []).append((r["at"], asked.get((r["work_id"], r["iteration"]))))
    service = 0.0
    for done in by_eval.values():
        busy_s, prev = 0.0, None
        for at, req in sorted(done):
            if req is None:
                continue
            start = req if prev is None else max(req, prev)
            busy_s += max(0.0, at - start)
            prev = at
        service = max(service, busy_s)
    overheads, added = [], []
    steps: dict[str, list] = {k: [] for k in STEPS}
    model_s = CALLS_PER_ITERATION * latency
    verdict_at = {(r["work_id"], r["iteration"]): r["at"]
                  for r in q(home, f"SELECT work_id, iteration, at FROM verdicts WHERE work_id IN ({marks})", ids)}
    by_item: dict[str, list] = {}
    for a in attempts:
        by_item.setdefault(a["work_id"], []).append(a)
    for rows in by_item.values():
        for a, b in zip(rows, rows[1:]):
            key = (a["work_id"], a["iteration"])
            if key in elapsed and key in checks:
                overheads.append((b["started_at"] - a["started_at"]) * 1000 - elapsed[key] * 1000 - checks[key])
            if key in elapsed and key in checks and key in verdict_at:
                added.append((b["started_at"] - a["started_at"] - model_s) * 1000)
                for step, ms in (("act", (elapsed[key] - model_s) * 1000),
                                 ("verify", (verdict_at[key] - asked[key]) * 1000 - checks[key]),
                                 ("checks", checks[key]),
                                 ("next", (b["started_at"] - verdict_at[key]) * 1000)):
                    steps[step].append(ms)
    submitted = {r["id"]: r["created_at"] for r in q(home, f"SELECT id, created_at FROM work_items WHERE id IN ({marks})", ids)}
    pre = {r["work_id"]: sum(c.get("duration_ms") or 0 for c in json.loads(r["checks"]))
           for r in q(home, f"SELECT work_id, checks FROM preflights WHERE work_id IN ({marks})", ids)}
    # the first N items find an idle loop-agent each; the later ones queue behind them by design
    first = sorted(by_item, key=lambda w: submitted[w])[:n]
    dispatch = [(by_item[w][0]["started_at"] - submitted[w]) * 1000 - (pre.get(w) or 0) for w in first]
    # the later items wait for a loop-agent to end its run: from that run's end to the next
    # item's first attempt on the same loop-agent, less that item's preflight command
    ended = {r["id"]: r["ended_at"] for r in q(home, f"SELECT id, ended_at FROM work_items WHERE id IN ({marks})", ids)}
    by_agent: dict[str, list] = {}
    for w, rows in by_item.items():
        by_agent.setdefault(rows[0]["instance"], []).append((rows[0]["started_at"], w))
    handoff = []
    for runs in by_agent.values():
        runs.sort()
        for (_, prev), (start, nxt) in zip(runs, runs[1:]):
            if ended.get(prev) is not None and submitted[nxt] <= ended[prev]:
                handoff.append((start - ended[prev]) * 1000 - (pre.get(nxt) or 0))
    span = max(r["committed_at"] for r in its) - w0 if its else None
    rate = len(its) / span if span else None
    bound = n / model_s
    loop_pss = [v for k, v in pss.items() if k.startswith("loop-agent") and v is not None]
    return {
        "n": n, "items": len(ids), "iterations": len(its), "expected_iterations": len(ids) * iterations,
        "iterations_per_s": round(rate, 2) if rate else None, "bound_per_s": round(bound, 2),
        "ratio": round(rate / bound, 3) if rate else None,
        "overhead_ms_p50": _pct(overheads, 0.5), "overhead_ms_p99": _pct(overheads, 0.99),
        "added_latency_ms_p50": _pct(added, 0.5), "added_latency_ms_p99": _pct(added, 0.99),
        "step_ms_p50": {k: _pct(v, 0.5) for k, v in steps.items()},
        "step_ms_p99": {k: _pct(v, 0.99) for k, v in steps.items()},
        "dispatch_ms_p50": _pct(dispatch, 0.5), "dispatch_ms_p99": _pct(dispatch, 0.99),
        "handoff_ms_p50": _pct(handoff, 0.5), "handoff_ms_p99": _pct(handoff, 0.99),
        "sqlite_write_wait_ms_p50": _pct(waits, 0.5), "sqlite_write_wait_ms_p99": _pct(waits, 0.99),
        "cpu_ms_per_iteration": round(cpu_s * 1000 / len(its), 1) if its else None,
        "eval_agent_busy": round(service / span, 3) if span else None, "eval_agents": max(1, len(by_eval)),
        "run_s": round(span, 2) if span else None,
        "host_cpu_busy": round(busy, 3), "startup_ms": startup_ms, "warm_ms": settled_ms,
        "pss_mb": {"loop_agent_mean": round(statistics.mean(loop_pss), 1) if loop_pss else None,
                   **{k: v for k, v in pss.items() if not k.startswith("loop-agent")}},
    }


def binding_limit(rows: list[dict], enough: float = 0.8) -> str:
    """What binds first, from the figures: the host's CPU, SQLite's write lock, or memory;
    ``enough``: the ratio at which nothing is said to bind."""
    top = rows[-1]
    if top["ratio"] is not None and top["ratio"] >= enough:
        return f"nothing up to N={top['n']}: throughput follows the model latency"
    if (top.get("eval_agent_busy") or 0) >= 0.85:
        k = top.get("eval_agents", 1)
        who = "the eval-agent: one process verifies" if k == 1 else f"the eval-agents: each of {k} verifies its share,"
        return (f"{who} every iteration in turn, busy "
                f"{round(100 * top['eval_agent_busy'])} % of the run at N={top['n']} "
                f"({top['iterations_per_s']} iterations/s)")
    if top["host_cpu_busy"] >= 0.85:          # before the lock: on a saturated host, lock holders wait for a core
        cores = os.cpu_count()
        per = top["machine_cpu_ms_per_iteration"]
        return (f"CPU: at N={top['n']} the host's {cores} cores are {round(100 * top['host_cpu_busy'])} % busy "
                f"at {per} ms of the machine's CPU per iteration, so at most about "
                f"{round(cores * 1000 / per, 1)} iterations/s fit on this host")
    if (top["sqlite_write_wait_ms_p99"] or 0) > 100:
        return (f"SQLite's write lock: at N={top['n']} a writer waits {top['sqlite_write_wait_ms_p99']} ms "
                "(p99) for it")
    return f"the org's own pace: overhead p99 {top['overhead_ms_p99']} ms per iteration at N={top['n']}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--ns", default="1,2,4,8,16,32")
    ap.add_argument("--latency", type=float, default=0.3, help="seconds per model call")
    ap.add_argument("--items-per-agent", type=int, default=2)
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--startups", type=int, default=5,
                    help="cold starts of the default org (startup_ms: their median)")
    ap.add_argument("--eval-agents", type=int, default=0,
                    help="eval-agents side by side ([org] eval_agents); 0: one per 16 loop-agents")
    ap.add_argument("--real-ns", default="10,30,100", help="the real-latency sweep's N ('': skip it)")
    ap.add_argument("--real-latency", type=float, default=3.0, help="seconds per model call in the real sweep")
    ap.add_argument("--model-double", choices=("process", "role"), default="process",
                    help="where the scripted model runs: a process of its own, reached over HTTP as a hosted "
                         "model is (its CPU reported apart), or inside each loop-agent (scripted:FILE)")
    ap.add_argument("--history", type=int, default=0,
                    help="ended work items of the past in each org's store before it starts (workload.add_history)")
    ap.add_argument("--cpu-steps", action="store_true",
                    help="also measure each role's CPU by step (bench/cpu_steps): cpu_ms_per_iteration_by_step")
    args = ap.parse_args(argv)
    ns = [int(x) for x in args.ns.split(",") if x.strip()]
    real_ns = [int(x) for x in args.real_ns.split(",") if x.strip()]
    if args.startups < 1:
        print(BenchError("bad_argument", f"--startups {args.startups}: startup_ms is the median of the starts",
                         "give --startups 1 or more").line(), file=sys.stderr)
        return 2
    quiet_logs()
    with tempfile.TemporaryDirectory(prefix="sc", dir="/tmp") as d:
        starts = default_startups(Path(d), args.startups)
    try:
        rows = sweep(ns, args.latency, args)
        real = sweep(real_ns, args.real_latency, args)
    except BenchError as exc:
        print(exc.line(), file=sys.stderr)
        return 2
    for row in real:
        row["binds"] = binding_limit([row], enough=0.9)
    figures: dict = {"startup_ms": statistics.median(starts), "startup_ms_runs": starts}
    targets_min: dict = {}
    targets_max: dict = {"startup_ms": TARGETS_MAX["startup_ms"]}
    if rows:
        top = rows[-1]
        n32 = next((r for r in rows if r["n"] == 32), None)
        figures.update({
            "throughput_ratio_n32": top["ratio"], "overhead_ms_p99_n32": top["overhead_ms_p99"],
            "added_latency_ms_p50_n32": n32["added_latency_ms_p50"] if n32 else None,
            "machine_cpu_ms_per_iteration_n32": n32["machine_cpu_ms_per_iteration"] if n32 else None,
            "pss_mb_idle_loop_agent": top["pss_mb"]["loop_agent_mean"],
            "binding_limit": binding_limit(rows), "model_latency_s": args.latency, "largest_n": top["n"],
            "per_n": rows})
        targets_min.update(TARGETS_MIN)
        targets_max.update(TARGETS_MAX)
    if real:
        top = real[-1]
        figures.update({
            "throughput_ratio_n100_real": top["ratio"], "dispatch_ms_p99_n100_real": top["dispatch_ms_p99"],
            "org_pss_mb_n100": top["org_pss_mb"], "largest_n_real": top["n"],
            "real_model_latency_s": args.real_latency, "binding_limit_real": top["binds"], "per_n_real": real})
        figures.setdefault("pss_mb_idle_loop_agent", top["pss_mb"]["loop_agent_mean"])
        targets_min.update(TARGETS_REAL_MIN)
        targets_max.update(TARGETS_REAL_MAX)
    passes = {k: figures.get(k) is not None and figures[k] >= v for k, v in targets_min.items()}
    passes.update({k: figures.get(k) is not None and figures[k] <= v for k, v in targets_max.items()})
    return finish(figures, {**{k: f">= {v}" for k, v in targets_min.items()}, **targets_max}, passes,
                  as_json=args.json)


def sweep(ns: list[int], latency: float, args) -> list[dict]:
    """One fresh org per N at ``latency`` seconds per model call; each row printed as it comes."""
    rows = []
    for n in ns:
        with tempfile.TemporaryDirectory(prefix="sc", dir="/tmp") as d:
            rows.append(run_n(Path(d), n, latency=latency, items_per_agent=args.items_per_agent,
                              iterations=args.iterations, eval_agents=args.eval_agents or max(1, n // 16),
                              cpu_steps=args.cpu_steps, double=args.model_double, history=args.history))
        print(json.dumps(rows[-1]), file=sys.stderr)
    return rows


if __name__ == "__main__":
    sys.exit(main())
