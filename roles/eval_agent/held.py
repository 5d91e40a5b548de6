"""What the doer may not change about *how* a check runs.

A verify command checks the code; files that change how the runner runs (its configuration,
interpreter start-up hooks, modules that shadow the runner or the standard library, environment
files, the scripts the command invokes) could make a failing check pass without fixing anything.
For verification the eval-agent holds every such file to the baseline: the snapshot it verifies
has the baseline's version, or no file at all where the doer added one. The doer's version stays
in the workspace and its checkpoints; it is only not what the verdict rests on.

These rules are the second line. The first is the change scope (``scope``): the tree verified is
built from the baseline and the doer's changes inside the run's scope, so most of these files
never reach it; the rules below hold what the scope lets in (widened by ``--scope``, say).

The kinds, and what happens to each (``HELD`` is the table, ``held_back`` applies it):

| kind            | files                                                          | treatment          |
|-----------------|----------------------------------------------------------------|--------------------|
| runner_config   | conftest.py at any depth, pytest.ini, .pytest.ini, tox.ini,    | held to baseline   |
|                 | noxfile.py, .coveragerc, jest/vitest/mocha/ava/karma configs,  |                    |
|                 | .mocharc.*, babel configs, go.work                             |                    |
| mixed_config    | pyproject.toml's [tool.pytest*], [tool.coverage*], [tool.tox*],| sections held to   |
|                 | [tool.hatch.envs*]; setup.cfg's [tool:pytest], [coverage:*],    | baseline, the rest |
|                 | [pytest]; package.json's "scripts", "jest", "mocha", "ava",     | kept               |
|                 | "vitest", "c8", "nyc"                                           |                    |
| startup_hook    | sitecustomize.py, usercustomize.py, *.pth at any depth         | held to baseline   |
| shadow_module   | a module or package named like the test runner, what it        | held to baseline   |
|                 | imports or a plugin (``pytest_*``) (any), or a new one named   |                    |
|                 | like a standard-library module — as source, bytecode without   |                    |
|                 | source (``json.pyc``) or an extension module — where it can    |                    |
|                 | come first on ``sys.path`` (the workspace root, or a folder    |                    |
|                 | that is not a package)                                         |                    |
| env_file        | .env, .env.*, .envrc, .npmrc, .yarnrc*, .pnpmfile.cjs,          | held to baseline   |
|                 | .python-version, .node-version, .nvmrc, .tool-versions          |                    |
| invoked_script  | files a verify command executes (``./run.sh``, ``bash ci/t.sh``,| held to baseline   |
|                 | ``python tools/check.py``), Makefiles for ``make`` and what    |                    |
|                 | their recipes run, what ``npm test``'s script runs — never a   |                    |
|                 | data operand (``test -f done.txt``, ``mypy app.py``): see      |                    |
|                 | ``invoked``                                                    |                    |
| runner_install  | the test runner as installed in an environment inside the      | held to baseline   |
|                 | workspace (``site-packages/{pytest,_pytest,pluggy}``, pytest's |                    |
|                 | own dist-info, ``node_modules/{jest,vitest,mocha,…}``), and any|                    |
|                 | ``entry_points.txt`` of any distribution, wherever (how pytest  |                    |
|                 | load themselves)                                               |                    |

"Held to baseline" never fails an iteration by itself: the checks run without the doer's change,
and the verdict lists what was held back (``held`` in the verdict) with a note for the doer: ask
a human with ``request_action`` if such a change is really needed. Protected test files are
different: a change to one fails the iteration (see ``protect``), because it changes *what* is
checked.
"""
from __future__ import annotations

import io
import json
import re
import sys
from dataclasses import asdict, dataclass
from typing import Callable, Iterable, Mapping

from roles.eval_agent.invoked import executed_files
from roles.workbench.workspace.protect import match_paths

RESTORED = "restored from the baseline"      # the file existed at the baseline and was changed
REMOVED = "left out (added by the doer)"      # the doer added it
SECTIONS = "test sections restored from the baseline"

