"""The org learns, end to end with real processes (issue 7 proof).

Three runs on three workspaces hit the same failure the same way — ``validate_config.py``
rejects a ``timeout`` that is not a whole number of seconds, twice (with different details, so
the run is not stopped as ``repeated_failure``), then passes. From there on every step is done
by the org's own processes or the CLI: the curator writes the retros, consolidates the notes,
scores the pattern and opens a batch; the coordinator announces it; a human approves the
candidate with ``org candidates approve``; the skill's SKILL.md is rendered; the next work item
on a matching goal carries the skill in its recorded prompt and its use is counted.

Thresholds in org.toml: ``raw_notes_to_consolidate = 3`` (a run of this kind leaves three notes —
outcome, failure, fix — so every retro consolidates, whatever the order in which the runs end),
``candidates_per_batch = 1`` (one pattern, so at most a couple of candidates);
``notes_per_pattern`` keeps its default of 3.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from skills.skillmd import SECTIONS, parse
from tests.support.org import query, wait_for, running_org

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
"""

DEMO = Path(__file__).resolve().parents[2] / "scripts" / "demo"
CHECK = "python3 validate_config.py"
WHY = 'SettingsError: "timeout" must be an integer number of seconds'

# The check a team would keep beside its settings: prints what it found, then the rule broken
# (the last line). Protected, so no run can make it pass by editing it.
VALIDATOR = '''"""Validate settings.json: durations are whole numbers of seconds."""
import json
import sys

print("validate_config: reading settings.json")
with open("settings.json", encoding="utf-8") as f:
    settings = json.load(f)
value = settings.get("timeout")
if not isinstance(value, int) or isinstance(value, bool):
    print(f'expected int for "timeout", got {type(value).__name__} {value!r}')
    print('SettingsError: "timeout" must be an integer number of seconds')
    sys.exit(1)
print("ok: every duration is a whole number of seconds")
'''

#: (service, timeout as written, whole seconds)
RUNS = [("billing", "30s", 30), ("search", "45s", 45), ("mailer", "90s", 90)]
NEXT = ("gateway", "2m", 120)


def goal(service: str) -> str:
    return (f"Service {service}: make settings.json pass validate_config.py — the timeout must be a whole "
            "number of seconds")


def workspace(root: Path, service: str, timeout: str) -> Path:
    ws = root / f"ws-{service}"
    ws.mkdir(parents=True)
    (ws / "validate_config.py").write_text(VALIDATOR)
    settings = {"service": service, "timeout": timeout, "retries": 3}
    (ws / "settings.json").write_text(json.dumps(settings, indent=2) + "\n")
    return ws


def _edit(old, new, say: str) -> list[dict]:
    return [{"tool_uses": [{"name": "edit_file", "input": {
                "path": "settings.json", "old_string": f'"timeout": {json.dumps(old)}',
                "new_string": f'"timeout": {json.dumps(new)}'}}]},
            {"text": say}]


def recurring_script(path: Path, timeout: str, seconds: int) -> Path:
    """Strip the unit (still a string), then a float, then the int: fails twice the same way, then passes."""
    acts = [
        [{"text": "Let me read the settings first.",
          "tool_uses": [{"name": "read_file", "input": {"path": "settings.json"}}]},
         *_edit(timeout, str(seconds), "Removed the unit from timeout; validate_config.py should accept seconds now.")],
        _edit(str(seconds), float(seconds), "The validator still rejects timeout; I wrote it as a number."),
        _edit(float(seconds), seconds, "timeout is now an integer number of seconds."),
    ]
    path.write_text(json.dumps({"version": 1, "acts": acts}))
    return path


def skilled_script(path: Path, timeout: str, seconds: int) -> Path:
    """The next item's agent, with the skill in its prompt, writes the whole number at once."""
    path.write_text(json.dumps({"version": 1, "acts": [_edit(timeout, seconds, "Wrote timeout as a whole number of "
                                                                                "seconds, as the skill says.")]}))
    return path


def _start(home, *argv) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "scripts.cli.main", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "ORG_HOME": str(home.root)})


def _finish(proc: subprocess.Popen) -> str:
    try:
        out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()                     # never left behind: reaped, then reported
        out, err = proc.communicate()
    assert proc.returncode == 0, f"{' '.join(proc.args[2:])} exited {proc.returncode}: {err}"
    return out


def cli(home, *argv) -> str:
    return _finish(_start(home, *argv))


def settings_item(ws: Path, service: str, script: Path) -> list[str]:
    return ["submit", goal(service), "--workspace", str(ws), "--verify", CHECK, "--protect", "validate_config.py",
            "--scope", "settings.json",
            "--backend", f"scripted:{script}", "--max-iterations", "5", "--json"]


def unrelated_item(root: Path) -> list[str]:
    """The demo's word_count item: nothing to do with settings or validate_config.py."""
    ws = root / "ws-demo"
    shutil.copytree(DEMO / "project", ws)
    return ["submit", "make word_count right", "--workspace", str(ws), "--verify", "python3 -m unittest -q",
            "--backend", f"scripted:{DEMO / 'script.json'}", "--max-iterations", "5", "--json"]


def submit(home, items: list[list[str]]) -> list[str]:
    """Submit items (CLI argument lists) with concurrent CLI calls; returns their ids in order."""
    procs = [_start(home, *argv) for argv in items]
    outs = []
    for p in procs:                     # wait for every one before judging any
        try:
            outs.append(_finish(p))
        except AssertionError as exc:
            outs.append(exc)
    assert not [o for o in outs if isinstance(o, AssertionError)], outs
    return [json.loads(o)["id"] for o in outs]


