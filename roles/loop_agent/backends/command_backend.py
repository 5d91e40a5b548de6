"""The ``command`` act backend: an agent CLI (Claude Code by default) run once per act in the sandbox.

One act is one run of the CLI in the workspace, inside the sandbox, with the assembled prompt
(stable prefix, then the variable prompt) on its stdin, bounded by ``timeout_s`` and by the time the
run has left (``ActContext.remaining``). The sandbox has
no network; the CLI reaches exactly the model endpoint through a ``ModelEndpoint`` (a Unix socket
in a private folder bound into the sandbox, relayed to 127.0.0.1 inside), which adds the org's
credentials outside — the CLI itself only ever holds a placeholder key.

The Claude Code preset runs ``claude -p --output-format stream-json --verbose --permission-mode MODE
--allowedTools LIST [--max-turns N] [--model M]`` with HOME and ``CLAUDE_CONFIG_DIR`` in a private
per-work folder (outside the workspace, bound writable) and
``CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1``, then reads its result event (the last line): ``usage``,
``total_cost_usd``, ``num_turns``, ``subtype``, ``is_error``, ``result``, ``session_id``. The lines
before it — the session's messages — become the act's transcript (``record_stream``).

Metering: the endpoint reads the usage of every model response itself (``sandbox.metering``) and
the backend reports each through ``on_usage`` keyed by the response's request id, from the act's
own thread while the CLI runs (at each ``poll_s``) and once more when it ends — so a CLI that dies,
or code that calls the model behind the CLI's back, loses nothing. The CLI's final JSON is only a
cross-check (a warning when it claims more than was metered); it is never counted. Each request is
admitted against what the run has left (``ActContext.remaining``): its ``max_tokens`` is lowered
to fit, and once the budget is spent, or ``budget_left()`` names a stop code, further requests are
refused. The endpoint's refusals (by code) are logged with each act and summed in ``refusals``.

Status mapping (see ``backends.base``): ``success`` → ``ok``; ``error_max_turns`` → ``failed``
(``max_turns``); another ``error_*`` subtype → ``failed`` (code = subtype); ``is_error`` with a
success subtype (the CLI gave up on the API) → ``model_error`` (``cli_error``); a non-zero exit
without a result → ``failed`` (``cli_exit``); no JSON → ``failed`` (``bad_output``); the time
limit → ``failed`` (``timeout``); a request refused for the budget → ``budget_exhausted`` (the stop
code); a request for a model without a price → ``model_error`` (``unpriced_model``); the CLI or
the sandbox missing → ``model_error`` (``cli_missing`` / the sandbox's code: nothing will change
by iterating).
"""
from __future__ import annotations

import os
import queue
import re
import shutil
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping
from urllib.parse import urlparse

import structlog

from roles.base import telemetry
from roles.loop_agent.backends import exits
from roles.loop_agent.backends.base import ActContext, ActOutcome, BackendConfigError, Usage
from roles.loop_agent.pricing import PriceTable
from roles.workbench.sandbox import Captured, SandboxError, clean_env
from roles.workbench.relay.endpoint import MAX_SOCKET_PATH, RELAY_SCRIPT, ModelEndpoint
from roles.workbench.relay.metering import Ledger, Rates, Served

log = structlog.get_logger("loop_agent.command")

DEFAULT_BASE_URL = "https://api.anthropic.com"
CLAUDE_TOOLS = ("Read", "Edit", "Write", "Glob", "Grep", "Bash")
PRESETS = ("claude", "plain")
_LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
_SUMMARY_CAP = 2000
_TAIL = 1500


@dataclass(frozen=True)
class CommandConfig:
    """Settings of the command backend.

    ``binary``: the CLI (name on the sandbox PATH, or absolute path); ``preset``: ``claude``
    (Claude Code's JSON result) or ``plain`` (exit code and text only: no usage, so budgets in
    tokens and USD see only what the endpoint metered); ``model``: passed as ``--model``;
    ``upstream``: the model endpoint outside (default
    ``ANTHROPIC_BASE_URL`` or the Anthropic API); ``path_prepend``/``readonly_binds``: folders
    the CLI needs that the sandbox hides (e.g. a node installation under a home directory);
    ``memory_mb``: address-space limit of the CLI (None: off — JavaScript engines reserve large
    virtual ranges; Claude Code 2.1.112 on Node 20 hangs silently, before any request, under a
    limit of 8 GB or less); ``max_retries``: how often the CLI itself retries a failed model request
    (Claude Code's ``CLAUDE_CODE_MAX_RETRIES``; None: the CLI's default, which backs off for
    minutes on a 5xx); ``poll_s``: how often metered usage is reported and ``budget_left`` asked
    while the CLI runs; ``drain_s``: how long responses still in flight when the CLI ends are
    read for their usage before they are cut.
    """

    binary: str = "claude"
    preset: str = "claude"
    model: str | None = None
    permission_mode: str = "acceptEdits"
    allowed_tools: tuple[str, ...] = CLAUDE_TOOLS
    extra_args: tuple[str, ...] = ()
    timeout_s: float = 1800.0
    max_output_bytes: int = 4_000_000
    upstream: str | None = None
    path_prepend: tuple[str, ...] = ()
    readonly_binds: tuple[str, ...] = ()
    memory_mb: int | None = None
    max_retries: int | None = None
    placeholder_key: str = "sandbox-placeholder-key"
    relay_python: str = field(default_factory=lambda: sys.executable)
    poll_s: float = 1.0
    drain_s: float = 5.0