RUNNER_CONFIG = ("**/conftest.py", "pytest.ini", ".pytest.ini", "**/pytest.ini", "tox.ini", "noxfile.py",
                 ".coveragerc", "**/jest.config.*", "**/vitest.config.*", "**/vitest.workspace.*",
                 "**/.mocharc*", "**/ava.config.*", "**/karma.conf.*", "**/babel.config.*", "**/.babelrc*",
                 "go.work", "**/.cargo/config*")
STARTUP_HOOKS = ("**/sitecustomize.py", "**/usercustomize.py", "**/*.pth")
ENV_FILES = ("**/.env", "**/.env.*", ".envrc", "**/.npmrc", "**/.yarnrc", "**/.yarnrc.yml", ".pnpmfile.cjs",
             ".python-version", ".node-version", ".nvmrc", ".tool-versions")
RUNNER_INSTALL = ("**/site-packages/_pytest/**", "**/site-packages/pytest/**", "**/site-packages/pluggy/**",
                  "**/site-packages/py.py", "**/site-packages/pytest-*.dist-info/**",
                  # anywhere, not only under site-packages: any folder on sys.path is scanned for them
                  "**/*.dist-info/entry_points.txt", "**/*.egg-info/entry_points.txt",
                  "**/node_modules/{jest,jest-cli,jest-runner,@jest,vitest,@vitest,mocha,ava,tap,c8,nyc}/**",
                  "**/node_modules/.bin/{jest,vitest,mocha,ava,tap}")
_RUNNER_MODULES = frozenset({"pytest", "_pytest", "py", "pluggy", "unittest", "nose", "nose2", "coverage",
                             "xdist", "iniconfig", "hypothesis", "doctest", "runpy", "site", "encodings",
                             # what pytest itself imports, and a plugin loaded by its entry point
                             "packaging", "exceptiongroup", "tomli", "pygments", "colorama",
                             "_hypothesis_pytestplugin"})
# plugins pytest imports at start-up by their entry points are named so by convention
_RUNNER_PREFIXES = ("pytest_", "_pytest")
_SHADOWED = _RUNNER_MODULES | frozenset(m for m in sys.stdlib_module_names if not m.startswith("_"))
# a module file: source, bytecode without a source (importable as it is), or an extension module
_MODULE_FILE = re.compile(r"^([A-Za-z_]\w*)(?:\.py|\.pyc|(?:\.[\w-]+)?\.so|\.pyd)$")

# sections of the mixed files that configure the runner
_TOML_SECTIONS = re.compile(r"^tool\.(pytest|coverage|tox|hatch\.envs|nox)\b")
_INI_SECTIONS = re.compile(r"^(tool:pytest|pytest|coverage:.*|tox(:.*)?|testenv(:.*)?)$")
_JSON_KEYS = ("scripts", "jest", "mocha", "ava", "vitest", "c8", "nyc")


@dataclass(frozen=True)
class Held:
    path: str
    kind: str
    treatment: str

    def encode(self) -> dict:
        return asdict(self)


def _shadow_candidates(paths: Iterable[str]) -> list[str]:
    """Paths of modules named like the runner or a standard-library module, in a folder that can
    be first on ``sys.path``: the workspace root, or a folder with no ``__init__.py`` (pytest puts
    the first such folder above a test file on ``sys.path``)."""
    paths = list(paths)
    packages = {p.rsplit("/", 1)[0] for p in paths if p.endswith("/__init__.py")}
    out = []
    for p in paths:
        parts = p.split("/")
        if "__pycache__" in parts:
            continue                        # read only beside their sources, never imported by name
        name = _module_name(p)
        folder = "/".join(parts[:-2] if parts[-1] == "__init__.py" else parts[:-1])
        if name and (name in _SHADOWED or _runner_module(name)) and (folder == "" or folder not in packages):
            out.append(p)
    return out


def _module_name(path: str) -> str | None:
    """The module ``path`` is imported as (``pkg/__init__.py`` -> ``pkg``), or None."""
    parts = path.split("/")
    if parts[-1] == "__init__.py":
        return parts[-2] if len(parts) >= 2 else None
    m = _MODULE_FILE.match(parts[-1])
    return m.group(1) if m else None


def _runner_module(name: str | None) -> bool:
    return bool(name) and (name in _RUNNER_MODULES or name.startswith(_RUNNER_PREFIXES))


