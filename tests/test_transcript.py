"""The transcript: every act of a real scripted run (the anthropic backend through the SDK against
the scripted model server, the eval-agent's verifier), read back by `org show --transcript` and
`org export --transcript`; discarded attempts keep theirs; the run's bound; secrets, control
sequences; retention."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from roles.loop_agent.backends.anthropic_backend import AnthropicBackend, AnthropicConfig
from roles.loop_agent.backends.retry import RetryPolicy
from roles.loop_agent.engine import LoopSettings
from roles.workbench.scripted.server import ScriptedServer
from scripts.cli.main import main
from state_db.queries.transcript import of_work
from state_db.retention import prune
from state_db.vocab import Actor
from state_db.writer import StateWriter
from tests.support.loop import BUGGY, FIXED, ScriptedActs, engine, make_workspace, submit
from tests.support.org import query

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[1]
MODEL = "demo-model"
PRICES = {MODEL: {"input": 3.0, "output": 15.0, "cache_write": 3.75, "cache_read": 0.3}}
SECRET = "sk-ant-transcript-secret-0123456789"
WRONG = BUGGY.replace("a - b", "a * b")


def script(extra_text: str = "") -> dict:
    return {"version": 1, "acts": [
        [{"text": "Reading calc.py first." + extra_text,
          "tool_uses": [{"name": "read_file", "input": {"path": "calc.py"}}]},
         {"text": "Multiplying instead.", "tool_uses": [{"name": "write_file",
                                                         "input": {"path": "calc.py", "content": WRONG}}]},
         {"text": "Iteration 1 done."}],
        [{"tool_uses": [{"name": "write_file", "input": {"path": "calc.py", "content": FIXED}}]},
         {"text": "Now it adds."}],
    ]}


@pytest.fixture
def scripted(tmp_path):
    def start(body: dict) -> ScriptedServer:
        path = tmp_path / "script.json"
        path.write_text(json.dumps(body))
        srv = ScriptedServer(path, tmp_path / "scripted.jsonl")
        srv.start()
        started.append(srv)
        return srv
    started: list[ScriptedServer] = []
    yield start
    for srv in started:
        srv.stop()


def backend(srv: ScriptedServer) -> AnthropicBackend:
    config = AnthropicConfig(model=MODEL, base_url=srv.base_url, timeout_s=10,
                             retry=RetryPolicy(max_attempts=2, base_delay_s=0.01, jitter=0))
    return AnthropicBackend(config, PRICES, environ={})


def cli(capsys, *argv) -> str:
    capsys.readouterr()
    assert main(list(argv)) == 0
    return capsys.readouterr().out


def test_a_scripted_run_s_transcript_shows_every_turn_tool_call_result_and_the_failing_verdict(
        org_home, tmp_path, scripted, capsys, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", SECRET)
    ws = make_workspace(tmp_path)
    submit(org_home, ws)
    srv = scripted(script(f" Key: {SECRET} \x1b]52;c;ZXZpbA==\x07 clip"))
    assert engine(org_home, "w1", backend(srv)).run().reason == "goal_met"

    shown = json.loads(cli(capsys, "show", "w1", "--transcript", "--json"))
    attempts = shown["attempts"]
    assert [(a["iteration"], a["discarded"]) for a in attempts] == [(1, False), (2, False)]
    first = attempts[0]
    kinds = [e["kind"] for e in first["entries"]]
    assert kinds == ["prompt", "turn", "text", "tool_call", "tool_result", "turn", "text", "tool_call",
                     "tool_result", "turn", "text", "outcome"]
    assert "Iteration: 1" in first["entries"][0]["data"]["text"]
    read = first["entries"][4]["data"]
    assert read["name"] == "read_file" and read["ok"] and "a - b" in read["output"]
    assert first["entries"][7]["data"]["input"] == {"path": "calc.py", "content": WRONG}
    # every model call's usage, as metered, and the verdict's failing output beside the acts
    assert [u["request_id"] for u in first["usage"]] == [e["data"]["request_id"] for e in first["entries"]
                                                         if e["kind"] == "turn"]
    assert first["verdict"]["outcome"] == "fail" and "AssertionError" in first["verdict"]["failing"][0]["output"]
    assert first["lesson"] and attempts[1]["verdict"]["outcome"] == "pass"
    # agent text is data: the key is redacted and the clipboard write is gone, wherever it is stored
    said = first["entries"][2]["data"]["text"]
    assert SECRET not in json.dumps(shown) and "[redacted]" in said and "\x1b" not in said and "clip" in said

    text = cli(capsys, "show", "w1", "--transcript", "--iteration", "1")
    assert "iteration 1 · attempt 1 (committed)" in text and "→ write_file" in text
    assert "verdict: fail" in text and "AssertionError" in text and "iteration 2" not in text

    lines = [json.loads(line) for line in cli(capsys, "export", "w1", "--transcript").splitlines()]
    heads = [ln for ln in lines if ln["type"] == "attempt"]
    assert [h["attempt"] for h in heads] == [1, 2] and all("entries" not in h for h in heads)
    assert len([ln for ln in lines if ln["type"] == "entry"]) == sum(len(a["entries"]) for a in attempts)


class KilledAfterTwoTurns(ScriptedActs):
    """Records like a backend: one turn with a tool call and its result, a second turn's usage,
    then the process is killed (kill -9) before the second turn's words are written."""

    def act(self, ctx, *, on_usage, budget_left):
        if ctx.attempt > 1:
            return super().act(ctx, on_usage=on_usage, budget_left=budget_left)
        from roles.loop_agent.backends.base import Usage
        on_usage(Usage(f"r-{ctx.attempt}-1", "m", 10, 5))
        ctx.record("turn", {"turn": 1, "request_id": f"r-{ctx.attempt}-1"})
        ctx.record("tool_call", {"id": "t1", "name": "run_command", "input": {"command": "make"}})
        ctx.record("tool_result", {"id": "t1", "name": "run_command", "ok": False, "output": "make: *** failed"})
        on_usage(Usage(f"r-{ctx.attempt}-2", "m", 10, 5))
        ctx.record("text", {"text": "never written: the process dies first"})
        os.kill(os.getpid(), signal.SIGKILL)