class CommandBackend:
    """Act backend running an agent CLI in the sandbox.

    Params: ``config``; ``prices`` (``PriceTable`` or its mapping); ``make_runner(workspace)``
    returns the sandbox runner for a workspace (``roles.workbench.sandbox.runner_from_config``); ``state_dir``
    holds the CLI's private home per work item (outside every workspace); ``environ`` is read for
    ``ANTHROPIC_API_KEY`` / ``ANTHROPIC_AUTH_TOKEN`` / ``ANTHROPIC_BASE_URL``.
    Errors: ``BackendConfigError`` (``bad_config``, ``unknown_model``, ``missing_api_key``).
    """

    name = "command"

    def __init__(self, config: CommandConfig, prices: PriceTable | Mapping[str, Mapping[str, float]], *,
                 make_runner: Callable[[Path], Any], state_dir: Path,
                 environ: Mapping[str, str] | None = None) -> None:
        if config.preset not in PRESETS or not config.binary or config.timeout_s <= 0:
            raise BackendConfigError(f"command backend needs a binary, a preset in {PRESETS} and timeout_s > 0",
                                     code="bad_config")
        self.config = config
        self.prices = prices if isinstance(prices, PriceTable) else PriceTable(prices)
        if config.model:
            self.prices.price(config.model)  # unknown model: configuration error now, not mid-run
        env = os.environ if environ is None else environ
        self.upstream = config.upstream or env.get("ANTHROPIC_BASE_URL") or DEFAULT_BASE_URL
        self._api_key = env.get("ANTHROPIC_API_KEY") or None
        self._auth_token = env.get("ANTHROPIC_AUTH_TOKEN") or None
        if not (self._api_key or self._auth_token) and (urlparse(self.upstream).hostname or "") not in _LOOPBACK:
            raise BackendConfigError(f"ANTHROPIC_API_KEY is not set; export it to reach {self.upstream} "
                                     "(keys are read from the environment only)", code="missing_api_key")
        self._make_runner = make_runner
        self.state_dir = Path(state_dir)
        self.refusals: Counter[str] = Counter()  # the endpoint's refusals over every act, by code

    def with_model(self, model: str) -> "CommandBackend":
        """This backend on ``model`` (``--model``; a rung of the run's ladder). Raises
        BackendConfigError for a model the price table lacks."""
        import copy
        self.prices.price(model)
        other = copy.copy(self)
        other.config = replace(self.config, model=model)
        return other

    def __repr__(self) -> str:
        return f"CommandBackend(binary={self.config.binary!r}, preset={self.config.preset!r}, upstream={self.upstream!r})"

    def act(self, ctx: ActContext, *, on_usage: Callable[[Usage], None],
            budget_left: Callable[[], str | None]) -> ActOutcome:
        """Run the CLI once; see ``backends.base.Backend.act``. Never raises for CLI, sandbox or
        model problems; exceptions from ``on_usage`` propagate."""
        fields = {"work_id": ctx.work_id, "iteration": ctx.iteration, "attempt": ctx.attempt}
        code = budget_left()
        if code is not None:
            return _end("budget_exhausted", code, f"budget reached before the CLI started: {code}")
        runner = self._make_runner(ctx.workspace)
        path = self._inside_path()
        binary = shutil.which(self.config.binary, path=path)
        if binary is None:
            return _end("model_error", "cli_missing", f"{self.config.binary!r} is not on the sandbox's PATH ({path}); "
                        "install it or set the command backend's binary to its absolute path")
        try:
            home = self._private_home(ctx.work_id)
            sock_dir = _short_private_dir(self.state_dir)
            exit_bin, exits_file = exits.prepare(home)     # its honest exits (backends/exits.py)
        except OSError as exc:
            return _end("model_error", "cli_setup", f"cannot prepare the CLI's private folders under "
                        f"{self.state_dir}: {exc.strerror or exc}")
        stop_code: list[str] = []
        served: queue.SimpleQueue[Served] = queue.SimpleQueue()
        metered: list[Served] = []
        left = ctx.remaining()
        ledger = Ledger(left.tokens, left.cost_usd, self._rates)
        # the CLI never outlives the run's time: its limit is the smaller of its own and what is left
        timeout_s = self.config.timeout_s if left.seconds is None else max(1.0, min(self.config.timeout_s,
                                                                                      left.seconds))

        tracing = telemetry.current()
        seen_ns = [telemetry.now_ns()]       # a metered call is traced from the previous report on

        def report() -> None:
            # on_usage runs here, in the act's thread, never in the endpoint's: the engine's
            # database connection belongs to this thread
            while True:
                try:
                    s = served.get_nowait()
                except queue.Empty:
                    return
                metered.append(s)
                usage = Usage(s.request_id, s.model, s.input_tokens, s.output_tokens,
                              s.cache_creation_input_tokens, s.cache_read_input_tokens, s.cost_usd)
                on_usage(usage)
                if tracing.enabled:
                    tracing.model_call_done(usage, seen_ns[0])
                    seen_ns[0] = telemetry.now_ns()

        def should_stop() -> bool:
            report()
            code = budget_left()
            if code is not None:
                ledger.stop(code)
                stop_code.append(code)
            return code is not None

        log.info("cli starting", binary=binary, preset=self.config.preset, **fields)
        try:
            endpoint = ModelEndpoint(self.upstream, sock_dir / "model.sock", api_key=self._api_key,
                                     auth_token=self._auth_token, ledger=ledger, on_served=served.put,
                                     timeout_s=self.config.timeout_s, drain_s=self.config.drain_s)
            argv = [self.config.relay_python, "-I", str(RELAY_SCRIPT), str(endpoint.socket_path), "--",
                    binary, *self._preset_args(ctx)]
            with endpoint:
                got = runner.execute(
                    argv, cwd=ctx.workspace, timeout_s=timeout_s, max_output=self.config.max_output_bytes,
                    stdin=(_prompt(ctx) + exits.INSTRUCTIONS).encode("utf-8"),
                    env={**self._env(home, f"{path}{os.pathsep}{exit_bin}"), exits.ENV: str(exits_file)},
                    writable=[home, sock_dir],
                    readonly_binds=self._readonly(binary), separate_stderr=True,
                    limits=_cli_limits(runner, self.config.memory_mb), should_stop=should_stop,
                    poll_s=self.config.poll_s)
        except SandboxError as exc:
            log.error("cli not started: sandbox error", code=exc.code, error=str(exc), **fields)
            return _end("model_error", exc.code, str(exc))
        finally:
            shutil.rmtree(sock_dir, ignore_errors=True)
            report()  # what the endpoint metered after the last poll, or before a failure
        self.refusals.update(endpoint.refusals)
        if self.config.preset == "claude":
            record_stream(got.output, ctx.record)
        else:                                   # a plain CLI's account is its output
            ctx.record("text", {"text": got.output, "source": "cli"})
        outcome = self._outcome(got, stop_code, ledger, endpoint, budget_left, metered, timeout_s)
        said = exits.read(exits_file)
        if said and outcome.status in ("ok", "failed"):
            calls, requests = exits.recorded(said)
            outcome = replace(outcome, tool_calls=outcome.tool_calls + calls, requests=outcome.requests + requests)
            log.info("cli exits recorded", kinds=[k for k, _ in said], next="after the iteration is committed", **fields)
        log.info("cli ended", status=outcome.status, error_code=outcome.error_code, exit_code=got.exit_code,
                 duration_s=round(got.duration_s, 2), requests=endpoint.requests, refused=endpoint.refused,
                 refusals=dict(endpoint.refusals), metered_tokens=sum(s.total_tokens for s in metered),
                 metered_cost_usd=round(sum(s.cost_usd for s in metered), 6), **fields)
        return outcome

    def _rates(self, model: str) -> Rates | None:
        """Per-token prices of ``model``, or of the table's model it is a dated snapshot of
        (``claude-sonnet-4-5-20250929`` → ``claude-sonnet-4-5``); None when unpriced."""
        known = [m for m in self.prices.models() if model == m or model.startswith(m + "-")]
        if not known:
            return None
        p = self.prices.price(max(known, key=len))
        return Rates(p.input / 1e6, p.output / 1e6, p.cache_write / 1e6, p.cache_read / 1e6)

    # -- preparing the run -------------------------------------------------------------------

    def _inside_path(self) -> str:
        return os.pathsep.join([*self.config.path_prepend, clean_env()["PATH"]])

    def _preset_args(self, ctx: ActContext) -> list[str]:
        c = self.config
        if c.preset == "plain":
            return list(c.extra_args)
        # stream-json: every message of the CLI's session, one a line, then its result (the transcript)
        args = ["-p", "--output-format", "stream-json", "--verbose", "--permission-mode", c.permission_mode]
        if c.allowed_tools:
            args += ["--allowedTools", ",".join(c.allowed_tools)]
        args += ["--max-turns", str(ctx.max_turns)]
        if c.model:
            args += ["--model", c.model]
        return args + list(c.extra_args)

    def _env(self, home: Path, path: str) -> dict[str, str]:
        env = {"PATH": path, "HOME": str(home), "CLAUDE_CONFIG_DIR": str(home / ".claude"),
               "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "ANTHROPIC_API_KEY": self.config.placeholder_key}
        if self.config.max_retries is not None:
            env["CLAUDE_CODE_MAX_RETRIES"] = str(self.config.max_retries)
        return env

    def _private_home(self, work_id: str) -> Path:
        home = self.state_dir / re.sub(r"[^A-Za-z0-9_.-]", "_", work_id) / "home"
        (home / ".claude").mkdir(parents=True, exist_ok=True)
        os.chmod(home.parent, 0o700)
        return home

    def _readonly(self, binary: str) -> list[Path]:
        found = {Path(binary).parent, Path(os.path.realpath(binary)).parent, RELAY_SCRIPT.parent,
                 Path(sys.base_prefix), *(Path(p) for p in self.config.path_prepend),
                 *(Path(p) for p in self.config.readonly_binds)}
        return sorted(p for p in found if p.is_absolute() and p.exists())

    # -- reading the result ------------------------------------------------------------------

    def _outcome(self, got: Captured, stop_code: list[str], ledger: Ledger, endpoint: ModelEndpoint,
                 budget_left: Callable[[], str | None], metered: list[Served], timeout_s: float) -> ActOutcome:
        tail = (got.stderr or got.output)[-_TAIL:].strip()
        if got.stopped:
            code = stop_code[-1] if stop_code else "stopped"
            return _end("budget_exhausted", code, f"the CLI was stopped mid-run: {code}")
        if got.timed_out:
            return _end("failed", "timeout", f"the CLI ran past {timeout_s:g}s and was killed")
        if ledger.refused is not None:
            code = budget_left() or ledger.refused
            return _end("budget_exhausted", code, f"the model endpoint refused a request: {code}")
        if endpoint.refusals["unpriced_model"]:
            return _end("model_error", "unpriced_model", "the CLI asked for a model the price table lacks; add its "
                        f"[prices] entry to org.toml or set model.name to a priced model: {tail}")
        if got.exit_code == 127 and parse_result(got.output) is None:
            return _end("model_error", "cli_missing", f"the CLI could not be executed: {tail}")
        if self.config.preset == "plain":
            if got.exit_code != 0:
                return _end("failed", "cli_exit", f"the CLI exited with {got.exit_code}: {tail}")
            return ActOutcome(status="ok", summary=got.output[-_SUMMARY_CAP:].strip() or "(no output)")
        data = parse_result(got.output)
        if data is None:
            if got.exit_code != 0:
                return _end("failed", "cli_exit", f"the CLI exited with {got.exit_code}: {tail}")
            return _end("failed", "bad_output", f"the CLI printed no JSON result: {got.output[-_TAIL:].strip()}")
        _cross_check(data, metered)
        return claude_outcome(data)


def _cross_check(data: dict, metered: list[Served]) -> None:
    """Warn when the CLI's own totals exceed what the endpoint metered: then a model call went
    uncounted, which the endpoint is there to make impossible."""
    raw = data.get("usage")
    if not isinstance(raw, dict):
        return
    claimed = sum(_int(raw.get(k)) for k in ("input_tokens", "output_tokens", "cache_creation_input_tokens",
                                             "cache_read_input_tokens"))
    counted = sum(s.total_tokens for s in metered)
    if claimed > counted:
        log.warning("cli reports more usage than the endpoint metered", cli_tokens=claimed, metered_tokens=counted,
                    next="only the metered usage counts; check the upstream reports usage on every response")


def parse_result(stdout: str) -> dict | None:
    """Claude Code's ``--output-format json`` result object (``type == "result"``) from stdout,
    or None. Tolerates stray lines before it."""
    import json

    text = stdout.strip()
    candidates = [text] + [ln for ln in reversed(text.splitlines()) if ln.lstrip().startswith("{")]
    for candidate in candidates:
        try:
            data = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(data, dict) and data.get("type", "result") == "result":
            return data
    return None


def record_stream(stdout: str, record: Callable[[str, dict | None], None]) -> int:
    """Record the CLI's session from its ``stream-json`` lines: each assistant message's words
    and tool calls, each tool result, one ``turn`` per model message. Returns the entries made.

    The CLI runs in the sandbox, so this is the doer's own account: kept as data (bounded and
    cleaned by the recorder), marked ``source: cli``, never counted — usage is the endpoint's
    meter. Lines that are not such events (a truncated middle, stray output) are skipped."""
    import json

    made, turns, seen = 0, 0, set()
    for line in stdout.splitlines():
        if not line.startswith("{"):
            continue
        try:
            event = json.loads(line)
        except (ValueError, RecursionError):
            continue
        message = event.get("message") if isinstance(event, dict) else None
        if not isinstance(message, dict) or not isinstance(message.get("content"), (list, str)):
            continue
        blocks = message["content"] if isinstance(message["content"], list) else [{"type": "text",
                                                                                    "text": message["content"]}]
        if event.get("type") == "assistant":
            mid = message.get("id")
            if mid not in seen:
                seen.add(mid)
                turns += 1
                record("turn", {"turn": turns, "message_id": mid, "model": message.get("model"),
                                "stop_reason": message.get("stop_reason"), "source": "cli"})
                made += 1
            for b in (b for b in blocks if isinstance(b, dict)):
                if b.get("type") == "text" and b.get("text"):
                    record("text", {"text": b["text"], "source": "cli"})
                elif b.get("type") == "tool_use":
                    record("tool_call", {"id": b.get("id"), "name": b.get("name"), "input": b.get("input"),
                                         "source": "cli"})
                else:
                    continue
                made += 1
        elif event.get("type") == "user":
            for b in (b for b in blocks if isinstance(b, dict) and b.get("type") == "tool_result"):
                record("tool_result", {"id": b.get("tool_use_id"), "ok": not b.get("is_error"),
                                       "output": _result_text(b.get("content")), "source": "cli"})
                made += 1
    return made


def _result_text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(c.get("text", "")) for c in content if isinstance(c, dict) and c.get("type") == "text")
    return ""


