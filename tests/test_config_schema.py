"""org.toml's typed schema: errors name the line that wrote the key and the key probably meant; the
JSON Schema printed by ``org config schema`` accepts what the models accept; the default file is
the models' defaults."""
from __future__ import annotations

import json
import subprocess
import sys
import tomllib

import pytest

from scripts.cli import main as cli
from state_db.kernel import config as config_mod
from state_db.kernel.config import ConfigKeyError, line_of

jsonschema = pytest.importorskip("jsonschema")


def load_text(tmp_path, text: str, env: dict | None = None):
    path = tmp_path / "org.toml"
    path.write_text(text)
    return config_mod.load(path, env=env or {})


def error_of(tmp_path, text: str, env: dict | None = None) -> ConfigKeyError:
    with pytest.raises(ConfigKeyError) as info:
        load_text(tmp_path, text, env)
    return info.value


@pytest.mark.parametrize("text, key, line", [
    ("[org]\nloop_agents = 0\n", "org.loop_agents", 2),
    ("# my org\n\n[caps]\nmax_iterations = 3\nbudget_usd = -1   # too low\n", "caps.budget_usd", 5),
    ("org.loop_agents = 0\n", "org.loop_agents", 1),
    ("org = { loop_agents = 0 }\n", "org.loop_agents", 1),
    ("[limits]\ntotal_spend_usd = 1\n\n[prices.\"my-model\"]\ninput = 1\n", "prices.my-model.output", 4),
    ("[model]\nbackend = \"scripted\"\nname = \"nowhere\"\n", "model.name", 3),
    ("[sandbox]\ncpu_seconds = 10\nmode = 'unsandboxed'\n", "sandbox.mode", 3),
    ("[gate]\nask_for = [\n  \"network\",\n  1,\n]\n", "gate.ask_for", 2),
    ("[org]\nloop_agents = 2\n[[gate]]\nask_for = []\n", "gate", 3),
    ("[transport]\n  endpoint   =   'tcp:/x'\n", "transport.endpoint", 2),
])
def test_an_error_names_the_line_that_wrote_the_key(tmp_path, text, key, line):
    err = error_of(tmp_path, text)
    assert (err.key, err.lineno) == (key, line)
    assert f"org.toml:{line})" in err.line() and err.line().startswith(f"error[config_invalid]: ")


def test_a_value_from_the_environment_names_the_variable_not_a_line(tmp_path):
    err = error_of(tmp_path, "[org]\nloop_agents = 2\n", env={"ORG_LOOP_AGENTS": "999"})
    assert err.key == "org.loop_agents" and err.lineno is None
    assert "$ORG_LOOP_AGENTS" in str(err) and "unset ORG_LOOP_AGENTS" in err.hint


@pytest.mark.parametrize("text, key, meant", [
    ("[org]\nloop_agent = 3\n", "org.loop_agent", "org.loop_agents"),
    ("[caps]\ntotal_spend_usd = 3\n", "caps.total_spend_usd", "limits.total_spend_usd"),
    ("[orgg]\nloop_agents = 3\n", "orgg", "org"),
    ("[prices.m]\ninput = 1\noutput = 1\ncache_write = 1\ncache_reed = 1\n", "prices.m.cache_reed",
     "prices.m.cache_read"),
    ("[sandbox]\nmemory = 512\n", "sandbox.memory", "sandbox.memory_mb"),
])
def test_an_unknown_key_says_which_key_was_meant(tmp_path, text, key, meant):
    err = error_of(tmp_path, text)
    assert (err.key, err.suggestion) == (key, meant)
    assert f"did you mean {meant if '.' in meant else f'[{meant}]'}?" in err.hint


def test_an_unknown_key_like_no_other_lists_the_known_ones(tmp_path):
    err = error_of(tmp_path, "[logs]\nzzzzzz = 1\n")
    assert err.suggestion is None and "known keys in [logs]: max_bytes, backups" in err.hint


