"""A cap flag changes the cap it names and no other: every other cap keeps its default (org.toml's
[caps], else the built-in one); removing a cap is a flag of its own; `org show` says where each cap
came from — through the real CLI, and a run submitted with one flag still stops on a default budget."""
from __future__ import annotations

import json
import math

import pytest

from roles.loop_agent.engine import LoopSettings, policy_for
from roles.operations.caps import CapsError, given, resolve
from roles.operations.submit import SubmitRequest, submit
from state_db.kernel import config as config_mod
from state_db.connection import connect
from state_db.queries import work as work_q
from state_db.queries.work import Caps
from state_db.vocab import Actor, WorkStatus
from state_db.writer import StateWriter
from tests.support.loop import ScriptedActs, engine, make_workspace
from tests.test_rough_edges import coded, org

pytestmark = pytest.mark.timeout(120)

DEFAULTS = {"max_iterations": 10, "budget_tokens": 400000, "budget_usd": 5.0, "timeout_s": 3600}
KEY = {"ANTHROPIC_API_KEY": "sk-test-never-used"}


def submit_cli(home, tmp_path, *flags):
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    out = org(home, tmp_path, "submit", "g", "--workspace", str(ws), "--verify", "true", "--no-wait", "--json",
              *flags, env_extra=KEY)
    return out


def stored(home, work_id) -> dict:
    from state_db.connection import read_rows
    return json.loads(read_rows(home.db_path, "SELECT caps FROM work_items WHERE id=?", (work_id,))[0]["caps"])


def test_one_flag_keeps_every_other_default_and_says_where_each_came_from(org_home, tmp_path):
    out = submit_cli(org_home, tmp_path, "--max-iterations", "4")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["caps"] == {**DEFAULTS, "max_iterations": 4}
    # a new org home's org.toml lists the defaults: that is where they come from now
    assert data["caps_from"] == {"max_iterations": "flag", "budget_tokens": "org.toml", "budget_usd": "org.toml",
                                 "timeout_s": "org.toml"}
    assert stored(org_home, data["id"])["from"] == data["caps_from"]
    shown = org(org_home, tmp_path, "show", data["id"])
    assert shown.returncode == 0, shown.stderr
    assert ("caps: max_iterations=4 (--max-iterations), budget_tokens=400000 (org.toml), budget_usd=5 (org.toml), "
            "timeout_s=3600 (org.toml)") in shown.stdout
    as_json = json.loads(org(org_home, tmp_path, "show", data["id"], "--json").stdout)
    assert as_json["run"]["caps"]["budget_usd"] == {"value": 5.0, "from": "org.toml"}


def test_without_a_caps_table_in_org_toml_the_built_in_defaults_are_named_as_such(org_home, tmp_path):
    org_home.config_path.write_text("[org]\nloop_agents = 1\n")
    data = json.loads(submit_cli(org_home, tmp_path, "--timeout", "30").stdout)
    assert data["caps"] == {**DEFAULTS, "timeout_s": 30}
    assert data["caps_from"] == {"max_iterations": "default", "budget_tokens": "default", "budget_usd": "default",
                                 "timeout_s": "flag"}


def test_org_toml_fills_the_caps_no_flag_names_and_is_named_as_their_source(org_home, tmp_path):
    org_home.config_path.write_text("[caps]\nbudget_usd = 0.5\ntimeout_s = 60\n")
    out = submit_cli(org_home, tmp_path, "--budget-tokens", "1000")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["caps"] == {"max_iterations": 10, "budget_tokens": 1000, "budget_usd": 0.5, "timeout_s": 60}
    assert data["caps_from"] == {"max_iterations": "default", "budget_tokens": "flag", "budget_usd": "org.toml",
                                 "timeout_s": "org.toml"}


def test_removing_a_cap_is_explicit_and_shown_as_none_never_as_of_zero(org_home, tmp_path):
    out = submit_cli(org_home, tmp_path, "--no-timeout", "--no-budget-usd")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["caps"] == {"max_iterations": 10, "budget_tokens": 400000}
    assert Caps.from_json(stored(org_home, data["id"])).removed() == ("budget_usd", "timeout_s")
    shown = org(org_home, tmp_path, "show", data["id"]).stdout
    assert "budget_usd=none (--no-budget-usd)" in shown and "timeout_s=none (--no-timeout)" in shown
    status = org(org_home, tmp_path, "status").stdout
    assert "/0" not in status and "of 0" not in status and "None" not in status, status


@pytest.mark.parametrize("flags, code", [
    (("--no-max-iterations", "--no-budget-tokens", "--no-budget-usd", "--no-timeout"), "no_cap"),
    (("--budget-usd", "3", "--no-budget-usd"), "bad_caps"),
    (("--budget-usd", "nan"), "bad_caps"),
    (("--timeout", "inf"), "bad_caps"),
    (("--max-iterations", "0"), "bad_caps"),
])
def test_a_run_with_no_cap_or_a_cap_that_could_never_fire_is_refused_in_one_coded_line(org_home, tmp_path, flags, code):
    out = submit_cli(org_home, tmp_path, *flags)
    assert out.returncode == 1 and coded(out.stderr) == code, out.stderr


