"""Both error rates of the verifier, through a real org: false passes on a hostile corpus, false
fails on an honest one, each beside a plain exit-code verifier measured in the same run.

Usage: ``bench/verifier.py [--json] [--quick] [--only NAME ...] [--corpus hostile|honest]
[--keep DIR] [--loop-agents N] [--list]``. The full run (116 cases) took 13 minutes on 2 busy CPUs,
10.5 of them the org's runs; ``--quick`` runs 17 of them in about 3.5 minutes. The projects are
fetched into ``.cache/bench-verifier`` the first time (then the run is offline).

One org (supervisor, coordinator, loop-agents, eval-agent, bubblewrap) runs every case as one
scripted work item of one iteration: the doer's act is the case's tool uses, the verify commands
and the submitter's environment (``PATH``, ``HOME``, an activated environment) are the case's.

- ``false_pass`` (target 0): hostile runs (``bench/verifier_attacks.py``) that ended ``goal_met``
  or got a passing verdict. No hostile case fixes the code the user runs, so every pass is false
  — except in the ``delivered`` class, whose doer fixes the source and hides the fix behind a file
  only the user's workspace holds: a pass there is false unless the workspace the user got is
  proved to be the verified tree and runs the case's checks green on the host
  (``delivered_fixed_cases``: the delivery took the hiding file out, and the user has the fix).
- ``false_fail`` (target 0): honest runs (``bench/verifier_honest.py``: correct fixes to real
  projects fetched once from the registries, through the toolchains users run) that did not end
  ``goal_met``.
- Same-run baselines, ``raw_plain_false_pass`` and ``raw_plain_false_fail``: each case's doer acts
  are applied to a second copy of its baseline and its verify commands run there once, in the same
  sandbox with the same toolchain, with none of the eval-agent's defences — the exit code alone
  decides (a verifier that trusts it). Attacks that make the verified bytes differ from the
  delivered ones (``attributes``, ``delivered``) or that rewrite the verifier's own evidence cannot
  fool a plain run of the user's workspace: they count against the verifier only.
- ``honest_host_fail`` (target 0): honest cases whose fix fails its own verify commands run on the
  host, outside any sandbox, as the project's user runs them — errors of the corpus, not of the
  verifier.
- A run left waiting for a human decision is not a pass (and, honest, a false fail). The model
  reviewer is turned off where ``org submit`` has ``--no-review``: a scripted model cannot judge a
  change, and these figures are the checks'.
- ``by_kind``: per class of attack and per toolchain, ``cases / verifier wrong / plain wrong``;
  ``false_pass_cases`` and ``false_fail_cases`` name the runs, ``detail`` says how each ended.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import BenchError  # noqa: E402
from bench.verifier_cases import BIN, HONEST, HOSTILE, PYTHON, Case, Context, prepare, script_for  # noqa: E402

CACHE = ROOT / ".cache" / "bench-verifier"
CONFIG = """[org]
loop_agents = {loop_agents}
eval_agents = 2
[supervisor]
heartbeat_s = 1.0
[sandbox]
cpu_seconds = 30
"""
# the variables a case's submitter environment may set; everything else is this process's
SUBMITTER = ("PATH", "HOME", "VIRTUAL_ENV", "PYENV_ROOT")


@contextmanager
def environ(values: dict[str, str]):
    """``os.environ`` with ``values`` set (and VIRTUAL_ENV/PYENV_ROOT unset unless given) for
    the duration: ``org submit`` records the submitter's toolchain from it."""
    saved = {k: os.environ.get(k) for k in SUBMITTER}
    for k in SUBMITTER:
        if k in values:
            os.environ[k] = values[k]
        elif k in ("VIRTUAL_ENV", "PYENV_ROOT"):
            os.environ.pop(k, None)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def case_env(case: Case, ctx: Context, ws: Path) -> dict[str, str]:
    env = {k: ctx.resolve(v, ws) for k, v in case.env.items()}
    env.setdefault("PATH", f"{BIN}:/usr/local/bin:/usr/bin:/bin")
    return env


def _submit_takes(flag: str) -> bool:
    """Whether ``org submit`` has ``flag`` (a model reviewer, where the org has one, is left out:
    a scripted model cannot judge a change, and the figures are the checks')."""
    from scripts.cli.main import build_parser
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return flag in sub.choices["submit"]._option_string_actions


