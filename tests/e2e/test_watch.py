"""``org watch`` in a real pseudo-terminal (tmux, 80×24) over a real org: the screen shows a
running run's phase and n of max and a decision that waits; approving it with a key records the
decision as the human's (decisions.decided_by, an events row by actor ``human``)."""
from __future__ import annotations

import getpass
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.support.org import ONE_AGENT, query, running_org, wait_for

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ONE_AGENT.replace("loop_agents = 1", "loop_agents = 2")     # one asks, one acts
VERIFY = "grep -q right answer.txt"
# runs until the test lets it go (bounded: 30 s), so the run is seen acting
HELD = "for i in $(seq 300); do [ -f go ] && break; sleep 0.1; done; echo right > answer.txt"

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (.ci/run installs it)")


def script(folder: Path, name: str, turns: list) -> Path:
    path = folder / f"{name}.json"
    path.write_text(json.dumps({"version": 1, "acts": [turns]}))
    return path


class Tmux:
    """One tmux server on its own socket, running one command in an 80×24 window."""

    def __init__(self, command: str, env: dict):
        self.dir = tempfile.mkdtemp(prefix="tw-")           # a socket path must stay short
        self.base = ["tmux", "-S", os.path.join(self.dir, "s"), "-f", "/dev/null"]
        subprocess.run([*self.base, "new-session", "-d", "-x", "80", "-y", "24", command],
                       check=True, timeout=10, env=env)

    def screen(self) -> str:
        out = subprocess.run([*self.base, "capture-pane", "-p"], capture_output=True, text=True, timeout=10)
        return out.stdout

    def shows(self, text: str) -> str | None:
        screen = self.screen()
        return screen if text in screen else None

    def cursor(self) -> str:
        """The selected line (it starts with ›)."""
        return next((line for line in self.screen().splitlines() if line.startswith("›")), "")

    def keys(self, *keys: str) -> None:
        subprocess.run([*self.base, "send-keys", *keys], check=True, timeout=10)

    def close(self) -> None:
        subprocess.run([*self.base, "kill-server"], capture_output=True, timeout=10)
        shutil.rmtree(self.dir, ignore_errors=True)


def select(tmux: Tmux, ident: str) -> None:
    """Move the cursor (›) to the line of ``ident``, down then up, a bounded number of steps."""
    for key in ["j"] * 8 + ["k"] * 16:
        if tmux.cursor().startswith(f"› {ident}"):
            return
        before = tmux.cursor()
        tmux.keys(key)
        try:        # the cursor moves at once, unless it is at the end of the list already
            wait_for(lambda: tmux.cursor() != before, timeout=1, what="the cursor to move")
        except AssertionError:
            pass
    raise AssertionError(f"no line for {ident} to select:\n{tmux.screen()}")


def submit(home, env, tag: str, backend_script: Path) -> str:
    ws = home.root.parent / "ws" / tag
    ws.mkdir(parents=True)
    (ws / "answer.txt").write_text("wrong\n")
    out = subprocess.run([sys.executable, "-m", "scripts.cli.main", "submit", f"make answer.txt say right ({tag})",
                          "--workspace", str(ws), "--verify", VERIFY, "--backend", f"scripted:{backend_script}",
                          "--max-iterations", "3", "--no-wait", "--json"],
                         capture_output=True, text=True, timeout=30, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout)["id"]


@pytest.mark.timeout(90)
def test_watch_shows_a_running_run_and_approves_a_decision_as_the_human(tmp_path):
    ask = {"name": "request_action", "input": {"kind": "outside_workspace", "command": "echo approved >> action.log",
                                               "reason": "the goal needs it"}}
    gated = script(tmp_path, "gated", [{"tool_uses": [ask]}, {"text": "Asked a human."}])
    held = script(tmp_path, "held", [{"tool_uses": [{"name": "run_command", "input": {"command": HELD}}]},
                                     {"text": "Wrote the answer."}])
    with running_org(CONFIG) as home:
        env = {**os.environ, "ORG_HOME": str(home.root)}
        asking = submit(home, env, "asks", gated)
        acting = submit(home, env, "acts", held)
        decision = wait_for(lambda: query(home, "SELECT * FROM decisions WHERE work_id = ? AND status = 'pending'",
                                          (asking,)), timeout=40, what=f"{asking} to ask a human")[0]
        command = (f"cd {shlex.quote(str(ROOT))} && ORG_HOME={shlex.quote(str(home.root))} "
                   f"exec {shlex.quote(sys.executable)} -m scripts.cli.main watch --interval 0.3")
        tmux = Tmux(command, env)
        try:
            last = {}

            def showing():
                screen = last["screen"] = tmux.screen()
                row = next((line for line in screen.splitlines() if line.strip().startswith(acting)
                            or line.startswith(f"› {acting}")), "")
                return screen if ("acting" in row and "1/3" in row and decision["id"] in screen) else None

            try:
                screen = wait_for(showing, timeout=30, what="the screen to show the run acting at 1/3 and the decision")
            except AssertionError as exc:
                raise AssertionError(f"{exc}\n{last.get('screen')}") from None
            assert "NEEDS YOU" in screen and "RUNNING" in screen
            assert all(len(line) <= 80 for line in screen.splitlines())
            select(tmux, acting)
            tmux.keys("Enter")
            # the run is acting from its attempt's start; its tool call shows once the model's first
            # answer has come and the command runs (the page refreshes every 0.3 s)
            detail = wait_for(lambda: (screen := tmux.shows("phase: acting  iteration 1/3")) and
                              "now: run_command" in screen and screen, timeout=10,
                              what=f"{acting}'s page with its running tool call")
            assert "now: run_command" in detail
            tmux.keys("b")
            select(tmux, decision["id"])
            tmux.keys("a")
            wait_for(lambda: f"approve {decision['id']}? y / n" in tmux.screen(), timeout=10, what="the y/n question")
            tmux.keys("y")
            row = wait_for(lambda: (r := query(home, "SELECT * FROM decisions WHERE id = ?", (decision["id"],))[0])
                           ["status"] != "pending" and r, timeout=15, what="the decision recorded")
            assert row["decided_by"] == getpass.getuser() and row["status"] in ("approved", "executing", "executed")
            events = query(home, "SELECT actor FROM events WHERE kind = 'decisions.approved' AND subject = ?",
                           (decision["id"],))
            assert [e["actor"] for e in events] == ["human"]
            tmux.keys("q")
            wait_for(lambda: "org watch" not in tmux.screen(), timeout=10, what="the watch to quit")
        finally:
            tmux.close()
            (home.root.parent / "ws" / "acts" / "go").touch()
