"""More of the toolchains users run, through the real org and its sandbox, offline: an activated
virtual environment (``pytest -q`` found on PATH), ``make test``, ``node --test``, tox installed
as pipx installs it and nox (each with an environment created before the run), ``npm test`` with
vitest and with jest, and a verify command whose file operand is the file the goal is about —
each reaches ``goal_met`` with a fix the scripted model makes in one act. And the other side: ``uv run`` on a project it would have to
resolve over the network ends ``verify_unrunnable`` at the preflight, before any model request,
quoting uv and saying how to run it offline."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.e2e.test_toolchains import (BASE, BROKEN, PY, TEST, VENV_BIN, fix_script, install_pytest, org,  # noqa: F401
                                       project, python_project, run_to_goal, submitter, wheels)
from tests.support.org import query, wait_for

pytestmark = pytest.mark.timeout(300)


def test_an_activated_venv_runs_plain_pytest_q(org, wheels, tmp_path):  # noqa: F811
    """``source .venv/bin/activate`` before submitting: VIRTUAL_ENV set, its bin/ first on PATH."""
    venv = tmp_path / "activated"
    subprocess.run([str(BASE / "bin" / "python3"), "-m", "venv", "--without-pip", str(venv)], check=True)
    install_pytest(venv / "bin" / "python", wheels)
    ws = python_project(tmp_path, "activated-project")
    env = submitter([venv / "bin", "/usr/bin", "/bin"], VIRTUAL_ENV=str(venv))
    run_to_goal(org, ws, "pytest -q", fix_script(tmp_path, "calc.py", "a - b", "a + b"), env)


def test_make_test_runs_pytest_under_the_projects_interpreter(org, tmp_path):  # noqa: F811
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    ws = python_project(tmp_path, "make-project", {"Makefile": f"test:\n\t{PY} -m pytest -q -p no:cacheprovider\n"})
    env = submitter([VENV_BIN, "/usr/bin", "/bin"])
    run_to_goal(org, ws, "make test", fix_script(tmp_path, "calc.py", "a - b", "a + b"), env)


def test_node_test_runs_the_projects_tests(org, tmp_path):  # noqa: F811
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    ws = project(tmp_path / "node-test-project", {
        "package.json": json.dumps({"name": "calc", "version": "1.0.0", "private": True, "type": "commonjs"}),
        "calc.js": "exports.add = (a, b) => a - b;\n",
        "test/calc.test.js": "const test = require('node:test');\nconst assert = require('node:assert');\n"
                             "const { add } = require('../calc');\n"
                             "test('adds', () => assert.strictEqual(add(2, 3), 5));\n"
                             "test('adds zero', () => assert.strictEqual(add(2, 0), 2));\n"})
    env = submitter([Path(node).parent, "/usr/bin", "/bin"])
    run_to_goal(org, ws, "node --test", fix_script(tmp_path, "calc.js", "a - b", "a + b"), env)


def test_a_file_the_check_reads_is_the_doers_to_write(org, tmp_path):  # noqa: F811
    """``python check.py data.txt``-style operands: the file the goal is about is not held to the
    baseline as an invoked script (only what the command executes is); here it is code the
    baseline had, in the default change scope."""
    ws = project(tmp_path / "operand-project", {"calc.py": BROKEN, "check_add.py":
                 "import sys\nsys.path.insert(0, '.')\nfrom calc import add\nassert add(2, 3) == 5\n"})
    env = submitter([VENV_BIN, "/usr/bin", "/bin"])
    run_to_goal(org, ws, f"{PY} check_add.py calc.py", fix_script(tmp_path, "calc.py", "a - b", "a + b"), env)


def _ended_run(home, ws: Path, verify: str, script: Path, env: dict, *flags: str) -> tuple[dict, list[dict]]:
    argv = [PY, "-m", "scripts.cli.main", "submit", "fix the answer", "--workspace", str(ws), "--verify", verify,
            "--backend", f"scripted:{script}", "--max-iterations", "2", "--json", *flags]
    got = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=Path(__file__).parents[2],
                         env={**env, "ORG_HOME": str(home.root)})
    assert got.returncode == 0, got.stderr
    wid = json.loads(got.stdout)["id"]
    row = wait_for(lambda: (r := query(home, "SELECT * FROM work_items WHERE id=?", (wid,))[0])["status"] == "ended"
                   and r, timeout=60, what=f"{wid} to end")
    return row, query(home, "SELECT outcome, held_back FROM verdicts WHERE work_id=? ORDER BY at", (wid,))


def test_a_data_operand_the_baseline_had_reaches_the_checks_only_when_the_human_scopes_it(org, tmp_path):  # noqa: F811
    """A data file the check reads that the baseline already had may be the check's oracle
    (``diff out.txt expected.txt``): the doer's edit is held out of the default (code only) change
    scope and never verified — and ``--scope FILE`` at submit is how the honest user lets it through."""
    files = {"answer.txt": "wrong\n", "calc.py": BROKEN}
    verify = "grep -qx right answer.txt"
    env = submitter([VENV_BIN, "/usr/bin", "/bin"])
    ws = project(tmp_path / "unscoped", files)
    row, verdicts = _ended_run(org, ws, verify, fix_script(tmp_path, "answer.txt", "wrong", "right"), env)
    assert row["stop_reason"] != "goal_met", row
    held = json.loads(verdicts[0]["held_back"])
    assert verdicts[0]["outcome"] == "fail" and [(h["path"], h["kind"]) for h in held] == [("answer.txt", "out_of_scope")]
    ws = project(tmp_path / "scoped", files)
    row, verdicts = _ended_run(org, ws, verify, fix_script(tmp_path, "answer.txt", "wrong", "right"), env,
                               "--scope", "answer.txt")
    assert row["stop_reason"] == "goal_met", (row["stop_detail"], verdicts)
    assert verdicts[-1]["outcome"] == "pass" and json.loads(verdicts[-1]["held_back"]) == []
    assert (ws / "answer.txt").read_text() == "right\n"


def test_uv_run_that_must_resolve_over_the_network_is_unrunnable_before_any_model_request(org, tmp_path):  # noqa: F811
    uv = shutil.which("uv", path=str(VENV_BIN))
    if uv is None:
        pytest.skip("uv is not installed (it comes with the project's test extras)")
    ws = python_project(tmp_path, "uv-unsynced", {
        ".gitignore": ".venv/\n",
        "pyproject.toml": '[project]\nname = "calc"\nversion = "0.1.0"\nrequires-python = ">=3.11"\n'
                          'dependencies = []\n\n[dependency-groups]\ndev = ["pytest"]\n\n[tool.uv]\npackage = false\n'})
    script = fix_script(tmp_path, "calc.py", "a - b", "a + b")
    env = submitter([VENV_BIN, "/usr/bin", "/bin"], UV_CACHE_DIR=str(tmp_path / "empty-uv-cache"))
    argv = [PY, "-m", "scripts.cli.main", "submit", "fix add", "--workspace", str(ws), "--verify", "uv run pytest -q",
            "--backend", f"scripted:{script}", "--max-iterations", "3", "--json"]
    got = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=Path(__file__).parents[2],
                         env={**env, "ORG_HOME": str(org.root)})
    wid = json.loads(got.stdout)["id"]
    row = wait_for(lambda: (r := query(org, "SELECT * FROM work_items WHERE id=?", (wid,))[0])["status"] == "ended"
                   and r, timeout=90, what=f"{wid} to end")
    assert row["stop_reason"] == "verify_unrunnable", row["stop_detail"]
    assert "`uv run pytest -q` never reached its tests on the baseline" in row["stop_detail"]
    assert "--frozen --no-sync" in row["stop_detail"]
    assert query(org, "SELECT COUNT(*) AS n FROM iterations WHERE work_id=?", (wid,))[0]["n"] == 0
    assert query(org, "SELECT COUNT(*) AS n FROM model_calls WHERE work_id=?", (wid,))[0]["n"] == 0


def test_uv_run_on_a_packaged_project_synced_before_the_run_needs_no_network(org, wheels, tmp_path):  # noqa: F811
    """A uv project that uv builds and installs (a build backend, ``package`` on) and that its user
    synced before submitting: ``uv run`` in the eval-agent's snapshot must not rebuild it (the
    snapshot's files are newer than the install, and the build backend is not in the sandbox)."""
    uv = shutil.which("uv", path=str(VENV_BIN))
    if uv is None:
        pytest.skip("uv is not installed (it comes with the project's test extras)")
    got = subprocess.run([PY, "-m", "pip", "download", "-q", "-d", str(wheels), "flit_core>=3.2,<4"],
                         capture_output=True, text=True, timeout=180)
    if got.returncode != 0:
        pytest.skip(f"cannot fetch flit_core's wheel: {got.stderr.strip()[-300:]}")
    ws = python_project(tmp_path, "uv-packaged", {
        ".gitignore": ".venv/\n",
        "pyproject.toml": '[build-system]\nrequires = ["flit_core>=3.2,<4"]\nbuild-backend = "flit_core.buildapi"\n\n'
                          '[project]\nname = "calc"\nversion = "0.1.0"\ndescription = "calc"\n'
                          'requires-python = ">=3.11"\ndependencies = []\n\n[dependency-groups]\ndev = ["pytest"]\n'})
    subprocess.run([uv, "sync", "-q", "--offline", "--no-index", "--find-links", str(wheels),
                    "--python", str(BASE / "bin" / "python3")], cwd=ws, check=True, timeout=180,
                   env={**os.environ, "UV_CACHE_DIR": str(tmp_path / "uv-cache")})
    assert list((ws / ".venv").glob("lib/python*/site-packages/calc-0.1.0.dist-info"))     # installed, as the user has it
    env = submitter([VENV_BIN, "/usr/bin", "/bin"], UV_CACHE_DIR=str(tmp_path / "empty-uv-cache"))
    run_to_goal(org, ws, "uv run pytest -q", fix_script(tmp_path, "calc.py", "a - b", "a + b"), env)


