"""Held as an invoked script: only what a verify command executes, never a data operand."""
from __future__ import annotations

import json

import pytest

from roles.eval_agent import held
from roles.eval_agent.invoked import executed_files, simple_commands

pytestmark = pytest.mark.timeout(30)

PATHS = {"run.sh", "ci/t.sh", "tools/check.py", "app.py", "done.txt", "Makefile", "package.json", "scripts/test.js",
         "scripts/pre.js", "setup.js", "sub/Makefile", "sub/go.sh", "bin/check", "env.sh", "pkg/mod.py", "data.json"}
MAKEFILE = b"test:\n\t@python tools/check.py data.json\n\t-./bin/check --quiet app.py\n"
PACKAGE = json.dumps({"scripts": {"pretest": "node scripts/pre.js", "test": "node --require ./setup.js scripts/test.js",
                                  "lint": "eslint app.py"}}).encode()
FILES = {"Makefile": MAKEFILE, "package.json": PACKAGE, "sub/Makefile": b"all:\n\tsh go.sh done.txt\n"}


@pytest.mark.parametrize("command, expected", [
    ("test -f done.txt", []),
    ("mypy app.py", []),
    ("ruff check app.py && ruff format --check app.py", []),
    ("python -m pytest -q tools/check.py", []),
    ("python -m pkg.mod", []),
    ("python -c 'import app' app.py", []),
    ("cat done.txt | grep -q ok", []),
    ("diff <(python app.py) done.txt", []),
    ("./run.sh", ["run.sh"]),
    ("bash -e ci/t.sh done.txt", ["ci/t.sh"]),
    ("FOO=1 env -u X timeout 30 nice -n 5 python3 -W error tools/check.py app.py", ["tools/check.py"]),
    ("sh -c 'exit 0' ci/t.sh", []),
    (". ./env.sh && mypy app.py", ["env.sh"]),
    ("test -f done.txt; bin/check app.py", ["bin/check"]),
    ("python app.py > done.txt", ["app.py"]),
    ("make -s test", ["Makefile", "bin/check", "tools/check.py"]),
    ("make -C sub", ["sub/Makefile", "sub/go.sh"]),
    ("npm test", ["package.json", "scripts/pre.js", "scripts/test.js", "setup.js"]),
    ("npm run lint", ["package.json"]),
])
def test_only_what_a_command_executes_is_invoked(command, expected):
    assert executed_files([command], PATHS, FILES.get) == expected


def test_operands_are_never_held_but_an_executed_script_is():
    """The doer writes done.txt and app.py (the goal's files): nothing is held; a rewritten run.sh is."""
    base = {"run.sh": b"exit 1\n", "app.py": b"x = 1\n"}
    target = {"run.sh": b"exit 0\n", "app.py": b"x = 2\n", "done.txt": b"ok\n"}
    commands = ("test -f done.txt", "mypy app.py", "sh run.sh")
    kinds = held.candidates(set(base) | set(target), commands, base, read=base.get)
    kinds = {p: k for p, k in kinds.items() if base.get(p) != target.get(p)}
    got, edits = held.held_back(kinds, base, target)
    assert [(h.path, h.kind) for h in got] == [("run.sh", "invoked_script")] and edits == {"run.sh": b"exit 1\n"}


def test_the_shell_splits_commands_at_its_operators():
    assert simple_commands("a x && b 'y && z' | c; (d)") == (("a", "x"), ("b", "y && z"), ("c",), ("d",))


def test_files_a_check_names_anywhere_are_named():
    from roles.eval_agent.invoked import named_files
    got = named_files(['[ "$(cat answer.txt)" = right ] || echo "FAIL: $(cat ./out/x.json)"', "mypy app.py",
                       "pytest --rootdir=. -c setup.cfg"], {"answer.txt", "out/x.json", "app.py", "setup.cfg", "b.py"})
    assert got == ["answer.txt", "app.py", "out/x.json", "setup.cfg"]
