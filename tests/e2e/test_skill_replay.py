"""Skills prove their value before a human reviews them: replayed with and without, end to end.

Three runs hit the same failure the same way (the learning loop's settings family,
tests/e2e/test_learning_loop.py). Their scripted model behaves as a model would with a skill that
helps: when a skill is in its context (``## Skill:`` in the prompt) it writes the whole number
at once; without one it takes three iterations. From there the org's own processes do the rest:
the curator proposes a candidate, the coordinator plans and submits its replays (two source
items, each run with the candidate and without it, from their baselines), the batch opens only
once they ended, and the candidate shows WITH / WITHOUT / Δ. Replays write no knowledge and never
count as uses; the approved skill is carried by the next matching item. ``org skills eval`` on an
item whose model ignores skills shows no difference.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.e2e.test_learning_loop import (DEMO, NEXT, RUNS, _edit, cli, ended, settings_item, skilled_script, submit,
                                          workspace)
from tests.support.org import query, running_org, wait_for

pytestmark = pytest.mark.timeout(300)

CONFIG = """
[org]
loop_agents = 3
[supervisor]
heartbeat_s = 0.2
heartbeat_timeout_s = 10.0
stop_timeout_s = 6.0
[knowledge]
raw_notes_to_consolidate = 3
notes_per_pattern = 3
candidates_per_batch = 1
[learning]
replay = "on"
replay_items = 2
replay_concurrency = 4
"""


def helped_script(path: Path, timeout: str, seconds: int) -> Path:
    """Without a skill: unit stripped (still a string), a float, then the int — three iterations.
    With any skill in the prompt: the int at once."""
    acts = [
        [{"text": "Let me read the settings first.",
          "tool_uses": [{"name": "read_file", "input": {"path": "settings.json"}}]},
         *_edit(timeout, str(seconds), "Removed the unit from timeout.")],
        _edit(str(seconds), float(seconds), "The validator still rejects timeout; I wrote it as a number."),
        _edit(float(seconds), seconds, "timeout is now an integer number of seconds."),
    ]
    helped = [_edit(timeout, seconds, "The skill says: whole seconds, as an integer.")]
    path.write_text(json.dumps({"version": 1, "acts": acts,
                                "when": [{"prompt_contains": "## Skill: ", "acts": helped}]}))
    return path


@pytest.fixture
def org(monkeypatch):
    with running_org(CONFIG) as home:
        monkeypatch.setenv("ORG_HOME", str(home.root))
        yield home


def test_a_candidate_is_replayed_with_and_without_before_review_and_shows_its_difference(org, tmp_path):
    ids = submit(org, [settings_item(workspace(tmp_path, svc, t), svc, helped_script(tmp_path / f"{svc}.json", t, s))
                       for svc, t, s in RUNS])
    assert {r["stop_reason"] for r in ended(org, ids, timeout=60)} == {"goal_met"}

    # the coordinator plans the candidate's replays on two of the runs it came from, both arms each
    cand = wait_for(lambda: query(org, "SELECT id, name FROM skill_candidates WHERE status='pending'"),
                    timeout=30, what="a pending candidate")[0]
    plan = wait_for(lambda: query(org, "SELECT * FROM replay_plans WHERE subject=?", (cand["id"],)),
                    timeout=15, what=f"a replay plan for {cand['id']}")[0]
    items = json.loads(plan["items"])
    assert plan["status"] == "planned" and len(items) == 2, plan
    assert {i["relation"] for i in items} == {"source"} and {i["id"] for i in items} <= set(ids), items
    replays = wait_for(lambda: (r := query(org, "SELECT work_id, arm, source_id FROM replays WHERE subject=?",
                                           (cand["id"],))) and len(r) == 4 and r,
                       timeout=30, what="four replay runs submitted")
    assert sorted((r["source_id"], r["arm"]) for r in replays) == sorted(
        (i["id"], arm) for i in items for arm in ("with", "without"))
    runs = ended(org, [r["work_id"] for r in replays], timeout=90)
    assert {r["stop_reason"] for r in runs} == {"goal_met"}, runs
    work = {w["id"]: w for w in query(org, "SELECT id, origin, origin_id, workspace, ended_at FROM work_items")}
    assert all(work[r["work_id"]]["origin"] == "replay" and work[r["work_id"]]["origin_id"] == cand["id"]
               for r in replays)
    assert all(f"/replays/{cand['id']}/" in work[r["work_id"]]["workspace"] for r in replays)

    shown = cli(org, "show", replays[0]["work_id"])
    assert f"replay: {cand['id']} ({cand['name']}), {replays[0]['arm']} it, of {replays[0]['source_id']}" in shown, shown

    # each arm carried exactly what it measures: the candidate, or no skill at all
    for r in replays:
        manifests = [json.loads(p["prompt"])["skills"] for p in
                     query(org, "SELECT prompt FROM iterations WHERE work_id=? ORDER BY n", (r["work_id"],))]
        assert manifests and all(m == ([cand["name"]] if r["arm"] == "with" else []) for m in manifests), (r, manifests)

    # the batch opens once the replays ended, and the candidate shows WITH / WITHOUT / Δ
    batch = wait_for(lambda: query(org, "SELECT id, created_at FROM candidate_batches"), timeout=30,
                     what="a review batch")[0]
    assert batch["created_at"] >= max(work[r["work_id"]]["ended_at"] for r in replays)
    shown = json.loads(cli(org, "candidates", "show", cand["id"], "--json"))
    rep = shown["replay"]
    assert rep["measured"] and rep["items_measured"] == 2, rep
    assert rep["with"]["goal_rate"] == 1.0 and rep["without"]["goal_rate"] == 1.0
    assert rep["with"]["iterations_to_goal"] == 1 and rep["without"]["iterations_to_goal"] == 3
    assert rep["delta"]["iterations_to_goal"] == -2 and rep["delta"]["tokens"] < 0, rep["delta"]
    assert {x["work_id"] for x in rep["runs"]} == {r["work_id"] for r in replays}
    text = cli(org, "candidates", "show", cand["id"])
    assert "replayed: with: 2/2 goals, 1 iterations to goal" in text and "iterations -2" in text, text
    listed = cli(org, "candidates", "list")
    assert "2/2 / 2/2 / +0" in listed, listed

    # replays teach nothing of their own: no notes, their retros are skipped
    rids = [r["work_id"] for r in replays]
    marks = ",".join("?" * len(rids))
    assert not query(org, f"SELECT id FROM raw_notes WHERE run_id IN ({marks})", rids)
    skipped = wait_for(lambda: (s := query(org, f"SELECT subject FROM events WHERE kind='retro.skipped' "
                                                f"AND subject IN ({marks})", rids)) and len(s) == 4 and s,
                       timeout=15, what="the replays' retros skipped")
    assert {s["subject"] for s in skipped} == set(rids)

    # approved, the skill is carried by the next matching item; replays never count as uses
    cli(org, "candidates", "approve", cand["id"], "--json")
    svc, t, s = NEXT
    (nxt,) = submit(org, [settings_item(workspace(tmp_path, svc, t), svc, skilled_script(tmp_path / "next.json", t, s))])
    assert ended(org, [nxt], timeout=30)[0]["stop_reason"] == "goal_met"
    counted = wait_for(lambda: [x for x in json.loads(cli(org, "skills", "list", "--json"))
                                if x["name"] == cand["name"] and x["use_count"] >= 1],
                       timeout=15, interval=0.2, what="the skill's use counted")
    assert counted[0]["use_count"] == 1, counted

    # a skill measured where it does not help: the demo's word-count item, whose model ignores skills
    ws = tmp_path / "ws-demo"
    shutil.copytree(DEMO / "project", ws)
    (plain,) = submit(org, [["submit", "make word_count right", "--workspace", str(ws), "--verify",
                             "python3 -m unittest -q", "--backend", f"scripted:{DEMO / 'script.json'}",
                             "--max-iterations", "5", "--json"]])
    assert ended(org, [plain], timeout=30)[0]["stop_reason"] == "goal_met"
    ev = json.loads(cli(org, "skills", "eval", cand["name"], "--item", plain, "--wait", "25", "--json"))
    assert [i["id"] for i in ev["items"]] == [plain] and ev["summary"]["measured"], ev
    d = ev["summary"]["delta"]
    assert d["goal_rate"] == 0 and d["iterations_to_goal"] == 0, ev["summary"]
    shown = cli(org, "skills", "show", cand["name"])
    assert f"replayed ({ev['id']})" in shown and "iterations +0" in shown, shown