def killed_run(home) -> None:
    """Run w1 in a child process whose first act is killed after two model responses."""
    code = ("import sys; from pathlib import Path; from state_db.kernel.home import OrgHome; "
            "from tests.support.loop import engine; from tests.test_transcript import KilledAfterTwoTurns; "
            "engine(OrgHome(Path(sys.argv[1])), 'w1', KilledAfterTwoTurns([[]])).run()")
    got = subprocess.run([sys.executable, "-c", code, str(home.root)], cwd=ROOT, timeout=30)
    assert got.returncode == -signal.SIGKILL


def test_a_discarded_attempt_keeps_what_it_recorded_up_to_its_last_model_response(org_home, tmp_path):
    ws = make_workspace(tmp_path)
    submit(org_home, ws)
    killed_run(org_home)
    acts = KilledAfterTwoTurns([[{"write": {"calc.py": FIXED}}]])
    assert engine(org_home, "w1", acts).run().reason == "goal_met"
    w = StateWriter(org_home.db_path, Actor.HUMAN)
    attempts = of_work(w.conn, "w1")
    assert [(a["attempt"], a["discarded"], a["outcome"]) for a in attempts] == [(1, True, "discarded"),
                                                                                  (2, False, "committed")]
    kept = attempts[0]["entries"]
    assert [e["kind"] for e in kept] == ["prompt", "turn", "tool_call", "tool_result"]
    assert kept[3]["data"]["output"] == "make: *** failed" and len(attempts[0]["usage"]) == 2
    assert "verdict" not in attempts[0] and attempts[1]["verdict"]["outcome"] == "pass"
    w.close()