@pytest.fixture(scope="module")
def tox_tool(tmp_path_factory, wheels):  # noqa: F811
    """tox installed the way pipx installs it: its own virtual environment, and a link to its
    script in a folder on the user's PATH (wheels fetched once from the package index)."""
    root = tmp_path_factory.mktemp("pipx")
    got = subprocess.run([PY, "-m", "pip", "download", "-q", "-d", str(wheels), "tox"], capture_output=True,
                         text=True, timeout=180)
    if got.returncode != 0:
        pytest.skip(f"cannot fetch tox's wheels: {got.stderr.strip()[-300:]}")
    venv = root / "venvs" / "tox"
    subprocess.run([str(BASE / "bin" / "python3"), "-m", "venv", str(venv)], check=True, timeout=120)
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-index", "--find-links",
                    str(wheels), "tox"], check=True, capture_output=True, timeout=180)
    (root / "bin").mkdir()
    (root / "bin" / "tox").symlink_to(venv / "bin" / "tox")
    return root / "bin"


def test_tox_with_an_environment_created_before_the_run(org, wheels, tox_tool, tmp_path):  # noqa: F811
    ws = python_project(tmp_path, "tox-project", {
        ".gitignore": ".tox/\n",
        "tox.ini": "[tox]\nenv_list = py\n\n[testenv]\nskip_install = true\ndeps = pytest\ncommands = pytest -q\n"})
    env = submitter([tox_tool, "/usr/bin", "/bin"])
    subprocess.run(["tox", "-e", "py", "--notest"], cwd=ws, check=True, capture_output=True, timeout=300,
                   env={**env, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheels)})
    run_to_goal(org, ws, "tox -e py", fix_script(tmp_path, "calc.py", "a - b", "a + b"), env)


