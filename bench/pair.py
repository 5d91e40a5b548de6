"""Paired runs against an earlier commit: are this tree's loop and org figures worse than its?

Usage: ``bench/pair.py --json --against REV [--bench loop org] [--rounds N]``.

On this 2-CPU virtual machine one benchmark moves by half again from hour to hour (its CPU and its
disk both), so a figure is compared only with the earlier commit's measured in the same minutes:
``REV`` is checked out into a temporary git worktree and the two trees' runs alternate, round
after round, each in a fresh process. The earlier tree runs on this checkout's virtual
environment, plus any dependency it declared that this one no longer has, installed from the
package index into a throwaway overlay (``pip install --target``).

- ``loop``: ``bench.loop.bench_loop(…, 30)`` three times a round in each tree (in-process
  engine, real state.db, shadow history and verifier): ``loop_overhead_ms`` and
  ``loop_overhead_ms_earlier`` are the medians of ``overhead_ms_per_iteration``.
- ``org``: ``bench/org.py --json`` once a round in each tree (a real org on ipc://): the medians of
  its dispatch latency, iteration overhead, eval snapshot, start-up and resume, each beside the
  earlier tree's (``…_earlier``).

Every figure comes with ``…_change`` (this tree's median less the earlier one's: negative is
better) and the samples. No targets: it answers "no worse than before?", with numbers.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import tomllib
from importlib import metadata
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import BenchError  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ORG_FIGURES = ("dispatch_to_first_act_ms_p50", "iteration_overhead_ms_p50", "eval_snapshot_ms_10k_files",
               "startup_ms", "resume_ms")
LOOP_RUNS = 3        # bench_loop runs per round and tree, in one process (imports paid once)
RUN_TIMEOUT_S = 300

LOOP_CODE = """
import json, sys, tempfile
from pathlib import Path
from bench.common import quiet_logs
quiet_logs()
from bench.loop import bench_loop
with tempfile.TemporaryDirectory(prefix="pair-") as t:
    bench_loop(Path(t), 4)       # imports and first connections, out of the figures
out = []
for _ in range(int(sys.argv[1])):
    with tempfile.TemporaryDirectory(prefix="pair-") as t:
        out.append(bench_loop(Path(t), 30)["overhead_ms_per_iteration"])
print(json.dumps(out))
"""


class Tree:
    """A source tree and the interpreter that runs it."""

    def __init__(self, root: Path, python: str, env: dict[str, str], timeout_s: float = RUN_TIMEOUT_S) -> None:
        self.root, self.python, self.env, self.timeout_s = root, python, env, timeout_s

    def run(self, args: list[str]) -> str:
        what = f"{self.root}: {' '.join(Path(a).name if a.endswith('.py') else a for a in args[:2])}"
        try:
            proc = subprocess.run([self.python, *args], cwd=self.root, env=self.env, capture_output=True,
                                  text=True, timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            raise BenchError("bench_timeout", f"{what} ran longer than {self.timeout_s:.0f} s and was stopped",
                             "run that benchmark on its own to see where it waits") from None
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(("{", "["))]
        if not lines:
            tail = " | ".join(proc.stderr.strip().splitlines()[-3:]) or "nothing on stderr"
            raise BenchError("bench_failed", f"{what} printed no figures (exit {proc.returncode}): {tail}",
                             "run that benchmark on its own to see why")
        return lines[-1]

    def loop(self) -> list[float]:
        return json.loads(self.run(["-c", LOOP_CODE, str(LOOP_RUNS)]))

    def org(self) -> dict:
        return json.loads(self.run([str(self.root / "bench" / "org.py"), "--json"]))


def _env(root: Path, extra: list[str] = ()) -> dict[str, str]:
    """The tree first on the path (its packages shadow any installed copy), then ``extra``."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = os.pathsep.join([str(root), *extra])
    return env


