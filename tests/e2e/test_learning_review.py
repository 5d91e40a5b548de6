"""Learning a human can see and trust, end to end with real processes (issue 19 proof).

The learning demo's three similar jobs open a review batch; a human renames the candidate and
approves it through the CLI; the renamed skill is carried by the next matching run and shown by
``org knowledge`` with its use. A run that failed only because its environment lacks a module
leaves no note. Thresholds are the demo's own (``LEARNING_THRESHOLDS``), written to org.toml here
as ``start-org --demo learning`` passes them to the org it starts.
"""
from __future__ import annotations

import json
import re

import pytest

from scripts.demo.run import LEARNING_THRESHOLDS, SERVICES, run_learning_demo
from skills.skillmd import parse
from state_db.kernel import config as config_mod
from tests.e2e.test_learning_loop import cli, ended, settings_item, skilled_script, submit, workspace
from tests.support.org import query, running_org, wait_for

CONFIG = """
[org]
loop_agents = 3
[supervisor]
heartbeat_s = 0.2
heartbeat_timeout_s = 10.0
stop_timeout_s = 6.0
[knowledge]
""" + "\n".join(f"{k} = {v}" for k, v in LEARNING_THRESHOLDS.items()) + "\n"

TIMING = re.compile(r"\d+(\.\d+)?\s*(s|ms)\b|\d+ (passed|failed)")
MISSING_DEP = "import no_such_dependency_xyz\nimport unittest\n\n\nclass T(unittest.TestCase):\n" \
              "    def test_it(self):\n        self.assertTrue(True)\n"


@pytest.fixture
def org(monkeypatch):
    with running_org(CONFIG) as home:
        monkeypatch.setenv("ORG_HOME", str(home.root))
        yield home


def _env_failure_item(tmp_path):
    ws = tmp_path / "ws-env"
    ws.mkdir()
    (ws / "test_env.py").write_text(MISSING_DEP)
    script = tmp_path / "env.json"
    script.write_text(json.dumps({"version": 1, "acts": [[{"text": "Nothing to change here."}]] * 3}))
    return ["submit", "make the tests of ws-env pass", "--workspace", str(ws), "--verify", "python3 -m unittest -q",
            "--backend", f"scripted:{script}", "--max-iterations", "3", "--json"]


def test_learning_demo_batch_is_renamed_and_approved_by_cli_and_the_next_run_carries_the_skill(org, tmp_path):
    # 1. the demo: three similar jobs, a batch, and how to review it
    lines: list[str] = []
    assert run_learning_demo(org, config_mod.load(org.config_path), timeout_s=45, out=lines.append) == 0, lines
    said = "\n".join(lines)
    assert "raw_notes_to_consolidate = 3" in said and "candidates_per_batch = 1" in said
    batch = re.search(r"batch (b-\S+) is open", said).group(1)
    assert "scripts/org candidates approve" in said and "scripts/org knowledge" in said
    pending = [c for c in json.loads(cli(org, "candidates", "list", "--json")) if c["batch_id"] == batch]
    cand = next(c for c in pending if c["name"].startswith("handle-"))
    text = cli(org, "candidates", "show", cand["id"])
    assert 'SettingsError: "timeout" must be an integer number of seconds' in text
    assert not TIMING.search(cand["description"] + cand["body"]), cand    # no timing or runner count

    # 2. an environment failure beside it leaves no note
    env_run, = submit(org, [_env_failure_item(tmp_path)])
    ended(org, [env_run], timeout=20)
    wait_for(lambda: query(org, "SELECT 1 FROM events WHERE kind='retro.skipped' AND subject=?", (env_run,)),
             timeout=10, what=f"the curator to skip the retro of {env_run}")
    assert not query(org, "SELECT id FROM raw_notes WHERE run_id=?", (env_run,))

    # 3. a human renames the candidate: name, heading and description agree; then approves it
    new = "settings-timeout-whole-seconds"
    desc = f"Use {new} when validate_config.py says a timeout must be a whole number of seconds."
    cli(org, "candidates", "edit", cand["id"], "--name", new, "--description", desc)
    shown = parse(cli(org, "candidates", "show", cand["id"]).split("\n\n", 1)[1])
    assert shown.name == new and shown.body.startswith(f"# {new}\n") and new in shown.description
    assert cand["name"] not in shown.body and cand["name"] not in shown.description
    assert json.loads(cli(org, "candidates", "approve", cand["id"], "--json"))["results"][0]["status"] == "approved"

    # 4. the next matching run carries the skill; org knowledge shows where it came from and where it was used
    svc, t, s = "gateway", "2m", 120
    nxt, = submit(org, [settings_item(workspace(tmp_path, svc, t), svc, skilled_script(tmp_path / "n.json", t, s))])
    assert ended(org, [nxt], timeout=25)[0]["stop_reason"] == "goal_met"
    prompts = [json.loads(r["prompt"]) for r in query(org, "SELECT prompt FROM iterations WHERE work_id=?", (nxt,))]
    assert prompts and all(p["skills"] == [new] for p in prompts), prompts
    know = wait_for(lambda: (k := json.loads(cli(org, "knowledge", "--json"))) and k["skills"]
                    and k["skills"][0]["uses"] >= 1 and k, timeout=70, interval=0.5, what="the skill's use counted")
    skill = know["skills"][0]
    assert skill["name"] == new and skill["used_in"] == [nxt] and len(skill["learned_from"]) == len(SERVICES)
    assert know["counts"]["skills"] == 1 and know["counts"]["raw"] >= 9
    assert env_run in [x["run"] for x in know["raw"]["skipped_runs"]]
    assert not [c for c in know["curated"] if "curated note cn-" in c["topic"]]
    assert "raw notes" in cli(org, "knowledge")
