"""The verifier cannot be fooled (issue 14 proof), through the real org processes and sandbox.

Every run is scripted through the anthropic backend (``scripted:FILE``) on its own small git
repository (``hostile_tricks``): ``calc.py`` has a bug, ``test_calc.py`` one failing test, the
verify command is pytest under this project's interpreter (shown read-only in the sandbox).
One org serves the whole module: the preflight failures run first, alone, so the scripted
servers' logs can show that no model request was made; then every other run is submitted at
once and each test waits for its own. Sandbox failure needs an org whose ``bwrap`` fails, so it
gets its own. What the verifier does not stop yet is marked as an expected failure (strict: the
mark must go when it is stopped).
"""
from __future__ import annotations

import json
import os
import shutil
import sys
from contextlib import contextmanager

import pytest

from tests.e2e.hostile_tricks import (CALC_BUGGY, CALC_FIXED, FORGERIES, POSITIVE_CONTROL, TESTS, TRICKS, Trick,
                                      make_workspace, org_cli, outcome, prepare, pytest_command, stubborn_doer, submit)
from tests.support.org import cleanup, query, running_org, short_home_dir, wait_for, write_config

pytestmark = pytest.mark.timeout(420)

PY = sys.executable
CPU_SECONDS = 10              # also the verify commands' time limit: the baseline timeout case sleeps past it
MAX_ITERATIONS = 2
STUBBORN_ITERATIONS = 6
NO_PROGRESS_REPEAT = 3
CONFIG = f"""
[org]
loop_agents = 4
[supervisor]
heartbeat_s = 0.2
heartbeat_timeout_s = 10.0
stop_timeout_s = 6.0
[sandbox]
cpu_seconds = {CPU_SECONDS}
[loop]
no_progress_repeat = {NO_PROGRESS_REPEAT}
no_progress_window = 5
"""
# preflight failure kind -> (baseline files, verify command, what the stop detail must quote)
UNRUNNABLE = {
    "missing_binary": ({}, "no-such-tool-xyz --check", ("exit 127", "not found")),
    "not_executable": ({"check.sh": "#!/bin/sh\nexit 0\n"}, "./check.sh", ("exit 126", "Permission denied")),
    "baseline_timeout": ({}, "sleep 60", ("timed out", "sandbox.cpu_seconds")),
}
BASELINE_PASSES = ("baseline_passes_rejected", "baseline_passes_approved")


@pytest.fixture(scope="module")
def org():
    with running_org(CONFIG) as home:
        yield home


def ended(home, wid: str, timeout: float = 300.0) -> dict:
    return wait_for(lambda: (r := query(home, "SELECT * FROM work_items WHERE id=?", (wid,))[0])["status"] == "ended"
                    and r, timeout=timeout, interval=0.2, what=f"{wid} to end")


def scripted_requests(home) -> int:
    """Requests the scripted model servers of ``home`` answered or refused (their JSONL logs)."""
    return sum(len(p.read_text().splitlines()) for p in home.logs_dir.glob("scripted-*.jsonl*"))


@pytest.fixture(scope="module")
def preflights(org):
    """The runs whose verify command cannot run on the baseline, submitted before any other
    run of the org (so no scripted server has been asked anything yet); -> kind -> results."""
    root = org.root.parent / "preflight"
    kinds = list(UNRUNNABLE)
    prepared = {}
    for kind in kinds:
        files, command, _ = UNRUNNABLE[kind]
        trick = Trick(kind, ((),), files={"calc.py": CALC_BUGGY, "test_calc.py": TESTS, **files})
        prepared[kind] = prepare(root, trick, PY, verify=(command,))
    # the slow one first without waiting, so the others' waits overlap it
    slow = submit(org, prepared["baseline_timeout"])
    results = {k: submit(org, prepared[k], wait=True) for k in kinds if k != "baseline_timeout"}
    results["baseline_timeout"] = slow
    for kind in kinds:
        results[kind]["work"] = ended(org, results[kind]["id"], timeout=60)
    requests = scripted_requests(org)
    return {k: {**r, "requests_before_any_other_run": requests} for k, r in results.items()}


@pytest.fixture(scope="module")
def runs(org, preflights):
    """Every other run of the module, submitted at once: name -> (Trick, submit result)."""
    root = org.root.parent / "runs"
    passing = {"calc.py": CALC_FIXED, "test_calc.py": TESTS}
    plan: list[tuple[Trick, int]] = [(Trick(name, ((),), files=passing), 1) for name in BASELINE_PASSES]
    plan += [(POSITIVE_CONTROL, MAX_ITERATIONS), (stubborn_doer(STUBBORN_ITERATIONS), STUBBORN_ITERATIONS)]
    plan += [(t, MAX_ITERATIONS) for t in (*TRICKS, *FORGERIES)]
    return {t.name: (t, submit(org, prepare(root, t, PY, max_iterations=n))) for t, n in plan}