def test_nox_reusing_a_session_environment_created_before_the_run(org, wheels, tmp_path):  # noqa: F811
    """nox in its own virtual environment named by path; ``-R`` reuses the session's environment
    and installs nothing (offline)."""
    got = subprocess.run([PY, "-m", "pip", "download", "-q", "-d", str(wheels), "nox"], capture_output=True,
                         text=True, timeout=180)
    if got.returncode != 0:
        pytest.skip(f"cannot fetch nox's wheels: {got.stderr.strip()[-300:]}")
    venv = tmp_path / "nox-venv"
    subprocess.run([str(BASE / "bin" / "python3"), "-m", "venv", str(venv)], check=True, timeout=120)
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-index", "--find-links",
                    str(wheels), "nox"], check=True, capture_output=True, timeout=180)
    ws = python_project(tmp_path, "nox-project", {
        ".gitignore": ".nox/\n",
        "noxfile.py": "import nox\n\n\n@nox.session\ndef tests(session):\n    session.install('pytest')\n"
                      "    session.run('pytest', '-q')\n"})
    env = submitter([venv / "bin", "/usr/bin", "/bin"])
    subprocess.run([str(venv / "bin" / "nox"), "-s", "tests", "--install-only"], cwd=ws, check=True,
                   capture_output=True, timeout=300, env={**env, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheels)})
    run_to_goal(org, ws, f"{venv}/bin/nox -s tests -R", fix_script(tmp_path, "calc.py", "a - b", "a + b"), env)


