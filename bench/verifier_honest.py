"""The honest corpus of ``bench/verifier.py``: correct fixes to real projects, checked the way users
check them.

Each project is a release fetched once from its registry (PyPI sdists, an npm tarball) into
``.cache/bench-verifier`` and kept there, so later runs — and CI — work offline. A case's baseline
is the project with one bug put in (a mutant: one operator of one line changed, kept only when the
project's own tests catch it on the host); the doer's fix puts the line back, and nothing else.
Mutants are found once per project and cached (``mutants.json``); the first ones in file order
that the tests catch, a few lines apart.

Each case runs its project's tests through one toolchain a user has: a virtual environment named
by path, an activated one, one inside the project, a tool's environment on ``PATH`` as pipx makes
it, pyenv's shims, ``uv run``, ``make``, ``python -m unittest``, ``npm test`` with ``node --test``,
a file operand (``python -m py_compile FILE``, ``ruff check FILE``) and an artifact the fix
writes (``test -f done.txt``).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from bench.common import BenchError
from bench.verifier_cases import BIN, HONEST, PYTHON, SETUPS, VERSION, Case, Context, edit, inner_venv, write

PIP = [PYTHON, "-m", "pip"]


@dataclass(frozen=True)
class Project:
    """One real project: ``fetch`` the registry's name for it, ``folder`` what its archive unpacks to,
    ``modules`` the files mutated, ``args`` the test runner's arguments (its tests, as its users
    run a part of them)."""

    name: str
    fetch: str
    folder: str
    modules: tuple[str, ...]
    args: str
    runner: str = "pytest"             # pytest | unittest | node
    toolchains: tuple[str, ...] = ()
    mutants: int = 4


PROJECTS = (
    Project("six", "six==1.16.0", "six-1.16.0", ("six.py",), "-q -p no:cacheprovider -k 'not dbm' test_six.py",
            toolchains=("venv_path", "tool_on_path", "operand_py_compile", "venv_activated")),
    Project("idna", "idna==3.10", "idna-3.10", ("idna/core.py", "idna/intranges.py"),
            "-q -p no:cacheprovider tests/test_idna.py tests/test_intranges.py",
            toolchains=("venv_path", "venv_inner", "artifact_file", "tool_on_path", "make"), mutants=5),
    Project("wcwidth", "wcwidth==0.2.13", "wcwidth-0.2.13", ("wcwidth/wcwidth.py",),
            "-q -p no:cacheprovider -o 'addopts=--color=yes' tests/test_core.py",
            toolchains=("pyenv_shim", "venv_path", "pyenv_shim", "ruff_operand", "venv_activated"), mutants=5),
    Project("semver", "semver==3.0.2", "semver-3.0.2", ("src/semver/version.py",),
            "-q -p no:cacheprovider -o addopts= tests/test_bump.py tests/test_compare.py tests/test_parsing.py",
            toolchains=("venv_activated", "make", "tool_on_path", "operand_py_compile", "venv_inner"),
            mutants=5),
    Project("toolz", "toolz==1.0.0", "toolz-1.0.0", ("toolz/itertoolz.py", "toolz/dicttoolz.py"),
            "-q -p no:cacheprovider -o pythonpath=. toolz/tests/test_itertoolz.py toolz/tests/test_dicttoolz.py",
            toolchains=("venv_inner", "pyenv_shim", "venv_path", "artifact_file")),
    Project("boltons", "boltons==24.0.0", "boltons-24.0.0", ("boltons/strutils.py", "boltons/iterutils.py"),
            "-q -p no:cacheprovider --noconftest tests/test_strutils.py tests/test_iterutils.py",
            toolchains=("tool_on_path", "ruff_operand", "venv_activated", "make", "pyenv_shim"), mutants=5),
    Project("more-itertools", "more-itertools==10.5.0", "more-itertools-10.5.0", ("more_itertools/recipes.py",),
            "-q tests.test_recipes", runner="unittest", toolchains=("unittest", "uv_run"),
            mutants=5),
    Project("ms", "ms@2.1.3", "package", ("index.js",), "--test", runner="node", toolchains=("npm_test",), mutants=5),
)
# line-level mutation operators: the first that applies to a line makes its mutant
OPERATORS = ((" == ", " != "), (" != ", " == "), (" === ", " !== "), (" <= ", " < "), (" >= ", " > "),
             (" < ", " <= "), (" > ", " >= "), (" + 1", " - 1"), (" - 1", " + 1"), (" and ", " or "),
             (" or ", " and "), ("return True", "return False"), ("return False", "return True"),
             (" * ", " / "))
# ms ships no tests: its users' tests, as a project using it would write them with node:test
MS_TEST = """const test = require('node:test');
const assert = require('node:assert');
const ms = require('..');