def runner_sections_toml(text: str) -> dict[str, object]:
    """The tables of a TOML file (``pyproject.toml``) that configure a test runner
    (``[tool.pytest…]``, ``[tool.coverage…]``, ...): dotted name -> value as parsed;
    ``{"<unparsable>": text}`` when it does not parse."""
    import tomllib
    try:
        data = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError):
        return {"<unparsable>": text}
    out = {}

    def walk(prefix: str, node):
        if isinstance(node, dict):
            for k, v in node.items():
                key = f"{prefix}.{k}" if prefix else k
                if _TOML_SECTIONS.match(key):
                    out[key] = v
                elif key.count(".") < 4:
                    walk(key, v)
    walk("", data)
    return out


def runner_sections_ini(text: str) -> dict[str, object]:
    """Like ``runner_sections_toml`` for ini files (``[pytest]``, ``[tool:pytest]``, ``[tox]``, ...):
    section -> its keys and values, a value over several lines as one string."""
    import configparser
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    try:
        parser.read_string(text)
    except configparser.Error:
        return {"<unparsable>": text}
    return {s: dict(parser[s]) for s in parser.sections() if _INI_SECTIONS.match(s)}


def _sections_json(text: str) -> dict[str, object]:
    try:
        data = json.loads(text)
    except ValueError:
        return {"<unparsable>": text}
    return {k: data[k] for k in _JSON_KEYS if isinstance(data, dict) and k in data}


def _rewrite_ini(text: str, base: str) -> str:
    """``text`` with its runner sections replaced by ``base``'s (other sections kept as written)."""
    kept, skipping = [], False
    for line in io.StringIO(text):
        m = re.match(r"^\s*\[([^\]]+)\]", line)
        if m:
            skipping = bool(_INI_SECTIONS.match(m.group(1).strip()))
        if not skipping:
            kept.append(line)
    own, skipping = [], True
    for line in io.StringIO(base):
        m = re.match(r"^\s*\[([^\]]+)\]", line)
        if m:
            skipping = not _INI_SECTIONS.match(m.group(1).strip())
        if not skipping:
            own.append(line)
    body = "".join(kept)
    return body + ("" if body.endswith("\n") or not body else "\n") + "".join(own)


def _rewrite_toml(text: str, base: str) -> str:
    """Like ``_rewrite_ini`` for TOML tables (``[tool.pytest.ini_options]`` and the like)."""
    def runner_table(header: str) -> bool:
        name = header.strip().strip("[]").strip().replace('"', "").replace("'", "")
        return bool(_TOML_SECTIONS.match(name))

    def split(src: str, keep_runner: bool) -> str:
        out, keep = [], not keep_runner
        for line in io.StringIO(src):
            m = re.match(r"^\s*(\[\[?[^\]]+\]\]?)", line)
            if m:
                keep = runner_table(m.group(1)) if keep_runner else not runner_table(m.group(1))
            if keep:
                out.append(line)
        return "".join(out)
    body = split(text, keep_runner=False)
    return body + ("" if body.endswith("\n") or not body else "\n") + split(base, keep_runner=True)


def _rewrite_json(text: str, base: str) -> str | None:
    try:
        data, old = json.loads(text), json.loads(base) if base else {}
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(old, dict):
        return None
    for k in _JSON_KEYS:
        data.pop(k, None)
        if k in old:
            data[k] = old[k]
    return json.dumps(data, indent=2) + "\n"


_MIXED: dict[str, tuple[Callable[[str], dict], Callable[[str, str], str | None]]] = {
    "pyproject.toml": (runner_sections_toml, _rewrite_toml),
    "setup.cfg": (runner_sections_ini, _rewrite_ini),
    "package.json": (_sections_json, _rewrite_json),
}


