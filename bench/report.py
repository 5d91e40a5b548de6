"""Run every benchmark's default run and write ``bench/RESULTS.md``.

Usage: ``bench/report.py [--out bench/RESULTS.md] [--only NAME ...] [--figures NAME=FILE ...] [--update]``. Runs transport, loop, org,
chaos and soak, then any other ``bench/<name>.py`` that takes ``--json``, one after the other,
each with its default arguments or those ``ARGS`` names (the chaos run at 120 items, 14 kills).

Each benchmark prints one JSON object with ``targets`` (figure → target, as ``"<= 5"`` or a bare
number meaning "at most") and ``pass`` (figure → bool). The report puts each figure beside its
target with pass/fail, lists the same-run baselines (figures named ``raw_*``) and the other
scalar figures, and records the commit (``git rev-parse HEAD``, "dirty" with uncommitted
changes), the machine (uname, CPUs, Python) and the date. Exit 1 when a target fails or a
benchmark produced no JSON. ``--figures NAME=FILE`` takes a benchmark's figures from the JSON it
printed earlier instead of running it (a run longer than the report's time bound, such as
``bench/verifier.py --json``'s full corpora); a benchmark's lists of case names (figures named
``*_cases``) are listed after the other figures. ``--update`` replaces only the lines of the
benchmarks run (or given) in the existing report and keeps every other benchmark's.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCHES = ("transport", "loop", "org", "chaos", "soak")   # first, in this order; then any other benchmark


def benchmarks() -> list[str]:
    """Every ``bench/<name>.py`` that takes ``--json`` (helpers and this report aside)."""
    found = sorted(p.stem for p in (ROOT / "bench").glob("*.py")
                   if p.stem != "report" and '"--json"' in p.read_text(errors="replace"))
    return [b for b in BENCHES if b in found] + [b for b in found if b not in BENCHES]
TIMEOUT_S = 600
# The runs the report records where a benchmark's default is a quick one: the chaos run at the
# size the issues ask for (120 items, 14 kills: ~80 s here).
# The paired run holds the loop and org figures against the last commit before the history moved
# onto libgit2 and the loop became next-step data, measured in the same minutes (bench/pair.py).
PAIR_AGAINST = "c3b909c"
ARGS = {"chaos": ["--items", "120", "--kills", "14", "--seconds", "70"],
        "chaos_pg": ["--items", "120", "--kills", "14", "--seconds", "70"],
        "pair": ["--against", PAIR_AGAINST],
        "verifier": ["--quick"]}
SKIP = {"targets", "pass", "ok", "samples", "definitions", "suspends", "detail", "final", "home",
        "lost_item_ids", "submit_error_samples", "recovery_timeout_samples"}


def run_bench(name: str) -> dict:
    """Run ``bench/<name>.py --json``; returns its figures plus ``_exit``, ``_seconds``, ``_error``."""
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, str(ROOT / "bench" / f"{name}.py"), "--json", *ARGS.get(name, ())],
                            cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.terminate()                         # SIGTERM: the benchmark stops the org it started
        try:
            proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
        return {"_exit": None, "_seconds": TIMEOUT_S, "_error": f"timed out after {TIMEOUT_S}s"}
    seconds = round(time.monotonic() - t0, 1)
    lines = [ln for ln in stdout.splitlines() if ln.startswith("{")]
    try:
        figures = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        tail = " | ".join(stderr.strip().splitlines()[-3:])
        return {"_exit": proc.returncode, "_seconds": seconds, "_error": f"no JSON on stdout: {tail}"}
    return {**figures, "_exit": proc.returncode, "_seconds": seconds, "_error": None}


# the columns of a benchmark's per-N tables (bench/scale.py): the first sweep, the real-latency one
PER_N = ("n", "iterations_per_s", "bound_per_s", "ratio", "added_latency_ms_p50", "overhead_ms_p99", "dispatch_ms_p50",
         "sqlite_write_wait_ms_p99", "cpu_ms_per_iteration", "machine_cpu_ms_per_iteration",
         "model_double_cpu_ms_per_iteration", "host_cpu_busy", "eval_agent_busy", "startup_ms", "pss_mb.loop_agent_mean")
PER_N_REAL = ("n", "iterations_per_s", "bound_per_s", "ratio", "dispatch_ms_p50", "dispatch_ms_p99", "submit_ms_per_item",
              "sqlite_write_wait_ms_p99", "org_pss_mb", "host_cpu_busy", "machine_cpu_ms_per_iteration",
              "added_latency_ms_p50", "binds")
STEPS_SHOWN = 8         # a role's steps listed in the CPU-by-step table (its largest)


def _dig(row: dict, key: str):
    for part in key.split("."):
        row = row.get(part) if isinstance(row, dict) else None
    return row


def target_text(target) -> str:
    return f"<= {target}" if isinstance(target, (int, float)) and not isinstance(target, bool) else str(target)


def fmt(value) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:,.3f}".rstrip("0").rstrip(".") if abs(value) < 1000 else f"{value:,.0f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    if isinstance(value, dict):
        return ", ".join(f"{k}: {fmt(v)}" for k, v in value.items()) or "—"
    if isinstance(value, list):
        return ", ".join(fmt(v) for v in value) or "—"
    return "—" if value is None else str(value)


def _numbers(value: list) -> bool:
    """A list shown among the other figures: repeated measurements (e.g. every start-up)."""
    return bool(value) and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in value)


def commit() -> str:
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                           capture_output=True, text=True).stdout.strip()
    return (head or "unknown") + (" (dirty)" if dirty else "")


def machine() -> str:
    u = platform.uname()
    return (f"{u.system} {u.release} {u.machine}; {os.cpu_count()} CPUs; Python {platform.python_version()} "
            f"({platform.python_implementation()})")


def load() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def render(results: dict[str, dict], started: str, load_before: str = "") -> tuple[str, bool]:
    ok = True
    out = ["# Benchmark results", "",
           "Generated by `bench/report.py` (each benchmark's default run, `bench/<name>.py --json`); "
           "do not edit by hand.", "",
           f"- date: {started}", f"- commit: `{commit()}`", f"- machine: {machine()}",
           f"- load average (1 / 5 / 15 min) before: {load_before or '—'}; after: {load()}", "",
           "## Targets", "", "| benchmark | figure | value | target | result |", "|---|---|---|---|---|"]
    for name, r in results.items():
        if r["_error"]:
            ok = False
            out.append(f"| {name} | (run) | — | JSON figures | **FAIL**: {r['_error']} |")
            continue
        for key, target in r.get("targets", {}).items():
            passed = r.get("pass", {}).get(key)
            ok = ok and passed is True
            out.append(f"| {name} | `{key}` | {fmt(r.get(key))} | {target_text(target)} | "
                       f"{'pass' if passed else '**FAIL**'} |")
    baselines = [(n, k, v) for n, r in results.items() for k, v in r.items() if k.startswith("raw_")]
    out += ["", "## Same-run baselines", ""]
    out += [f"- {n} `{k}`: {fmt(v)}" for n, k, v in baselines] or ["- none"]
    out += ["", "## Other figures", ""]
    for name, r in results.items():
        extra = {k: v for k, v in r.items() if not k.startswith("_") and k not in SKIP and not k.startswith("raw_")
                 and k not in r.get("targets", {}) and not (isinstance(v, list) and not _numbers(v))}
        ran = f"figures from {r['_from']}" if r.get("_from") else f"exit {r['_exit']}, {r['_seconds']} s"
        out.append(f"- **{name}** ({ran})"
                   + (": " + "; ".join(f"`{k}` {fmt(v)}" for k, v in extra.items()) if extra else ""))
    for name, r in results.items():
        for key, cols, title in (("per_n", PER_N, "per number of loop-agents"),
                                 ("per_n_real", PER_N_REAL, "per number of loop-agents at a hosted model's latency")):
            if r.get(key):
                out += ["", f"## {name}: {title}", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
                out += ["| " + " | ".join(fmt(_dig(row, k)) for k in cols) + " |" for row in r[key]]
        for row in [*r.get("per_n", []), *r.get("per_n_real", [])]:
            by_step = row.get("cpu_ms_per_iteration_by_step")
            if not by_step:
                continue
            source = row.get("cpu_steps_run")         # the steps measured in a run of their own
            out += ["", f"## {name}: CPU per iteration by role and step at N = {row['n']} (ms, calls)"
                    + (f" — {source}" if source else ""), "",
                    "| role | process | SQL | steps (thread CPU, inclusive) |", "|---|---|---|---|"]
            for role, got in by_step.items():
                steps = list(got.get("steps", {}).items())[:STEPS_SHOWN]
                out.append(f"| {role} | {fmt(got.get('process_ms'))} | {fmt(got.get('sql_ms'))} | "
                           + "; ".join(f"{step} {fmt(v['ms'])} ({fmt(v['calls'])})" for step, v in steps) + " |")
    for name, r in results.items():
        named = {k: v for k, v in r.items() if k.endswith("_cases") and isinstance(v, list) and v}
        if named:
            out += ["", f"## {name}: cases", ""] + [f"- `{k}` ({len(v)}): {', '.join(map(str, v))}"
                                                   for k, v in named.items()]
    definitions = next((r["definitions"] for r in results.values() if r.get("definitions")), None)
    if definitions:
        out += ["", "## Chaos figures, defined", ""] + [f"- `{k}`: {v}." for k, v in definitions.items()]
    out += ["", f"Overall: **{'all targets met' if ok else 'a target failed'}**.", ""]
    return "\n".join(out), ok


def _sections(text: str) -> list[tuple[str, list[str]]]:
    """``text`` as (header, lines) pairs, the part before the first ``## `` header first."""
    out: list[tuple[str, list[str]]] = [("", [])]
    for line in text.splitlines():
        if line.startswith("## "):
            out.append((line, []))
        elif not line.startswith("Overall: "):
            out[-1][1].append(line)
    return out