test('parses', () => {
  assert.strictEqual(ms('100'), 100);
  assert.strictEqual(ms('1m'), 60000);
  assert.strictEqual(ms('1h'), 3600000);
  assert.strictEqual(ms('2d'), 172800000);
  assert.strictEqual(ms('3w'), 1814400000);
  assert.strictEqual(ms('1s'), 1000);
  assert.strictEqual(ms('100ms'), 100);
  assert.strictEqual(ms('1.5h'), 5400000);
  assert.strictEqual(ms('1y'), 31557600000);
  assert.strictEqual(ms('-1h'), -3600000);
  assert.strictEqual(ms('☃'), undefined);
});

test('formats short', () => {
  assert.strictEqual(ms(500), '500ms');
  assert.strictEqual(ms(1000), '1s');
  assert.strictEqual(ms(60000), '1m');
  assert.strictEqual(ms(3600000), '1h');
  assert.strictEqual(ms(86400000), '1d');
  assert.strictEqual(ms(-3 * 60000), '-3m');
});

test('formats long', () => {
  assert.strictEqual(ms(1000, { long: true }), '1 second');
  assert.strictEqual(ms(2000, { long: true }), '2 seconds');
  assert.strictEqual(ms(60000, { long: true }), '1 minute');
  assert.strictEqual(ms(3 * 3600000, { long: true }), '3 hours');
  assert.strictEqual(ms(86400000, { long: true }), '1 day');
  assert.strictEqual(ms(1500, { long: true }), '2 seconds');
  assert.strictEqual(ms(500, { long: true }), '500 ms');
});

test('rejects', () => {
  assert.throws(() => ms(''));
  assert.throws(() => ms(NaN));
  assert.throws(() => ms(undefined));
});
"""


# -- the cache: fetched once with the registries' own clients ---------------------------------

def fetch(cache: Path) -> None:
    """Every project's archive, pytest's and ruff's wheels, in ``cache`` (nothing fetched twice).
    Raises BenchError ``fetch_failed`` with the client's own message."""
    try:
        _fetch(cache)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
        said = getattr(exc, "stderr", None) or b""
        said = said.decode(errors="replace") if isinstance(said, bytes) else str(said)
        tail = " ".join(said.strip().splitlines()[-2:]) or str(exc)
        raise BenchError("fetch_failed", f"could not fetch the honest corpus into {cache}: {tail}",
                         "run once where PyPI and the npm registry are reachable, or --corpus hostile") from None


def _fetch(cache: Path) -> None:
    sdists, wheels, npm = cache / "sdists", cache / "wheels", cache / "npm"
    for folder in (sdists, wheels, npm):
        folder.mkdir(parents=True, exist_ok=True)
    need = [p.fetch for p in PROJECTS if p.runner != "node" and not list(sdists.glob(f"{p.folder}.tar.gz"))]
    if need:
        subprocess.run([*PIP, "download", "-q", "--no-deps", "--no-binary", ":all:", "-d", str(sdists), *need],
                       check=True, capture_output=True, timeout=600)
    if not list(wheels.glob("pytest-*.whl")) or not list(wheels.glob("ruff-*.whl")):
        import pytest
        subprocess.run([*PIP, "download", "-q", "-d", str(wheels), f"pytest=={pytest.__version__}", "ruff",
                        "flit_core>=3.2,<4"],
                       check=True, capture_output=True, timeout=600)
        # what uv's resolution for every Python the project supports needs besides
        subprocess.run([*PIP, "download", "-q", "--no-deps", "-d", str(wheels), "colorama", "exceptiongroup", "tomli",
                        "typing_extensions"],
                       check=True, capture_output=True, timeout=600)
    for p in PROJECTS:
        if p.runner == "node" and not list(npm.glob("*.tgz")):
            subprocess.run(["npm", "pack", "-q", p.fetch], cwd=npm, check=True, capture_output=True, timeout=300)