def test_resolve_refuses_what_the_flags_cannot_say_too(org_home):
    cfg = config_mod.load_config(org_home)
    for values in ({"budget_usd": math.nan}, {"timeout_s": -1.0}, {"max_iterations": 2.5}, {"budget_tokens": True}):
        with pytest.raises(CapsError):
            given(values)
        with pytest.raises(CapsError):      # a Caps built by hand is checked as the flags are
            resolve(cfg, Caps(**values))
    with pytest.raises(CapsError, match="unknown caps"):
        given({"budget": 3})
    with pytest.raises(CapsError, match="both given"):
        given({"budget_usd": 3.0}, removed=("budget_usd",))
    assert resolve(cfg, Caps()).encode() == DEFAULTS
    assert resolve(cfg, given({}, removed=("timeout_s",))).removed() == ("timeout_s",)


def test_a_run_given_only_an_iteration_cap_still_stops_on_the_default_token_budget(org_home, tmp_path):
    """The issue's case: "only 4 iterations, please" must not remove the budgets."""
    org_home.config_path.write_text("[caps]\nbudget_tokens = 500\n")
    ws = make_workspace(tmp_path)
    cfg = config_mod.load_config(org_home)
    done = submit(org_home, cfg, SubmitRequest(goal="make add() add", workspace=str(ws), verify=["false"],
                                               caps=Caps(max_iterations=40), backend="command"), wake=False)
    assert done.caps.encode() == {"max_iterations": 40, "budget_tokens": 500, "budget_usd": 5.0, "timeout_s": 3600}
    co = StateWriter(org_home.db_path, Actor.COORDINATOR)
    with co.transaction() as tx:
        tx.set_status("work_items", done.id, WorkStatus.DISPATCHED, assigned_to="loop-agent-1")
    co.close()
    conn = connect(org_home.db_path, readonly=True)
    try:
        policy = policy_for(work_q.item(conn, done.id), LoopSettings())
    finally:
        conn.close()
    assert {c.kind for c in policy.budgets()} == {"token_budget", "cost_budget", "timeout"}
    five_calls = [{"write": {"calc.py": "x = 1\n"}}, {}, {}, {}, {}]       # 600 tokens in the first act
    decision = engine(org_home, done.id, ScriptedActs([five_calls], tokens=(100, 20))).run()
    assert decision.reason == "token_budget", decision


def test_stored_caps_round_trip_with_their_sources_and_old_rows_have_none():
    caps = Caps(max_iterations=4, budget_usd=None, sources=(("max_iterations", "flag"), ("budget_usd", "flag")))
    assert Caps.from_json(json.dumps(caps.to_json())) == caps and caps.removed() == ("budget_usd",)
    old = Caps.from_json('{"max_iterations": 3}')
    assert old.sources == () and old.source("max_iterations") is None and old.encode() == {"max_iterations": 3}
    assert Caps.from_json('{"max_iterations": 3, "from": {"max_iterations": "bogus"}}').sources == ()


def test_one_caps_type_from_the_flags_to_the_condition_that_stops_the_run(org_home):
    """The CLI's flags, MCP's arguments, the request, the stored column and the stop policy all hold
    the same ``Caps``: no form in between drops or renames a cap."""
    from roles.loop_agent.policy import policy_from_caps
    from scripts.cli.commands import submit as submit_cmd
    from scripts.cli.main import Parser
    parser = Parser(prog="org submit")
    submit_cmd.add_arguments(parser)
    args = parser.parse_args(["g", "--workspace", "w", "--verify", "true", "--max-iterations", "4", "--no-timeout"])
    from_cli = submit_cmd.request_of(args).caps
    from_mcp = given({"max_iterations": 4, "budget_tokens": None}, ("timeout_s",))
    assert from_cli == from_mcp == Caps(max_iterations=4, sources=(("max_iterations", "flag"), ("timeout_s", "flag")))
    caps = resolve(config_mod.load_config(org_home), from_cli)
    assert Caps.from_json(json.dumps(caps.to_json())) == caps
    assert (caps.max_iterations, caps.timeout_s, caps.removed()) == (4, None, ("timeout_s",))
    kinds = [next(iter(c)) for c in policy_from_caps(caps).encode()]
    assert "timeout" not in kinds and {"max_iterations", "token_budget", "cost_budget"} <= set(kinds)


def test_caps_applied_over_others_keep_the_sources_of_both():
    base = Caps(max_iterations=10, budget_usd=5.0, timeout_s=60.0,
                sources=(("max_iterations", "org.toml"), ("budget_usd", "default"), ("timeout_s", "flag")))
    raised = Caps.given({"max_iterations": 20}, removed=("budget_usd",)).over(base)
    assert raised == Caps(max_iterations=20, timeout_s=60.0, sources=(
        ("max_iterations", "flag"), ("budget_usd", "flag"), ("timeout_s", "flag")))
    assert raised.removed() == ("budget_usd",) and Caps().over(base) == base


def test_a_standing_order_stored_with_flat_caps_still_reads_as_one_caps():
    from roles.operations.submit import SubmitRequest
    req = SubmitRequest(goal="g", workspace="/w", verify=["true"], caps=Caps.given({"budget_usd": 1.5}, ("timeout_s",)))
    assert SubmitRequest.decode(json.loads(json.dumps(req.encode()))) == req
    old = {"goal": "g", "workspace": "/w", "verify": ["true"], "max_iterations": 3, "budget_tokens": None,
           "budget_usd": None, "timeout_s": None, "no_caps": ["timeout_s"]}
    assert SubmitRequest.decode(old).caps == Caps.given({"max_iterations": 3}, ("timeout_s",))
