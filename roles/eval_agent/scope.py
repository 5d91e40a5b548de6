"""The change scope: which of the doer's changes reach the checks, constructed from an allow-list.

The tree the verify commands run on is *built*, not filtered: the baseline, plus the doer's
changes that are inside the run's change scope. Every other change the doer made is held to the
baseline — the checks run with the baseline's version, or without a file the doer added — and
listed in the verdict (``Held`` of kind ``out_of_scope``), shown to the doer in its feedback and
to the human in ``org show``. What is not in the scope cannot steer a check, whatever its name or
place: a runner configuration under a name nobody listed, a plugin declared anywhere, a module
dropped at the workspace root, test data no protect glob covers.

The default scope (``DEFAULT_SCOPE`` is this table, and the README's):

| change                                                          | in the default scope |
|-----------------------------------------------------------------|----------------------|
| an edit to, or the removal of, a regular file that existed at   | yes                  |
| the baseline and is code (``CODE_TYPES``)                        |                      |
| a new regular file a verify command names (``test -f done.txt``,| yes                  |
| ``python check.py out/report.json``): what the check is about   |                      |
| (a named file that existed at the baseline may be the check's   | no: ``--scope`` it   |
| oracle — ``diff out.txt expected.txt`` — and is not)            |                      |
| a new regular file of a code type in an existing code package:  | yes                  |
| a folder (not the root) that held, at the baseline, code of the |                      |
| same language in the scope (for Python: a package, with its     |                      |
| ``__init__.py``)                                                 |                      |
| tests (``protect.DEFAULT_PROTECTED_PATTERNS`` and test names),   | no                   |
| test data and fixtures (anything below a test or fixture folder)|                      |
| configuration, build and packaging metadata (any file that is   | no                   |
| not of a code type; ``setup.py``, ``conftest.py``, ``*.config.*``|                      |
| and the other ``CONFIG_NAMES``)                                  |                      |
| dotfiles and everything in a dot folder                         | no                   |
| environments and vendored or built code (``node_modules``,      | no                   |
| ``site-packages``, a folder with a ``pyvenv.cfg``, ``build``, …) |                      |
| links, nested repositories                                      | no                   |

``--scope GLOB`` at submit (the work item's ``scope``) and ``[verify] scope`` in org.toml widen
it: a changed path that matches one of their globs is in scope too (a nested repository never
is: its files are not recorded), and so is a file an action a human approved changed (the
action's effect is the human's, not the doer's). A human who approves a doer's ``request_action`` of kind
``scope`` widens it for that run only (recorded on the work item). Protected files stay
protected: a change to one fails the iteration (``protect``).

Inside the scope, the rules of ``held`` are the second line: a file that changes how a check
runs is held to the baseline even when a glob widened the scope to it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Iterable, Mapping, Sequence

from roles.eval_agent import held as held_rules
from roles.eval_agent.held import REMOVED, RESTORED, Held
from roles.eval_agent.invoked import named_files
from roles.workbench.workspace.protect import DEFAULT_PROTECTED_PATTERNS, match_paths

OUT_OF_SCOPE = "out_of_scope"

# file types that are code, by language (a new file joins a package of its own language)
CODE_TYPES: dict[str, str] = {
    **dict.fromkeys(("py", "pyi", "pyx", "pxd"), "python"),
    **dict.fromkeys(("js", "mjs", "cjs", "jsx", "ts", "mts", "cts", "tsx", "vue", "svelte"), "javascript"),
    "go": "go", "rs": "rust", "rb": "ruby", "php": "php", "java": "java", "kt": "kotlin", "scala": "scala",
    "swift": "swift", "cs": "csharp", "lua": "lua", "pl": "perl", "pm": "perl", "ex": "elixir", "exs": "elixir",
    "erl": "erlang", "hs": "haskell", "ml": "ocaml", "clj": "clojure", "dart": "dart", "jl": "julia", "r": "r",
    "R": "r", "zig": "zig", "nim": "nim", "sh": "shell", "bash": "shell",
    **dict.fromkeys(("c", "h", "cc", "cpp", "cxx", "hh", "hpp", "hxx"), "c"),
}
# code files that configure a tool, build or package the project, or start the interpreter
CONFIG_NAMES = ("setup.py", "conftest.py", "noxfile.py", "fabfile.py", "dodo.py", "pavement.py", "manage.py",
                "sitecustomize.py", "usercustomize.py", "conf.py", "build.rs", "*.config.*", "*.conf.*",
                "*rc.js", "*rc.cjs", "*rc.mjs", "Gruntfile.*", "gulpfile.*", "Jakefile*", "Makefile.*")
# folders whose files are tests, test data or fixtures
TEST_FOLDERS = frozenset({"test", "tests", "testing", "__tests__", "spec", "specs", "e2e", "fixtures", "fixture",
                          "testdata", "test_data", "test-data", "__fixtures__", "__mocks__", "__snapshots__",
                          "mocks", "conformance", "benchmarks", "bench", "examples", "docs", "doc"})
TEST_NAMES = ("test_*", "*_test.*", "*_tests.*", "test.*", "tests.*", "*.test.*", "*.spec.*", "*_spec.*",
              "*Test.*", "*Tests.*", "*_test", "*-test.*")
# folders of installed, vendored or built code
ENV_FOLDERS = frozenset({"node_modules", "site-packages", "dist-packages", "__pypackages__", "venv", "env",
                         "virtualenv", "build", "dist", "vendor", "third_party", "bower_components", "target",
                         "__pycache__", "out", "lib64"})
_ENV_SUFFIXES = (".egg-info", ".dist-info", ".egg")
REGULAR = (0o100644, 0o100755)

_NAME_RX = re.compile("|".join(
    "(?:" + re.escape(g).replace(r"\*", ".*").replace(r"\?", ".") + ")" for g in (*CONFIG_NAMES, *TEST_NAMES)))

DEFAULT_SCOPE = ("edits to existing code files (not tests, test data, fixtures, configuration, build or packaging "
                 "metadata, dotfiles, environments); new code files inside existing code packages")


def language(path: str) -> str | None:
    """The language of a code file (None: not code)."""
    name = path.rsplit("/", 1)[-1]
    if "." not in name.lstrip("."):
        return None
    return CODE_TYPES.get(name.rsplit(".", 1)[1])


def _environments(base: Iterable[str]) -> frozenset[str]:
    """Folders that are environments at the baseline, whatever their name (a ``pyvenv.cfg``)."""
    return frozenset(p.rsplit("/", 1)[0] if "/" in p else "" for p in base if p.rsplit("/", 1)[-1] == "pyvenv.cfg")


def is_code(path: str, envs: frozenset[str] = frozenset()) -> bool:
    """Whether ``path`` is code the default scope may change: a code type, and none of a test,
    test data, configuration, a dotfile or part of an environment."""
    if language(path) is None:
        return False
    parts = path.split("/")
    for i, part in enumerate(parts[:-1]):
        if part.startswith(".") or part in TEST_FOLDERS or part in ENV_FOLDERS or part.endswith(_ENV_SUFFIXES):
            return False
        if "/".join(parts[: i + 1]) in envs:
            return False
    if "" in envs:
        return False                         # the workspace is itself an environment
    name = parts[-1]
    return not (name.startswith(".") or _NAME_RX.fullmatch(name) or match_paths([path], DEFAULT_PROTECTED_PATTERNS))


@dataclass(frozen=True)
class Scope:
    """A run's change scope: the default allow-list, widened by ``widen`` globs."""

    widen: tuple[str, ...] = ()
    named: frozenset[str] = frozenset()          # files the verify commands name (``invoked.named_files``)
    approved: frozenset[str] = frozenset()       # files an action a human approved changed

    def decide(self, changed: Iterable[str], base: Mapping[str, tuple[int, str]],
               target: Mapping[str, tuple[int, str]]) -> dict[str, bool]:
        """For each changed path: in scope (True) or held to the baseline (False). ``base`` and
        ``target``: path -> (mode, object id) of the baseline and the checkpoint."""
        changed = list(changed)
        envs = _environments(base)
        widened = set(match_paths(changed, self.widen)) if self.widen else set()
        # a new file the checks name is what they are about; one the baseline had may be their oracle
        widened |= {p for p in changed if p in self.named and p not in base and target.get(p, (0,))[0] in REGULAR}
        widened |= {p for p in changed if p in self.approved}
        packages = _code_packages(base, envs)
        out = {}
        for p in changed:
            entry = target.get(p)
            if entry is not None and entry[0] == 0o160000:
                out[p] = False                     # a nested repository: its files are never recorded
            elif p in widened:
                out[p] = True
            elif entry is not None and entry[0] not in REGULAR:
                out[p] = False                     # a link: what it points at is not the change
            elif not is_code(p, envs):
                out[p] = False
            elif p in base:
                out[p] = base[p][0] in REGULAR     # an edit (or removal) of existing code
            else:
                folder = p.rsplit("/", 1)[0] if "/" in p else ""
                out[p] = language(p) in packages.get(folder, ())
        return out


