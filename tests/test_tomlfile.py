"""org.toml parsed once per process (state_db/kernel/tomlfile.py), and the default file rendered
only when asked for."""
from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from state_db.kernel import config as config_mod, tomlfile
from state_db.kernel.home import OrgHome

pytestmark = pytest.mark.timeout(60)


def test_the_same_text_is_parsed_once_and_each_caller_gets_its_own_tables(monkeypatch):
    parses = []
    real = tomllib.loads
    monkeypatch.setattr(tomlfile.tomllib, "loads", lambda text: parses.append(text) or real(text))
    monkeypatch.setattr(tomlfile, "_last", None)
    text = '[org]\nloop_agents = 3\n[[webhooks]]\nurl = "x"\n'
    first = tomlfile.loads(text)
    first["org"]["loop_agents"] = 99                  # config.load adds env overrides to its copy
    first["webhooks"].append({"url": "y"})
    second = tomlfile.loads(text)
    assert second == {"org": {"loop_agents": 3}, "webhooks": [{"url": "x"}]}
    assert len(parses) == 1
    assert tomlfile.loads(text.replace("3", "4"))["org"]["loop_agents"] == 4     # any change: parsed again
    assert len(parses) == 2
    with pytest.raises(tomllib.TOMLDecodeError):
        tomlfile.loads("[org\n")


def test_a_role_reads_its_store_and_its_configuration_from_one_parse(tmp_path, monkeypatch):
    home = OrgHome(tmp_path)
    home.config_path.write_text('[org]\nloop_agents = 3\n[state]\nurl = ""\n')
    parses = []
    real = tomllib.loads
    monkeypatch.setattr(tomlfile.tomllib, "loads", lambda text: parses.append(text) or real(text))
    monkeypatch.setattr(tomlfile, "_last", None)
    assert home.store_url == ""
    assert config_mod.load_config(home).org.loop_agents == 3
    assert len(parses) == 1
    home.config_path.write_text('[org]\nloop_agents = 5\n')
    assert config_mod.load_config(home).org.loop_agents == 5          # the file changed: read anew


def test_the_default_file_is_rendered_when_asked_for_not_on_import():
    probe = ("import state_db.kernel.config as c; before = 'DEFAULT_TOML' in vars(c); "
             "text = c.DEFAULT_TOML; print(before, text == c.render_default(), 'DEFAULT_TOML' in vars(c))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=30,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.stdout.split() == ["False", "True", "True"], out.stderr
