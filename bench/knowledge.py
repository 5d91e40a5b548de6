"""Knowledge pipeline benchmark: consolidating raw notes and choosing skills.

Usage: ``bench/knowledge.py --json [--notes N] [--skills N] [--seed S]`` (default run ≤ 45 s).

- ``consolidate_ms_1000_notes``: a fresh org home's state.db holds 1,000 pending raw notes, the
  retros of a few hundred ended runs; the curator's own pass (``roles/curator/pipeline.py``)
  runs once and the time spent in ``knowledge.consolidate.consolidate`` is the figure — grouping,
  merging and the write transaction that creates the curated notes and archives every raw note.
  ``curator_pass_ms_1000_notes`` is the whole pass (scoring, candidate drafts, batch).
- ``select_skills_ms_500_skills``: ``skills.select.choose_skills`` for one work item's context
  (goal and verify commands) among 500 active skills, **warm** (the per-database index cached,
  as in a running loop-agent): median over many work items. ``select_skills_ms_500_skills_cold``
  is the first choice after the cache is dropped (the index is rebuilt from state.db).

Notes are generated deterministically from ``--seed``: about two thirds are what the curator
derives without a model (``knowledge.retro.derive`` over synthetic run records: outcome, failure,
fix and context notes), one third are model-written retros in Japanese. Runs draw from recurring
patterns (a check failing with a given error, in English or Japanese output) with variants:
values in the output, iteration counts, stop reasons, files changed, skills carried.
Informational: ``grouping_f1_failure_fix`` (pairwise F1 of the curated groups of failure and fix
notes against the pattern each run was generated from), ``notes_japanese`` (notes with Japanese
text), ``for_run_ms_warm`` (skills and curated knowledge chosen for a new run).
Targets: consolidate ≤ 2,000 ms, select ≤ 20 ms.
"""
from __future__ import annotations

import argparse
import hashlib
import random
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

_CJK = re.compile("[\u3040-\u30ff\u4e00-\u9fff]")
TARGETS = {"consolidate_ms_1000_notes": 2000.0, "select_skills_ms_500_skills": 20.0}

# Recurring patterns: (check, varying salient line, last salient line = what went wrong,
# files a fix changes, what the fix did). ``{n}`` varies from iteration to iteration.
PATTERNS = [
    ("pytest -q tests/test_timeparse.py", "E       AssertionError: assert {n} == 187200",
     "FAILED tests/test_timeparse.py::test_mixed_units - AssertionError", ["timeparse.py"],
     "parse_duration now sums every unit token"),
    ("python3 validate_config.py", 'expected int for "timeout", got str "{n}"',
     'SettingsError: "timeout" must be an integer number of seconds', ["settings.json"],
     "timeout is written as a whole number of seconds"),
    ("python3 -m unittest -q", '  File "loader.py", line {n}, in <module> (error)',
     "ModuleNotFoundError: No module named 'yaml'", ["loader.py", "requirements.txt"],
     "the loader parses JSON with the standard library instead of yaml"),
    ("npm test -- --runInBand", "    at renderList (src/list.js:{n}:17) error",
     "TypeError: Cannot read properties of undefined (reading 'map')", ["src/list.js"],
     "renderList returns an empty list when items is undefined"),
    ("cargo test --quiet", "test parser::tests::splits_fields ... FAILED (case {n})",
     "thread 'parser::tests::splits_fields' panicked at 'index out of bounds: the len is 3 but the index is 3'",
     ["src/parser.rs"], "the field loop stops before the last separator"),
    ("mypy --strict app", 'app/models.py:{n}: error: Revealed type is "builtins.str | None"',
     'app/models.py:41: error: Incompatible return value type (got "str | None", expected "str")',
     ["app/models.py"], "display_name falls back to the user name when the nickname is missing"),
    ("npx tsc --noEmit", "src/price.ts({n},5): error TS2322: Type 'string' is not assignable to type 'number'.",
     "Found 1 error in src/price.ts", ["src/price.ts"], "the price is parsed with Number() before it is stored"),
    ("go test ./...", '    codec_test.go:{n}: got "a,b" want "a;b" (fail)', "--- FAIL: TestRoundTrip",
     ["codec.go"], "Encode uses the separator from the options"),
    ("pytest -q tests/test_fetch.py", "E   urllib.error.URLError: <urlopen error [Errno 101]> attempt {n}",
     "FAILED tests/test_fetch.py::test_download - URLError: Network is unreachable", ["fetch.py"],
     "the fetcher reads a committed fixture instead of the network"),
    ("./scripts/check_migrations.sh", "error: checking 00{n}_add_index.sql",
     "error: migration 0007 depends on 0008 which is applied later", ["migrations/0007_add_index.sql"],
     "the index migration was renumbered after the table it indexes"),
    ("pytest -q tests/test_listing.py",
     "E       AssertionError: assert ['b.txt', 'a.txt'] == ['a.txt', 'b.txt'] seed {n}",
     "FAILED tests/test_listing.py::test_sorted - AssertionError", ["listing.py"],
     "the listing is sorted before it is returned"),
    ("python3 -m pytest tests/test_store.py -q", "E   sqlite3.OperationalError: database is locked (writer {n})",
     "FAILED tests/test_store.py::test_concurrent_writes - OperationalError", ["store.py"],
     "writes go through one connection with a busy timeout"),
    ("pytest -q tests/test_import_csv.py",
     "E   UnicodeDecodeError: 'utf-8' codec can't decode byte 0x82 in position {n}",
     "エラー: 顧客CSVの読み込みに失敗しました", ["importer.py"], "CSV は encoding='cp932' で読む"),
    ("python3 check_settings.py", '設定エラー: retry_interval = "{n}秒"',
     "設定エラー: retry_interval は秒数の整数で指定してください", ["config/app.toml"], "retry_interval を整数の秒数にした"),
    ("./bin/check-migrations", "エラー: 確認中 00{n}_create_orders.sql",
     "エラー: マイグレーションの順序が不正です", ["db/migrate/0012_create_orders.sql"], "マイグレーションの番号を振り直した"),
    ("npm test -- date", 'Expected: "令和{n}年4月1日" (失敗)', "失敗: 和暦の日付変換が期待値と一致しません",
     ["src/era.ts"], "元年の扱いを修正した"),
]
SKILL_NAMES = ["handle-assertionerror-pytest-timeparse", "fix-settingserror-validate-config",
               "handle-modulenotfounderror-unittest", "use-fixtures-for-network-tests", "handle-typeerror-npm-test"]