def _missing(tree: Path) -> list[str]:
    """The requirements ``tree`` declares that this environment does not have installed."""
    from packaging.requirements import Requirement
    declared = tomllib.loads((tree / "pyproject.toml").read_text())["project"].get("dependencies", [])
    out = []
    for spec in declared:
        try:
            metadata.version(Requirement(spec).name)
        except metadata.PackageNotFoundError:
            out.append(spec)
    return out


def earlier_tree(rev: str, scratch: Path) -> Tree:
    """``rev`` checked out under ``scratch``, with what it needs beyond this environment."""
    tree = scratch / "tree"
    _step(["git", "-C", str(ROOT), "worktree", "add", "--detach", "--quiet", str(tree), rev], 120,
          "worktree_failed", f"git could not check out {rev[:12]}", "see 'git worktree list' and prune what is stale")
    extra = []
    missing = _missing(tree)
    if missing:
        target = scratch / "overlay"
        _step([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
               "--target", str(target), *missing], 600, "install_failed",
              f"pip could not install what {rev[:12]} needs ({', '.join(missing)})",
              "check that the package registry is reachable")
        extra.append(str(target))
    return Tree(tree, sys.executable, _env(tree, extra))


def _step(argv: list[str], timeout_s: float, code: str, what: str, todo: str) -> None:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise BenchError(code, f"{what}: no answer in {timeout_s:.0f} s", todo) from None
    if proc.returncode != 0:
        tail = " | ".join(proc.stderr.strip().splitlines()[-2:])
        raise BenchError(code, f"{what}: {tail or f'exit {proc.returncode}'}", todo)


def _median(xs: list[float]) -> float:
    return round(statistics.median(xs), 3)


def compare(this: Tree, earlier: Tree, benches: list[str], rounds: int) -> dict:
    samples: dict[str, tuple[list[float], list[float]]] = {}
    for _ in range(rounds):
        for which, tree in ((0, this), (1, earlier)):       # alternate: the same minutes for both
            if "loop" in benches:
                samples.setdefault("loop_overhead_ms", ([], []))[which].extend(tree.loop())
            if "org" in benches:
                figures = tree.org()
                for name in ORG_FIGURES:
                    if figures.get(name) is not None:
                        samples.setdefault(f"org_{name}", ([], []))[which].append(figures[name])
    out: dict = {}
    for name, (mine, theirs) in samples.items():
        if not mine or not theirs:
            continue
        out[name] = _median(mine)
        out[f"{name}_earlier"] = _median(theirs)
        out[f"{name}_change"] = round(out[name] - out[f"{name}_earlier"], 3)
        out.setdefault("samples", {})[name] = {"this": mine, "earlier": theirs}
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.add_argument("--against", required=True, help="the earlier commit (any git revision)")
    p.add_argument("--bench", nargs="+", choices=("loop", "org"), default=["loop", "org"])
    p.add_argument("--rounds", type=int, default=3, help="rounds of alternating runs")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", "--quiet", f"{args.against}^{{commit}}"],
                         capture_output=True, text=True).stdout.strip()
    if not rev:
        print(f"error[bad_revision]: {args.against!r} is not a commit of this repository — "
              "name one that 'git log' shows", file=sys.stderr)
        return 2
    scratch = Path(tempfile.mkdtemp(prefix="lo-pair-"))
    try:
        earlier = earlier_tree(rev, scratch)
        this = Tree(ROOT, sys.executable, _env(ROOT))
        figures = {"against": rev[:12], "rounds": args.rounds, **compare(this, earlier, args.bench, args.rounds)}
    except BenchError as exc:
        print(exc.line(), file=sys.stderr)
        return 1
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(scratch / "tree")],
                       capture_output=True, timeout=60)
        shutil.rmtree(scratch, ignore_errors=True)
    from bench.common import finish
    return finish(figures, {}, {}, as_json=args.json)


if __name__ == "__main__":
    sys.exit(main())