def test_an_empty_verify_command_is_refused_at_submit(org):
    ws = make_workspace(org.root.parent / "empty-verify", {"calc.py": CALC_FIXED}, PY)
    code, _, err = org_cli(org, "submit", "fix it", "--workspace", str(ws), "--verify", "",
                           "--backend", "scripted:/nonexistent.json")
    assert code != 0 and err.startswith("error[empty_verify]"), err
    blank = org_cli(org, "submit", "fix it", "--workspace", str(ws), "--verify", "   ")
    assert blank[0] != 0 and "error[empty_verify]" in blank[2]
    assert query(org, "SELECT COUNT(*) AS c FROM work_items WHERE workspace=?", (str(ws),))[0]["c"] == 0


@pytest.mark.parametrize("kind", list(UNRUNNABLE))
def test_an_unrunnable_verify_command_ends_the_run_before_any_model_request(org, preflights, kind):
    """verify_unrunnable at the preflight, naming the command and quoting what the shell said."""
    got = preflights[kind]
    _, command, quoted = UNRUNNABLE[kind]
    work = got["work"]
    assert work["stop_reason"] == "verify_unrunnable", work
    assert f"`{command}`" in work["stop_detail"] and all(q in work["stop_detail"] for q in quoted), work["stop_detail"]
    if kind != "baseline_timeout":                  # submitted with a wait: org submit printed the outcome
        assert got["exit"] == 3 and got["preflight"]["outcome"] == "unrunnable", got
    pre = query(org, "SELECT outcome, written_by FROM preflights WHERE work_id=?", (got["id"],))
    assert pre and pre[0]["outcome"] == "unrunnable" and pre[0]["written_by"].startswith("eval-agent")
    assert query(org, "SELECT COUNT(*) AS c FROM model_calls WHERE work_id=?", (got["id"],))[0]["c"] == 0
    assert query(org, "SELECT COUNT(*) AS c FROM iterations WHERE work_id=?", (got["id"],))[0]["c"] == 0
    assert got["requests_before_any_other_run"] == 0


def _baseline_passes_decision(org, wid: str) -> dict:
    pending = "SELECT * FROM decisions WHERE work_id=? AND status='pending'"
    return wait_for(lambda: (rows := query(org, pending, (wid,))) and rows[0], timeout=120,
                    what=f"the baseline_passes decision of {wid}")


def test_a_baseline_that_already_passes_asks_a_human_and_reject_ends_the_run(org, runs):
    wid = runs["baseline_passes_rejected"][1]["id"]
    d = _baseline_passes_decision(org, wid)
    assert d["kind"] == "baseline_passes" and "passes already" in d["question"]
    assert query(org, "SELECT COUNT(*) AS c FROM model_calls WHERE work_id=?", (wid,))[0]["c"] == 0
    code, _, err = org_cli(org, "decide", d["id"], "reject", "nothing to do")
    assert code == 0, err
    assert ended(org, wid)["stop_reason"] == "human_rejected"
    assert query(org, "SELECT COUNT(*) AS c FROM iterations WHERE work_id=?", (wid,))[0]["c"] == 0


def test_a_baseline_that_already_passes_goes_on_when_approved(org, runs):
    wid = runs["baseline_passes_approved"][1]["id"]
    d = _baseline_passes_decision(org, wid)
    code, _, err = org_cli(org, "decide", d["id"], "approve")
    assert code == 0, err
    work = ended(org, wid)
    assert query(org, "SELECT COUNT(*) AS c FROM iterations WHERE work_id=?", (wid,))[0]["c"] >= 1, work
    assert work["stop_reason"] != "human_rejected"