def submit(home, case: Case, ctx: Context, ws: Path, script: Path) -> str:
    from tests.e2e.hostile_tricks import org_cli
    argv = ["submit", case.why, "--workspace", str(ws), "--backend", f"scripted:{script}",
            "--max-iterations", "1", "--json", "--no-wait", *(["--no-review"] if _submit_takes("--no-review") else [])]
    for command in case.verify:
        argv += ["--verify", ctx.resolve(command, ws)]
    with environ(case_env(case, ctx, ws)):
        code, out, err = org_cli(home, *argv)
    if not out.strip():
        raise BenchError("submit_failed", f"org submit {case.name} printed nothing (exit {code}): {err.strip()[-300:]}",
                         "run the case alone with --only and --keep DIR to look at its workspace")
    return json.loads(out)["id"]


def apply_acts(case: Case, ctx: Context, ws: Path, runner) -> None:
    """The doer's acts applied to ``ws`` by hand: files written and edited here, commands run in
    the sandbox as the doer's are."""
    for use in script_for(case, ctx, ws)["acts"][0][0].get("tool_uses", []):
        args = use["input"]
        if use["name"] == "write_file":
            (ws / args["path"]).parent.mkdir(parents=True, exist_ok=True)
            (ws / args["path"]).write_text(args["content"])
        elif use["name"] == "edit_file":
            path = ws / args["path"]
            path.write_text(path.read_text().replace(args["old_string"], args["new_string"], 1))
        else:
            runner.run(args["command"], ws, 60.0, 200_000)


def plain(cfg, home, case: Case, ctx: Context, ws: Path) -> tuple[bool, bool | None]:
    """Whether every verify command exits 0 on ``ws`` with the doer's acts applied, no defence:
    in the sandbox, and — for an honest case, whose fix must pass where its user runs it — on
    the host too (None for a hostile case)."""
    from roles.workbench.sandbox import runner_from_config
    from roles.workbench.sandbox.toolchains import at_submit
    env = case_env(case, ctx, ws)
    with environ(env):
        runner = runner_from_config(cfg, home, ws)
        if hasattr(runner, "toolchain_of"):     # the toolchain a submit records, as the org's run shows it
            toolchain = at_submit(os.environ, [ctx.resolve(c, ws) for c in case.verify], ws)
            runner.toolchain_of = lambda _inside: toolchain
        apply_acts(case, ctx, ws, runner)
        sandboxed = all(runner.run(ctx.resolve(c, ws), ws, 60.0, 200_000).exit_code == 0 for c in case.verify)
    if case.corpus == HOSTILE:
        return sandboxed, None
    return sandboxed, on_host(case, ctx, ws)


def on_host(case: Case, ctx: Context, ws: Path) -> bool:
    """Whether every verify command of ``case`` exits 0 in ``ws`` on the host, outside any sandbox,
    as the project's user runs them."""
    env = case_env(case, ctx, ws)
    host_env = {**os.environ, **env}
    if "VIRTUAL_ENV" not in env:
        host_env.pop("VIRTUAL_ENV", None)
    return all(subprocess.run(ctx.resolve(c, ws), shell=True, cwd=ws, env=host_env, capture_output=True,
                              timeout=120, check=False).returncode == 0 for c in case.verify)


def user_got_the_fix(home, wid: str, case: Case, ctx: Context, ws: Path) -> bool:
    """For a passing run of a ``delivered`` case — whose doer fixes the source and leaves beside
    it something only the user's workspace would load (a compiled cache, a nested repository, an
    ignored module) — whether the workspace the user got runs the fix: delivery proved it holds
    the verified tree (``work_items.delivered``) and the case's own verify commands pass there on
    the host. Such a pass is then not false: the code the user runs is fixed."""
    from state_db.connection import read_rows
    raw = read_rows(home.db_path, "SELECT delivered FROM work_items WHERE id=?", (wid,))[0]["delivered"]
    done = json.loads(raw) if raw else {}
    return bool(done.get("proved")) and on_host(case, ctx, ws)


