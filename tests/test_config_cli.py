"""org.toml validation and the CLI skeleton (issue 2 proof)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from scripts.cli import main as cli
from state_db.kernel import config
from state_db.kernel.errors import ConfigError


@pytest.mark.parametrize("text, key", [
    ("[org]\nloop_agents = 0\n", "org.loop_agents"),
    ("[org]\nloop_agents = 'two'\n", "org.loop_agents"),
    ("[org]\nloop_agents = true\n", "org.loop_agents"),
    ("[caps]\nbudget_usd = -1\n", "caps.budget_usd"),
    ("[caps]\nbudget_usd = nan\n", "caps.budget_usd"),
    ("[model]\nbackend = 'gpt'\n", "model.backend"),
    ("[model]\nname = 'claude-unknown'\n", "model.name"),
    ("[model]\nbase_url = 'ftp://x'\n", "model.base_url"),
    ("[prices.m]\ninput = 1\noutput = 1\ncache_write = 1\n", "prices.m.cache_read"),
    ("[prices.m]\ninput = -3\noutput = 1\ncache_write = 1\ncache_read = 0\n", "prices.m.input"),
    ("[org]\nunknown_key = 1\n", "org.unknown_key"),
    ("[nonsense]\nx = 1\n", "nonsense"),
    ("[sandbox]\nmode = 'unsandboxed'\n", "sandbox.mode"),
    ("[transport]\nendpoint = 'tcp:/nope'\n", "transport.endpoint"),
    ("[gate]\nask_for = [1, 2]\n", "gate.ask_for"),
    ("[command]\npath_prepend = ['relative/bin']\n", "command.path_prepend"),
])
def test_bad_config_values_give_coded_errors_naming_the_key(tmp_path, text, key):
    path = tmp_path / "org.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        config.load(path, env={})
    assert err.value.code == "config_invalid"
    assert err.value.key == key
    assert key.split(".")[-1] in str(err.value)


def test_unparseable_toml_is_a_coded_error(tmp_path):
    path = tmp_path / "org.toml"
    path.write_text("[org\nloop_agents = ")
    with pytest.raises(ConfigError, match="not valid TOML"):
        config.load(path, env={})


def test_explicit_zero_price_is_allowed_for_local_models(tmp_path):
    path = tmp_path / "org.toml"
    path.write_text("[model]\nname = 'local'\n[prices.local]\ninput = 0\noutput = 0\ncache_write = 0\ncache_read = 0\n")
    assert config.load(path, env={}).prices["local"]["input"] == 0


def test_environment_overrides_and_bad_override_errors(tmp_path):
    cfg = config.load(None, env={"ORG_LOOP_AGENTS": "4", "ORG_SPEND_CAP_USD": "7.5"})
    assert cfg["org.loop_agents"] == 4 and cfg["limits.total_spend_usd"] == 7.5
    assert cfg.overridden == {"org.loop_agents": "ORG_LOOP_AGENTS", "limits.total_spend_usd": "ORG_SPEND_CAP_USD"}
    with pytest.raises(ConfigError, match="ORG_LOOP_AGENTS"):
        config.load(None, env={"ORG_LOOP_AGENTS": "many"})


def test_default_file_is_written_once_and_is_valid(tmp_path):
    path = tmp_path / "org.toml"
    assert config.write_default(path) is True
    assert config.write_default(path) is False
    assert config.load(path, env={})["caps.max_iterations"] == 10


def _subcommands():
    parser = cli.build_parser()
    action = next(a for a in parser._actions if a.dest == "command")
    return action.choices


def test_every_command_has_help_text():
    for name, sub in _subcommands().items():
        assert sub.description and len(sub.description) > 10, f"'org {name}' has no help text"
        for action in sub._actions:
            if action.dest != "help":
                assert action.help, f"'org {name}' option {action.dest} has no help text"


def test_bad_arguments_print_one_coded_line_and_exit_2(capsys):
    assert cli.main(["status", "--bogus"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error[bad_arguments]:")


def test_broken_config_is_one_line_through_the_cli(org_home, capsys):
    org_home.config_path.write_text("[org]\nloop_agents = -2\n")
    assert cli.main(["config", "check"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error[config_invalid]: org.loop_agents") and "Traceback" not in err


def test_status_json_reads_state_db_while_the_org_is_down(org_home, capsys):
    assert cli.main(["status", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["session"] is None and data["work"]["counts"] == {}


def test_doctor_exit_codes(org_home, capsys):
    code = cli.main(["doctor", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == report["exit"] and code in (0, 1)
    (org_home.run_dir / "loop-agent-1.pid").write_text("999999 12345\n")  # a pid that is not running
    assert cli.main(["doctor"]) >= 1
    assert "stale" in capsys.readouterr().out
    org_home.db_path.write_bytes(b"this is not a database" * 100)
    assert cli.main(["doctor"]) == 2


def test_cli_entry_point_runs_as_a_process_without_traceback(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "scripts.cli.main", "--home", str(tmp_path / "none"), "status"],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1
    assert proc.stderr.startswith("error[no_org_home]") and "Traceback" not in proc.stderr
