"""Attention outside the chat: one webhook POST and one desktop notification per event that needs
a human, across a coordinator restart; a failing webhook is counted, logged and given up after
bounded retries while the org goes on."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from roles.coordinator.announce import announce
from roles.coordinator.attention import Delivery, Settings, link, message
from state_db.vocab import Actor, WorkStatus
from tests.support.org import query, roles, running_org, wait_for

GATE = [[{"tool_uses": [{"name": "request_action", "input": {
    "kind": "network", "command": "echo fetched >> fetched.txt", "reason": "needs the upstream file"}}]},
    {"text": "Asked a human."}]]


class _Hook(BaseHTTPRequestHandler):
    """A webhook receiver: records each POST's JSON body, answers ``status``."""

    posts: list = []
    status = 200

    def do_POST(self):  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        type(self).posts.append((self.headers.get("Content-Type"), json.loads(body)))
        self.send_response(type(self).status)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def hook():
    _Hook.posts, _Hook.status = [], 200
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server, _Hook
    server.shutdown()
    server.server_close()


def _refused_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/hook"          # nothing listens there once closed


def _fake_notify_send(tmp_path: Path) -> Path:
    """A notify-send on PATH that records its arguments, one line per notification."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "notified.txt"
    script = bin_dir / "notify-send"
    script.write_text(f"#!/bin/sh\necho \"$*\" >> {record}\n")
    script.chmod(0o755)
    return record


def _cli(home, *argv):
    return subprocess.run([sys.executable, "-m", "scripts.cli.main", *argv], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "ORG_HOME": str(home.root)})


def _submit(home, name: str, verify: str, acts: list) -> str:
    ws = home.root.parent / name
    ws.mkdir()
    (ws / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    script = home.root.parent / f"{name}.json"
    script.write_text(json.dumps({"version": 1, "acts": acts, "repeat_last": True}))
    got = _cli(home, "submit", "make add() add", "--workspace", str(ws), "--verify", verify, "--backend",
               f"scripted:{script}", "--max-iterations", "2", "--json", "--no-wait")
    assert got.returncode == 0, got.stderr
    return json.loads(got.stdout)["id"]


def _config(webhook: str, retries: int = 3) -> str:
    return f"""
[org]
loop_agents = 1
[supervisor]
heartbeat_s = 0.2
[model]
backend = "scripted"
[attention]
webhook_url = "{webhook}"
webhook_retries = {retries}
dashboard_url = "http://127.0.0.1:9/?token=t0k"
"""


@pytest.mark.timeout(90)
def test_one_post_and_one_notification_per_attention_event_also_across_a_coordinator_restart(
        hook, tmp_path, monkeypatch):
    """A decision waits: one POST and one notification. The coordinator is killed -9 and restarted
    by the supervisor; then a run ends verify_unrunnable: one more of each, and the decision's
    is not repeated. Each POST is Slack-compatible JSON linking to the run's dashboard page."""
    server, got = hook
    record = _fake_notify_send(tmp_path)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    with running_org(_config(f"http://127.0.0.1:{server.server_port}/hook")) as home:
        waiting = _submit(home, "gate", "true", GATE)
        first = wait_for(lambda: query(home, "SELECT * FROM attention WHERE posted_at > 0"), timeout=30,
                         what="the decision's POST recorded")
        assert [r["kind"] for r in first] == ["decision_waiting"] and len(got.posts) == 1
        old = roles(home)["coordinator"]
        os.kill(old["pid"], signal.SIGKILL)
        wait_for(lambda: (r := roles(home)["coordinator"])["pid"] != old["pid"] and r["status"] == "ready",
                 timeout=30, what="the coordinator restarted")
        broken = _submit(home, "broken", "no-such-tool-xyz --check", [[{"text": "never asked"}]])
        wait_for(lambda: query(home, "SELECT 1 FROM attention WHERE kind='verify_unrunnable' AND posted_at > 0"),
                 timeout=30, what="the verify_unrunnable POST")
        rows = {r["kind"]: r for r in query(home, "SELECT * FROM attention")}
        assert set(rows) == {"decision_waiting", "verify_unrunnable"}
        assert all(r["post_attempts"] == 1 and r["notified_at"] for r in rows.values())
        wait_for(lambda: len(record.read_text().splitlines()) >= 2, timeout=10, what="two notifications")
    assert len(got.posts) == 2, got.posts
    (ctype1, decision), (ctype2, unrunnable) = got.posts
    assert ctype1 == ctype2 == "application/json" and {"text", "blocks"} <= set(decision) == set(unrunnable)
    assert f"waiting for {waiting}" in decision["text"]
    assert f"<http://127.0.0.1:9/runs/{waiting}|open in the dashboard>" in decision["text"]
    assert "t0k" not in str(got.posts)
    assert broken in unrunnable["text"] and "verify_unrunnable" in unrunnable["text"]
    notes = record.read_text().splitlines()
    assert len(notes) == 2 and waiting in notes[0] and broken in notes[1]


