"""Workspaces across hosts: what a joined host's checkpoint costs with its push to the
coordinator host's history over git://, beside a local checkpoint in the same run.

Usage: ``bench/hosts.py --json [--checkpoints N]``.

A real ``git daemon`` (``roles.workbench.serve.gitserve``) on 127.0.0.1 serves a coordinator-side
history whose baseline a ``WorkspaceHistory`` recorded; a ``RemoteHistory`` fetches it and
records N checkpoints of one changed file, each pushed before it returns, and a plain local
``WorkspaceHistory`` records the same N as the baseline.

- ``checkpoint_push_ms_p50``: a joined host's checkpoint, push included (median);
- ``raw_checkpoint_local_ms_p50`` (the same-run baseline): the same checkpoint on one host;
- ``baseline_fetch_ms``: a fresh joined host taking the baseline (fetch and checkout).
Target: ``checkpoint_push_ms_p50`` ≤ 250 (an act takes seconds; a push must not be what a run
waits for).
"""
from __future__ import annotations

import argparse
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TARGETS = {"checkpoint_push_ms_p50": 250.0}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bench(root: Path, checkpoints: int) -> dict:
    from roles.workbench.serve.gitserve import GitServer
    from roles.workbench.workspace.history import WorkspaceHistory
    from roles.workbench.workspace.remote import RemoteHistory

    ws = root / "coordinator" / "ws"
    (ws / "src").mkdir(parents=True)
    for i in range(50):
        (ws / "src" / f"m{i}.py").write_text(f"def f{i}():\n    return {i}\n")
    history_dir = root / "coordinator" / "history"
    history_dir.mkdir()
    WorkspaceHistory(history_dir / "w1.git", ws).baseline()
    port = _free_port()
    server = GitServer(history_dir, "127.0.0.1", port)
    server.start()
    try:
        remote = RemoteHistory(root / "worker" / "history" / "w1.git", root / "worker" / "ws",
                               remote=f"git://127.0.0.1:{port}/w1.git", defer=True)
        t0 = time.perf_counter()
        remote.baseline()
        fetch_ms = (time.perf_counter() - t0) * 1000
        local_ws = root / "local" / "ws"
        local_ws.mkdir(parents=True)
        local = WorkspaceHistory(root / "local" / "h.git", local_ws, defer=True)
        local.baseline()
        times: dict[str, list[float]] = {"push": [], "local": []}
        for n in range(1, checkpoints + 1):
            for name, h in (("push", remote), ("local", local)):
                (h.workspace / "f.txt").write_text(f"{n}\n")
                started = time.perf_counter()
                h.checkpoint(n)
                times[name].append((time.perf_counter() - started) * 1000)
        pushed = WorkspaceHistory(history_dir / "w1.git", ws).iteration_commit(checkpoints)
        assert pushed == remote.iteration_commit(checkpoints), "the last checkpoint did not reach the coordinator"
    finally:
        server.stop()
    return {"checkpoint_push_ms_p50": round(statistics.median(times["push"]), 2),
            "checkpoint_push_ms_max": round(max(times["push"]), 2),
            "raw_checkpoint_local_ms_p50": round(statistics.median(times["local"]), 2),
            "baseline_fetch_ms": round(fetch_ms, 1), "checkpoints": checkpoints}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.add_argument("--checkpoints", type=int, default=20, help="checkpoints recorded on each side")
    args = p.parse_args(argv)
    from bench.common import at_most, finish, quiet_logs
    quiet_logs()
    with tempfile.TemporaryDirectory(prefix="lo-bench-") as tmp:
        figures = bench(Path(tmp), args.checkpoints)
    return finish(figures, TARGETS, at_most(figures, TARGETS), as_json=args.json)


if __name__ == "__main__":
    sys.exit(main())