def test_the_cli_prints_key_line_and_suggestion_on_one_line(org_home, capsys):
    org_home.config_path.write_text("[org]\nloop_agents = 2\n\n[org.extra]\n")
    assert cli.main(["config", "check"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error[config_invalid]: unknown key org.extra (")
    assert err[0].split(" — ")[0].endswith("org.toml:4)")


def test_line_of_counts_arrays_of_tables_and_ignores_comments():
    text = "# [org]\n[[s]]\nx = 1\n[[s]]\n# x = 2\nx = 3\n"
    assert line_of(text, ("s", "1", "x")) == 6
    assert line_of(text, ("s", "0")) == 2
    assert line_of(text, ("absent", "x")) is None


def validator():
    schema = config_mod.json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


SAMPLE = """\
[org]
loop_agents = 4
[caps]
max_iterations = 20
budget_usd = 2.5
[model]
backend = "command"
name = "local"
base_url = "http://127.0.0.1:8080"
[prices.local]
input = 0
output = 0
cache_write = 0
cache_read = 0
[command]
allowed_tools = ["Read", "Edit"]
path_prepend = ["/opt/node/bin"]
[mcp]
tools = ["status", "submit"]
[transport]
endpoint = "tcp://127.0.0.1:7100"
"""


def test_the_json_schema_accepts_the_default_file_and_a_sample_the_models_accept(tmp_path):
    v = validator()
    for text in (config_mod.DEFAULT_TOML, SAMPLE):
        load_text(tmp_path, text)                         # the models accept it ...
        assert list(v.iter_errors(tomllib.loads(text))) == []   # ... and so does the schema


@pytest.mark.parametrize("text", [
    "[org]\nloop_agents = 0\n",
    "[org]\nloop_agents = 257\n",
    "[org]\nloop_agents = '2'\n",
    "[org]\nloop_agent = 2\n",
    "[nonsense]\n",
    "[caps]\nbudget_usd = 0\n",
    "[model]\nbackend = 'gpt'\n",
    "[model]\nbase_url = 'ftp://x'\n",
    "[prices.m]\ninput = 1\n",
    "[prices.m]\ninput = -1\noutput = 1\ncache_write = 1\ncache_read = 1\n",
    "[command]\npath_prepend = ['relative']\n",
    "[mcp]\ntools = ['everything']\n",
    "[transport]\nendpoint = 'udp://x'\n",
    "[attention]\nnotify_send = 'yes'\n",
])
def test_the_json_schema_refuses_what_the_models_refuse(tmp_path, text):
    with pytest.raises(ConfigKeyError):
        load_text(tmp_path, text)
    assert list(validator().iter_errors(tomllib.loads(text))), text


def test_the_schema_carries_defaults_descriptions_and_environment_variables():
    schema = config_mod.json_schema()
    org = schema["$defs"]["Org"]["properties"]["loop_agents"]
    assert (org["default"], org["minimum"], org["maximum"], org["x-env"]) == (2, 1, 256, "ORG_LOOP_AGENTS")
    assert "fingerprint" in schema["$defs"]["Loop"]["properties"]["no_progress_repeat"]["description"]
    assert set(schema["properties"]) == set(config_mod.Config.model_fields)


def test_org_config_schema_prints_the_schema_without_an_org(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "scripts.cli.main", "--home", str(tmp_path / "none"),
                           "config", "schema"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == config_mod.json_schema()


def test_the_default_file_is_the_models_defaults_with_every_key_documented_in_place():
    assert tomllib.loads(config_mod.DEFAULT_TOML) == config_mod.defaults()
    for dotted, field in config_mod.SCHEMA.items():
        section, name = dotted.split(".")
        line = line_of(config_mod.DEFAULT_TOML, (section, name))
        text = config_mod.DEFAULT_TOML.splitlines()[line - 1]
        assert text.startswith(f"{name} = "), dotted
        env = (field.json_schema_extra or {}).get("x-env")
        assert env is None or env in config_mod.DEFAULT_TOML, dotted


def test_environment_overrides_name_real_keys_and_parse_to_their_type():
    env = {"ORG_LOOP_AGENTS": "3", "ORG_SPEND_CAP_USD": "12", "ORG_ALLOW_UNSANDBOXED": "1", "ORG_SANDBOX": "unsandboxed"}
    cfg = config_mod.load(None, env=env)
    assert (cfg.org.loop_agents, cfg.limits.total_spend_usd, cfg.sandbox.mode) == (3, 12.0, "unsandboxed")
    assert set(config_mod.ENV_OVERRIDES.values()) <= set(config_mod.SCHEMA)


def test_the_typed_config_is_frozen_and_reads_as_attributes():
    cfg = config_mod.load(None, env={})
    assert cfg.caps.max_iterations == cfg["caps.max_iterations"] == 10
    assert cfg.prices["scripted"]["input"] == 0
    with pytest.raises(Exception):
        cfg.caps.max_iterations = 11                              # type: ignore[misc]


class Every(config_mod.Section):
    """a standing order"""
    goal: str = config_mod.key("x", min_length=1)
    every_s: float = config_mod.key(3600, gt=0)


class WithSchedules(config_mod.Config):
    """The configuration with one more line: a list of tables, as ``[[schedules]]`` will be."""
    schedules: list[Every] = config_mod.key([], "standing orders")


def test_a_list_of_tables_added_in_one_line_gets_lines_suggestions_and_a_schema(tmp_path):
    text = "[org]\nloop_agents = 1\n\n[[schedules]]\ngoal = 'a'\n\n[[schedules]]\ngoal = 'b'\nevry_s = 60\n"
    with pytest.raises(ConfigKeyError) as info:
        WithSchedules(tomllib.loads(text))
    err = info.value.at(tmp_path / "org.toml", text)
    assert (err.key, err.suggestion, err.lineno) == ("schedules.1.evry_s", "schedules.1.every_s", 9)
    with pytest.raises(ConfigKeyError) as info:
        WithSchedules(tomllib.loads("[[schedules]]\ngoal = 'a'\nevery_s = 0\n"))
    assert info.value.key == "schedules.0.every_s" and "a number > 0" in str(info.value)
    cfg = WithSchedules(tomllib.loads(text.replace("evry_s", "every_s")))
    assert [s.every_s for s in cfg.schedules] == [3600, 60]
    schema = WithSchedules.model_json_schema()
    assert schema["properties"]["schedules"]["items"] == {"$ref": "#/$defs/Every"}


def test_code_reads_the_configuration_as_attributes_not_dotted_strings():
    """``cfg.caps.max_iterations``, not ``cfg["caps.max_iterations"]``: a typo in an attribute fails
    where it is written (and in a type checker), a typo in a string only when that line runs."""
    import re
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    dotted = re.compile(r'(?<=[\w)\]])\[["\'](' + "|".join(config_mod.SECTIONS) + r')\.[a-z_]+["\']\]')
    found = [f"{p.relative_to(root)}:{n}: {line.strip()}"
             for top in ("roles", "scripts", "knowledge", "skills", "bench", "transport", "state_db")
             for p in sorted((root / top).rglob("*.py")) if p.name != "config.py"
             for n, line in enumerate(p.read_text().splitlines(), 1) if dotted.search(line)]
    assert found == [], "read these as attributes (cfg.section.key):\n" + "\n".join(found)
