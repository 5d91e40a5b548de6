"""The user's real toolchains through the real org and the real sandbox: each project is a small
git repository with a failing test; the scripted model fixes it in one act and the eval-agent,
running the verify command in its sandbox, ends the run with ``goal_met``. Nothing about the
toolchains is mocked: a pyenv root with its own shims, virtual environments inside and outside
the workspace, a uv project, npm."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from roles.workbench.sandbox import bubblewrap
from tests.support.org import query, running_org, wait_for

pytestmark = pytest.mark.skipif(bubblewrap() is None, reason="bubblewrap (bwrap) is not installed")
PY = sys.executable
BASE = Path(sys.base_prefix)
VENV_BIN = Path(PY).parent
CONFIG = """
[org]
loop_agents = 2
[supervisor]
heartbeat_s = 0.2
stop_timeout_s = 6.0
"""
BROKEN = "def add(a, b):\n    return a - b\n"
TEST = "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"


@pytest.fixture(scope="module")
def org():
    with running_org(CONFIG) as home:
        yield home


@pytest.fixture(scope="module")
def wheels(tmp_path_factory):
    """pytest and its dependencies as wheels, the versions this project's venv runs (pip's cache
    makes this a local copy after the first run)."""
    folder = tmp_path_factory.mktemp("wheels")
    want = f"pytest=={metadata.version('pytest')}"
    got = subprocess.run([PY, "-m", "pip", "download", "-q", "-d", str(folder), want, "colorama"],
                         capture_output=True, text=True, timeout=120)
    if got.returncode != 0:
        pytest.skip(f"cannot fetch pytest's wheels: {got.stderr.strip()[-300:]}")
    return folder


def install_pytest(python: Path, wheels: Path) -> None:
    subprocess.run([PY, "-m", "pip", "--python", str(python), "install", "-q", "--no-index", "--find-links", str(wheels),
                    "pytest"], check=True, capture_output=True, timeout=120)


def project(root: Path, files: dict[str, str]) -> Path:
    """A git repository holding ``files``, committed."""
    root.mkdir(parents=True)
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(root)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "start"], check=True)
    return root


def fix_script(folder: Path, path: str, old: str, new: str) -> Path:
    script = folder / "fix.json"
    script.write_text(json.dumps({"version": 1, "acts": [[
        {"text": "Fixing it.", "tool_uses": [{"name": "edit_file", "input": {"path": path, "old_string": old,
                                                                              "new_string": new}}]},
        {"text": f"I fixed {path}."}]]}))
    return script


def run_to_goal(home, ws: Path, verify: str, script: Path, env: dict) -> dict:
    """Submit through the CLI with the submitter's ``env`` and wait for the run to end."""
    argv = [PY, "-m", "scripts.cli.main", "submit", "fix add", "--workspace", str(ws), "--verify", verify,
            "--backend", f"scripted:{script}", "--max-iterations", "3", "--json"]
    got = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=Path(__file__).parents[2],
                         env={**env, "ORG_HOME": str(home.root)})
    assert got.returncode == 0, got.stderr
    wid = json.loads(got.stdout)["id"]
    row = wait_for(lambda: (r := query(home, "SELECT * FROM work_items WHERE id=?", (wid,))[0])["status"] == "ended"
                   and r, timeout=40, what=f"{wid} to end")
    verdicts = query(home, "SELECT outcome, written_by, checks FROM verdicts WHERE work_id=? ORDER BY at", (wid,))
    assert row["stop_reason"] == "goal_met", (row["stop_detail"], [v["checks"][:1500] for v in verdicts])
    assert verdicts[-1]["outcome"] == "pass" and verdicts[-1]["written_by"] == "eval-agent"
    return row