def candidates(paths: Iterable[str], commands: Iterable[str], base: Iterable[str] = (),
               read: Callable[[str], bytes | None] = lambda p: None) -> dict[str, str]:
    """Every path (of the baseline or the checkpoint) that is of a held kind: path -> kind.
    ``base`` names the baseline's paths (a module named like a standard-library one that the
    project had from the start is its own design, and may be the code under test); ``read``
    gives a baseline file's content (the Makefiles and ``package.json`` whose scripts a verify
    command runs)."""
    paths, base = set(paths), set(base)
    kinds: dict[str, str] = {}
    for kind, patterns in (("runner_config", RUNNER_CONFIG), ("startup_hook", STARTUP_HOOKS),
                           ("runner_install", RUNNER_INSTALL),
                           ("env_file", ENV_FILES)):
        for p in match_paths(paths, patterns):
            kinds.setdefault(p, kind)
    for p in _shadow_candidates(paths):
        if p not in base or _runner_module(_module_name(p)):
            kinds.setdefault(p, "shadow_module")
    for p in executed_files(commands, paths, read):
        kinds.setdefault(p, "invoked_script")
    for p in paths:
        if p.rsplit("/", 1)[-1] in _MIXED:
            kinds.setdefault(p, "mixed_config")
    return kinds


def held_back(kinds: Mapping[str, str], base: Mapping[str, bytes], target: Mapping[str, bytes],
              protected: Iterable[str] = ()) -> tuple[list[Held], dict[str, bytes | None]]:
    """Which of the ``kinds`` paths are held to ``base`` for verification (``base`` and
    ``target``: path -> content, for those paths), and the edits that do it: path -> content to
    write into the snapshot, or None to leave the file out. ``protected`` paths are left to the
    protection rules (a change to one fails the iteration instead)."""
    protected = set(protected)
    held, edits = [], {}
    for p in sorted(kinds):
        kind = kinds[p]
        new, old = target.get(p), base.get(p)
        if p in protected or new == old:
            continue
        if kind == "mixed_config":
            if new is None:
                continue                       # deleted: nothing of the doer's is run
            sections, rewrite = _MIXED[p.rsplit("/", 1)[-1]]
            new_s, old_s = new.decode("utf-8", "replace"), (old or b"").decode("utf-8", "replace")
            want = sections(old_s) if old is not None else {}
            if sections(new_s) == want:
                continue
            rewritten = rewrite(new_s, old_s)
            if rewritten is None or sections(rewritten) != want:
                edits[p] = old                 # the rest cannot be kept safely: the whole file is held
                held.append(Held(p, kind, RESTORED if old is not None else REMOVED))
            else:
                edits[p] = rewritten.encode()
                held.append(Held(p, kind, SECTIONS))
        elif old is None:
            held.append(Held(p, kind, REMOVED))
            edits[p] = None
        else:
            held.append(Held(p, kind, RESTORED))
            edits[p] = old
    return held, edits


def note_for_doer(held: Iterable[Held]) -> str:
    """The feedback line that tells the doer what was not verified, and what to do instead."""
    items = list(held)
    if not items:
        return ""
    outside = [h for h in items if h.kind == "out_of_scope"]
    items = [h for h in items if h.kind != "out_of_scope"]
    parts = []
    if outside:
        listed = ", ".join(f"{h.path} ({h.treatment})" for h in outside[:12])
        more = f" and {len(outside) - 12} more" if len(outside) > 12 else ""
        parts.append(f"Outside the change scope, held back from verification: {listed}{more}. The checks ran with "
                     "the baseline's versions; these changes are not delivered with the result but kept apart for a "
                     "human. The scope is edits to existing code files and new code files in existing code "
                     "packages (not tests, test data, configuration, packaging metadata or dotfiles). Change the "
                     "code under test instead, or ask a human with request_action (kind scope) to widen it.")
    if items:
        parts.append(_note_held(items))
    return " ".join(parts)


def _note_held(items: list[Held]) -> str:
    listed = ", ".join(f"{h.path} ({h.kind.replace('_', ' ')}: {h.treatment})" for h in items[:12])
    more = f" and {len(items) - 12} more" if len(items) > 12 else ""
    return (f"Held back from verification: {listed}{more}. Changes to how the checks run (runner "
            "configuration, start-up hooks, modules shadowing the runner or the standard library, "
            "environment files, the scripts the verify commands run) are not verified; the checks ran "
            "with the baseline's versions. Change the code under test instead, or ask a human with "
            "request_action if such a change is really needed.")
