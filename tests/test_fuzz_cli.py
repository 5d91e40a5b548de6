"""The ``org`` CLI in-process (``scripts.cli.main.main``) under random argv: always an int exit
code, never a traceback; a failure is one coded line on stderr; read-only commands leave
state.db as it was (the journal aside).

Left out on purpose: ``chat`` (reads stdin until EOF), ``resume`` (starts an org), ``logs -f``
(follows forever). ``ping`` runs with a short timeout.
"""
from __future__ import annotations

import io
import json
import re
import sys
from contextlib import redirect_stderr, redirect_stdout

import pytest
from hypothesis import given
from hypothesis import strategies as st

from roles.operations.submit import SubmitRequest, submit
from scripts.cli.main import EXIT_INTERNAL, main
from state_db.bootstrap import init_home
from state_db.connection import connect
from state_db.kernel.home import OrgHome
from state_db.queries.work import Caps

READ_ONLY = {"status", "show", "decisions", "diff", "export", "logs", "doctor", "config"}
CODED_LINE = re.compile(r"^error\[[a-z_]+\]: \S")
HELP = {"-h", "--help"}


@pytest.fixture(scope="module")
def org(tmp_path_factory):
    """An org home that was never started, holding one submitted work item with a baseline."""
    root = tmp_path_factory.mktemp("cli")
    home = OrgHome(root / "org")
    cfg, _ = init_home(home)
    ws = root / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("one\n")
    script = root / "script.json"
    script.write_text(json.dumps({"version": 1, "acts": [[{"text": "done"}]]}))
    item = submit(home, cfg, SubmitRequest(goal="g", workspace=str(ws), verify=["true"], caps=Caps(max_iterations=1),
                                           backend=f"scripted:{script}"))
    (root / "cwd").mkdir()
    (root / "empty").mkdir()
    (root / "file.txt").write_text("x")
    return {"home": home, "root": root, "id": item["id"]}


def everything_but_the_journal(db) -> dict:
    conn = connect(db, readonly=True)
    try:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")
                  if r[0] not in ("events", "sqlite_sequence")]
        return {t: [tuple(r) for r in conn.execute(f"SELECT * FROM {t} ORDER BY 1")] for t in tables}
    finally:
        conn.close()


def run_cli(argv: list[str]) -> tuple[int | None, str, str]:
    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")        # commands also write to .buffer
    err = io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:                                  # see test_help_returns_an_exit_code
            assert HELP & set(argv) and exc.code in (0, None), (argv, exc.code)
            code = None
        out.flush()
    return code, out.buffer.getvalue().decode("utf-8", "replace"), err.getvalue()


def argv_for(org) -> st.SearchStrategy:
    root, wid = org["root"], org["id"]
    ids = st.sampled_from([wid, "w-nope", "", "-x", "../etc", "w-" + "9" * 300])
    junk = st.one_of(st.text(max_size=12), st.sampled_from(["--", "-", "--json", "--force", "-n", "0", "-1", "nan",
                                                             "1e309", "\x00", "é", "--home", "-h"]))
    number = st.one_of(st.integers(-3, 10**12).map(str), st.sampled_from(["nan", "inf", "-0", "x", "1e400", ""]))
    short = st.sampled_from(["0", "0.01", "0.1", "-1", "nan"])
    ws = st.sampled_from([str(root / "empty"), str(root / "missing"), str(root / "file.txt"), ".", "..", "rel"])
    out = st.sampled_from([str(root / "out.patch"), str(root / "empty" / "x.patch")])  # unwritable: see below
    opt = lambda *xs: st.one_of(st.just([]), st.just(list(xs)))  # noqa: E731
    cmd = {
        "status": st.tuples(opt("--json")),
        "show": st.tuples(ids.map(lambda i: [i]), opt("--json")),
        "decisions": st.tuples(opt("--all"), opt("--json")),
        "diff": st.tuples(ids.map(lambda i: [i]), st.one_of(st.just([]), number.map(lambda n: ["--iteration", n]))),
        "export": st.tuples(ids.map(lambda i: [i]), opt("--patch"), st.one_of(st.just([]), out.map(lambda o: ["-o", o]))),
        "logs": st.tuples(st.one_of(st.just([]), junk.map(lambda r: ["--role", r])),
                          st.one_of(st.just([]), number.map(lambda n: ["-n", n])), opt("--json")),
        "doctor": st.tuples(opt("--json")),
        "config": st.tuples(st.sampled_from([["check"], ["show"], ["fix"], []]), opt("--json")),
        "cancel": st.tuples(ids.map(lambda i: [i]), opt("--json")),
        "decide": st.tuples(ids.map(lambda i: [i]), st.sampled_from([["approve"], ["reject", "no"], ["edit"],
                                                                     ["respond", ""], ["maybe"]]), opt("--stop")),
        "stop": st.tuples(opt("--force"), st.one_of(st.just([]), short.map(lambda t: ["--timeout", t]))),
        "suspend": st.tuples(opt("--force"), opt("--json")),
        "gc": st.tuples(opt("--dry-run"), opt("--history"), st.one_of(st.just([]), number.map(lambda n: ["--older-than", n]))),
        "ping": st.tuples(st.lists(st.sampled_from(["coordinator", "nobody", "loop-agent-9", "../x"]), max_size=2),
                          st.just(["--timeout", "0.05"])),
        "submit": st.tuples(st.text(max_size=10).map(lambda g: [g]), ws.map(lambda w: ["--workspace", w]),
                            st.lists(st.sampled_from(["true", "", "exit 1"]), max_size=2).map(
                                lambda vs: [a for v in vs for a in ("--verify", v)]),
                            st.one_of(st.just([]), number.map(lambda n: ["--max-iterations", n])),
                            st.sampled_from([[], ["--backend", "nope"], ["--backend", "scripted:/nonexistent"]])),
    }
    commands = st.sampled_from(sorted(cmd)).flatmap(
        lambda c: st.tuples(st.just(c), cmd[c]).map(lambda t: [t[0]] + [a for part in t[1] for a in part]))
    garbled = st.tuples(commands, st.lists(junk, max_size=3), st.integers(0, 6)).map(
        lambda t: t[0][:t[2]] + t[1] + t[0][t[2]:])
    return st.one_of(commands, commands, garbled, st.lists(junk, max_size=4))