STOPS = ["goal_met"] * 6 + ["repeated_failure"] * 2 + ["max_iterations", "timeout"]
APPROACH = ["Changed {p} to {f}.", "Edited {p}; {f} (first try).", "Rewrote part of {p} so that {f}.",
            "Retried with a smaller change to {p}."]


def _sig(*parts) -> str:
    return hashlib.sha256("\n".join(map(str, parts)).encode()).hexdigest()[:16]


def synthetic_record(rng: random.Random, run_id: str):
    """A plausible ended run (see the module docstring) as ``knowledge.record.RunRecord``."""
    from knowledge.record import Check, Iteration, RunRecord
    from roles.eval_agent.evidence import failing_tests     # what the eval-agent records of a check

    k = rng.randrange(len(PATTERNS))
    check, detail, why, paths, fix = PATTERNS[k]
    stop = rng.choice(STOPS)
    fails = rng.choice([2, 2, 3, 4])
    cap = fails if stop == "max_iterations" else max(6, fails + 1)
    carried = rng.sample(SKILL_NAMES, rng.choice([0, 0, 0, 1, 2]))
    its, value = [], rng.randrange(1, 400)
    for n in range(1, fails + 2):
        passing = n == fails + 1
        if passing and stop != "goal_met":
            break
        if not (stop == "repeated_failure" and n == fails):
            value = rng.randrange(1, 400)                         # new detail: the run goes on
        tail = "\n".join([f"running {check}", detail.format(n=value), why])
        path = rng.choice(paths)
        summary = (f"Changed {path}: {fix}." if passing else rng.choice(APPROACH).format(p=path, f=fix))
        checks = [Check(check, True, "", 0, False, "ok")] if passing else \
            [Check(check, False, _sig(detail.format(n=value), why), 1, False, tail,
                   tests=tuple(failing_tests(None, tail)))]
        if rng.random() < 0.3:
            checks.append(Check("ruff check .", True, "", 0, False, "All checks passed!"))
        its.append(Iteration(n, "ok", summary, ({"name": "edit_file", "input": {"path": path}},), (path,),
                             None if passing else f"{why[:80]} again: try something else than {path}", "",
                             {"skills": carried, "knowledge": [], "lessons": list(range(1, n))},
                             rng.randrange(2000, 9000), 0.0, _sig(run_id, n), "pass" if passing else "fail",
                             tuple(checks), ()))
    tokens = sum(it.tokens for it in its)
    caps = {"max_iterations": cap, "budget_tokens": 400000, "timeout_s": 1800}
    elapsed = 1800.0 if stop == "timeout" else rng.uniform(20, 1500)
    return k, RunRecord(run_id, f"Make `{check}` pass", (check,), caps, "ended", stop, "", elapsed,
                        tuple(its), len(its) * 3, tokens, 0.0, ("claude-sonnet-4-5",), len(its), 0, None,
                        {name: (name, check) for name in carried})


