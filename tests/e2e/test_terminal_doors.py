"""Agent text never commands the human's terminal: a corpus of escape sequences, written by a
scripted doer into its goal, its gated request, its workspace files and the logs, goes through
every front end of the CLI in a real pseudo-terminal and arrives as visible text only.

The control is the same corpus through ``org diff --raw`` (the bytes as they are, for a pipe): it
reaches the terminal whole, so each front end that shows it as text is the defence at work."""
from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from state_db.writer import StateWriter
from state_db.vocab import Actor, WorkStatus
from tests.support.loop import CHECK, ScriptedActs, engine, make_workspace

ROOT = Path(__file__).resolve().parents[2]

# What a hostile doer writes: a clipboard write (OSC 52, ended by BEL), a title change (ended by
# ESC \), a screen clear, a C1 CSI, a DCS query, a device-status query (the terminal would type
# its answer), a bidi override, a carriage return that would hide the line before it, a NUL.
CORPUS = ("\x1b]52;c;ZWNobyBwd25lZA==\x07" "\x1b]0;pwned-title\x1b\\" "\x1b[2J\x1b[H" "\u009b31mred"
          "\x1bP+q544e\x1b\\" "\x1b[6n" "\u202eevil" "\rfake\x00line" "\x1b]8;;http://evil.example\x1b\\x\x1b]8;;\x1b\\")
# every control a terminal acts on; \n (and \r before it, added by the terminal itself) and \t pass
FORBIDDEN = {chr(c) for c in [*range(0, 9), *range(11, 32), 0x7f, *range(0x80, 0xa0)]} | set("\u202a\u202b\u202c\u202d\u202e")