@pytest.mark.timeout(90)
def test_a_refused_webhook_is_counted_logged_and_given_up_while_the_org_goes_on(tmp_path, monkeypatch):
    """Nothing listens at the webhook: the POST fails, is tried once more, then given up; both
    failures are counted (org status shows them) and logged; the decision is still made and the
    run goes on to its end."""
    monkeypatch.setenv("PATH", f"/usr/bin{os.pathsep}/bin")          # no notify-send to pop up
    with running_org(_config(_refused_url(), retries=1)) as home:
        wid = _submit(home, "gate", "true", GATE)
        row = wait_for(lambda: (r := query(home, "SELECT * FROM attention")) and r[0]["post_attempts"] >= 2 and r[0],
                       timeout=30, what="two failed POSTs")
        assert row["posted_at"] is None and "Connection refused" in row["last_error"]
        pending = wait_for(lambda: json.loads(_cli(home, "decisions", "--json").stdout), what="a pending decision")
        assert _cli(home, "decide", pending[0]["id"], "approve").returncode == 0
        wait_for(lambda: query(home, "SELECT 1 FROM work_items WHERE id=? AND status='ended'", (wid,)),
                 timeout=40, what="the run to end")
        rows = wait_for(lambda: (r := query(home, "SELECT * FROM attention")) and all(
            x["post_attempts"] == 2 for x in r) and r, timeout=20, what="every event tried twice")
        counters = {r["name"]: r["value"] for r in query(
            home, "SELECT name, value FROM transport_counters WHERE instance='coordinator'")}
        assert counters.get("webhook_failed") == 2 * len(rows) and counters.get("webhook_gave_up") == len(rows), \
            (counters, [r["key"] for r in rows])
        logged = [json.loads(line)["event"] for line in (home.logs_dir / "coordinator.log").read_text().splitlines()
                  if "webhook_" in line]
        assert sorted(logged) == ["webhook_failed"] * len(rows) + ["webhook_gave_up"] * len(rows), logged
        status = _cli(home, "status", "--json")
        assert status.returncode == 0 and "webhook_failed" in status.stdout


def test_a_500_is_retried_with_backoff_then_delivered_once(org_home, writer_for, hook):
    """The receiver answers 500 twice, then 200: three tries at 1 s and 2 s of backoff (an
    injected clock), one delivery, two failures counted, nothing raised to the caller."""
    server, got = hook
    got.status = 500
    now = [100.0]
    delivery = Delivery(org_home.db_path, "coordinator", Settings(
        webhook_url=f"http://127.0.0.1:{server.server_port}/", notify_send=False), clock=lambda: now[0])
    _decision(writer_for)
    co = writer_for(Actor.COORDINATOR)
    assert announce(co, 600, dashboard_url="http://dash.local/") and announce(co, 600) == []
    with capture_logs() as logs:
        assert delivery.deliver(co) == 1.0
        assert delivery.deliver(co) == 1.0               # not due yet: no POST
        now[0] += 1.0
        assert delivery.deliver(co) == 2.0
        got.status = 200
        now[0] += 2.0
        assert delivery.deliver(co) is None
        assert delivery.deliver(co) is None             # delivered: never again
    assert len(got.posts) == 3 and got.posts[0] == got.posts[2]
    assert [e["event"] for e in logs] == ["webhook_failed", "webhook_failed", "webhook_posted"]
    (row,) = query(org_home, "SELECT * FROM attention")
    assert row["post_attempts"] == 3 and row["posted_at"] and row["link"] == "http://dash.local/runs/w1"
    assert query(org_home, "SELECT value FROM transport_counters WHERE name='webhook_failed'")[0]["value"] == 2