def japanese_retro(rng: random.Random, k: int, run_id: str) -> list:
    """What a model writing in Japanese makes of a run on pattern ``k`` (the model-written form)."""
    from knowledge.notes import NoteDraft

    check, _, why, paths, fix = PATTERNS[k]
    a, times, path = rng.randrange(1, 4), rng.choice([2, 3]), rng.choice(paths)
    ok = rng.random() < 0.7
    out = [NoteDraft(
        f"実行 {run_id} は{'目標を達成して' if ok else '繰り返しの失敗で'}終了した（イテレーション {a + times} 回）。",
        f"停止理由は{'適切' if ok else '妥当'}だった: 検証コマンド `{check}` は毎回最後まで実行された。",
        f"予算に対する消費は{rng.randrange(10, 90)}%。教訓は{times}件書かれ、{rng.randrange(0, times + 1)}件が次の反復で守られた。",
        f"`{check}` で検証する作業全般。",
        {"kind": "outcome", "iterations": list(range(1, a + times + 1)), "checks": [check]})]
    variants = [f"同じ失敗が{times}回続いた場合は、同じ修正を繰り返さず方針を変えるべき。",
                f"「{why}」が2回以上出たら、{path} を見直してからやり方を変える。",
                f"`{check}` が同じ理由で失敗したときは、再試行の前にチェックの出力を読み直すこと。"]
    out.append(NoteDraft(
        f"イテレーション {a} から {a + times - 1} まで `{check}` が「{why}」で失敗した。",
        rng.choice(variants),
        f"{path} を{times}回変更したが同じエラーが出た。出力の最後の行が原因を示していた。手順としてチェックを再実行した。",
        f"`{check}` で検証し、出力に「{why}」が出る作業。",
        {"kind": "failure", "iterations": list(range(a, a + times)), "checks": [check]}))
    if ok:
        out.append(NoteDraft(
            f"イテレーション {a + times} で {path} を変更して `{check}` が通った: {fix}。",
            f"{path} の変更が有効だった: 同じ失敗が出たら、まずこの変更から始めるとよい。",
            f"それまでの{times}回は別の箇所を直していた。{fix}ことで解決した。",
            f"`{check}` が「{why}」で失敗する場合。",
            {"kind": "fix", "iterations": [a + times], "checks": [check]}))
    return out


class Run(NamedTuple):
    id: str
    author: str          # "derived" or "model"
    drafts: list
    goal: str
    pattern: int         # index in PATTERNS: the label the grouping is scored against


def generate_notes(seed: int, total: int) -> list[Run]:
    """Retros of many runs with exactly ``total`` notes between them."""
    from knowledge.retro import derive

    rng = random.Random(seed)
    out, count, r = [], 0, 0
    while count < total:
        r += 1
        run_id = f"w-{seed:x}-{r:04d}"
        k, rec = synthetic_record(rng, run_id)
        author = "model" if rng.random() < 0.35 else "derived"
        drafts = japanese_retro(rng, k, run_id) if author == "model" else derive(rec)
        drafts = drafts[: total - count]
        if not drafts:       # a run that taught nothing about the work (its checks could not run) has no retro
            continue
        out.append(Run(run_id, author, drafts, rec.goal, k))
        count += len(drafts)
    return out


def fresh_home(root: Path):
    from state_db.bootstrap import init_home
    from state_db.kernel.home import OrgHome

    home = OrgHome(root)
    home.root.mkdir(parents=True)
    init_home(home)
    return home


def store_runs(home, runs) -> None:
    """The runs ended (a human's cancel is enough for notes to refer to) and their retros written."""
    from knowledge.notes import write_retro
    from state_db.vocab import Actor, StopReason, WorkStatus
    from state_db.writer import StateWriter

    human, curator = StateWriter(home.db_path, Actor.HUMAN), StateWriter(home.db_path, Actor.CURATOR, "curator")
    now = time.time()
    with human.transaction(render=False) as tx:
        for run in runs:
            run_id = run.id
            tx.insert("work_items", {"id": run_id, "goal": run.goal, "workspace": f"/srv/ws/{run_id}",
                                     "verify": ["true"], "backend": "anthropic", "status": WorkStatus.QUEUED,
                                     "created_by": "bench", "created_at": now, "updated_at": now})
            tx.set_status("work_items", run_id, WorkStatus.ENDED, stop_reason=StopReason.CANCELLED)
    for run in runs:
        with curator.transaction(render=False) as tx:
            write_retro(tx, run.id, run.drafts, author=run.author)
    human.close()
    curator.close()


