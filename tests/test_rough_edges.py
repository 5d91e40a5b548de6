"""What a new user tripped on, each through the real CLI (or scripts/start-org) in a fresh org home:
expected failures are one coded line, and each corrected behaviour is what the user sees."""
from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import shutil
import signal
import subprocess
import sys
import termios
import time
from importlib import metadata
from pathlib import Path

import pytest

from state_db.vocab import Actor
from tests.support import install_current
from tests.support.timing import scaled

ROOT = Path(__file__).resolve().parents[1]
CODED = re.compile(r"^error\[(?P<code>[a-z_]+)\]: .+ — .+$")

pytestmark = pytest.mark.timeout(60)


def _env(home_root: Path | None, tmp: Path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "ORG_"))}
    env["XDG_STATE_HOME"] = str(tmp / "xdg")          # the home registry stays in the test's folder
    if home_root is not None:
        env["ORG_HOME"] = str(home_root)
    env.update(extra)
    return env


def org(home, tmp: Path, *argv, env_extra=None, timeout=30) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "scripts.cli.main", *argv], capture_output=True, text=True,
                          cwd=ROOT, timeout=timeout, env=_env(home.root, tmp, **(env_extra or {})))


def coded(err: str) -> str:
    """The code of the one coded line ``err`` must be (no traceback, no usage text)."""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    m = CODED.match(lines[0])
    assert m, err
    return m["code"]


def set_session(home, status: str) -> None:
    from state_db.writer import StateWriter
    w = StateWriter(home.db_path, Actor.HUMAN)
    try:
        with w.transaction() as tx:
            tx.insert("org_session", {"id": 1, "status": status, "updated_at": time.time()})
    finally:
        w.close()


def session_status(home) -> str | None:
    from state_db.connection import read_rows
    rows = read_rows(home.db_path, "SELECT status FROM org_session")
    return rows[0]["status"] if rows else None


# 1. scripts/start-org: a bad --home or an unknown flag is one coded line ---------------------------

@pytest.mark.parametrize("case", ["missing_parent", "a_file", "unknown_flag"])
def test_start_org_refuses_a_bad_home_or_flag_with_one_coded_line(tmp_path, case):
    a_file = tmp_path / "README.md"
    a_file.write_text("not a folder\n")
    argv, code = {"missing_parent": (["--home", "/proc/nope"], "bad_home"),
                  "a_file": (["--home", str(a_file)], "bad_home"),
                  "unknown_flag": (["--bogus"], "bad_arguments")}[case]
    out = subprocess.run([sys.executable, "-m", "scripts.cli.start_org", *argv], capture_output=True, text=True,
                         cwd=ROOT, timeout=30, env=_env(tmp_path / "unused", tmp_path))
    assert out.returncode != 0 and coded(out.stderr) == code, out.stderr
    assert "usage:" not in out.stdout + out.stderr
    if case == "unknown_flag":
        assert "see 'scripts/start-org --help'" in out.stderr
    assert not (tmp_path / "unused").exists()


def test_the_start_org_script_passes_the_coded_line_through(tmp_path):
    """The shell entry (when its install is current, so it runs no pip) prints the same line."""
    if not install_current(ROOT):
        pytest.skip("the checkout's .venv is not installed for scripts/start-org (it would run pip)")
    out = subprocess.run([str(ROOT / "scripts" / "start-org"), "--bogus"], capture_output=True, text=True,
                         timeout=30, env=_env(tmp_path / "unused", tmp_path))
    assert out.returncode != 0 and coded(out.stderr) == "bad_arguments", out.stderr


# 2. org logs --role with a name no role has ---------------------------------------------------------

def test_logs_for_an_unknown_role_names_the_known_ones(org_home, tmp_path):
    out = org(org_home, tmp_path, "logs", "--role", "nosuch")
    assert out.returncode == 1 and coded(out.stderr) == "unknown_role", out.stderr
    assert "'nosuch'" in out.stderr and "loop-agent" in out.stderr and "coordinator" in out.stderr
    assert org(org_home, tmp_path, "logs", "--role", "loop-agent").returncode == 0