def claude_outcome(data: dict) -> ActOutcome:
    """The act's outcome from a Claude Code result object (usage is handled by the caller)."""
    subtype = str(data.get("subtype") or "")
    text = data.get("result") if isinstance(data.get("result"), str) else ""
    turns = _int(data.get("num_turns"))
    summary = text[:_SUMMARY_CAP] or f"{turns} turn(s), no closing text"
    if subtype == "error_max_turns":
        return ActOutcome("failed", summary, stop_reason=subtype, error_code="max_turns",
                          error="the CLI was still working when it reached --max-turns", turns=turns)
    if subtype.startswith("error"):
        return ActOutcome("failed", summary, stop_reason=subtype, error_code=subtype,
                          error=f"the CLI ended with {subtype}", turns=turns)
    if data.get("is_error"):
        return ActOutcome("model_error", summary, stop_reason=subtype or None, error_code="cli_error",
                          error=f"the CLI reported an error: {text[:300]}", turns=turns)
    return ActOutcome("ok", summary, stop_reason=subtype or None, turns=turns)


def _end(status: str, code: str, error: str, *, turns: int = 0) -> ActOutcome:
    return ActOutcome(status=status, summary=error[:_SUMMARY_CAP], error_code=code, error=error, turns=turns)


def _prompt(ctx: ActContext) -> str:
    return f"{ctx.system_prefix}\n\n{ctx.variable_prompt}" if ctx.system_prefix else ctx.variable_prompt


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _cli_limits(runner: Any, memory_mb: int | None):
    """The runner's limits for the CLI: no CPU-time cap (the wall clock bounds it), its own memory cap."""
    limits = getattr(runner, "limits", None)
    return None if limits is None else replace(limits, cpu_s=None, memory_mb=memory_mb)


def _short_private_dir(preferred: Path) -> Path:
    """An owner-only folder for the endpoint socket whose path stays under the sun_path limit."""
    room = len("/ep-12345678/model.sock")  # what mkdtemp and the socket name add
    base = preferred if len(str(preferred)) + room <= MAX_SOCKET_PATH else Path(tempfile.gettempdir())
    base.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix="ep-", dir=base))