def run_in_pty(argv: list[str], env: dict, *, keys: bytes = b"", until: bytes | None = None,
               timeout: float = 30.0) -> bytes:
    """Run ``argv`` with a real pseudo-terminal as its stdin, stdout and stderr; returns every byte
    it wrote. ``keys`` are typed once ``until`` has been seen (or at once)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=ROOT,
                            start_new_session=True)
    os.close(slave)
    out = b""
    typed = not keys
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:          # EIO: the child closed its side
                    break
                if not chunk:
                    break
                out += chunk
            if not typed and (until is None or until in out):
                os.write(master, keys)
                typed = True
            if proc.poll() is not None and not ready:
                break
        else:
            raise AssertionError(f"{argv[3:]} did not end in {timeout} s; it wrote {out[-2000:]!r}")
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        os.close(master)
    return out


def _shown_controls(out: bytes) -> set[str]:
    text = out.decode("utf-8", "replace").replace("\r\n", "\n")
    return {c for c in text if c in FORBIDDEN}


def make_hostile_run(home, tmp_path: Path, corpus: str = CORPUS) -> dict:
    """A parked run in ``home`` whose goal, gated request, workspace file and a log line hold
    ``corpus``; returns the environment that runs the org CLI on it (also bench/doors.py's)."""
    ws = make_workspace(tmp_path)
    human = StateWriter(home.db_path, Actor.HUMAN)
    with human.transaction() as tx:
        tx.insert("work_items", {"id": "w1", "goal": f"fix add {corpus}", "workspace": str(ws),
                                 "verify": [CHECK], "caps": {"max_iterations": 3}, "backend": "anthropic",
                                 "status": WorkStatus.QUEUED, "created_by": "human",
                                 "created_at": time.time(), "updated_at": time.time()})
    human.close()
    co = StateWriter(home.db_path, Actor.COORDINATOR)
    with co.transaction() as tx:
        tx.set_status("work_items", "w1", WorkStatus.DISPATCHED, assigned_to="loop-agent-1")
    co.close()
    request = {"kind": "network", "command": f"curl {corpus}", "reason": f"needed {corpus}"}
    acts = ScriptedActs([[{"write": {"calc.py": f"# {corpus.replace(chr(0), '')}\ndef add(a, b):\n    return a - b\n"},
                           "request": request}]])
    assert engine(home, "w1", acts).run() is None                     # parked on the decision
    home.logs_dir.mkdir(parents=True, exist_ok=True)
    (home.logs_dir / "loop-agent-1.log").write_text(orjson.dumps(
        {"timestamp": "2026-01-01T00:00:00Z", "instance": "loop-agent-1", "level": "info",
         "event": "tool_output", "output": corpus}).decode() + "\n")
    return {**os.environ, "ORG_HOME": str(home.root), "PYTHONPATH": str(ROOT), "TERM": "xterm-256color",
            "COLUMNS": "200", "LINES": "50"}


@pytest.fixture
def hostile_run(org_home, tmp_path):
    """A parked run whose goal, gated request, workspace file and a log line hold the corpus."""
    return org_home, make_hostile_run(org_home, tmp_path)


def _org(*argv: str) -> list[str]:
    return [sys.executable, "-m", "scripts.cli.main", *argv]


FRONT_ENDS = [("decisions",), ("show", "w1"), ("status",), ("logs",), ("diff", "w1"), ("export", "w1", "--patch"),
              ("decide", "d-nope", "approve")]


@pytest.mark.timeout(180)
def test_every_cli_front_end_shows_the_corpus_as_text_in_a_real_terminal(hostile_run):
    """decisions, show, status, logs, diff, export (to a terminal) and an error line: no control
    an agent wrote reaches the terminal; each shows the clipboard write as visible text."""
    home, env = hostile_run
    seen = {}
    for argv in FRONT_ENDS:
        out = run_in_pty(_org(*argv), env)
        seen[argv[0]] = out
        assert not _shown_controls(out), (argv, sorted(map(hex, map(ord, _shown_controls(out)))), out[-1500:])
    for name in ("decisions", "show", "logs", "diff", "export"):
        assert "␛]52;c;" in seen[name].decode(), (name, seen[name][-1500:])


@pytest.mark.timeout(120)
def test_org_chat_shows_the_corpus_as_text(hostile_run):
    """``org chat``'s slash commands in a real terminal: what they print is shown, not obeyed."""
    home, env = hostile_run
    out = run_in_pty(_org("chat", "--no-announcements"), env, keys=b"/show w1\n/decisions\n\x04", until=b"org> ")
    assert "␛]52;c;" in out.decode("utf-8", "replace"), out[-1500:]
    assert not _shown_controls(out.replace(b"\x1b[?2004h", b"").replace(b"\x1b[?2004l", b"").replace(b"\x1b[?1034h", b"")), \
        sorted(map(hex, map(ord, _shown_controls(out))))


@pytest.mark.timeout(120)
def test_the_control_diff_raw_passes_the_bytes_and_so_the_attack_is_real(hostile_run):
    """``org diff --raw`` (for pipes) writes the workspace's bytes as they are: the corpus reaches
    the terminal whole, the OSC 52 write included — what the default front ends stop."""
    home, env = hostile_run
    out = run_in_pty(_org("diff", "w1", "--raw"), env)
    assert b"\x1b]52;c;ZWNobyBwd25lZA==\x07" in out and b"\x1b]0;pwned-title\x1b\\" in out


@pytest.mark.timeout(120)
def test_org_export_to_a_pipe_is_the_patch_byte_for_byte(hostile_run):
    """A patch exported to a pipe is data: git can apply it, control bytes and all."""
    home, env = hostile_run
    got = subprocess.run(_org("export", "w1", "--patch"), env=env, cwd=ROOT, capture_output=True, timeout=60)
    assert got.returncode == 0 and b"\x1b]52;c;" in got.stdout


@pytest.mark.timeout(120)
def test_org_watch_draws_the_corpus_as_text(hostile_run):
    """``org watch`` on the alternate screen: its own drawing sequences only; the goal and the
    question an agent wrote show the clipboard write as text, never as an OSC or a DCS."""
    home, env = hostile_run
    out = run_in_pty(_org("watch", "--interval", "0.2"), env, keys=b"q", until="NEEDS YOU".encode())
    text = out.decode("utf-8", "replace")
    assert "NEEDS YOU" in text and "␛]52;c;" in text, text[-2000:]
    for sequence in ("\x1b]", "\x1bP", "\x07", "\x9b", "\x9d", "\u202e", "\x1b[6n", "\x1b[2J"):
        assert sequence not in text, (repr(sequence), text[-2000:])
