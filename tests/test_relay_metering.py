"""Metered model access: a doer that attacks the model relay from inside the sandbox is refused,
capped and counted.

Real processes throughout: a fake Anthropic-compatible server on 127.0.0.1 that reports the usage
it serves (JSON and streamed; a "hog" that always writes all the ``max_tokens`` it is allowed,
and charges one input token per 3 bytes — denser than the endpoint's estimate), and an attacking
"CLI" run by the real command backend in the real bubblewrap sandbox in place of ``claude``. It
asks for batches, model listings, files, admin and other paths, sends huge requests, tries the
relay from a child process and the endpoint's socket directly, then runs ``kill -9 -1`` without
printing any result. The run's counted usage (``model_calls``) must equal what the server served.

The sandbox gives every process of the run the same uid: the relay can tell the CLI's own
process from its children only by which process holds the connecting socket, and a process that
could ptrace the CLI could still speak as it — what it sends is metered and capped all the same.
"""
from __future__ import annotations

import json
import math
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import structlog

from roles.loop_agent.backends.base import ActContext, Remaining
from roles.workbench.scripted.server import Exchange, MessagesServer, error_body, message_body, sse_event, sse_events
from roles.workbench.sandbox import bubblewrap
from roles.workbench.relay.metering import Ledger, Rates, UsageReader
from tests.support.loop import make_workspace, submit
from tests.support.loop import engine as loop_engine
from tests.support.org import query
from tests.test_claude_code_real import org_backend  # org.toml, then the factory, the key in the environment

PY = sys.executable
SONNET = {"input": 3.0, "output": 15.0, "cache_write": 3.75, "cache_read": 0.3}  # org.toml's default prices
pytestmark = pytest.mark.skipif(bubblewrap() is None,
                                reason="bubblewrap (bwrap) is not installed: apt-get install -y bubblewrap")


def budget_overshoot_ratio(counted: float, budget: float) -> float:
    """Counted usage ÷ budget: 1.0 spends the budget exactly; above 1.0 is the overshoot."""
    return counted / budget


