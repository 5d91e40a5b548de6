"""org.toml and its environment overrides under random and mutated input: ``config.load`` gives a
valid Config or a ConfigError that names the key, never another exception."""
from __future__ import annotations

import math
import string

import pytest
from hypothesis import given
from hypothesis import strategies as st

from state_db.kernel import config as config_mod
from state_db.kernel.errors import ConfigError

SECTIONS = sorted({k.split(".")[0] for k in config_mod.SCHEMA} | {"prices", "nonsense"})
KEYS = sorted({k.split(".")[1] for k in config_mod.SCHEMA} | set(config_mod.PRICE_KEYS) | {"typo"})


def toml_value(value) -> str:
    """A TOML literal for a Python value (floats: inf and nan as TOML spells them)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return ("nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")) if not math.isfinite(value) \
            else repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return "{" + ", ".join(f'"{k}" = {toml_value(v)}' for k, v in value.items()) + "}"


scalars = st.one_of(st.booleans(), st.integers(-2, 2**64), st.floats(),
                    st.text(alphabet=string.ascii_letters + string.digits + ":/._- ", max_size=20),
                    st.sampled_from(["ipc", "tcp://127.0.0.1:7000", "bubblewrap", "unsandboxed", "scripted",
                                     "claude-sonnet-4-5", "http://127.0.0.1:1", ""]))
values = st.recursive(scalars, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.sampled_from(KEYS), c,
                                                                                   max_size=3), max_leaves=6)
documents = st.dictionaries(st.sampled_from(SECTIONS), st.dictionaries(st.sampled_from(KEYS), values, max_size=4),
                            max_size=4)


def render(doc: dict) -> str:
    return "".join(f"[{section}]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in body.items())
                   for section, body in doc.items())


def loaded_or_coded(path, env=None):
    try:
        cfg = config_mod.load(path, env=env or {})
    except ConfigError as exc:
        assert exc.code == "config_invalid"
        assert exc.key is not None or "not valid TOML" in str(exc), str(exc)
        return exc
    config_mod.validate(cfg.data)                     # what load returns is valid, every key typed
    assert cfg["model.name"] in cfg.prices
    return cfg


@given(documents)
def test_random_tables_and_values_load_or_name_the_bad_key(tmp_path_factory, doc):
    path = tmp_path_factory.mktemp("cfg") / "org.toml"
    path.write_text(render(doc))
    got = loaded_or_coded(path)
    if isinstance(got, ConfigError) and got.key:                 # the key named is one the file wrote
        section, _, name = got.key.partition(".")
        assert section in doc and (not name or name.split(".")[0] in doc[section] or got.key in config_mod.SCHEMA
                                   or section == "prices"), (got.key, doc)


@given(st.binary(max_size=400))
def test_random_bytes_load_or_fail_with_a_coded_error(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("cfg") / "org.toml"
    path.write_bytes(data)
    loaded_or_coded(path)


@given(st.data())
def test_mutated_default_file_loads_or_names_the_bad_key(tmp_path_factory, data):
    lines = config_mod.DEFAULT_TOML.splitlines()
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(lines) - 1))
        line = lines[i]
        op = data.draw(st.sampled_from(["value", "drop", "cut", "dup"]))
        if op == "value" and "=" in line and not line.lstrip().startswith("#"):
            lines[i] = line.split("=", 1)[0] + "= " + toml_value(data.draw(values))
        elif op == "drop":
            del lines[i]
        elif op == "cut":
            lines[i] = line[:data.draw(st.integers(0, len(line)))]
        else:
            lines.insert(i, line)
    path = tmp_path_factory.mktemp("cfg") / "org.toml"
    path.write_text("\n".join(lines) + "\n")
    loaded_or_coded(path)


@given(st.dictionaries(st.sampled_from(sorted(config_mod.ENV_OVERRIDES)),
                       st.one_of(st.text(max_size=12), st.sampled_from(["0", "1", "64", "65", "-1", "1e400", "nan",
                                                                        "inf", "true", "ipc", "bubblewrap"])),
                       max_size=4))
def test_environment_overrides_load_or_name_the_key(env):
    got = loaded_or_coded(None, env=env)
    if isinstance(got, ConfigError):
        assert got.key in config_mod.SCHEMA or got.key == "model.name"


@pytest.mark.parametrize("text, key", [
    ("[org]\nloop_agents = 0\n", "org.loop_agents"),
    ("[org]\nloop_agents = true\n", "org.loop_agents"),
    ("[caps]\nbudget_usd = nan\n", "caps.budget_usd"),
    ("[retention]\nevents_days = -inf\n", "retention.events_days"),
    ("[prices.m]\ninput = 1\n", "prices.m.output"),
    ("[model]\nname = \"absent\"\n", "model.name"),
    ("[gate]\nask_for = [1]\n", "gate.ask_for"),
    ("[org.deep]\nx = 1\n", "org.deep"),
    ("[[org]]\nloop_agents = 2\n", "org"),
])
def test_wrong_types_and_values_name_their_key(tmp_path, text, key):
    path = tmp_path / "org.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        config_mod.load(path, env={})
    assert info.value.key == key
