"""Running a real org in tests: a short org home (ipc paths must stay under ~100 bytes),
waits on observable state with timeouts that report what was seen, and certain cleanup."""
from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

from roles.supervisor import procs
from state_db.connection import read_rows
from tests.support.timing import scaled
from transport.probe import wait_until


# One loop-agent, quick heartbeats: an org for tests that watch one run at a time.
ONE_AGENT = """
[org]
loop_agents = 1
[supervisor]
heartbeat_s = 0.2
heartbeat_timeout_s = 10.0
stop_timeout_s = 6.0
"""


def short_home_dir() -> Path:
    return Path(tempfile.mkdtemp(prefix="lo-"))


def query(home, sql, params=()):
    return read_rows(home.db_path, sql, params)


def wait_for(predicate, timeout=15.0, interval=0.05, what="condition"):
    """Poll ``predicate`` until it returns a truthy value; fail with the last value seen. ``timeout``
    is what it may take on an idle host: the wait allows for the host's load (``timing.scaled``)."""
    try:
        return wait_until(predicate, timeout=scaled(timeout), what=what, interval=interval)
    except TimeoutError as exc:
        raise AssertionError(str(exc)) from None


def roles(home) -> dict[str, dict]:
    return {r["instance"]: r for r in query(home, "SELECT * FROM role_instances")}


def kill_everything(home) -> None:
    """Kill the supervisor and every role process recorded for this home (by pid + start time)."""
    procs.kill_org(home)


def write_config(home, text: str) -> None:
    home.root.mkdir(parents=True, exist_ok=True)
    home.config_path.write_text(text)


def cleanup(home) -> None:
    kill_everything(home)
    shutil.rmtree(home.root, ignore_errors=True)


def env_for(home) -> dict:
    env = dict(os.environ)
    env["ORG_HOME"] = str(home.root)
    return env


@contextmanager
def running_org(config_text: str):
    """An initialised org in a short home, started in the background; killed and removed after."""
    from scripts import control
    from state_db.bootstrap import init_home
    from state_db.kernel.home import OrgHome

    root = short_home_dir()
    home = OrgHome(root / "org")
    write_config(home, config_text)
    init_home(home)
    try:
        control.start_background(home, timeout_s=scaled(20))
        yield home
    finally:
        cleanup(home)
        shutil.rmtree(root, ignore_errors=True)