class HogServer(MessagesServer):
    """Answers ``POST /v1/messages`` with every output token it is allowed; records what it served.

    ``slow_s``: a streamed reply pauses that long after ``message_start``. Any other path would be
    answered 200 (as if a batch had been accepted) and recorded in ``other``: it must stay empty.
    """

    def __init__(self, slow_s: float = 0.0) -> None:
        super().__init__()
        self.slow_s = slow_s
        self.served: list[dict] = []
        self.other: list[str] = []
        self._lock = threading.Lock()

    def respond(self, exchange: Exchange) -> None:
        if exchange.path.split("?")[0] != "/v1/messages" or not isinstance(exchange.body, dict):
            with self._lock:
                self.other.append(exchange.path)
            return exchange.json(200, {"id": "msgbatch_leaked", "processing_status": "in_progress"})
        body = exchange.body
        usage = {"input_tokens": math.ceil(len(exchange.raw) / 3), "output_tokens": int(body["max_tokens"]),
                 "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
        rid = f"req_hog_{uuid.uuid4().hex[:16]}"
        with self._lock:
            self.served.append({"request_id": rid, "max_tokens": body["max_tokens"], "stream": bool(body.get("stream")),
                                "thinking": body.get("thinking"), **usage})
        message = message_body(model=body["model"], content=[{"type": "text", "text": "tok " * 50}],
                               stop_reason="max_tokens", usage=usage)
        if not body.get("stream"):
            return exchange.json(200, message, {"request-id": rid})
        events = list(sse_events(message))
        h = exchange.handler
        h.close_connection = True
        h.send_response(200)
        for name, value in (("Content-Type", "text/event-stream"), ("Connection", "close"), ("request-id", rid)):
            h.send_header(name, value)
        h.end_headers()
        h.wfile.write(events[0])  # message_start: the input is known, the output is not yet
        h.wfile.flush()
        time.sleep(self.slow_s)
        h.wfile.write(b"".join(events[1:]))
        h.wfile.flush()


ATTACKER = '''#!{python} -I
import http.client, json, os, socket, subprocess, sys, urllib.error, urllib.request
conf = json.load(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "attack.json")))
sys.stdin.read()
base = os.environ["ANTHROPIC_BASE_URL"]
report = {{"routes": {{}}, "messages": []}}

def msg(text, max_tokens, stream=False, **extra):
    return dict({{"model": "claude-sonnet-4-5", "max_tokens": max_tokens, "stream": stream,
                 "messages": [{{"role": "user", "content": text}}]}}, **extra)

def call(method, path, body=None, first_line_only=False):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method=method,
                                 headers={{"content-type": "application/json", "anthropic-version": "2023-06-01"}})
    try:
        resp = urllib.request.urlopen(req, timeout=20)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{{}}").get("error", {{}}).get("message", "")[:60]
    if first_line_only:
        return resp.status, resp.readline().decode().strip()[:40]
    return resp.status, len(resp.read())

if conf["mode"] == "die_mid_stream":
    status, line = call("POST", "/v1/messages", msg("hello", 3000, stream=True), first_line_only=True)
    report["messages"].append([status, line])
else:
    for method, path in [("POST", "/v1/messages/batches"), ("GET", "/v1/models"), ("POST", "/v1/files"),
                         ("POST", "/v1/messages/count_tokens"), ("GET", "/v1/organizations/api_keys"),
                         ("DELETE", "/v1/messages"), ("POST", "/v1/complete")]:
        body = {{"requests": [{{"custom_id": "a", "params": msg("x" * 300000, 100000)}}]}} if method == "POST" else None
        report["routes"][method + " " + path] = call(method, path, body)[0]
    child = "import json,os,urllib.request as u;r=u.Request(os.environ['ANTHROPIC_BASE_URL']+'/v1/messages',data=json.dumps({{'model':'claude-sonnet-4-5','max_tokens':50000,'messages':[{{'role':'user','content':'hi'}}]}}).encode(),headers={{'content-type':'application/json'}})\\ntry:\\n print(u.urlopen(r,timeout=10).status)\\nexcept Exception as e:\\n print(getattr(e,'code',type(e).__name__))"
    report["child"] = subprocess.run([sys.executable, "-I", "-c", child], capture_output=True, text=True).stdout.strip()
    sock_path = open("/proc/%d/cmdline" % os.getppid(), "rb").read().split(b"\\0")[3].decode()
    direct = socket.socket(socket.AF_UNIX)
    direct.connect(sock_path)
    payload = json.dumps(msg("hi", 50000)).encode()
    direct.sendall(b"POST /v1/messages HTTP/1.1\\r\\nHost: x\\r\\nContent-Length: %d\\r\\n\\r\\n" % len(payload) + payload)
    report["direct"] = direct.recv(100).split(b"\\r\\n")[0].decode()
    report["messages"].append(call("POST", "/v1/messages", msg("hog " * 20, 5000)))
    report["messages"].append(call("POST", "/v1/messages", msg("hog " * 20, 100000, stream=True,
                                                               thinking={{"type": "enabled", "budget_tokens": 90000}})))
    for _ in range(5):
        report["messages"].append(call("POST", "/v1/messages", msg("x" * 300000, 100000)))  # ~100k tokens each
    report["messages"].append(call("POST", "/v1/messages", msg("one more", 100)))
with open("attack-report.json", "w") as f:
    json.dump(report, f)
os.kill(-1, 9)
os.kill(os.getpid(), 9)
'''


@pytest.fixture
def attacker(tmp_path):
    """Writes the attacking CLI; returns a function setting its mode and returning its path."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    cli = bin_dir / "claude"
    cli.write_text(ATTACKER.format(python=PY))
    cli.chmod(0o755)

    def configure(mode: str) -> Path:
        (bin_dir / "attack.json").write_text(json.dumps({"mode": mode}))
        return cli
    return configure


def cost(row: dict) -> float:
    return (row["input_tokens"] * SONNET["input"] + row["output_tokens"] * SONNET["output"]) / 1e6


@pytest.mark.parametrize("cap, budget", [("budget_tokens", 20_000), ("budget_usd", 0.30)], ids=["tokens", "cost"])
def test_an_attacking_cli_is_refused_capped_and_counted_to_the_token_it_was_served(
        org_home, tmp_path, attacker, monkeypatch, cap, budget):
    ws = make_workspace(tmp_path)
    with HogServer() as hog:
        backend = org_backend(org_home, hog.base_url, attacker("hog"), monkeypatch).backend
        submit(org_home, ws, caps={cap: budget, "max_iterations": 2})
        with structlog.testing.capture_logs() as logs:
            decision = loop_engine(org_home, "w1", backend).run()
    seen = json.loads((ws / "attack-report.json").read_text())
    assert decision.reason == ("token_budget" if cap == "budget_tokens" else "cost_budget"), (decision, seen)

    # nothing but POST /v1/messages reached the server: batches, listings, files, admin were refused
    assert hog.other == [] and set(seen["routes"].values()) == {403}, seen
    assert seen["child"] == "403" and seen["direct"].startswith("HTTP/1.1 403"), seen
    assert backend.refusals["route"] == 7 and backend.refusals["relay_peer"] == 1 and backend.refusals["peer"] == 1

    # two calls served, each capped to what the budget had left; then every request refused
    assert [s["stream"] for s in hog.served] == [False, True], hog.served
    spent = 0.0
    for s in hog.served:
        left = budget - spent
        assert (s["max_tokens"] <= left if cap == "budget_tokens" else s["max_tokens"] * SONNET["output"] / 1e6 <= left)
        spent += s["input_tokens"] + s["output_tokens"] if cap == "budget_tokens" else cost(s)
    second = hog.served[1]
    assert second["max_tokens"] < 100_000 and second["thinking"]["budget_tokens"] < second["max_tokens"]
    assert [m[0] for m in seen["messages"]] == [200, 200] + [400] * 6, seen
    assert backend.refusals[decision.reason] == 6

    # counted = served, per request id, though the CLI was killed before printing any result
    calls = query(org_home, "SELECT * FROM model_calls WHERE work_id='w1' ORDER BY request_id")
    assert sorted((c["request_id"], c["input_tokens"], c["output_tokens"]) for c in calls) == \
        sorted((s["request_id"], s["input_tokens"], s["output_tokens"]) for s in hog.served)
    assert sum(c["cost_usd"] for c in calls) == pytest.approx(sum(cost(s) for s in hog.served))
    counted = sum(c["input_tokens"] + c["output_tokens"] for c in calls) if cap == "budget_tokens" \
        else sum(c["cost_usd"] for c in calls)
    ratio = budget_overshoot_ratio(counted, budget)
    assert 0.95 <= ratio <= 1.02, ratio
    ended = next(e for e in logs if e["event"] == "cli ended")
    assert ended["status"] == "budget_exhausted" and ended["exit_code"] != 0, ended
    print(f"budget_overshoot_ratio[{cap}] = {ratio:.4f} (counted {counted:g} of {budget:g})")


def test_a_cli_killed_mid_stream_still_has_the_whole_response_counted(org_home, tmp_path, attacker, monkeypatch):
    """The CLI reads only ``message_start`` and dies; the endpoint reads the rest for its usage."""
    ws = make_workspace(tmp_path)
    with HogServer(slow_s=1.0) as hog:
        backend = org_backend(org_home, hog.base_url, attacker("die_mid_stream"), monkeypatch).backend
        usages: list = []
        ctx = ActContext("w-1", 1, 1, ws, "SYSTEM", "Iteration: 1\nFix add().",
                         remaining=lambda: Remaining(tokens=50_000))
        outcome = backend.act(ctx, on_usage=usages.append, budget_left=lambda: None)
    seen = json.loads((ws / "attack-report.json").read_text())
    assert seen["messages"] == [[200, "event: message_start"]], seen
    assert (outcome.status, outcome.error_code) == ("failed", "cli_exit"), outcome  # no result printed
    assert [(u.request_id, u.input_tokens, u.output_tokens) for u in usages] == \
        [(s["request_id"], s["input_tokens"], 3000) for s in hog.served]


def test_the_ledger_holds_what_requests_in_flight_may_spend():
    """Parallel requests cannot each be granted the same remainder."""
    ledger = Ledger(10_000, None, lambda m: Rates(0, 0, 0, 0) if m == "m" else None)
    body = json.dumps({"model": "m", "max_tokens": 8000, "messages": []}).encode()
    first, second, third = ledger.admit(body), ledger.admit(body), ledger.admit(body)
    assert first.max_tokens == 8000 and 0 < second.max_tokens < 2000, (first, second)
    assert third.code == "token_budget"
    ledger.settle(first, {"input_tokens": 10, "output_tokens": 100, "cache_creation_input_tokens": 0,
                          "cache_read_input_tokens": 0})
    assert ledger.admit(body).max_tokens > 7000  # what the first did not use is free again
    assert ledger.admit(json.dumps({"model": "other", "max_tokens": 1}).encode()).code == "unpriced_model"


def test_usage_is_read_from_json_and_from_a_stream_cut_anywhere():
    message = message_body(model="m", content=[{"type": "text", "text": "hi " * 40}], stop_reason="end_turn",
                           usage={"input_tokens": 11, "output_tokens": 7, "cache_read_input_tokens": 5})
    whole = UsageReader(streamed=False)
    whole.feed(json.dumps(message).encode())
    whole.finish()
    assert whole.counts()["output_tokens"] == 7 and whole.complete
    stream = b"".join(sse_events(message))
    for cut in range(0, len(stream), 37):
        r = UsageReader(streamed=True)
        r.feed(stream[:cut])
        r.feed(stream[cut:])
        r.finish()
        assert r.counts() == {"input_tokens": 11, "output_tokens": 7, "cache_creation_input_tokens": 0,
                              "cache_read_input_tokens": 5} and r.complete and r.message_id == message["id"]
    started = UsageReader(streamed=True)
    started.feed(next(iter(sse_events(message))))
    assert started.counts()["input_tokens"] == 11 and not started.complete
    failed = UsageReader(streamed=True)
    failed.feed(sse_event("error", error_body("overloaded_error", "busy")))
    assert failed.counts() is None and failed.complete