def test_random_argv_gives_an_exit_code_and_one_coded_line_on_failure(org, monkeypatch):
    monkeypatch.setenv("ORG_HOME", str(org["home"].root))
    monkeypatch.chdir(org["root"] / "cwd")
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    db = org["home"].db_path

    @given(argv_for(org))
    def check(argv):
        # the first word that is neither an option nor the value of --home (or an abbreviation of it)
        words = [a for i, a in enumerate(argv) if not (i and "--home".startswith(argv[i - 1]) and argv[i - 1].startswith("--ho"))]
        command = next((a for a in words if not a.startswith("-")), None)
        before = everything_but_the_journal(db)
        code, out, err = run_cli(argv)
        if code is None:
            return
        assert isinstance(code, int) and code != EXIT_INTERNAL, (argv, err)
        echoed = sum(a.count("\n") for a in argv)                  # argparse quotes bad arguments as given
        if command is None and code == 2 and not err:             # no command: the help, exit 2
            assert "usage: org" in out
        elif code != 0 and command not in ("doctor", "ping"):     # they exit non-zero with a report
            assert CODED_LINE.match(err) and err.endswith("\n") and err.count("\n") <= 1 + echoed, (argv, code, err)
        if argv and argv[0] in READ_ONLY:
            assert everything_but_the_journal(db) == before, argv

    check()


def test_help_returns_an_exit_code(org, monkeypatch):
    monkeypatch.setenv("ORG_HOME", str(org["home"].root))
    with redirect_stdout(io.StringIO()):
        assert main(["status", "--help"]) == 0


@pytest.mark.parametrize("target", ["missing/x.patch", "empty"])
def test_export_to_an_unwritable_path_is_a_coded_error(org, monkeypatch, target):
    monkeypatch.setenv("ORG_HOME", str(org["home"].root))
    code, _, err = run_cli(["export", org["id"], "--patch", "-o", str(org["root"] / target)])
    assert code == 1 and CODED_LINE.match(err.strip()), err


def test_a_workspace_inside_the_org_home_is_refused(org, monkeypatch):
    monkeypatch.setenv("ORG_HOME", str(org["home"].root))
    before = everything_but_the_journal(org["home"].db_path)
    code, _, err = run_cli(["submit", "read the keys", "--workspace", str(org["home"].run_dir), "--verify", "true"])
    assert code == 1 and CODED_LINE.match(err), err
    assert everything_but_the_journal(org["home"].db_path) == before


@pytest.mark.parametrize("argv", [["--home", "a\x00b", "status"], ["--ho", "\x00"]])
def test_a_home_path_with_a_nul_byte_is_a_coded_error(argv):
    code, _, err = run_cli(argv)
    assert code == 1 and CODED_LINE.match(err.strip()) and "bad_home" in err, (code, err)
