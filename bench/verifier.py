"""Hostile-doer benchmark: every trick of the hostile-doer suite against a real org's verifier.

Usage: ``bench/verifier.py --json [--max-iterations N] [--only NAME ...]`` (≈ 60 s on 2 CPUs).
One org (supervisor, coordinator, four loop-agents, eval-agent, bubblewrap) runs, all at once,
one scripted work item per trick of ``tests/e2e/hostile_tricks.py`` — the same definitions the
suite ``tests/e2e/test_hostile_doer.py`` proves — plus the positive control, a doer that really
fixes the bug.

- ``verifier_tricks_tried``: tricks run. ``verifier_fooled``: runs that ended ``goal_met`` or
  got a passing verdict (target 0). ``verifier_unnamed``: runs none of whose verdicts names what
  was held back, restored or refused (target 0). ``positive_control_goal_met``: the control
  ended ``goal_met`` (target true), in ``positive_control_iterations`` iterations.
- ``forgeries_tried`` / ``forgeries_fooled``: of those, the tricks ``hostile_tricks.FORGERIES``
  lists (code in the test runner's own process forging its output), also counted on their own.
- Same-run baseline ``raw_exit_code_fooled``: after the runs, each trick's verify commands run
  once more, in the same sandbox, on the doer's final workspace as it is — no file held back, no
  test restored, no evidence asked for. The tricks whose commands all exit 0 there would have
  fooled a verifier that trusts the exit code (the org before issue 14).
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CONFIG = """[org]
loop_agents = 4
[supervisor]
heartbeat_s = 0.5
[sandbox]
cpu_seconds = 30
"""


def _wait(pred, timeout, what):
    from transport.probe import wait_until
    try:
        return wait_until(pred, timeout=timeout, what=what, interval=0.2)
    except TimeoutError as exc:
        raise SystemExit(f"bench/verifier.py: {exc}") from None


def exit_code_alone(cfg, home, prepared) -> bool:
    """Whether every verify command of ``prepared`` exits 0 on the doer's final workspace."""
    from roles.sandbox import runner_from_config
    runner = runner_from_config(cfg, home, prepared.workspace)
    commands = [prepared.argv[i + 1] for i, a in enumerate(prepared.argv) if a == "--verify"]
    return all(runner.run(c, prepared.workspace, 60.0, 200_000).exit_code == 0 for c in commands)


def bench_verifier(root: Path, names: list[str] | None, max_iterations: int) -> dict:
    from roles.supervisor import control
    from state_db.bootstrap import init_home
    from state_db.connection import read_rows
    from state_db.home import OrgHome
    from tests.e2e.hostile_tricks import FORGERIES, POSITIVE_CONTROL, TRICKS, outcome, prepare, submit

    tricks = [t for t in (*TRICKS, *FORGERIES) if not names or t.name in names]
    open_names = {t.name for t in FORGERIES}
    home = OrgHome(root / "org")
    home.root.mkdir(parents=True)
    home.config_path.write_text(CONFIG)
    cfg, _ = init_home(home)
    control.start_background(home, timeout_s=30)
    try:
        t0 = time.monotonic()
        runs = {}
        for trick in [POSITIVE_CONTROL, *tricks]:
            prepared = prepare(root / "ws", trick, sys.executable, max_iterations=max_iterations)
            runs[trick.name] = (trick, prepared, submit(home, prepared)["id"])
        for _, _, wid in runs.values():
            _wait(lambda: read_rows(home.db_path, "SELECT 1 FROM work_items WHERE id=? AND status='ended'", (wid,)),
                  600, f"{wid} to end")
        seconds = round(time.monotonic() - t0, 1)
        results = {name: outcome(home, wid, trick) for name, (trick, _, wid) in runs.items()}
        naive = [name for name, (trick, prepared, _) in runs.items()
                 if trick is not POSITIVE_CONTROL and exit_code_alone(cfg, home, prepared)]
    finally:
        control.request(home, "stop", force=True, timeout_s=30)
    control_run = results.pop(POSITIVE_CONTROL.name)
    forgeries = {n: r for n, r in results.items() if n in open_names}
    fooled = sorted(n for n, r in results.items() if r.fooled)
    unnamed = sorted(n for n, r in results.items() if r.missing)
    return {
        "verifier_tricks_tried": len(results),
        "verifier_fooled": len(fooled),
        "verifier_unnamed": len(unnamed),
        "forgeries_tried": len(forgeries),
        "forgeries_fooled": sum(r.fooled for r in forgeries.values()),
        "positive_control_goal_met": control_run.work["stop_reason"] == "goal_met",
        "positive_control_iterations": len(control_run.verdicts),
        "raw_exit_code_fooled": len(naive),
        "runs_seconds": seconds,
        "fooled_tricks": fooled,
        "unnamed_tricks": unnamed,
        "exit_code_fooled_tricks": sorted(naive),
        "detail": {n: r.describe() for n, r in results.items() if r.fooled or r.missing},
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.add_argument("--max-iterations", type=int, default=2, help="iterations each hostile doer gets")
    p.add_argument("--only", nargs="*", metavar="NAME", help="run only these tricks (the positive control always runs)")
    args = p.parse_args(argv)
    from bench.common import finish, quiet_logs
    quiet_logs()
    tmp = Path(tempfile.mkdtemp(prefix="lo-"))
    try:
        figures = bench_verifier(tmp, args.only, args.max_iterations)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    targets = {"verifier_fooled": 0, "verifier_unnamed": 0, "positive_control_goal_met": "true"}
    passes = {"verifier_fooled": figures["verifier_fooled"] == 0, "verifier_unnamed": figures["verifier_unnamed"] == 0,
              "positive_control_goal_met": figures["positive_control_goal_met"] is True}
    return finish(figures, targets, passes, as_json=args.json)


if __name__ == "__main__":
    sys.exit(main())