# 3. org ping while the org is suspended leaves nothing in outbox/ -----------------------------------

def test_ping_of_a_suspended_org_leaves_no_outbox_files(tmp_path):
    from state_db.bootstrap import init_home
    from state_db.kernel.home import OrgHome
    from tests.support.org import short_home_dir
    from transport.keys import Keyring, keyring_path

    root = short_home_dir()                                        # ipc paths stay short
    try:
        home = OrgHome(root / "org")
        init_home(home)
        Keyring.create(keyring_path(home.run_dir)).issue("human")   # as the supervisor left it
        set_session(home, "suspended")
        out = org(home, tmp_path, "ping", "--timeout", "0.3")
        assert out.returncode == 1 and "no answer" in out.stdout, out.stdout + out.stderr
        left = [str(p.relative_to(home.outbox_dir)) for p in home.outbox_dir.rglob("*") if p.is_file()]
        assert left == [], f"ping left {left}"
        doctor = org(home, tmp_path, "doctor")
        assert "undelivered" not in doctor.stdout and "wake(s) the CLI left" not in doctor.stdout, doctor.stdout
    finally:
        shutil.rmtree(root, ignore_errors=True)


# 4. submit while the org is not running says that nothing will run yet -----------------------------

@pytest.mark.parametrize("status, then", [(None, "'scripts/start-org'"), ("suspended", "'org resume'"),
                                          ("stopped", "'org resume'")])
def test_submit_to_an_org_that_is_not_running_says_nothing_runs_yet(org_home, tmp_path, status, then):
    if status:
        set_session(org_home, status)
    ws = tmp_path / "ws"
    ws.mkdir()
    out = org(org_home, tmp_path, "submit", "make it so", "--workspace", str(ws), "--verify", "true",
              env_extra={"ANTHROPIC_API_KEY": "sk-test-never-used"})
    assert out.returncode == 0, out.stderr
    assert f"the org is {status or 'never started'}: nothing runs until {then}" in out.stdout, out.stdout


# 5. org suspend on a stopped org --------------------------------------------------------------------

def test_suspend_refuses_a_stopped_org_and_leaves_it_stopped(org_home, tmp_path):
    set_session(org_home, "stopped")
    out = org(org_home, tmp_path, "suspend")
    assert out.returncode == 1 and coded(out.stderr) == "org_stopped", out.stderr
    assert session_status(org_home) == "stopped"


# 6. chat: a prompt, line editing, history, Ctrl-C clears the line, Ctrl-D leaves; more commands ------

def test_the_chat_loop_survives_ctrl_c_and_ends_at_the_end_of_input():
    from scripts.cli.chat import converse

    typed = iter(["/status", KeyboardInterrupt, "hello", "", None, "never read"])

    def read_line():
        item = next(typed)
        if item is KeyboardInterrupt:
            raise KeyboardInterrupt
        return item

    asked, said = [], []

    def respond(line):
        asked.append(line)
        if line == "hello":
            raise KeyboardInterrupt   # Ctrl-C while an answer is being worked out
        return f"answer to {line}"

    converse(read_line, said.append, respond)
    assert asked == ["/status", "hello"]
    assert said == ["answer to /status", "", "(interrupted)"]


