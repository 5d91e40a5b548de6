"""Credentials never on a command line or in a file others can read: ``org join`` refuses a store
URL with a password in its arguments, takes it from a file, a prompt or ``$ORG_STATE_PASSWORD``
and keeps it in the home's ``store.pgpass`` (0600) — ``org.toml`` (0600 too) never holds it —;
``org doctor`` warns about a secret-holding file others can read.

A second local user (``nobody``) is the reader: the control shows it reads a 0644 ``org.toml``."""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from psycopg.conninfo import conninfo_to_dict

from state_db.kernel.credentials import exposed, password_in, store_password, without_password, write_private
from state_db.kernel.home import OrgHome

ROOT = Path(__file__).resolve().parents[1]
KEY = "rq1*Sgb8x-UP5/n&E5(0hwdZ0%(F1a[J0xLTx8@="         # a Z85 CURVE key (40 characters)


def _cli(home_root: Path, *argv: str, env: dict | None = None, stdin: str | None = None):
    return subprocess.run([sys.executable, "-m", "scripts.cli.main", *argv], capture_output=True, text=True,
                          timeout=60, cwd=ROOT, input=stdin,
                          env={**os.environ, "ORG_HOME": str(home_root), "PYTHONPATH": str(ROOT), **(env or {})})


def _join(home_root: Path, store: str, *extra: str, env=None, stdin=None):
    return _cli(home_root, "join", "--coordinator", "tcp://127.0.0.1:1", "--coordinator-key", KEY,
                "--role", "loop-agent", "--listen", "tcp://127.0.0.1:2", "--store", store, "--timeout", "1",
                *extra, env=env, stdin=stdin)


@pytest.mark.timeout(60)
def test_org_join_refuses_a_password_on_its_command_line_and_writes_nothing(tmp_path):
    """``--store postgresql://u:PASS@…`` (or ``?password=``): one coded line, exit 1, no home made."""
    for url in ("postgresql://u:s3cret@127.0.0.1:1/db", "postgresql://u@127.0.0.1:1/db?password=s3cret"):
        got = _join(tmp_path / "joined", url)
        assert got.returncode == 1 and got.stderr.startswith("error[password_on_command_line]:"), got.stderr
        assert "s3cret" not in got.stderr and not (tmp_path / "joined").exists()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["file", "env", "stdin"])
def test_the_password_goes_to_an_owner_only_passfile_never_to_org_toml(tmp_path, how):
    """From a file, ``$ORG_STATE_PASSWORD`` or stdin (``-``): the password lands in store.pgpass
    (0600) before the store is reached; the join fails on the unreachable store, naming no password."""
    home = tmp_path / "joined"
    secret = "pa:ss\\word"
    extra, env, stdin = [], None, None
    if how == "file":
        (tmp_path / "pw").write_text(secret + "\n")
        extra = ["--store-password-file", str(tmp_path / "pw")]
    elif how == "env":
        env = {"ORG_STATE_PASSWORD": secret}
    else:
        extra, stdin = ["--store-password-file", "-"], secret + "\n"
    got = _join(home, "postgresql://u@127.0.0.1:1/db", *extra, env=env, stdin=stdin)
    assert got.returncode == 1 and "db_unreachable" in got.stderr and secret not in got.stderr, got.stderr
    passfile = home / "store.pgpass"
    assert stat.S_IMODE(passfile.stat().st_mode) == 0o600
    assert passfile.read_text() == "*:*:*:*:pa\\:ss\\\\word\n"          # libpq's escapes
    assert not (home / "org.toml").exists()


def test_the_store_url_names_the_passfile_for_libpq_and_holds_no_password(tmp_path):
    """libpq reads the URL written to org.toml: no password in it, its ``passfile`` the home's."""
    url = store_password(tmp_path, "postgresql://u:old@db.example:5433/org?sslmode=require&password=x", "new")
    info = conninfo_to_dict(url)
    assert "password" not in info and "old" not in url and "new" not in url
    assert info["passfile"] == str(tmp_path / "store.pgpass") and info["sslmode"] == "require"
    assert info["user"] == "u" and info["host"] == "db.example" and info["port"] == "5433"
    assert password_in("postgresql://u:p%40ss@h/db") == "p@ss"
    assert without_password("postgresql://u:p@h/db?a=1&password=q") == "postgresql://u@h/db?a=1"


@pytest.fixture
def open_dir():
    """A folder other users may enter (pytest's own temporary root is owner-only)."""
    path = Path(tempfile.mkdtemp(prefix="org-cred-"))
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.timeout(60)
def test_org_toml_is_owner_only_and_doctor_warns_about_a_readable_secret_file(open_dir):
    """A new home's org.toml is 0600; made 0644, ``org doctor`` names it with the fix, and a second
    local user reads it (the control: what the warning is about)."""
    from state_db.bootstrap import init_home
    home = OrgHome(open_dir / "org")
    init_home(home)
    os.chmod(home.root, 0o755)                    # even where the home itself can be entered
    got = _cli(home.root, "doctor")
    assert stat.S_IMODE(home.config_path.stat().st_mode) == 0o600, got.stdout + got.stderr
    assert "secret files" in got.stdout and not exposed(home)
    reader = ["runuser", "-u", "nobody", "--", "cat", str(home.config_path)]
    can_switch = os.geteuid() == 0 and shutil.which("runuser")
    if can_switch:
        other = subprocess.run(reader, capture_output=True, text=True, timeout=30)
        assert other.returncode != 0 and other.stdout == ""
    home.config_path.write_text(home.config_path.read_text()
                                + '\n[attention]\nwebhook_url = "https://hooks.example/T0/B0/XyZ"\n')
    os.chmod(home.config_path, 0o644)
    got = _cli(home.root, "doctor")
    line = next(ln for ln in got.stdout.splitlines() if "secret files" in ln)
    assert line.startswith("warning") and str(home.config_path) in line and "chmod 600" in line, got.stdout
    if can_switch:                                # the control: 0644 is readable by another user
        assert "XyZ" in subprocess.run(reader, capture_output=True, text=True, timeout=30).stdout


def test_write_private_replaces_a_readable_file_with_an_owner_only_one(tmp_path):
    path = tmp_path / "secret"
    path.write_text("old")
    os.chmod(path, 0o644)
    old = os.umask(0)
    try:
        write_private(path, "new")
    finally:
        os.umask(old)
    assert path.read_text() == "new" and stat.S_IMODE(path.stat().st_mode) == 0o600


@pytest.mark.timeout(60)
def test_org_migrate_store_refuses_a_password_on_its_command_line(tmp_path):
    """``org migrate-store --to postgresql://u:PASS@…``: one coded line, the password not repeated."""
    from state_db.bootstrap import init_home
    home = OrgHome(tmp_path / "org")
    init_home(home)
    got = _cli(home.root, "migrate-store", "--to", "postgresql://u:s3cret@127.0.0.1:1/db")
    assert got.returncode == 1 and got.stderr.startswith("error[password_on_command_line]:"), got.stderr
    assert "s3cret" not in got.stderr + got.stdout