def _code_packages(base: Mapping[str, tuple[int, str]], envs: frozenset[str]) -> dict[str, set[str]]:
    """Folder -> the languages it holds code of at the baseline (the root is never a package;
    a Python folder is one only with its ``__init__.py``)."""
    out: dict[str, set[str]] = {}
    for p, (mode, _) in base.items():
        if "/" not in p or mode not in REGULAR or not is_code(p, envs):
            continue
        folder = p.rsplit("/", 1)[0]
        lang = language(p)
        if lang == "python" and f"{folder}/__init__.py" not in base:
            continue
        out.setdefault(folder, set()).add(lang)
    return out


@dataclass(frozen=True)
class Construction:
    """What the checks run on: ``edits`` turn the checkpoint into the verified tree (path ->
    bytes, (mode, id) or None), ``held`` lists every change held to the baseline, ``protected``
    the protected files the doer changed (restored, and a failed check)."""

    edits: dict = field(default_factory=dict)
    held: tuple[Held, ...] = ()
    protected: tuple[str, ...] = ()


def construct(base: Mapping[str, tuple[int, str]], target: Mapping[str, tuple[int, str]], *,
              scope: Scope, protected: Sequence[str], commands: Sequence[str], read_base, read_target
              ) -> Construction:
    """The edits that make the checkpoint (``target``) the tree the checks run on: protected
    files and every change outside ``scope`` back to the baseline, then the ``held`` rules over
    what is left. ``read_base`` / ``read_target``: path -> content (bytes or None)."""
    changed = sorted(p for p in set(base) | set(target) if base.get(p) != target.get(p))
    if not scope.named:
        scope = replace(scope, named=frozenset(named_files(commands, set(base) | set(target))))
    protected_set = set(protected)
    edits: dict = {}
    held: list[Held] = []
    restored = sorted(p for p in changed if p in protected_set and p in base)
    for p in restored:
        edits[p] = base[p]
    decided = scope.decide([p for p in changed if p not in edits], base, target)
    inside = []
    for p, ok in decided.items():
        if ok:
            inside.append(p)
            continue
        edits[p] = base.get(p)
        held.append(Held(p, OUT_OF_SCOPE, RESTORED if p in base else REMOVED))
    # the second line: inside the scope, what changes how a check runs is held to the baseline
    kinds = held_rules.candidates(set(base) | set(target), commands, base, read=read_base)
    kinds = {p: k for p, k in kinds.items() if p in inside}
    if kinds:
        more, contents = held_rules.held_back(kinds, {p: read_base(p) for p in kinds if p in base},
                                              {p: read_target(p) for p in kinds if p in target}, protected_set)
        held += more
        for p, content in contents.items():
            edits[p] = None if content is None else (base[p] if content == read_base(p) else content)
    return Construction(edits, tuple(sorted(held, key=lambda h: h.path)), tuple(restored))