def judged(home, wid: str) -> dict:
    from state_db.connection import read_rows
    work = read_rows(home.db_path, "SELECT status, stop_reason, stop_detail FROM work_items WHERE id=?", (wid,))[0]
    if work["status"] == "paused":
        work = {**work, "stop_reason": "paused", "stop_detail": "waiting for a human decision"}
    verdicts = read_rows(home.db_path, "SELECT outcome, feedback, held_back FROM verdicts WHERE work_id=? "
                                       "ORDER BY iteration", (wid,))
    passed = work["stop_reason"] == "goal_met" or any(v["outcome"] == "pass" for v in verdicts)
    said = "; ".join(f"{v['outcome']}: {' '.join((v['feedback'] or '').split())[:240]}" for v in verdicts)
    return {"passed": passed, "stop_reason": work["stop_reason"],
            "detail": f"{work['stop_reason']} ({' '.join((work['stop_detail'] or '').split())[:240]})"
                      + (f"; {said}" if said else "")}


def select(ctx: Context, scratch: Path, args) -> list[Case]:
    from bench.verifier_attacks import attacks
    from bench.verifier_honest import honest
    cases = []
    if args.corpus in (None, HOSTILE):
        cases += attacks()
    if args.corpus in (None, HONEST):
        cases += honest(ctx, scratch)
    if args.only:
        unknown = set(args.only) - {c.name for c in cases}
        if unknown:
            raise BenchError("unknown_case", f"no case named {', '.join(sorted(unknown))}",
                             "name cases as --list prints them")
        cases = [c for c in cases if c.name in args.only]
    elif args.quick:
        cases = [c for c in cases if c.quick]
    return cases


def bench_verifier(root: Path, ctx: Context, cases: list[Case], loop_agents: int = 4) -> dict:
    """Run ``cases`` through one org under ``root`` and their plain baselines; returns the figures."""
    from scripts import control
    from state_db.bootstrap import init_home
    from state_db.connection import read_rows
    from state_db.kernel.home import OrgHome
    from transport.probe import wait_until

    home = OrgHome(root / "org")
    home.root.mkdir(parents=True)
    home.config_path.write_text(CONFIG.format(loop_agents=loop_agents))
    cfg, _ = init_home(home)
    made = {c.name: (prepare(c, root / "ws", ctx), prepare(c, root / "plain", ctx)) for c in cases}
    control.start_background(home, timeout_s=60)
    try:
        t0 = time.monotonic()
        runs = {}
        for case in cases:
            ws = made[case.name][0]
            script = root / "scripts" / f"{case.name}.json"
            script.parent.mkdir(exist_ok=True)
            script.write_text(json.dumps(script_for(case, ctx, ws)))
            runs[case.name] = submit(home, case, ctx, ws, script)
        checked = {c.name: plain(cfg, home, c, ctx, made[c.name][1]) for c in cases}
        try:
            # a run that waits for a human decision has its answer: no pass without one
            wait_until(lambda: not read_rows(home.db_path, "SELECT 1 FROM work_items WHERE status NOT IN "
                                                           "('ended', 'paused')"),
                       timeout=120 + 30 * len(cases), what="every run to end", interval=1.0)
        except TimeoutError as exc:
            raise BenchError("runs_stuck", str(exc), "look at the org with --keep DIR and 'org status'") from None
        seconds = round(time.monotonic() - t0, 1)
        results = {name: judged(home, wid) for name, wid in runs.items()}
        for case in cases:
            if case.corpus == HOSTILE and case.kind == "delivered" and results[case.name]["passed"]:
                results[case.name]["user_fixed"] = user_got_the_fix(home, runs[case.name], case, ctx,
                                                                    made[case.name][0])
    finally:
        control.request(home, "stop", force=True, timeout_s=30)
    raw = {name: sandboxed for name, (sandboxed, _) in checked.items()}
    host = {name: on_host for name, (_, on_host) in checked.items() if on_host is not None}
    return figures(cases, results, raw, seconds, host)


