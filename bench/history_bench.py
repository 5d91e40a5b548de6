"""Timing of the workspace history (libgit2, ``roles/workbench/workspace``) on a large workspace (called by
``bench/loop.py`` and ``bench/org.py``)."""
from __future__ import annotations

import statistics
import time
from pathlib import Path

from roles.workbench.workspace.history import WorkspaceHistory


def bench_checkpoint(tmpdir: Path, files: int = 10_000, repeats: int = 7) -> dict[str, float]:
    """Time the history on a ``files``-file workspace; one file changed per measured step.

    The history is held as the running loop holds it (``defer=True``: its index, the stat cache,
    is written out every few dozen changed entries and when the run stops). Returns milliseconds
    (medians): ``checkpoint_ms_10k_files``, ``fingerprint_ms_10k_files``, ``reset_ms_10k_files``,
    ``materialize_fresh_ms_10k_files`` (into an empty directory),
    ``materialize_reused_ms_10k_files`` (into the previous snapshot: only changes rewritten),
    ``index_write_ms_10k_files`` (writing the index out, as at the run's stop) and the one-off
    ``baseline_ms_10k_files``; the keys say 10k whatever ``files`` is.
    """
    if repeats < 2:
        raise ValueError("repeats must be >= 2 (the reused snapshot needs a previous one)")
    root = Path(tmpdir)
    ws = root / "workspace"
    per_dir = 100
    for i in range(files):
        d = ws / f"pkg{i // per_dir:03d}"
        if i % per_dir == 0:
            d.mkdir(parents=True)
        name = f"test_m{i}.py" if i % 50 == 0 else f"m{i}.py"
        (d / name).write_text(f"VALUE_{i} = {i}\n")
    hist = WorkspaceHistory(root / "history" / "bench.git", ws, defer=True)
    t = time.perf_counter()
    hist.baseline()
    baseline_ms = (time.perf_counter() - t) * 1000
    target = ws / "pkg000" / "m1.py"

    def timed(fn) -> float:
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1000

    checkpoint, fingerprint, reset, fresh, again = [], [], [], [], []
    for n in range(1, repeats + 1):
        target.write_text(f"VALUE_1 = {n}\n")
        fingerprint.append(timed(hist.fingerprint_of_workspace))
        target.write_text(f"VALUE_1 = {n} # again\n")
        checkpoint.append(timed(lambda: hist.checkpoint(n)))
    snapshot = root / "snapshot-reused"
    hist.materialize(hist.iteration_commit(1), snapshot)
    for n in range(2, repeats + 1):
        again.append(timed(lambda: hist.materialize(hist.iteration_commit(n), snapshot)))
    index_write = []
    for n in range(min(repeats, 3)):
        target.write_text(f"changed after the checkpoint {n}\n")
        hist.fingerprint_of_workspace()
        index_write.append(timed(hist.flush_pending))
        reset.append(timed(lambda: hist.reset_to(hist.iteration_commit(repeats))))
        dest = root / f"snapshot{n}"
        fresh.append(timed(lambda: hist.materialize(hist.iteration_commit(repeats), dest)))
    return {
        "checkpoint_ms_10k_files": _median(checkpoint),
        "fingerprint_ms_10k_files": _median(fingerprint),
        "reset_ms_10k_files": _median(reset),
        "materialize_fresh_ms_10k_files": _median(fresh),
        "materialize_reused_ms_10k_files": _median(again),
        "index_write_ms_10k_files": _median(index_write),
        "baseline_ms_10k_files": round(baseline_ms, 1),
        "files": files,
    }


def _median(values: list[float]) -> float:
    return round(statistics.median(values), 1)
