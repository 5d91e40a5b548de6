"""Loop engine benchmark: per-iteration overhead, prompt growth, checkpoint cost.

Usage: ``bench/loop.py --json [--iterations N]`` (default run ≤ 45 s).

- ``overhead_ms_per_iteration``: in-process engine with the scripted Messages API server reached
  through the anthropic SDK, real state.db, shadow-git checkpoints and the eval-agent's verifier
  (snapshot + verdict); the time inside the act (model calls and tools) and inside the verify
  command is measured and subtracted. Median over iterations 2..N; ``overhead_ms_mean`` is the
  mean, and ``write_out_ms_at_end`` what writing the history's index (its stat cache, kept in
  memory while the run goes) and moving its branch out cost when the run stopped. Every
  checkpoint is a git commit in git's own files (three new objects and its own new ref) when it
  is recorded.
- ``variable_prompt_growth_ratio``: bytes of the prompt outside the stable prefix at iteration
  30 ÷ at iteration 3, for a run that never meets its goal.
- ``checkpoint_ms_10k_files``: one file changed in a 10,000-file workspace, as the running loop
  records it (``bench/history_bench.py``, which times the history's other steps beside it).
- ``fs_ref_update_us_p50``/``fs_new_file_us_p50``/``fs_append_us_p50``: the disk's own cost,
  measured in the same run beside the others: a git ref update, a new file, and an append to an
  existing file (on this machine's virtual disk a new file costs 60–800 µs, an append 4–50 µs;
  a checkpoint makes four new files and replaces none), and ``overhead_ms_per_iteration_tmpfs``, the same loop
  with the org home in /dev/shm: what the engine costs apart from the disk. ``cpu_ref_ms_p50``
  is a fixed piece of CPU work timed in the same run: on this 2-CPU virtual machine it varies by
  half again from hour to hour, and the overhead with it. Only the on-disk figure is held to
  the target. What was made before the run starts is frozen out of the collector's way
  (``gc.freeze()``), as a role process does once it is ready.
Targets: overhead ≤ 10 ms (a guard: checkpoints stay real git objects through libgit2, and the earlier
≤ 3 ms target is retired with that decision), ratio ≤ 1.3, checkpoint ≤ 50 ms.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TARGETS = {"overhead_ms_per_iteration": 10.0, "variable_prompt_growth_ratio": 1.3, "checkpoint_ms_10k_files": 50.0}


# A realistic goal and a realistic failing check: its output (≈1.3 kB, like a short pytest
# failure) names the current counter, so every iteration fails differently and the run never
# stops early on repeated_failure or no_progress.
GOAL = ("The function parse_duration in timeparse.py must accept strings such as '1h30m', '45s' and "
        "'2d 4h', return the total number of seconds as an int, and raise ValueError with a message "
        "naming the bad token for anything else. Keep the public API unchanged and do not add "
        "dependencies; the existing tests in tests/test_timeparse.py describe the expected behaviour.")
FAILING_CHECK = ("n=$(cat n.txt); printf '%s\\n' "
                 "'============================= FAILURES =============================' "
                 "'___________________ test_parse_duration_mixed_units ___________________' "
                 "'    def test_parse_duration_mixed_units():' "
                 "'>       assert parse_duration(\"2d 4h\") == 187200' "
                 "\"E       AssertionError: assert $n == 187200\" "
                 "'E        +  where result = parse_duration(\"2d 4h\")' "
                 "'tests/test_timeparse.py:31: AssertionError' "
                 "'___________________ test_parse_duration_rejects_garbage ___________________' "
                 "'    def test_parse_duration_rejects_garbage():' "
                 "'        with pytest.raises(ValueError, match=\"bad token\"):' "
                 "'>           parse_duration(\"3x\")' "
                 "'E       Failed: DID NOT RAISE <class ValueError>' "
                 "'tests/test_timeparse.py:40: Failed' "
                 "'=========================== short test summary info ===========================' "
                 "\"FAILED tests/test_timeparse.py::test_parse_duration_$n - AssertionError\" "
                 "'FAILED tests/test_timeparse.py::test_parse_duration_rejects_garbage - Failed: DID NOT RAISE' "
                 "\"2 failed, 9 passed in 0.${n}4s\"; exit 1")


def _word(i: int) -> str:
    """A different word for each iteration: numbers alone are noise to a failure signature, and
    every iteration here must fail differently (no repeated_failure before the cap)."""
    letters = ""
    while True:
        i, r = divmod(i, 26)
        letters = "abcdefghijklmnopqrstuvwxyz"[r] + letters
        if i == 0:
            return "value_" + letters


def make_script(path: Path, iterations: int) -> None:
    acts = []
    for i in range(1, iterations + 1):
        acts.append([
            {"text": f"Attempt {i}: write the counter.",
             "tool_uses": [{"name": "write_file", "input": {"path": "n.txt", "content": f"{_word(i)}\n"}}],
             "usage": {"input_tokens": 1200, "output_tokens": 60, "cache_creation_input_tokens": 0,
                       "cache_read_input_tokens": 900}},
            {"text": f"Iteration {i}: I wrote the counter file with {i}; the check should now see it. "
                     "This summary is as long as a real model's closing paragraph usually is, "
                     "so that the prompt's history sections are exercised realistically.",
             "usage": {"input_tokens": 1300, "output_tokens": 80, "cache_creation_input_tokens": 0,
                       "cache_read_input_tokens": 900}},
        ])
    path.write_text(json.dumps({"version": 1, "acts": acts}))


def bench_loop(root: Path, iterations: int) -> dict:
    from roles.eval_agent import checks as eval_checks
    from roles.eval_agent.verifier import Verifier
    from roles.loop_agent.backends.factory import build
    from roles.loop_agent.engine import LoopEngine, LoopSettings
    from roles.workbench.workspace.history import WorkspaceHistory
    from state_db.bootstrap import init_home
    from state_db.kernel.home import OrgHome
    from state_db.writer import StateWriter

    home = OrgHome(root / "org")
    (home.root).mkdir(parents=True)
    home.config_path.write_text("[loop]\nno_progress_window = 5\n")
    cfg, _ = init_home(home)
    ws = root / "ws"
    ws.mkdir()
    (ws / "n.txt").write_text("0\n")
    script = root / "script.json"
    make_script(script, iterations)
    human = StateWriter(home.db_path, "human")
    with human.transaction() as tx:
        # the doer's file is data, outside the default (code only) change scope: named, as a user
        # submitting this run would (--scope n.txt), or the verified tree would never hold it
        tx.insert("work_items", {"id": "b1", "goal": GOAL, "workspace": str(ws), "verify": [FAILING_CHECK],
                                 "scope": ["n.txt"],
                                 "caps": {"max_iterations": iterations}, "backend": f"scripted:{script}",
                                 "status": "dispatched", "assigned_to": "loop-agent-1", "created_by": "bench",
                                 "created_at": time.time(), "updated_at": time.time()})
    built = build(f"scripted:{script}", cfg, home, "loop-agent-1")
    act_times: dict[int, float] = {}
    check_times: dict[int, float] = {}
    marks: dict[int, float] = {}

    class TimedBackend:
        name = built.backend.name

        def act(self, ctx, **kw):
            t0 = time.perf_counter()
            try:
                return built.backend.act(ctx, **kw)
            finally:
                act_times[ctx.iteration] = act_times.get(ctx.iteration, 0) + time.perf_counter() - t0

    real_run_check = eval_checks.run_check

    last_check: list[float] = []

    def timed_check(command, cwd, **kw):
        result = real_run_check(command, cwd, **kw)
        last_check.append(result.duration_ms / 1000)
        return result

    import roles.eval_agent.verifier as verifier_mod
    verifier_mod.run_check = timed_check
    verifier = Verifier(home, StateWriter(home.db_path, "eval-agent", "eval-agent"), timeout_s=30)

    def verify(work_id, n):
        verifier.verify(work_id, n)
        if n:                   # n == 0 is the preflight on the baseline, before the first act
            check_times[n] = last_check[-1]
            marks[n] = time.perf_counter()

    writer = StateWriter(home.db_path, "loop-agent", "loop-agent-1")
    history = WorkspaceHistory(home.history_dir / "b1.git", ws, defer=True)  # as the loop-agent runs it
    write_outs: list[float] = []
    flush = history.flush_pending

    def timed_flush():
        t0 = time.perf_counter()
        flush()
        write_outs.append(time.perf_counter() - t0)

    history.flush_pending = timed_flush
    engine = LoopEngine(writer, "b1", TimedBackend(), verify, history,
                        LoopSettings(no_progress=(iterations + 1, iterations + 1)))
    import gc
    gc.freeze()         # as a role process does once it is ready (roles/base/runtime.py)
    t_start = time.perf_counter()
    decision = engine.run()
    built.close()
    verifier_mod.run_check = real_run_check
    overheads = []
    prev = t_start
    for n in sorted(marks):
        wall = marks[n] - prev
        prev = marks[n]
        if n >= 2:
            overheads.append((wall - act_times.get(n, 0) - check_times.get(n, 0)) * 1000)
    rows = writer.conn.execute("SELECT n, prompt FROM iterations WHERE work_id='b1' ORDER BY n").fetchall()
    sizes = {r["n"]: json.loads(r["prompt"])["variable_bytes"] for r in rows}
    return {
        "overhead_ms_per_iteration": round(statistics.median(overheads), 3),
        "overhead_ms_p90": round(sorted(overheads)[int(len(overheads) * 0.9) - 1], 3),
        "overhead_ms_mean": round(statistics.fmean(overheads), 3),
        "write_out_ms_at_end": round(sum(write_outs) * 1000, 3),
        "act_ms_median": round(statistics.median(act_times.values()) * 1000, 3),
        "verify_command_ms_median": round(statistics.median(check_times.values()) * 1000, 3),
        "iterations": len(rows),
        "stop_reason": str(decision.reason) if decision else None,
        "variable_prompt_bytes_it3": sizes.get(3),
        "variable_prompt_bytes_it30": sizes.get(30),
        "variable_prompt_growth_ratio": round(sizes[30] / sizes[3], 3) if 30 in sizes and 3 in sizes else None,
    }


def fs_baseline(root: Path, n: int = 300) -> dict:
    """The file system's own cost on the bench's disk, measured in the same run: what a git
    ref update (new lock file, rename over the ref), a new loose object (temp file, rename) and
    an append to an open file (a reflog line) cost here: what a checkpoint writes."""
    root.mkdir(parents=True)
    ref = root / "ref"
    ref.write_text("0" * 40 + "\n")
    over, new, append = [], [], []
    log = os.open(root / "log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    for i in range(n):
        t0 = time.perf_counter()
        fd = os.open(f"{ref}.lock", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.write(fd, b"%040d\n" % i)
        os.close(fd)
        os.rename(f"{ref}.lock", ref)
        over.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        fd = os.open(root / f"tmp{i}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o444)
        os.write(fd, b"x" * 64)
        os.close(fd)
        os.rename(root / f"tmp{i}", root / f"obj{i}")
        new.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        os.write(log, b"%0199d\n" % i)
        append.append(time.perf_counter() - t0)
    os.close(log)
    return {"fs_ref_update_us_p50": round(statistics.median(over) * 1e6, 1),
            "fs_new_file_us_p50": round(statistics.median(new) * 1e6, 1),
            "fs_append_us_p50": round(statistics.median(append) * 1e6, 1)}


def cpu_baseline(rounds: int = 15) -> dict:
    """How fast this machine's CPU is right now, measured in the same run: a fixed piece of work
    shaped like an iteration's (SQLite transactions with JSON rows in memory, hashing,
    compression, string and dict work). The overhead moves with it when the host is busy."""
    import hashlib
    import sqlite3
    import zlib

    import orjson

    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        conn = sqlite3.connect(":memory:", isolation_level=None)
        conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, k TEXT, data TEXT)")
        conn.execute("CREATE INDEX t_k ON t (k)")
        for i in range(40):
            conn.execute("BEGIN IMMEDIATE")
            row = {"n": i, "summary": "x" * 300, "calls": [{"name": "write_file", "path": f"f{j}"} for j in range(8)]}
            conn.execute("INSERT INTO t (k, data) VALUES (?, ?)", (f"k{i % 7}", orjson.dumps(row).decode()))
            conn.execute("SELECT COUNT(*), MAX(id) FROM t WHERE k = ?", (f"k{i % 7}",)).fetchone()
            conn.execute("COMMIT")
            text = "\n".join(f"line {j}: {row['summary'][:40]}" for j in range(30))
            hashlib.sha1(zlib.compress(text.encode(), 1)).hexdigest()
        conn.close()
        times.append(time.perf_counter() - t0)
    return {"cpu_ref_ms_p50": round(statistics.median(times) * 1000, 3)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.add_argument("--iterations", type=int, default=30, help="iterations of the overhead run (≥ 30 for the ratio)")
    p.add_argument("--files", type=int, default=10_000, help="workspace size for the checkpoint figure")
    args = p.parse_args(argv)
    from bench.common import quiet_logs
    quiet_logs()
    from bench.history_bench import bench_checkpoint

    with tempfile.TemporaryDirectory(prefix="lo-bench-") as tmp:
        figures = bench_loop(Path(tmp) / "loop", args.iterations)
        figures.update(fs_baseline(Path(tmp) / "fs"))
    figures.update(cpu_baseline())
    if os.access("/dev/shm", os.W_OK):
        # the same run with the org home and workspace in memory: the engine's own cost, apart
        # from the disk's (reported, not a target)
        with tempfile.TemporaryDirectory(prefix="lo-bench-", dir="/dev/shm") as tmp:
            in_memory = bench_loop(Path(tmp) / "loop", args.iterations)
        figures["overhead_ms_per_iteration_tmpfs"] = in_memory["overhead_ms_per_iteration"]
    with tempfile.TemporaryDirectory(prefix="lo-bench-") as tmp:
        figures.update(bench_checkpoint(Path(tmp) / "ckpt", files=args.files))
    from bench.common import at_most, finish
    return finish(figures, TARGETS, at_most(figures, TARGETS), as_json=args.json)


if __name__ == "__main__":
    sys.exit(main())