class Terminal:
    """``org chat`` on a pseudo-terminal that is its controlling terminal (so Ctrl-C is SIGINT)."""

    def __init__(self, env: dict):
        self.master, slave = pty.openpty()

        def own_terminal():
            os.setsid()
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)
            # Ctrl-C at its default, as a person's shell starts a program: a test run started in
            # the background by a non-interactive shell ignores SIGINT, and a child inherits that
            signal.signal(signal.SIGINT, signal.SIG_DFL)

        self.proc = subprocess.Popen([sys.executable, "-m", "scripts.cli.main", "chat", "--no-announcements"],
                                     stdin=slave, stdout=slave, stderr=slave, cwd=ROOT, env=env,
                                     preexec_fn=own_terminal, close_fds=True)
        os.close(slave)
        self.seen = ""

    def type(self, keys: str) -> None:
        os.write(self.master, keys.encode())

    def expect(self, text: str, timeout: float = 15.0) -> str:
        """Wait until ``text`` appears in the output after what was read so far (``timeout``: on an
        idle host; the wait allows for the host's load); return that output."""
        timeout = scaled(timeout)
        deadline = time.monotonic() + timeout
        buf = ""
        while text not in buf:
            left = deadline - time.monotonic()
            ready = select.select([self.master], [], [], max(0.0, left))[0] if left > 0 else []
            if not ready:
                raise AssertionError(f"{text!r} did not appear in {timeout}s; saw {buf!r}")
            try:
                chunk = os.read(self.master, 4096).decode(errors="replace")
            except OSError:
                chunk = ""
            if not chunk:
                raise AssertionError(f"the chat closed before {text!r}; saw {buf!r}")
            buf += chunk
        cut = buf.index(text) + len(text)
        self.seen += buf[:cut]
        return buf[:cut]

    def wait_for_key(self, timeout: float = 15.0) -> None:
        """Wait until the chat sleeps waiting for input (its only thread asleep on two looks)."""
        deadline = time.monotonic() + scaled(timeout)
        asleep = 0
        while asleep < 2:
            if time.monotonic() > deadline:
                raise AssertionError("the chat never went back to waiting for a key")
            stat = Path(f"/proc/{self.proc.pid}/stat").read_text()
            asleep = asleep + 1 if stat[stat.rindex(")") + 2] == "S" else 0
            time.sleep(0.02)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        os.close(self.master)


def test_chat_on_a_terminal_edits_lines_keeps_history_and_takes_ctrl_c_and_ctrl_d(org_home, tmp_path):
    term = Terminal(_env(org_home.root, tmp_path, TERM="dumb"))
    try:
        term.expect("org> ")
        term.type("/statux\x7fs\r")                              # a typo, erased with backspace
        assert "session: never started" in term.expect("org> ")
        term.type("\x1b[A\r")                                    # the up arrow brings back /status
        assert "session: never started" in term.expect("org> ")
        # Ctrl-C drops the line, the chat stays. It is pressed once the chat waits for the next key,
        # as a person does: CPython's readline checks for a signal only when its select() is
        # interrupted, so a SIGINT that lands while it is busy with the previous key is seen late
        term.type("/help half typed")
        term.expect("half typed")
        term.wait_for_key()
        term.type("\x03")
        term.expect("org> ")
        assert term.proc.poll() is None
        term.type("/help\r")
        shown = term.expect("org> ")
        assert "/candidates" in shown and "unknown_command" not in shown
        term.type("\x04")                                        # Ctrl-D leaves
        assert term.proc.wait(timeout=15) == 0
    finally:
        term.close()
    assert "interrupted" not in term.seen
    history = (org_home.run_dir / "chat_history").read_text()
    assert "/status" in history and "/help" in history and "half typed" not in history


def test_chat_has_candidates_skills_diff_and_logs(org_home, tmp_path):
    stdin = "/candidates\n/skills\n/diff w-none\n/logs -n 1\n/logs -f\n/quit\n"
    out = subprocess.run([sys.executable, "-m", "scripts.cli.main", "chat", "--no-announcements"], input=stdin,
                         capture_output=True, text=True, cwd=ROOT, timeout=60, env=_env(org_home.root, tmp_path))
    assert out.returncode == 0, out.stderr
    assert "unknown_command" not in out.stdout and "error[internal]" not in out.stdout, out.stdout
    assert "error[not_found]: no work item w-none" in out.stdout
    assert "error[bad_arguments]: /logs cannot follow inside chat" in out.stdout


# 7. a cap of zero names the flag that exists ---------------------------------------------------------