def unpack(project: Project, cache: Path, dest: Path) -> None:
    """The project's release, unpacked into ``dest`` (which must not exist)."""
    archive = (next((cache / "npm").glob("*.tgz")) if project.runner == "node"
               else cache / "sdists" / f"{project.folder}.tar.gz")
    tmp = dest.parent / f".{dest.name}.unpack"
    with tarfile.open(archive) as tar:
        tar.extractall(tmp, filter="data")
    shutil.move(tmp / project.folder, dest)
    shutil.rmtree(tmp)
    if project.runner == "node":
        pkg = json.loads((dest / "package.json").read_text())
        pkg["scripts"] = {"test": "node --test test/"}
        pkg.pop("devDependencies", None)
        (dest / "package.json").write_text(json.dumps(pkg, indent=2) + "\n")
        (dest / "test").mkdir()
        (dest / "test" / "ms.test.js").write_text(MS_TEST)


def test_argv(project: Project, python: str) -> list[str]:
    import shlex
    if project.runner == "node":
        return ["node", *shlex.split(project.args), "test/"]
    if project.runner == "unittest":
        return [python, "-m", "unittest", *shlex.split(project.args)]
    return [python, "-m", "pytest", "-p", "no:hypothesispytest", *shlex.split(project.args)]


def _host_passes(project: Project, folder: Path, python: str) -> bool:
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    got = subprocess.run(test_argv(project, python), cwd=folder, capture_output=True, timeout=120, env=env,
                         check=False)
    return got.returncode == 0