def merge(old: str, new: str, names: list[str]) -> tuple[str, bool]:
    """The report ``old`` with the lines and sections of the benchmarks ``names`` taken from the
    report ``new`` (both written by ``render``); the other benchmarks' lines stay as they were.
    Returns (text, whether every target in it is met)."""
    def mine(line: str) -> bool:
        return any(line.startswith(p) for n in names for p in (f"| {n} |", f"- {n} `", f"- **{n}**"))

    def own(header: str) -> bool:
        return any(header.startswith(f"## {n}: ") for n in names)

    fresh = dict(_sections(new))
    out = []
    for header, lines in _sections(old):
        if own(header):
            continue
        if not header:                                  # the heading keeps the full run's date and commit
            when = {ln.split(":", 1)[0]: ln.split(":", 1)[1].strip() for ln in fresh[""] if ln.startswith("- ")}
            note = f"- updated: {', '.join(names)} at {when.get('- date', '?')}, commit {when.get('- commit', '?')}"
            lines = [ln for ln in lines if not ln.startswith(f"- updated: {', '.join(names)} ")]
            at = max((i for i, ln in enumerate(lines) if ln.startswith("- ")), default=len(lines) - 1) + 1
            lines = [*lines[:at], note, *lines[at:]]
        kept = [ln for ln in lines if not mine(ln)]
        while kept and not kept[-1]:
            kept.pop()
        added = [ln for ln in fresh.get(header, []) if mine(ln)]
        out += ([header] if header else []) + kept + added + [""]
    for header, lines in fresh.items():
        if own(header):
            out += [header, *lines]
    ok = not any("**FAIL**" in ln for ln in out)
    while out and not out[-1]:
        out.pop()
    out += ["", f"Overall: **{'all targets met' if ok else 'a target failed'}**.", ""]
    return "\n".join(out), ok


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(ROOT / "bench" / "RESULTS.md"), help="where to write the report")
    p.add_argument("--only", nargs="*", choices=benchmarks(), help="run only these benchmarks")
    p.add_argument("--figures", nargs="*", default=[], metavar="NAME=FILE",
                   help="take NAME's figures from FILE (the JSON it printed) instead of running it")
    p.add_argument("--update", action="store_true",
                   help="replace only these benchmarks' lines in the existing report, keeping the others'")
    args = p.parse_args(argv)
    started, load_before = time.strftime("%Y-%m-%d %H:%M:%S %Z"), load()
    results = {}
    for spec in args.figures:
        name, _, file = spec.partition("=")
        try:
            results[name] = {**json.loads(Path(file).read_text()), "_exit": None, "_seconds": None, "_error": None,
                             "_from": file}
        except (OSError, ValueError) as exc:
            print(f"error[bad_figures]: {spec}: {exc} — give NAME=FILE, FILE the JSON the benchmark printed",
                  file=sys.stderr)
            return 2
    for name in args.only or benchmarks():
        if name in results:
            continue
        print(f"running bench/{name}.py --json ...", file=sys.stderr, flush=True)
        results[name] = run_bench(name)
        print(f"  done in {results[name]['_seconds']} s (exit {results[name]['_exit']})", file=sys.stderr)
    text, ok = render(results, started, load_before)
    if args.update and Path(args.out).exists():
        text, ok = merge(Path(args.out).read_text(), text, list(results))
    Path(args.out).write_text(text)
    print(f"wrote {args.out}: {'all targets met' if ok else 'a target failed'}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
