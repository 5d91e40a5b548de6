"""state.db infrastructure: concurrency, migrations, path rule, secrets (issue 2 proof)."""
from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from state_db.connection import connect
from state_db.kernel.errors import SchemaTooNew
from state_db.kernel.home import project_root, resolve_home
from state_db.migrations import migrate
from state_db.schema import MIGRATIONS

ROOT = Path(__file__).resolve().parents[1]

WRITER_SCRIPT = r"""
import sys, time
sys.path.insert(0, sys.argv[3])
from state_db.writer import StateWriter
w = StateWriter(sys.argv[1], "loop-agent", "loop-agent-" + sys.argv[2])
errors = 0
for i in range(int(sys.argv[4])):
    # read-then-write: increment a counter; a deferred transaction would hit SQLITE_BUSY_SNAPSHOT
    with w.transaction(render=False) as tx:
        row = tx.one("SELECT value FROM transport_counters WHERE instance='shared' AND name='n'")
        value = (row[0] if row else 0) + 1
        tx.execute("INSERT INTO transport_counters(instance, name, value) VALUES ('shared','n',?) "
                   "ON CONFLICT(instance, name) DO UPDATE SET value = excluded.value", (value,))
print("done")
"""


def test_four_concurrent_writer_processes_never_see_database_locked(org_home):
    per_proc = 150
    procs = [subprocess.Popen([sys.executable, "-c", WRITER_SCRIPT, str(org_home.db_path), str(i), str(ROOT),
                               str(per_proc)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(4)]
    outs = [p.communicate(timeout=50) for p in procs]
    for (out, err), p in zip(outs, procs):
        assert p.returncode == 0, err
        assert "locked" not in err and "done" in out
    conn = connect(org_home.db_path, readonly=True)
    assert conn.execute("SELECT value FROM transport_counters WHERE instance='shared'").fetchone()[0] == 4 * per_proc
    conn.close()


def test_migration_from_older_schema_keeps_data_and_leaves_a_backup(tmp_path):
    db = tmp_path / "state.db"
    migrate(db, migrations=MIGRATIONS[:1])          # a database written by an older version
    conn = connect(db)
    conn.execute("INSERT INTO events(at, actor, kind) VALUES (1, 'human', 'kept')")
    conn.close()
    newer = MIGRATIONS + [("9001_add_column", "ALTER TABLE events ADD COLUMN extra TEXT;"),
                          ("9002_index", "CREATE INDEX events_extra ON events(extra);")]
    result = migrate(db, backups_dir=tmp_path / "backups", migrations=newer)
    assert result["applied"] == [name for name, _ in newer[1:]]
    conn = connect(db, readonly=True)
    assert conn.execute("SELECT kind FROM events").fetchone()[0] == "kept"
    assert conn.execute("PRAGMA user_version").fetchone()[0] == len(newer)
    assert [r[0] for r in conn.execute("SELECT name FROM _migrations ORDER BY rowid")] == [n for n, _ in newer]
    conn.close()
    backup = Path(result["backup"])
    assert backup.exists()
    old = sqlite3.connect(backup)
    assert old.execute("PRAGMA user_version").fetchone()[0] == 1
    assert old.execute("SELECT kind FROM events").fetchone()[0] == "kept"
    old.close()


def test_failing_migration_rolls_back_its_step(tmp_path):
    db = tmp_path / "state.db"
    migrate(db)
    bad = MIGRATIONS + [("9001_bad", "CREATE TABLE t(x); INSERT INTO nope VALUES (1);")]
    with pytest.raises(Exception) as err:
        migrate(db, backups_dir=tmp_path / "b", migrations=bad)
    assert err.value.code == "migration_failed"
    conn = connect(db, readonly=True)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
    assert conn.execute("SELECT COUNT(*) FROM sqlite_master WHERE name='t'").fetchone()[0] == 0
    conn.close()


def test_newer_schema_is_refused_and_left_untouched(tmp_path):
    db = tmp_path / "state.db"
    migrate(db)
    conn = connect(db)
    conn.execute(f"PRAGMA user_version={len(MIGRATIONS) + 5}")
    conn.close()
    before = db.read_bytes()
    with pytest.raises(SchemaTooNew) as err:
        migrate(db)
    assert err.value.code == "schema_too_new"
    assert db.read_bytes() == before
    from state_db.writer import StateWriter
    with pytest.raises(SchemaTooNew):
        with StateWriter(db, "human").transaction():
            pass


def test_path_rule_explicit_beats_env_beats_default(tmp_path):
    env = {"ORG_HOME": str(tmp_path / "from-env")}
    assert resolve_home(tmp_path / "explicit", env=env).root == tmp_path / "explicit"
    assert resolve_home(None, env=env).root == tmp_path / "from-env"
    assert resolve_home(None, env={}).root == project_root() / ".org"


def test_git_worktree_of_the_project_maps_to_the_main_checkout(tmp_path):
    main = tmp_path / "main"
    main.mkdir()
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run(git + ["init", "-q", str(main)], check=True)
    (main / "f").write_text("x")
    subprocess.run(git + ["-C", str(main), "add", "f"], check=True)
    subprocess.run(git + ["-C", str(main), "commit", "-qm", "init"], check=True)
    subprocess.run(git + ["-C", str(main), "worktree", "add", "-q", str(tmp_path / "wt")], check=True)
    (tmp_path / "wt" / "sub" / "deeper").mkdir(parents=True)
    assert project_root(tmp_path / "wt" / "sub" / "deeper") == main.resolve()
    assert project_root(main / "f") == main.resolve()


def test_org_from_a_subdirectory_creates_no_stray_database(tmp_path):
    sub = tmp_path / "project" / "sub"
    sub.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if k != "ORG_HOME"}
    env["ORG_HOME"] = str(tmp_path / "project" / ".org")  # an org that was never started
    for argv in (["status"], ["doctor"], ["logs"], ["status", "--json"]):
        proc = subprocess.run([sys.executable, "-m", "scripts.cli.main", *argv], cwd=sub, env=env,
                              capture_output=True, text=True, timeout=30,
                              )
        assert proc.returncode != 0
    assert not list(tmp_path.rglob("state.db")), "a read command created a database"
    # the default (no ORG_HOME) resolves from the code's location, never from the cwd
    env.pop("ORG_HOME")
    default_db = project_root() / ".org" / "state.db"
    existed = default_db.exists()
    subprocess.run([sys.executable, "-m", "scripts.cli.main", "status"], cwd=sub, env=env,
                   capture_output=True, text=True, timeout=30)
    assert default_db.exists() == existed
    assert not list(tmp_path.rglob("state.db"))


def test_fake_api_key_never_reaches_state_db_logs_or_snapshots(org_home, writer_for, monkeypatch):
    import structlog

    from state_db.kernel.logsetup import configure
    from state_db.snapshot import SnapshotHook
    from tests.support.state import submit

    fake = "sk-ant-FAKE-KEY-0123456789abcdef"
    monkeypatch.setenv("ANTHROPIC_API_KEY", fake)
    log = configure(org_home.logs_dir, "loop-agent", "loop-agent-1")
    log.info("calling model", api_key=fake, headers={"x-api-key": fake}, note=f"key is {fake}")
    hook = SnapshotHook(org_home.db_path, debounce_s=0)
    w = writer_for("human", hooks=[hook])
    submit(lambda *a, **k: w, goal=f"use key {fake} to call the API")
    with w.transaction() as tx:
        tx.journal("note", data={"token": fake})
    hook.flush()
    structlog.reset_defaults()
    for path in org_home.root.rglob("*"):
        if path.is_file():
            assert fake.encode() not in path.read_bytes(), f"secret leaked into {path}"
    assert "[redacted]" in (org_home.logs_dir / "loop-agent-1.log").read_text()