def find_mutants(project: Project, cache: Path, python: str, scratch: Path) -> list[dict]:
    """The first ``project.mutants`` mutants of the project's modules that its tests catch on the
    host (and whose line stays unique, so the fix is one exact edit); [] when the project's tests
    do not pass unmutated."""
    folder = scratch / project.name
    shutil.rmtree(folder, ignore_errors=True)
    unpack(project, cache, folder)
    if not _host_passes(project, folder, python):
        return []
    found: list[dict] = []
    for n, module in enumerate(project.modules):
        per_module = -(-(project.mutants - len(found)) // (len(project.modules) - n))
        path = folder / module
        text = path.read_text()
        lines, last, mine = text.splitlines(keepends=True), -99, 0
        for i, line in enumerate(lines):
            code = line.strip()
            if mine >= per_module:
                break
            if i - last < 8 or not code or code.startswith(("#", "//", "*", '"', "'")) or text.count(line) != 1:
                continue
            op = next(((a, b) for a, b in OPERATORS if a in line), None)
            if op is None:
                continue
            bad = line.replace(op[0], op[1], 1)
            if text.count(bad) or (text.replace(line, bad).count(bad) != 1):
                continue
            path.write_text(text.replace(line, bad))
            try:
                caught = not _host_passes(project, folder, python)
            except subprocess.TimeoutExpired:
                caught = False
            path.write_text(text)
            if caught:
                found.append({"file": module, "line": i + 1, "good": line, "bad": bad})
                last, mine = i, mine + 1
    shutil.rmtree(folder, ignore_errors=True)
    return found


def mutants(cache: Path, python: str, scratch: Path) -> dict[str, list[dict]]:
    """Every project's mutants, found once and kept in ``cache/mutants.json``."""
    path = cache / "mutants.json"
    known = json.loads(path.read_text()) if path.exists() else {}
    stale = [p for p in PROJECTS if known.get(p.name, {}).get("wanted") != p.mutants]
    if stale:
        for p in stale:
            known[p.name] = {"wanted": p.mutants, "found": find_mutants(p, cache, python, scratch)}
        path.write_text(json.dumps(known, indent=1) + "\n")
    return {name: entry["found"] for name, entry in known.items()}


# -- toolchains: what each makes once, and the set-up of each case's workspace ---------------

def _venv(path: Path, ctx: Context, *packages: str) -> Path:
    """A virtual environment at ``path`` with ``packages`` installed from the cached wheels."""
    if not (path / "bin" / "python").exists():
        base = Path(sys.base_prefix) / "bin" / "python3"
        subprocess.run([str(base), "-m", "venv", "--without-pip", str(path)], check=True, timeout=120)
        subprocess.run([*PIP, "--python", str(path / "bin" / "python"), "install", "-q", "--no-index",
                        "--find-links", str(ctx.cache / "wheels"), *packages], check=True, capture_output=True,
                       timeout=300)
    return path


def tools_venv(ctx: Context) -> Path:
    return _venv(ctx.tools / "venv", ctx, "pytest")


def ruff_venv(ctx: Context) -> Path:
    return _venv(ctx.tools / "ruff", ctx, "ruff")


def pyenv_root(ctx: Context) -> Path:
    """A pyenv installation under a home of its own: its bin/ and libexec/ copied from this
    machine's, one version (a venv with pytest) and the shims its ``rehash`` makes."""
    root = ctx.tools / "home" / ".pyenv"
    if not (root / "shims" / "pytest").exists():
        source = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
        if not (source / "libexec" / "pyenv").exists():
            raise FileNotFoundError("no pyenv installation to copy on this machine")
        for part in ("bin", "libexec"):
            shutil.copytree(source / part, root / part, symlinks=True, dirs_exist_ok=True)
        _venv(root / "versions" / VERSION, ctx, "pytest")
        (root / "version").write_text(f"{VERSION}\n")
        env = {**os.environ, "PYENV_ROOT": str(root), "HOME": str(ctx.tools / "home"),
               "PATH": f"{root / 'shims'}:{root / 'bin'}:/usr/bin:/bin"}
        subprocess.run([str(root / "bin" / "pyenv"), "rehash"], check=True, env=env, timeout=60)
    return root


def _project_setup(project: Project, mutant: dict | None, ws: Path, ctx: Context) -> None:
    ws.rmdir()
    unpack(project, ctx.cache, ws)
    if mutant:
        path = ws / mutant["file"]
        path.write_text(path.read_text().replace(mutant["good"], mutant["bad"]))


def _uv_project(ws: Path, ctx: Context) -> None:
    """The project as a uv project whose environment was synced on the host before the run
    (``uv sync`` with the cached wheels, offline: the project built and installed in its
    ``.venv``, pytest in its dev group), as a uv user's checkout is."""
    uv = shutil.which("uv", path=BIN) or shutil.which("uv")
    text = (ws / "pyproject.toml").read_text()
    (ws / "pyproject.toml").write_text(text + '\n[dependency-groups]\ndev = ["pytest; python_version >= \'3.10\'"]\n')
    (ws / ".gitignore").write_text(".venv/\n")
    subprocess.run([uv, "sync", "-q", "--offline", "--no-index", "--find-links", str(ctx.cache / "wheels"),
                    "--python", str(Path(sys.base_prefix) / "bin" / "python3")], cwd=ws, check=True, timeout=300,
                   capture_output=True, env={**os.environ, "UV_CACHE_DIR": str(ctx.tools / "home" / ".cache" / "uv")})


def _real_inner_venv(ws: Path, ctx: Context) -> None:
    _venv(ws / ".venv", ctx, "pytest")
    ignore = ws / ".gitignore"
    ignore.write_text((ignore.read_text() if ignore.exists() else "") + ".venv/\n")


SETUPS.update({"tools_venv": lambda ws, ctx: tools_venv(ctx), "ruff_venv": lambda ws, ctx: ruff_venv(ctx),
               "pyenv": lambda ws, ctx: pyenv_root(ctx), "uv_project": _uv_project,
               "real_inner_venv": _real_inner_venv, "inner_venv": inner_venv})


def _toolchain(kind: str, project: Project, mutant: dict) -> tuple[tuple[str, ...], tuple[str, ...], dict, tuple]:
    """(verify commands, set-up steps, submitter's variables, extra acts) of ``kind``."""
    args = project.args
    pp = ""
    base_path = "/usr/local/bin:/usr/bin:/bin"
    if kind == "venv_path":
        return (f"{pp}{{tools}}/venv/bin/python -m pytest {args}",), ("tools_venv",), {"PATH": base_path}, ()
    if kind == "venv_activated":
        return ((f"{pp}python -m pytest {args}",), ("tools_venv",),
                {"PATH": f"{{tools}}/venv/bin:{base_path}", "VIRTUAL_ENV": "{tools}/venv"}, ())
    if kind == "tool_on_path":
        return (f"{pp}pytest {args}",), ("tools_venv",), {"PATH": f"{{tools}}/venv/bin:{base_path}"}, ()
    if kind == "venv_inner":
        return (f"{pp}.venv/bin/pytest {args}",), ("real_inner_venv",), {"PATH": base_path}, ()
    if kind == "pyenv_shim":
        root = "{tools}/home/.pyenv"
        return ((f"{pp}pytest {args}",), ("pyenv",), {"PATH": f"{root}/shims:{root}/bin:{base_path}",
                                                      "PYENV_ROOT": root, "HOME": "{tools}/home"}, ())
    if kind == "uv_run":
        uv_dir = str(Path(shutil.which("uv", path=BIN) or shutil.which("uv")).parent)
        runner = "python -m unittest" if project.runner == "unittest" else "pytest"
        return ((f"uv run {runner} {args}",), ("uv_project",),
                {"PATH": f"{uv_dir}:{base_path}", "HOME": "{tools}/home"}, ())
    if kind == "make":
        recipe = f"test:\n\t{pp}{{python}} -m pytest -p no:hypothesispytest {args}\n"
        return ("make test",), (lambda ws, ctx: (ws / "Makefile").write_text(ctx.resolve(recipe, ws)),), \
            {"PATH": f"{BIN}:{base_path}"}, ()
    if kind == "unittest":
        return (f"{{python}} -m unittest {args}",), (), {"PATH": base_path}, ()
    if kind == "npm_test":
        return ("npm test",), (), {"PATH": f"{Path(shutil.which('npm') or '/usr/bin/npm').parent}:{base_path}"}, ()
    if kind == "operand_py_compile":
        return ((f"{{python}} -m py_compile {mutant['file']}", f"{pp}{{python}} -m pytest -p no:hypothesispytest {args}"),
                (), {"PATH": base_path}, ())
    if kind == "ruff_operand":
        return ((f"{{tools}}/ruff/bin/ruff check --no-cache --isolated --select F821,F841,E9 {mutant['file']}",
                 f"{pp}{{python}} -m pytest -p no:hypothesispytest {args}"), ("ruff_venv",), {"PATH": base_path}, ())
    if kind == "artifact_file":
        return ((f"{pp}{{python}} -m pytest -p no:hypothesispytest {args}", "test -f done.txt"), (),
                {"PATH": base_path}, (write("done.txt", "fixed\n"),))
    raise ValueError(kind)


def honest(ctx: Context, scratch: Path) -> list[Case]:
    """Every honest case: each project's mutants, each through the next of its toolchains."""
    fetch(ctx.cache)
    found = mutants(ctx.cache, ctx.python, scratch)
    cases = []
    for project in PROJECTS:
        for i, mutant in enumerate(found.get(project.name, [])):
            kind = project.toolchains[i % len(project.toolchains)]
            verify, steps, env, extra = _toolchain(kind, project, mutant)
            fix = edit(mutant["file"], mutant["bad"], mutant["good"])
            cases.append(Case(
                f"{project.name}_{i + 1}_{kind}", HONEST, kind, project.name,
                f"{project.name}: put back line {mutant['line']} of {mutant['file']}",
                ((fix, *extra),), verify, {}, (partial(_project_setup, project, mutant), *steps), env,
                quick=(i == 0 and project.name in ("six", "ms", "wcwidth")) or kind == "operand_py_compile"))
    return cases