def ended(home, ids: list[str], timeout: float) -> list[dict]:
    marks = ",".join("?" * len(ids))
    sql = f"SELECT id, status, stop_reason FROM work_items WHERE id IN ({marks})"
    return wait_for(lambda: (rows := query(home, sql, ids)) and all(r["status"] == "ended" for r in rows) and rows,
                    timeout=timeout, interval=0.1, what=f"runs {ids} to end")


@pytest.fixture
def org(monkeypatch):
    with running_org(CONFIG) as home:
        monkeypatch.setenv("ORG_HOME", str(home.root))
        yield home


def test_recurring_failures_become_an_approved_skill_that_the_next_matching_run_carries_and_counts(org, tmp_path):
    # 1. three runs, each on its own workspace, fail the same check the same way twice, then pass
    ids = submit(org, [settings_item(workspace(tmp_path, svc, t), svc, recurring_script(tmp_path / f"{svc}.json", t, s))
                       for svc, t, s in RUNS])
    runs = ended(org, ids, timeout=40)
    assert {r["stop_reason"] for r in runs} == {"goal_met"}, runs
    for wid in ids:
        v = query(org, "SELECT iteration, outcome, checks FROM verdicts WHERE work_id=? AND written_by='eval-agent' "
                       "ORDER BY iteration", (wid,))
        assert [x["outcome"] for x in v] == ["fail", "fail", "pass"], (wid, v)
        failing = [json.loads(x["checks"])[0] for x in v[:2]]
        assert all(c["name"] == CHECK and c["output_tail"].strip().endswith(WHY) for c in failing), failing
        assert failing[0]["signature"] != failing[1]["signature"]     # same failure, new detail: not stopped

    # 2. the curator writes the retros and curates one failure pattern over the three runs
    failures = wait_for(lambda: (r := query(org, "SELECT run_id, applicability FROM raw_notes "
                                                 "WHERE json_extract(evidence, '$.kind') = 'failure'"))
                        and len({x["run_id"] for x in r}) == 3 and r,
                        timeout=15, what="failure notes in the retros of the three runs")
    assert {f["run_id"] for f in failures} == set(ids) and all(CHECK in f["applicability"] for f in failures)
    retros = query(org, "SELECT subject, actor FROM events WHERE kind = 'retro.written'")
    assert {r["subject"] for r in retros} == set(ids) and {r["actor"] for r in retros} == {"curator"}, retros

    # 3. … a candidate in a batch that the coordinator announces
    batch = wait_for(lambda: query(org, "SELECT id FROM candidate_batches"), timeout=15,
                     what="a candidate batch opened by the curator")[0]["id"]
    announced = wait_for(lambda: [a for a in query(org, "SELECT data FROM events WHERE kind='announce'")
                                  if batch in json.loads(a["data"])["text"]],
                         timeout=10, what=f"an announcement of batch {batch}")
    assert "org candidates" in json.loads(announced[0]["data"])["text"]
    pending = json.loads(cli(org, "candidates", "list", "--json"))
    handle = [c for c in pending if c["name"].startswith("handle-")]
    assert len(handle) == 1 and handle[0]["batch_id"] == batch, pending
    cand = handle[0]
    assert cand["score"] >= 3 and cand["signals"]["recurrence"]["ok"], cand["signals"]
    curated = query(org, "SELECT tier, source_notes FROM curated_notes WHERE id=?", (cand["signals"]["curated_id"],))
    assert curated[0]["tier"] == "recommended"
    sources = json.loads(curated[0]["source_notes"])
    marks = ",".join("?" * len(sources))
    assert {n["run_id"] for n in query(org, f"SELECT run_id FROM raw_notes WHERE id IN ({marks})", sources)} == set(ids)

    # 4. a human approves it through the CLI: the skill file appears in the org home
    approved = json.loads(cli(org, "candidates", "approve", cand["id"], "--json"))
    assert approved["results"][0]["status"] == "approved"
    skill_md = org.skills_dir / cand["name"] / "SKILL.md"
    assert skill_md.is_file()
    text = skill_md.read_text()
    assert text.startswith("---\n")
    parsed = parse(text)
    assert parsed.name == cand["name"] and "validate_config.py" in parsed.description
    assert all(f"## {s}" in parsed.body for s in SECTIONS)
    assert set(parsed.metadata["origin-runs"].split(", ")) == set(ids)

    # 5. the next matching work item carries the skill in its recorded prompt (an unrelated one
    #    submitted beside it does not), and its use is counted
    svc, t, s = NEXT
    matching = settings_item(workspace(tmp_path, svc, t), svc, skilled_script(tmp_path / "next.json", t, s))
    nxt, other = submit(org, [matching, unrelated_item(tmp_path)])
    assert [r["stop_reason"] for r in ended(org, [nxt, other], timeout=25)] == ["goal_met", "goal_met"]

    def manifests(wid):
        return [json.loads(p["prompt"]) for p in query(org, "SELECT prompt FROM iterations WHERE work_id=? ORDER BY n",
                                                       (wid,))]
    assert manifests(nxt) and all(m["skills"] == [cand["name"]] for m in manifests(nxt)), manifests(nxt)
    assert manifests(other) and all(m["skills"] == [] for m in manifests(other)), manifests(other)
    skills = wait_for(lambda: [x for x in json.loads(cli(org, "skills", "list", "--json"))
                               if x["name"] == cand["name"] and x["use_count"] >= 1],
                      timeout=10, interval=0.2, what=f"use of {cand['name']} to be counted")
    assert skills[0]["use_count"] == 1 and skills[0]["last_used_at"]