@contextmanager
def org_with_failing_bwrap():
    """An org whose PATH finds a ``bwrap`` that cannot build a sandbox (exits 1, as bubblewrap
    does when user namespaces are refused)."""
    from scripts import control
    from state_db.bootstrap import init_home
    from state_db.kernel.home import OrgHome

    root = short_home_dir()
    fake = root / "fakebin"
    fake.mkdir()
    (fake / "bwrap").write_text("#!/bin/sh\necho 'bwrap: setting up uid map: Permission denied' >&2\nexit 1\n")
    (fake / "bwrap").chmod(0o755)
    home = OrgHome(root / "org")
    write_config(home, CONFIG)
    init_home(home)
    try:
        control.start_background(home, timeout_s=20, env={"PATH": f"{fake}:{os.environ['PATH']}"})
        yield home
    finally:
        cleanup(home)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def sandbox_failure(runs):
    """One run in an org whose bwrap fails (while the main org works through ``runs``); what
    it left, read before that org is removed."""
    with org_with_failing_bwrap() as home:
        got = submit(home, prepare(home.root.parent / "ws", POSITIVE_CONTROL, PY), wait=True)
        work = ended(home, got["id"], timeout=60)
        calls = query(home, "SELECT COUNT(*) AS c FROM model_calls WHERE work_id=?", (got["id"],))[0]["c"]
        log = [json.loads(line) for line in (home.logs_dir / "eval-agent.log").read_text().splitlines()
               if line.startswith("{")]
        return {"submit": got, "work": work, "model_calls": calls, "requests": scripted_requests(home),
                "tries": [e for e in log if e.get("event") in ("verify_failed", "verify_gave_up")]}


def test_a_sandbox_that_cannot_start_ends_the_run_before_any_model_request(sandbox_failure):
    """verify_unrunnable (sandbox_failed) after a bounded number of retries; no token spent."""
    got, work = sandbox_failure["submit"], sandbox_failure["work"]
    assert work["stop_reason"] == "verify_unrunnable", work
    assert "sandbox_failed" in work["stop_detail"] and "Permission denied" in work["stop_detail"], work
    assert got["exit"] == 3 and got["preflight"]["outcome"] == "unrunnable"
    assert sandbox_failure["model_calls"] == 0 and sandbox_failure["requests"] == 0
    tries = sandbox_failure["tries"]
    assert 1 <= len(tries) <= 3 and tries[-1]["event"] == "verify_gave_up", tries


def test_a_sandbox_that_cannot_start_names_the_verify_command(sandbox_failure):
    assert f"`{pytest_command(PY)}`" in sandbox_failure["work"]["stop_detail"], sandbox_failure["work"]["stop_detail"]


def test_the_positive_control_reaches_goal_met_in_one_iteration(org, runs):
    """The doer really fixes the bug: the eval-agent passes it, on the evidence of tests that ran."""
    wid = runs[POSITIVE_CONTROL.name][1]["id"]
    work = ended(org, wid)
    assert work["stop_reason"] == "goal_met", work
    got = outcome(org, wid, POSITIVE_CONTROL)
    assert [(v["iteration"], v["outcome"]) for v in got.verdicts] == [(1, "pass")]
    v = got.verdicts[0]
    assert v["written_by"].startswith("eval-agent") and v["evidence"] == "pytest: 2 ran, 2 passed (from its report)", v
    assert v["checks"][0]["evidence"] == "tests" and v["checks"][0]["tests"]["passed"] == 2
    assert not v["held_back"] and not v["protected_changed"]


HOSTILE = [*TRICKS, *FORGERIES]


@pytest.mark.parametrize("trick", HOSTILE, ids=lambda t: t.name)
def test_a_hostile_doer_never_gets_goal_met_and_the_verdict_names_why(org, runs, trick):
    wid = runs[trick.name][1]["id"]
    ended(org, wid)
    got = outcome(org, wid, trick)
    assert not got.fooled, f"{trick.name} fooled the verifier: {got.describe()}"
    assert got.verdicts and not got.missing, f"{trick.name}: no verdict names {got.missing}: {got.describe()}"
    # the doer is charged with its run: nothing here is the machine's fault
    assert got.work["stop_reason"] in ("max_iterations", "repeated_failure", "no_progress", "evidence_forged"), \
        got.describe()


def test_a_stubborn_doer_whose_failures_print_the_time_is_stopped_within_the_window(org, runs):
    trick = runs["stubborn_timestamps"][0]
    wid = runs["stubborn_timestamps"][1]["id"]
    work = ended(org, wid)
    assert work["stop_reason"] in ("repeated_failure", "no_progress"), work
    its = query(org, "SELECT n FROM iterations WHERE work_id=?", (wid,))
    assert len(its) <= NO_PROGRESS_REPEAT < STUBBORN_ITERATIONS, (len(its), work)
    got = outcome(org, wid, trick)
    tails = [v["checks"][0]["output_tail"] for v in got.verdicts]
    assert len({t for t in tails}) == len(tails) and all("computed at" in t for t in tails), tails