def submitter(path: list[str], home: Path | None = None, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYENV_VERSION")}
    env.update(PATH=os.pathsep.join(map(str, path)), HOME=str(home or Path.home()), **extra)
    return env


def python_project(tmp_path: Path, name: str, extra: dict[str, str] | None = None) -> Path:
    return project(tmp_path / name, {"calc.py": BROKEN, "test_calc.py": TEST, **(extra or {})})


def test_a_pyenv_interpreter_under_the_submitters_home_runs_pytest_q(org, wheels, tmp_path):
    """pyenv's own shims (made by its ``rehash``) on PATH, its versions behind them under a home
    the sandbox otherwise hides."""
    fake_home = tmp_path / "home"
    root = fake_home / ".pyenv"
    for part in ("bin", "libexec"):
        shutil.copytree(Path.home() / ".pyenv" / part, root / part, symlinks=True)
    if not (root / "libexec" / "pyenv").exists():
        pytest.skip("no pyenv installation to copy on this machine")
    subprocess.run([str(BASE / "bin" / "python3"), "-m", "venv", "--without-pip", str(root / "versions" / "3.11")],
                   check=True)
    install_pytest(root / "versions" / "3.11" / "bin" / "python", wheels)
    (root / "version").write_text("3.11\n")
    env = submitter([root / "shims", root / "bin", "/usr/bin", "/bin"], fake_home, PYENV_ROOT=str(root))
    subprocess.run([str(root / "bin" / "pyenv"), "rehash"], check=True, env=env)
    assert (root / "shims" / "pytest").exists()
    ws = python_project(tmp_path, "pyenv-project")
    run_to_goal(org, ws, "pytest -q", fix_script(tmp_path, "calc.py", "a - b", "a + b"), env)


def test_a_venv_inside_the_workspace_runs_by_its_own_path(org, wheels, tmp_path):
    ws = python_project(tmp_path, "venv-inside", {".gitignore": ".venv/\n"})
    subprocess.run([str(BASE / "bin" / "python3"), "-m", "venv", "--without-pip", str(ws / ".venv")], check=True)
    install_pytest(ws / ".venv" / "bin" / "python", wheels)
    env = submitter(["/usr/bin", "/bin"])
    run_to_goal(org, ws, ".venv/bin/pytest -q", fix_script(tmp_path, "calc.py", "a - b", "a + b"), env)


def test_a_venv_outside_the_workspace_named_by_the_verify_command(org, wheels, tmp_path):
    venv = tmp_path / "tools-venv"
    subprocess.run([str(BASE / "bin" / "python3"), "-m", "venv", "--without-pip", str(venv)], check=True)
    install_pytest(venv / "bin" / "python", wheels)
    ws = python_project(tmp_path, "venv-outside")
    env = submitter(["/usr/bin", "/bin"])
    run_to_goal(org, ws, f"{venv}/bin/pytest -q", fix_script(tmp_path, "calc.py", "a - b", "a + b"), env)


def test_a_uv_project_runs_uv_run_pytest(org, wheels, tmp_path):
    uv = shutil.which("uv", path=str(VENV_BIN))
    if uv is None:
        pytest.skip("uv is not installed (it comes with the project's test extras)")
    ws = python_project(tmp_path, "uv-project", {
        ".gitignore": ".venv/\n",
        "pyproject.toml": '[project]\nname = "calc"\nversion = "0.1.0"\nrequires-python = ">=3.11"\n'
                          'dependencies = []\n\n[dependency-groups]\ndev = ["pytest"]\n\n[tool.uv]\npackage = false\n'})
    subprocess.run([uv, "sync", "-q", "--offline", "--no-index", "--find-links", str(wheels),
                    "--python", str(BASE / "bin" / "python3")], cwd=ws, check=True, timeout=120,
                   env={**os.environ, "UV_CACHE_DIR": str(tmp_path / "uv-cache")})
    env = submitter([VENV_BIN, "/usr/bin", "/bin"])
    run_to_goal(org, ws, "uv run pytest -q", fix_script(tmp_path, "calc.py", "a - b", "a + b"), env)


def test_a_node_project_runs_npm_test(org, tmp_path):
    if shutil.which("npm") is None or shutil.which("node") is None:
        pytest.skip("node and npm are not installed")
    ws = project(tmp_path / "node-project", {
        "package.json": json.dumps({"name": "calc", "version": "1.0.0", "private": True,
                                    "scripts": {"test": "node test.js"}}),
        "calc.js": "exports.add = (a, b) => a - b;\n",
        "test.js": "const assert = require('assert');\nassert.strictEqual(require('./calc').add(2, 3), 5);\n"
                   "console.log('ok');\n"})
    env = submitter([Path(shutil.which("npm")).parent, "/usr/bin", "/bin"])
    run_to_goal(org, ws, "npm test", fix_script(tmp_path, "calc.js", "a - b", "a + b"), env)
