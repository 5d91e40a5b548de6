"""OpenTelemetry GenAI traces: the span tree and attributes of a two-iteration scripted run (in
memory), the eval-agent's span in the run's trace across real processes (OTLP/HTTP to a receiver
on 127.0.0.1), and nothing imported while tracing is off."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from roles.base import telemetry
from roles.loop_agent.backends.anthropic_backend import AnthropicBackend, AnthropicConfig
from roles.loop_agent.backends.retry import RetryPolicy
from roles.workbench.scripted.server import ScriptedServer
from tests.support.loop import BUGGY, CHECK, FIXED, engine, make_workspace, submit
from tests.support.org import query, running_org, wait_for

PRICES = {"scripted": {"input": 3.0, "output": 15.0, "cache_write": 3.75, "cache_read": 0.3}}
USAGE = {"input_tokens": 120, "output_tokens": 30, "cache_creation_input_tokens": 50, "cache_read_input_tokens": 400}


def _act(content: str) -> list:
    return [{"text": "I write calc.py.", "usage": USAGE,
             "tool_uses": [{"name": "write_file", "input": {"path": "calc.py", "content": content}}]},
            {"text": "Done."}]


SCRIPT = {"version": 1, "acts": [_act(BUGGY.replace("a - b", "a * b")), _act(FIXED)]}


@pytest.fixture
def exporter():
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    got = InMemorySpanExporter()
    telemetry.use(got, role="test")
    yield got
    telemetry.reset()


def _children(spans, parent) -> dict[str, list]:
    out: dict[str, list] = {}
    for s in spans:
        if s.parent is not None and s.parent.span_id == parent.context.span_id:
            out.setdefault(s.name, []).append(s)
    return out


def test_a_two_iteration_run_is_one_trace_with_genai_spans_and_the_verifiers_under_each_iteration(
        org_home, tmp_path, exporter):
    """Iteration 1 fails verification, iteration 2 passes: one trace (id derived from the work
    id) with the run span (stop reason goal_met) over two iteration spans, each holding gather,
    two chat spans with GenAI usage and finish reasons, the tool call, the checkpoint, the wait
    for the verdict and the eval-agent's verify span."""
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    server = ScriptedServer(script, tmp_path / "scripted.jsonl")
    url = server.start()
    try:
        backend = AnthropicBackend(AnthropicConfig(model="scripted", max_tokens=512, base_url=url, timeout_s=30,
                                                   retry=RetryPolicy(max_attempts=1)), PRICES)
        submit(org_home, make_workspace(tmp_path), verify=(CHECK,))
        decision = engine(org_home, "w1", backend).run()
    finally:
        server.stop()
    assert decision.reason == "goal_met"
    spans = exporter.get_finished_spans()
    assert {s.context.trace_id for s in spans} == {telemetry.trace_id_of("w1")}
    (run,) = [s for s in spans if s.parent is None]
    assert run.name == "invoke_agent loop-org" and run.context.span_id == telemetry.run_span_id("w1")
    assert run.attributes["loop_org.stop_reason"] == "goal_met" and run.attributes["loop_org.iterations"] == 2
    assert run.attributes["gen_ai.operation.name"] == "invoke_agent"
    under_run = _children(spans, run)
    assert len(under_run["preflight"]) == 1
    iterations = sorted(under_run["iteration 1"] + under_run["iteration 2"], key=lambda s: s.start_time)
    assert [s.context.span_id for s in iterations] == [telemetry.iteration_span_id("w1", 1, 1),
                                                       telemetry.iteration_span_id("w1", 2, 2)]
    for it, verdict in zip(iterations, ("fail", "pass")):
        kids = _children(spans, it)
        assert sorted(kids) == ["await_verdict", "chat scripted", "checkpoint", "execute_tool write_file",
                                "gather", "verify"], sorted(kids)
        first, second = sorted(kids["chat scripted"], key=lambda s: s.start_time)
        a = first.attributes
        assert (a["gen_ai.operation.name"], a["gen_ai.provider.name"], a["gen_ai.request.model"]) == (
            "chat", "anthropic", "scripted")
        assert a["gen_ai.usage.input_tokens"] == 120 + 50 + 400 and a["gen_ai.usage.output_tokens"] == 30
        assert a["gen_ai.usage.cache_creation.input_tokens"] == 50
        assert a["gen_ai.usage.cache_read.input_tokens"] == 400
        assert tuple(a["gen_ai.response.finish_reasons"]) == ("tool_use",)
        assert tuple(second.attributes["gen_ai.response.finish_reasons"]) == ("end_turn",)
        assert a["gen_ai.request.max_tokens"] > 0 and a["loop_org.cost_usd"] > 0
        (tool,) = kids["execute_tool write_file"]
        assert tool.attributes["gen_ai.tool.name"] == "write_file" and tool.attributes["gen_ai.tool.call.id"]
        assert kids["verify"][0].attributes["loop_org.verdict"] == verdict
        assert kids["await_verdict"][0].attributes["loop_org.verdict"] == verdict
        assert kids["checkpoint"][0].attributes["loop_org.changed_paths"] == 1
        assert all(first.start_time >= g.end_time for g in kids["gather"])