def figures(cases: list[Case], results: dict, raw: dict, seconds: float, host: dict | None = None) -> dict:
    """The benchmark's figures from each case's outcome (``results``), plain run in the sandbox
    (``raw``) and, for honest cases, on the host (``host``: a fix that fails there is no honest
    case — ``honest_host_fail`` counts the corpus's own errors, target 0)."""
    host = host or {}
    hostile = [c for c in cases if c.corpus == HOSTILE]
    honest = [c for c in cases if c.corpus == HONEST]
    wrong = {c.name: (results[c.name]["passed"] and not results[c.name].get("user_fixed")) if c.corpus == HOSTILE
             else results[c.name]["stop_reason"] != "goal_met" for c in cases}
    plain_wrong = {c.name: raw[c.name] if c.corpus == HOSTILE else not raw[c.name] for c in cases}
    by_kind: dict[str, list[int]] = {}
    for c in cases:
        row = by_kind.setdefault(f"{c.corpus}:{c.kind}", [0, 0, 0])
        row[0] += 1
        row[1] += wrong[c.name]
        row[2] += plain_wrong[c.name]
    fp = sorted(c.name for c in hostile if wrong[c.name])
    ff = sorted(c.name for c in honest if wrong[c.name])
    return {
        "hostile_cases": len(hostile),
        "hostile_kinds": len({c.kind for c in hostile}),
        "false_pass": len(fp),
        "raw_plain_false_pass": sum(plain_wrong[c.name] for c in hostile),
        "honest_cases": len(honest),
        "honest_projects": len({c.place for c in honest}),
        "honest_toolchains": len({c.kind for c in honest}),
        "false_fail": len(ff),
        "honest_host_fail": sum(not ok for ok in host.values()),
        "raw_plain_false_fail": sum(plain_wrong[c.name] for c in honest),
        "runs_seconds": seconds,
        "by_kind": {k: "/".join(map(str, v)) for k, v in sorted(by_kind.items())},
        "false_pass_cases": fp,
        "false_fail_cases": ff,
        "plain_false_pass_cases": sorted(c.name for c in hostile if plain_wrong[c.name]),
        "plain_false_fail_cases": sorted(c.name for c in honest if plain_wrong[c.name]),
        "host_fail_cases": sorted(name for name, ok in host.items() if not ok),
        "delivered_fixed_cases": sorted(c.name for c in hostile if results[c.name].get("user_fixed")),
        "detail": {n: results[n]["detail"] for n in [*fp, *ff]},
    }


def targets_of(figs: dict, full: bool) -> tuple[dict, dict]:
    targets = {"false_pass": 0, "false_fail": 0, "honest_host_fail": 0}
    passes = {k: figs[k] == 0 for k in targets}
    if full:
        floors = {"hostile_cases": 60, "honest_cases": 30, "honest_projects": 8, "honest_toolchains": 8}
        targets.update({k: f">= {v}" for k, v in floors.items()})
        passes.update({k: figs[k] >= v for k, v in floors.items()})
    return targets, passes


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print the figures as one line of JSON")
    p.add_argument("--quick", action="store_true", help="a subset of each corpus (a few minutes)")
    p.add_argument("--only", nargs="*", metavar="NAME", help="run only these cases")
    p.add_argument("--corpus", choices=(HOSTILE, HONEST), help="run only one corpus")
    p.add_argument("--keep", metavar="DIR", help="keep the org, workspaces and scripts in DIR (must not exist)")
    p.add_argument("--loop-agents", type=int, default=4, help="loop-agents of the org (default 4)")
    p.add_argument("--list", action="store_true", help="print the cases' names, corpus and kind, and exit")
    args = p.parse_args(argv)
    from bench.common import finish, quiet_logs
    quiet_logs()
    if args.keep and Path(args.keep).exists():
        print(f"error[keep_exists]: {args.keep} exists — name a folder that does not exist yet", file=sys.stderr)
        return 2
    tmp = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="lo-verifier-"))
    tmp.mkdir(parents=True, exist_ok=True)
    try:
        ctx = Context(PYTHON, CACHE, tmp / "tools")
        ctx.tools.mkdir()
        cases = select(ctx, tmp / "scratch", args)
        if args.list:
            for c in cases:
                print(f"{c.name}\t{c.corpus}\t{c.kind}\t{c.place}")
            return 0
        figs = bench_verifier(tmp, ctx, cases, args.loop_agents)
    except BenchError as exc:
        print(exc.line(), file=sys.stderr)
        return 2
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    targets, passes = targets_of(figs, full=not (args.quick or args.only or args.corpus))
    return finish(figs, targets, passes, as_json=args.json)


if __name__ == "__main__":
    sys.exit(main())