def bench_consolidate(root: Path, seed: int, total: int) -> dict:
    import knowledge.consolidate as K
    from knowledge.thresholds import Thresholds
    from roles.curator.pipeline import Pipeline
    from state_db.vocab import Actor
    from state_db.writer import StateWriter

    runs = generate_notes(seed, total)
    home = fresh_home(root)
    store_runs(home, runs)
    writer = StateWriter(home.db_path, Actor.CURATOR, "curator")
    spent: list[float] = []
    real = K.consolidate

    def timed(*a, **kw):
        t0 = time.perf_counter()
        try:
            return real(*a, **kw)
        finally:
            spent.append(time.perf_counter() - t0)

    K.consolidate = timed
    try:
        t0 = time.perf_counter()
        report = Pipeline(writer, Thresholds(), home.skills_dir).run()
        pass_ms = (time.perf_counter() - t0) * 1000
    finally:
        K.consolidate = real
    conn = writer.conn
    f1 = grouping_f1(conn, {r.id: r.pattern for r in runs})
    left = conn.execute("SELECT COUNT(*) FROM raw_notes WHERE status = 'pending'").fetchone()[0]
    curated = conn.execute("SELECT COUNT(*) FROM curated_notes").fetchone()[0]
    ja = sum(1 for (text,) in conn.execute("SELECT fact || judgment FROM raw_notes") if _CJK.search(text))
    writer.close()
    return {"consolidate_ms_1000_notes": round(spent[0] * 1000, 1), "curator_pass_ms_1000_notes": round(pass_ms, 1),
            "notes": total, "runs": len(runs), "notes_japanese": ja, "archived": report.archived,
            "pending_after": left, "curated_notes": curated, "patterns_scored": len(report.scored),
            "candidates_proposed": len(report.proposed), **f1, "home": home}