@pytest.fixture(scope="module")
def node_modules(tmp_path_factory):
    """vitest and jest installed once from the npm registry (what ``npm install`` leaves in a
    project), copied into each project below."""
    if shutil.which("npm") is None or shutil.which("node") is None:
        pytest.skip("node and npm are not installed")
    root = tmp_path_factory.mktemp("npm")
    (root / "package.json").write_text(json.dumps({"name": "deps", "version": "1.0.0", "private": True}))
    got = subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--silent", "vitest@3", "jest@29"], cwd=root,
                         capture_output=True, text=True, timeout=300)
    if got.returncode != 0:
        pytest.skip(f"cannot install vitest and jest: {got.stderr.strip()[-300:]}")
    return root / "node_modules"


# vitest's bundler instantiates WebAssembly, whose reservations no address-space limit admits
# (seen failing under prlimit --as of 2 GiB and of 16 GiB alike): the sandbox's memory bound
# (sandbox.memory_mb, applied as RLIMIT_AS) stops it before any test runs
_WASM = pytest.mark.xfail(strict=True, reason="RLIMIT_AS leaves no room for WebAssembly's reservations")


@pytest.mark.parametrize("runner,script", [pytest.param("vitest", "vitest run", marks=_WASM), ("jest", "jest")])
def test_npm_test_with_vitest_or_jest(org, node_modules, tmp_path, runner, script):  # noqa: F811
    test = ("import { test, expect } from 'vitest';\nimport { add } from '../calc.js';\n"
            "test('adds', () => expect(add(2, 3)).toBe(5));\n" if runner == "vitest" else
            "const { add } = require('../calc.js');\ntest('adds', () => expect(add(2, 3)).toBe(5));\n")
    calc = "export const add = (a, b) => a - b;\n" if runner == "vitest" else "exports.add = (a, b) => a - b;\n"
    ws = project(tmp_path / f"{runner}-project", {
        ".gitignore": "node_modules/\n",
        "package.json": json.dumps({"name": "calc", "version": "1.0.0", "private": True, "scripts": {"test": script},
                                    **({"type": "module"} if runner == "vitest" else {})}),
        "calc.js": calc, "test/calc.test.js": test})
    subprocess.run(["cp", "-a", str(node_modules), str(ws / "node_modules")], check=True, timeout=120)
    env = submitter([Path(shutil.which("npm")).parent, "/usr/bin", "/bin"])
    run_to_goal(org, ws, "npm test", fix_script(tmp_path, "calc.js", "a - b", "a + b"), env)