def test_a_run_s_transcript_stops_at_its_bound_and_says_so(org_home, tmp_path, scripted):
    ws = make_workspace(tmp_path)
    submit(org_home, ws, caps={"max_iterations": 3})
    big = "x" * 6000
    body = {"version": 1, "acts": [[{"text": big, "tool_uses": [{"name": "read_file", "input": {"path": "calc.py"}}]},
                                    {"text": big, "tool_uses": [{"name": "write_file",
                                                                 "input": {"path": "calc.py", "content": WRONG}}]},
                                    {"text": big}]], "repeat_last": True}
    srv = scripted(body)
    engine(org_home, "w1", backend(srv), settings=LoopSettings(transcript_bytes=20_000)).run()
    rows = query(org_home, "SELECT iteration, kind, LENGTH(data) AS size FROM transcript WHERE work_id='w1' "
                           "ORDER BY attempt, seq")
    assert rows[-1]["kind"] == "cut" and [r["kind"] for r in rows].count("cut") == 1 and rows[-1]["iteration"] == 1
    assert sum(r["size"] + 64 for r in rows) <= 20_000 + 200
    # the run went on after the cut: iteration 2 was committed and verified (then repeated_failure)
    assert query(org_home, "SELECT COUNT(*) AS n FROM verdicts WHERE work_id='w1'")[0]["n"] == 2


def test_retention_deletes_the_transcripts_of_runs_ended_long_ago_only(org_home, tmp_path):
    ws = make_workspace(tmp_path)
    submit(org_home, ws)
    killed_run(org_home)
    acts = KilledAfterTwoTurns([[{"write": {"calc.py": FIXED}}]])
    live = lambda: query(org_home, "SELECT COUNT(*) AS n FROM transcript")[0]["n"]  # noqa: E731
    before = live()
    sup = StateWriter(org_home.db_path, Actor.SUPERVISOR)
    # a running run's transcript stays whatever its age
    assert prune(sup, events_days=1, model_calls_days=1, ledger_keep_s=1, transcript_days=1,
                 now=time.time() + 5 * 86400)["transcript_entries"] == 0 and live() == before > 0
    engine(org_home, "w1", acts).run()
    assert prune(sup, events_days=30, model_calls_days=30, ledger_keep_s=1, transcript_days=30)["transcript_entries"] == 0
    out = prune(sup, events_days=30, model_calls_days=30, ledger_keep_s=1, transcript_days=2,
                now=time.time() + 3 * 86400)
    assert out["transcript_entries"] > before and live() == 0
    sup.close()


def test_hostile_content_is_bounded_and_never_stops_the_act():
    """Deep nesting, huge strings, many items and odd types from a model or a CLI are kept bounded."""
    from roles.loop_agent.transcript import Transcript
    deep: dict = {}
    node = deep
    for _ in range(500):
        node["x"] = {}
        node = node["x"]
    record = Transcript("w", 1, 1, run_bytes=200_000, clock=time.time)
    record.record("tool_call", {"name": "edit", "input": deep})
    record.record("tool_result", {"output": "y" * 1_000_000 + "THE END", "ok": True})
    record.record("tool_call", {"name": "many", "input": list(range(10_000)), "odd": object()})
    kept = [e["data"] for e in record._pending]
    assert len(kept) == 3
    assert len(json.dumps(kept[1])) < 9000 and kept[1]["output"].endswith("THE END")
    assert len(kept[2]["input"]) == 50 and isinstance(kept[2]["odd"], str)
    depth, node = 0, kept[0]["input"]
    while isinstance(node, dict):
        node, depth = node.get("x"), depth + 1
    assert depth <= 12 and isinstance(node, str)


class RaisesAfterATool(ScriptedActs):
    """Records a tool call and its result, then raises (a bug in a backend, not a crash)."""

    def act(self, ctx, *, on_usage, budget_left):
        if ctx.attempt > 1:
            return super().act(ctx, on_usage=on_usage, budget_left=budget_left)
        ctx.record("tool_call", {"id": "t1", "name": "run_command", "input": {"command": "make"}})
        ctx.record("tool_result", {"id": "t1", "name": "run_command", "ok": True, "output": "built"})
        raise RuntimeError("a backend bug")


def test_an_act_that_raises_keeps_what_it_recorded_with_the_error(org_home, tmp_path):
    ws = make_workspace(tmp_path)
    submit(org_home, ws)
    engine(org_home, "w1", RaisesAfterATool([[{"write": {"calc.py": FIXED}}]])).run()    # parks for a human
    rows = query(org_home, "SELECT kind, data FROM transcript WHERE work_id='w1' AND attempt=1 ORDER BY seq")
    assert [r["kind"] for r in rows] == ["prompt", "tool_call", "tool_result", "outcome"]
    ended = json.loads(rows[-1]["data"])
    assert ended["status"] == "error" and ended["error_code"] == "RuntimeError" and "a backend bug" in ended["error"]