def grouping_f1(conn, pattern_of: dict[str, int]) -> dict:
    """Pairwise F1 of the failure and fix notes' curated groups against the pattern each run was
    generated from (label: kind and pattern, whatever the language): precision = pairs grouped
    together that share a label ÷ pairs grouped together; recall = ÷ pairs that share a label."""
    from collections import Counter

    rows = conn.execute("""SELECT run_id, curated_id, json_extract(evidence, '$.kind') FROM raw_notes
                            WHERE json_extract(evidence, '$.kind') IN ('failure', 'fix')""").fetchall()
    labels = [(kind, pattern_of[run]) for run, _, kind in rows]
    def pairs(counts: Counter) -> int:
        return sum(c * (c - 1) // 2 for c in counts.values())

    both = pairs(Counter((r[1], lab) for r, lab in zip(rows, labels)))
    grouped, same = pairs(Counter(r[1] for r in rows)), pairs(Counter(labels))
    p, r = both / grouped if grouped else 0.0, both / same if same else 0.0
    return {"grouping_f1_failure_fix": round(2 * p * r / (p + r), 3) if p + r else 0.0,
            "grouping_precision": round(p, 3), "grouping_recall": round(r, 3),
            "failure_fix_notes": len(rows), "failure_fix_groups": len({r[1] for r in rows})}


def skill_rows(seed: int, count: int) -> list[dict]:
    """``count`` distinct approved-skill texts in the drafting format (English and Japanese)."""
    from skills.names import name_for, validate_name

    rng = random.Random(seed + 1)
    verbs = ["handle", "fix", "use", "avoid", "check", "prefer", "split", "pin", "mock", "retry"]
    subjects = ["timeout", "encoding", "migration", "fixture", "lockfile", "snapshot", "locale", "schema", "cache",
                "retry", "flaky-order", "network", "config", "date", "import", "typing", "lint", "build"]
    out, names = [], set()
    while len(out) < count:
        check, _, why, paths, fix = rng.choice(PATTERNS)
        base = name_for("failure", why, f"{check}|{why}")
        name = f"{rng.choice(verbs)}-{rng.choice(subjects)}-{base.split('-', 1)[1]}"[:56].strip("-")
        name = validate_name(f"{name}-{len(out)}")
        if name in names:
            continue
        names.add(name)
        ja = rng.random() < 0.3
        when = (f"`{check}` で検証し、出力に「{why}」が出る作業。" if ja else
                f"Work items verified by `{check}` whose check output shows \"{why}\".")
        advice = (f"同じ失敗が2回続いたら {paths[0]} を見直してから方針を変える。" if ja else
                  f"When `{check}` fails twice with \"{why}\", look at {paths[0]} before retrying.")
        body = "\n".join([f"# {name}", "", "## When to use", f"- {when}", "", "## Steps",
                          f"1. Run `{check}` and find the line that says \"{why}\".",
                          f"2. Look at {', '.join(paths)} first: {fix}.", "3. Re-run the check after each change.",
                          "", "## Criteria and thresholds", f"- Seen in {rng.randrange(3, 9)} independent run(s).",
                          f"- {advice}", "", "## Pitfalls", "- Repeating the same change after the same failure."])
        out.append({"name": name, "description": f"Use for {when[0].lower() + when[1:]} {advice}"[:900], "body": body})
    return out


def install_skills(home, rows: list[dict]) -> None:
    """Curator proposes, a human approves: ``len(rows)`` active skills (files are not rendered)."""
    from skills import candidates as C
    from state_db.vocab import Actor, CandidateStatus
    from state_db.writer import StateWriter

    curator, human = StateWriter(home.db_path, Actor.CURATOR, "curator"), StateWriter(home.db_path, Actor.HUMAN)
    with curator.transaction(render=False) as tx:
        for r in rows:
            tx.insert("skill_candidates", {"id": f"c-bench-{r['name']}", **r, "score": 4, "signals": {},
                                           "source_notes": [], "status": CandidateStatus.PENDING, "created_at": tx.now})
    with human.transaction(render=False) as tx:
        for r in rows:
            C.decide(tx, f"c-bench-{r['name']}", "approve", "bench")
    curator.close()
    human.close()


def work_contexts(seed: int, count: int) -> list[dict]:
    rng = random.Random(seed + 2)
    out = []
    for i in range(count):
        check, _, why, paths, _ = rng.choice(PATTERNS)
        goal = rng.choice([f"Make `{check}` pass without editing the tests",
                           f"{paths[0]}: fix the failure \"{why}\"",
                           f"{paths[0]} を直して `{check}` を通す",
                           f"Ship the release: {check} must be green and the changelog updated"])
        out.append({"id": f"w-next-{i}", "goal": goal, "verify": [check] + (["ruff check ."] if i % 3 == 0 else [])})
    return out


def bench_select(home, seed: int, count: int, queries: int) -> dict:
    from skills import select
    from state_db.connection import connect

    install_skills(home, skill_rows(seed, count))
    conn = connect(home.db_path, readonly=True)
    works = work_contexts(seed, queries)
    cold = []
    for w in works[:5]:
        select._cache.clear()
        t0 = time.perf_counter()
        select.choose_skills(conn, select.context_of(w))
        cold.append((time.perf_counter() - t0) * 1000)
    warm, chosen = [], []
    for w in works:
        t0 = time.perf_counter()
        got = select.choose_skills(conn, select.context_of(w))
        warm.append((time.perf_counter() - t0) * 1000)
        chosen.append(len(got))
    run_ms = []
    for w in works[:20]:
        t0 = time.perf_counter()
        select.for_run(conn, w)
        run_ms.append((time.perf_counter() - t0) * 1000)
    active = conn.execute("SELECT COUNT(*) FROM skills WHERE status = 'active'").fetchone()[0]
    conn.close()
    return {"select_skills_ms_500_skills": round(statistics.median(warm), 3), "select_skills_cache": "warm",
            "select_skills_ms_p90": round(sorted(warm)[int(len(warm) * 0.9) - 1], 3),
            "select_skills_ms_500_skills_cold": round(statistics.median(cold), 1),
            "for_run_ms_warm": round(statistics.median(run_ms), 3),
            "active_skills": active, "work_items": len(works),
            "skills_chosen_mean": round(statistics.mean(chosen), 2)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print the figures as one JSON line")
    p.add_argument("--notes", type=int, default=1000, help="pending raw notes to consolidate")
    p.add_argument("--skills", type=int, default=500, help="active skills to choose among")
    p.add_argument("--queries", type=int, default=200, help="work items whose skills are chosen (warm figure)")
    p.add_argument("--seed", type=int, default=7, help="seed of the generated notes and skills")
    args = p.parse_args(argv)
    from bench.common import quiet_logs
    quiet_logs()

    with tempfile.TemporaryDirectory(prefix="lo-bench-") as tmp:
        figures = bench_consolidate(Path(tmp) / "org", args.seed, args.notes)
        home = figures.pop("home")
        figures.update(bench_select(home, args.seed, args.skills, args.queries))
    figures["seed"] = args.seed
    from bench.common import at_most, finish
    return finish(figures, TARGETS, at_most(figures, TARGETS), as_json=args.json)


if __name__ == "__main__":
    sys.exit(main())