def test_poetry_run_pytest_with_the_projects_in_project_environment(org, wheels, tmp_path):  # noqa: F811
    """poetry installed pipx-style; the project's environment in ``.venv`` (poetry.toml's
    ``virtualenvs.in-project``), made before the run."""
    got = subprocess.run([PY, "-m", "pip", "download", "-q", "-d", str(wheels), "poetry"], capture_output=True,
                         text=True, timeout=240)
    if got.returncode != 0:
        pytest.skip(f"cannot fetch poetry's wheels: {got.stderr.strip()[-300:]}")
    tools = tmp_path / "pipx"
    subprocess.run([str(BASE / "bin" / "python3"), "-m", "venv", str(tools / "venvs" / "poetry")], check=True,
                   timeout=120)
    subprocess.run([str(tools / "venvs" / "poetry" / "bin" / "python"), "-m", "pip", "install", "-q", "--no-index",
                    "--find-links", str(wheels), "poetry"], check=True, capture_output=True, timeout=300)
    (tools / "bin").mkdir()
    (tools / "bin" / "poetry").symlink_to(tools / "venvs" / "poetry" / "bin" / "poetry")
    ws = python_project(tmp_path, "poetry-project", {
        ".gitignore": ".venv/\n", "poetry.toml": "[virtualenvs]\nin-project = true\n",
        "pyproject.toml": '[tool.poetry]\nname = "calc"\nversion = "0.1.0"\ndescription = ""\nauthors = []\n'
                          'package-mode = false\n\n[tool.poetry.dependencies]\npython = "^3.11"\n\n'
                          '[tool.poetry.group.dev.dependencies]\npytest = "*"\n'})
    subprocess.run([str(BASE / "bin" / "python3"), "-m", "venv", "--without-pip", str(ws / ".venv")], check=True)
    install_pytest(ws / ".venv" / "bin" / "python", wheels)
    env = submitter([tools / "bin", "/usr/bin", "/bin"])
    run_to_goal(org, ws, "poetry run pytest -q", fix_script(tmp_path, "calc.py", "a - b", "a + b"), env)


def test_hatch_run_with_an_environment_created_before_the_run(org, wheels, tmp_path):  # noqa: F811
    got = subprocess.run([PY, "-m", "pip", "download", "-q", "-d", str(wheels), "hatch"], capture_output=True,
                         text=True, timeout=240)
    if got.returncode != 0:
        pytest.skip(f"cannot fetch hatch's wheels: {got.stderr.strip()[-300:]}")
    venv = tmp_path / "hatch-venv"
    subprocess.run([str(BASE / "bin" / "python3"), "-m", "venv", str(venv)], check=True, timeout=120)
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-index", "--find-links",
                    str(wheels), "hatch"], check=True, capture_output=True, timeout=300)
    ws = python_project(tmp_path, "hatch-project", {
        ".gitignore": ".venv/\n",
        "pyproject.toml": '[project]\nname = "calc"\nversion = "0.1.0"\nrequires-python = ">=3.11"\n\n'
                          '[tool.hatch.envs.default]\npath = ".venv"\nskip-install = true\ndependencies = ["pytest"]\n'
                          '[tool.hatch.envs.default.scripts]\ntest = "pytest -q"\n'})
    env = submitter([venv / "bin", "/usr/bin", "/bin"])
    subprocess.run([str(venv / "bin" / "hatch"), "env", "create"], cwd=ws, check=True, capture_output=True,
                   timeout=300, env={**env, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheels),
                                     "UV_OFFLINE": "1", "UV_FIND_LINKS": str(wheels)})
    run_to_goal(org, ws, "hatch run test", fix_script(tmp_path, "calc.py", "a - b", "a + b"), env)
