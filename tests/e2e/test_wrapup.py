"""A run that trips its token budget ends with the budget's stop reason and a hand-off note; its
one wrap-up act stays within the reserved slice and changes nothing (issue 20). Real org
processes (supervisor, coordinator, loop-agent, eval-agent, curator), the real sandbox, the
scripted model server reached through the anthropic backend."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.org import ONE_AGENT, query, running_org, wait_for

CONFIG = ONE_AGENT + '[model]\nbackend = "scripted"\n[loop]\nwrapup_reserve = 0.05\n'
BUDGET = 10_000                 # a slice of one input (2,000) and a note (300) kept for the wrap-up: acts stop at 7,700
SHOW_AND_FAIL = f"{sys.executable} -c 'import sys; print(\"error: state \" + open(\"state\").read()); sys.exit(1)'"


def _usage(inp: int, out: int) -> dict:
    return {"input_tokens": inp, "output_tokens": out}


def _script(path: Path) -> Path:
    """Three acts that each write another word and fail the check (2,500 budget tokens an act, the
    largest input 2,000: a fourth would begin at 7,500 and reach 7,700, where the budget trips with
    a slice of one such input and a note kept, so it is not begun), then the wrap-up: it tries to
    write a file (no such tool in a wrap-up) and writes its note."""
    acts = []
    for word in ("alpha", "beta", "gamma"):
        acts.append([{"text": f"Writing {word}.", "tool_uses": [{"name": "write_file", "input": {
            "path": "state", "content": word}}], "usage": _usage(300, 100)},
            {"text": f"I wrote {word} to state.", "usage": _usage(2000, 100)}])
    acts.append([{"text": "Let me leave a trace.", "tool_uses": [{"name": "write_file", "input": {
                     "path": "sneaky.txt", "content": "x"}}], "usage": _usage(150, 20)},
                 {"text": "Done: wrote four words to state.\nRemains: the state check still fails; it wants "
                          "another value.\nLearned: the words alone do not satisfy the check.",
                  "usage": _usage(180, 40)}])
    path.write_text(json.dumps({"version": 1, "acts": acts}))
    return path


def cli(home, *argv):
    return subprocess.run([sys.executable, "-m", "scripts.cli.main", *argv], capture_output=True, text=True,
                          timeout=90, env={**os.environ, "ORG_HOME": str(home.root)})


@pytest.fixture(scope="module")
def org():
    with running_org(CONFIG) as home:
        yield home


@pytest.mark.timeout(120)
def test_a_token_budget_ends_with_its_reason_and_a_hand_off_note_within_the_reserved_slice(org):
    ws = org.root.parent / "ws-wrapup"
    ws.mkdir()
    (ws / "state").write_text("start")
    script = _script(org.root.parent / "wrapup.json")
    got = cli(org, "submit", "make the state check pass", "--workspace", str(ws), "--verify", SHOW_AND_FAIL,
              "--scope", "state", "--backend", f"scripted:{script}", "--budget-tokens", str(BUDGET), "--max-iterations", "10",
              "--json", "--no-wait")
    assert got.returncode == 0, got.stderr
    wid = json.loads(got.stdout)["id"]
    done = wait_for(lambda: (r := query(org, "SELECT * FROM work_items WHERE id=?", (wid,))[0])["status"] == "ended"
                    and r, timeout=90, interval=0.2, what=f"{wid} to end")
    assert done["stop_reason"] == "token_budget", done["stop_detail"]

    notes = query(org, "SELECT * FROM handoffs WHERE work_id=?", (wid,))
    assert len(notes) == 1, notes
    note = notes[0]
    assert note["source"] == "wrapup" and note["ending"] == 1
    assert note["remains"].startswith("the state check still fails") and "do not satisfy" in note["learned"]
    allowance = json.loads(note["allowance"])
    # the slice: one input the size of the largest (2,000) and a note, within what the acts left
    assert 2_300 <= allowance["tokens"] <= BUDGET - 7_500
    wrap = query(org, "SELECT * FROM attempts WHERE work_id=? AND wrapup=1", (wid,))
    assert [a["attempt"] for a in wrap] == [note["attempt"]] and wrap[0]["outcome"] == "wrapped_up"
    calls = query(org, "SELECT input_tokens + cache_write_tokens + output_tokens AS t FROM model_calls "
                       "WHERE work_id=? AND attempt=?", (wid, note["attempt"]))
    assert len(calls) == 2 and sum(c["t"] for c in calls) == note["tokens"] <= allowance["tokens"]
    total = query(org, "SELECT SUM(input_tokens + cache_write_tokens + output_tokens) AS t FROM model_calls "
                       "WHERE work_id=?", (wid,))[0]["t"]
    assert total <= BUDGET
    # no iteration for the wrap-up, nothing written by it
    assert [r["n"] for r in query(org, "SELECT n FROM iterations WHERE work_id=? ORDER BY n", (wid,))] == [1, 2, 3]
    assert not (ws / "sneaky.txt").exists() and (ws / "state").read_text() == "gamma"
    assert f"in all" in done["stop_detail"] and str(total) in done["stop_detail"], done["stop_detail"]

    shown = cli(org, "show", wid)
    assert shown.returncode == 0, shown.stderr
    assert "hand-off (ending 1, written by the wrap-up act" in shown.stdout
    assert "remains: the state check still fails" in shown.stdout
    as_json = json.loads(cli(org, "show", wid, "--json").stdout)
    assert as_json["handoffs"][0]["learned"] == note["learned"]
    # the wrap-up act has its transcript too, marked as the wrap-up
    transcript = json.loads(cli(org, "show", wid, "--transcript", "--json").stdout)["attempts"]
    last = transcript[-1]
    assert last["wrapup"] and not last["discarded"] and last["attempt"] == note["attempt"]
    assert last["entries"][0]["data"]["wrapup"] and last["entries"][-1]["kind"] == "outcome"
    assert len(last["usage"]) == 2