@pytest.mark.parametrize("flag", ["--timeout", "--max-iterations", "--budget-tokens", "--budget-usd"])
def test_a_cap_that_is_not_positive_names_its_own_flag(org_home, tmp_path, flag):
    ws = tmp_path / "ws"
    ws.mkdir()
    out = org(org_home, tmp_path, "submit", "g", "--workspace", str(ws), "--verify", "true", flag, "0",
              env_extra={"ANTHROPIC_API_KEY": "sk-test-never-used"})
    assert out.returncode == 1 and coded(out.stderr) == "bad_caps", out.stderr
    assert re.search(rf"{flag} must be positive", out.stderr) and "--timeout-s" not in out.stderr


# 8. the anthropic backend without a key is refused at submit ----------------------------------------

def test_the_anthropic_backend_without_a_key_is_refused_at_submit(org_home, tmp_path):
    from state_db.connection import read_rows
    ws = tmp_path / "ws"
    ws.mkdir()
    argv = ("submit", "g", "--workspace", str(ws), "--verify", "true", "--backend", "anthropic", "--no-wait")
    out = org(org_home, tmp_path, *argv)
    assert out.returncode == 1 and coded(out.stderr) == "no_api_key", out.stderr
    assert "export ANTHROPIC_API_KEY=… or set model.base_url" in out.stderr
    assert read_rows(org_home.db_path, "SELECT id FROM work_items") == []
    # what the backend accepts is accepted: a key, or a model server on this machine
    assert org(org_home, tmp_path, *argv, env_extra={"ANTHROPIC_API_KEY": "sk-test"}).returncode == 0
    assert org(org_home, tmp_path, *argv, env_extra={"ANTHROPIC_BASE_URL": "http://127.0.0.1:9"}).returncode == 0


# 9. org show: attempts only when an act was redone --------------------------------------------------

def _iteration(writer_for, n: int, attempts: list[int]) -> None:
    with writer_for(Actor.LOOP_AGENT, "loop-agent-1").transaction() as tx:
        for a in attempts:
            tx.insert("attempts", {"work_id": "w1", "attempt": a, "iteration": n, "instance": "loop-agent-1",
                                   "started_at": time.time(), "ended_at": time.time(),
                                   "outcome": "committed" if a == attempts[-1] else "discarded"})
        tx.insert("iterations", {"work_id": "w1", "n": n, "attempt": attempts[-1], "act_status": "ok",
                                 "committed_at": time.time()})


def _header(show_stdout: str) -> list[str]:
    return next(line for line in show_stdout.splitlines() if line.startswith("ITER")).split()


def test_show_has_no_attempt_column_when_nothing_was_redone(org_home, writer_for, tmp_path):
    from tests.support.state import assign_and_run, submit
    submit(writer_for)
    assign_and_run(writer_for)
    _iteration(writer_for, 1, [1])
    _iteration(writer_for, 2, [2])
    out = org(org_home, tmp_path, "show", "w1")
    assert out.returncode == 0, out.stderr
    assert _header(out.stdout)[:2] == ["ITER", "ACT"]
    assert "ATTEMPT" not in out.stdout and "ACTS" not in out.stdout


def test_show_counts_the_acts_of_a_redone_iteration(org_home, writer_for, tmp_path):
    from tests.support.state import assign_and_run, submit
    submit(writer_for)
    assign_and_run(writer_for)
    _iteration(writer_for, 1, [1, 2])             # the first act was cut and redone
    _iteration(writer_for, 2, [3])
    out = org(org_home, tmp_path, "show", "w1")
    assert out.returncode == 0, out.stderr
    assert _header(out.stdout)[:3] == ["ITER", "ACTS", "ACT"]
    rows = [line.split()[:2] for line in out.stdout.splitlines() if re.match(r"^\d+\s", line)]
    assert rows == [["1", "2"], ["2", "1"]], out.stdout


# 10. org --version ----------------------------------------------------------------------------------

def test_version_is_the_installed_packages(org_home, tmp_path):
    out = org(org_home, tmp_path, "--version")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"loop-org {metadata.version('loop-org')}"