def test_tracing_off_imports_no_opentelemetry_sdk(tmp_path):
    """With the default org.toml, a role's start-up, the engine, the backends and the verifier
    import nothing of the OpenTelemetry SDK or exporter (off costs nothing)."""
    code = ("import sys; from state_db.kernel import config; from roles.base import telemetry;"
            "import roles.loop_agent.engine, roles.loop_agent.backends.anthropic_backend,"
            " roles.loop_agent.backends.command_backend, roles.eval_agent.verifier, roles.base.runtime;"
            "t = telemetry.configure(config.load(None, env={}), 'loop-agent', 'loop-agent-1');"
            "assert t is telemetry.OFF and not t.enabled;"
            "print([m for m in sys.modules if m.startswith(('opentelemetry.sdk', 'opentelemetry.exporter'))])")
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         cwd=Path(__file__).resolve().parents[1])
    assert got.returncode == 0, got.stderr
    assert got.stdout.strip() == "[]"


class _Receiver(BaseHTTPRequestHandler):
    """An OTLP/HTTP receiver: keeps every decoded ExportTraceServiceRequest."""

    got: list = []

    def do_POST(self):  # noqa: N802 - http.server's name
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        req = ExportTraceServiceRequest()
        req.ParseFromString(body)
        type(self).got.append((self.path, self.headers.get("Content-Type"), req))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()
        self.wfile.write(b"")

    def log_message(self, *args):
        pass


@pytest.fixture
def receiver():
    _Receiver.got = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server, _Receiver.got
    server.shutdown()
    server.server_close()


def _spans(got) -> list[dict]:
    out = []
    for path, ctype, req in list(got):
        for rs in req.resource_spans:
            res = {kv.key: kv.value.string_value for kv in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    out.append({"name": s.name, "trace": s.trace_id.hex(), "id": s.span_id.hex(),
                                "parent": s.parent_span_id.hex(), "role": res.get("loop_org.role"),
                                "path": path, "type": ctype,
                                "attrs": {kv.key: kv.value for kv in s.attributes}})
    return out


@pytest.mark.timeout(90)
def test_org_processes_export_otlp_http_and_the_eval_agents_span_joins_the_runs_trace(
        receiver, tmp_path, monkeypatch):
    """A real org exports OTLP/HTTP protobuf to a receiver on 127.0.0.1: the loop-agent's
    iteration spans and the eval-agent's verify spans (another process, no context in any
    message) share the trace derived from the work id, each verify span a child of its iteration."""
    server, got = receiver
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    config = f"""
[org]
loop_agents = 1
[supervisor]
heartbeat_s = 0.2
[model]
backend = "scripted"
[telemetry]
otlp_endpoint = "http://127.0.0.1:{server.server_port}"
"""
    with running_org(config) as home:
        ws = make_workspace(home.root.parent / "t")
        script = home.root.parent / "script.json"
        script.write_text(json.dumps(SCRIPT))
        out = subprocess.run([sys.executable, "-m", "scripts.cli.main", "submit", "make add() add", "--workspace",
                              str(ws), "--verify", CHECK, "--backend", f"scripted:{script}", "--max-iterations", "3",
                              "--json", "--no-wait"], capture_output=True, text=True, timeout=60,
                             env={**os.environ, "ORG_HOME": str(home.root)})
        assert out.returncode == 0, out.stderr
        wid = json.loads(out.stdout)["id"]
        wait_for(lambda: query(home, "SELECT 1 FROM work_items WHERE id=? AND status='ended'", (wid,)),
                 timeout=40, what="the run to end")
        trace = format(telemetry.trace_id_of(wid), "032x")

        def complete():
            spans = [s for s in _spans(got) if s["trace"] == trace]
            names = {s["name"] for s in spans}
            return spans if {"invoke_agent loop-org", "iteration 1", "iteration 2", "verify"} <= names and \
                len([s for s in spans if s["name"] == "verify"]) == 2 else False
        spans = wait_for(complete, timeout=20, what=f"the run's spans at the receiver (got {len(got)} requests)")
    assert {(s["path"], s["type"]) for s in _spans(got)} == {("/v1/traces", "application/x-protobuf")}
    iterations = {s["id"]: s for s in spans if s["name"].startswith("iteration ")}
    verifies = [s for s in spans if s["name"] == "verify"]
    assert {s["role"] for s in iterations.values()} == {"loop-agent"}
    assert {s["role"] for s in verifies} == {"eval-agent"}
    assert {s["parent"] for s in verifies} == set(iterations)
    (run,) = [s for s in spans if s["name"] == "invoke_agent loop-org"]
    assert run["attrs"]["loop_org.stop_reason"].string_value == "goal_met" and run["parent"] == ""
    assert {s["parent"] for s in iterations.values()} == {run["id"]}
    chats = [s for s in spans if s["name"] == "chat scripted"]
    assert len(chats) == 4 and all(c["attrs"]["gen_ai.usage.output_tokens"].int_value for c in chats)