def test_an_org_spend_cap_trip_is_one_attention_event_however_many_runs_it_ends(org_home, writer_for):
    """Three queued runs end org_limit in one reconcile: three announcements in chat, one
    attention row (keyed by the cap)."""
    from roles.coordinator import dispatch
    human = writer_for(Actor.HUMAN)
    for i in range(3):
        with human.transaction() as tx:
            tx.insert("work_items", {"id": f"w{i}", "goal": "g", "workspace": f"/tmp/ws{i}", "verify": ["true"],
                                     "caps": {}, "backend": "anthropic", "status": WorkStatus.QUEUED,
                                     "created_by": "human", "created_at": tx.now, "updated_at": tx.now})
    co = writer_for(Actor.COORDINATOR)
    with co.transaction() as tx:
        assert len(dispatch.enforce_spend_cap(tx, 0.0)) == 3
    texts = announce(co, 600, spend_cap_usd=0.0)
    assert sum("org_limit" in t for t in texts) == 3
    rows = query(org_home, "SELECT kind, key, text FROM attention")
    assert [(r["kind"], r["key"]) for r in rows] == [("org_limit", "org_limit:0.0")]
    assert "raise limits.total_spend_usd" in rows[0]["text"]


def test_link_and_message_are_slack_compatible():
    """The dashboard link drops the base's query (a token) and credentials; the body's ``text`` is
    Slack-compatible, the agent text escaped."""
    assert link("http://u:p@h:1/app/?token=x#t", "runs/w1") == "http://h:1/app/runs/w1"
    assert link("", "runs/w1") is None
    assert message("hi", None)["text"] == "hi"
    assert message("hi", "http://h/")["text"] == "hi\n<http://h/|open in the dashboard>"


def _decision(writer_for) -> None:
    from tests.support.state import assign_and_run, submit
    submit(writer_for)
    assign_and_run(writer_for)
    with writer_for(Actor.LOOP_AGENT, "loop-agent-1").transaction() as tx:
        tx.insert("decisions", {"id": "d1", "work_id": "w1", "kind": "network",
                                "action": {"command": "curl x"}, "question": "may I curl?",
                                "status": "pending", "created_at": tx.now})


AGENT_TEXT = ("waiting: <!channel> <@U024BE7LH> <http://evil.example|open in the dashboard> & @here "
              "\x1b]52;c;cHduZWQ=\x07\x1b]0;title\x1b\\ <b>bold</b> <a href='http://evil.example'>x</a>\u202e")


def test_agent_text_reaches_the_webhook_as_text_no_mention_no_link_of_its_own():
    """Slack's ``&``, ``<`` and ``>`` are escaped and ``@`` is a look-alike in ``text``: agent text
    forms no ``<!channel>``, no user mention and no labelled link; the only link is the one built
    here; Slack draws the agent text as a plain_text block; no control byte is posted."""
    body = message(AGENT_TEXT, "http://127.0.0.1:9/runs/w1")
    text = body["text"]
    assert text.count("<") == 1 and text.endswith("<http://127.0.0.1:9/runs/w1|open in the dashboard>")
    assert "<!channel>" not in text and "<@" not in text and "@here" not in text
    assert "&lt;!channel&gt;" in text and "&amp;" in text
    assert "http://evil.example" not in text.rsplit("\n", 1)[0]             # no address of the agent's to click
    assert body["blocks"][0]["text"]["type"] == "plain_text"
    assert not any(c in str(body) for c in "\x1b\x07\u202e")
    assert body["unfurl_links"] is False


def test_notify_send_gets_plain_text_without_markup_or_controls(tmp_path, monkeypatch):
    """The real ``notify_send`` runs a notify-send (here one that records its argv): the body has
    no markup a notification server would draw, no control byte, and ``--`` before the texts."""
    from roles.coordinator.attention import notify_send

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "argv.json"
    script = bin_dir / "notify-send"
    script.write_text(f"#!{sys.executable}\nimport json, sys\nopen({str(record)!r}, 'w').write(json.dumps(sys.argv[1:]))\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    assert notify_send("-t 0 loop-org \x1b]0;x\x07", AGENT_TEXT)
    argv = json.loads(record.read_text())
    assert argv[:2] == ["--app-name=loop-org", "--"] and len(argv) == 4
    assert not any(c in "".join(argv) for c in "<>&\x1b\x07\u202e")
    assert "␛]52;c;" in argv[3] and "‹b›bold‹/b›" in argv[3]
