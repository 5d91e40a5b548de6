"""``org.toml``: the org's configuration, validated against a schema with coded errors.

The file is created with documented defaults on first start. Environment variables listed in
``ENV_OVERRIDES`` override file values. Secrets (API keys) are never read from or written to this
file: they come from the environment only, where the model backend reads them.
"""
from __future__ import annotations

import math
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from state_db.errors import ConfigError
from state_db.vocab import ProposalKind

DEFAULT_TOML = """\
# loop-org configuration. `org config check` validates it; `org config show` prints the
# effective values (after environment overrides). Secrets never go here: the model backend
# reads ANTHROPIC_API_KEY from the environment.

[org]
loop_agents = 2                 # env ORG_LOOP_AGENTS

[caps]                          # applied to a submit that gives no hard cap of its own
max_iterations = 10
budget_tokens = 400000
budget_usd = 5.0
timeout_s = 3600

[limits]
total_spend_usd = 50.0          # org-wide: runs stop with org_limit beyond it; env ORG_SPEND_CAP_USD

[model]
backend = "anthropic"           # anthropic | command | scripted
name = "claude-sonnet-4-5"      # must be in [prices]; env ORG_MODEL
base_url = ""                   # any Anthropic-compatible server; env ANTHROPIC_BASE_URL
max_tokens = 4096
request_timeout_s = 120
max_retries = 6

# USD per million tokens. A model missing here is a configuration error; 0 is allowed
# (local models, the scripted demo server).
[prices."claude-sonnet-4-5"]
input = 3.0
output = 15.0
cache_write = 3.75
cache_read = 0.30

[prices."claude-opus-4-1"]
input = 15.0
output = 75.0
cache_write = 18.75
cache_read = 1.50

[prices."claude-haiku-4-5"]
input = 1.0
output = 5.0
cache_write = 1.25
cache_read = 0.10

[prices."scripted"]
input = 0
output = 0
cache_write = 0
cache_read = 0

[loop]
recent_iterations = 3           # iterations shown in detail in each prompt
summary_cap_chars = 2000        # rolling summary of older iterations
lessons_max = 5
no_progress_repeat = 3          # same fingerprint this many times ...
no_progress_window = 5          # ... within this many iterations

[knowledge]
raw_notes_to_consolidate = 5
notes_per_pattern = 3
candidates_per_batch = 5
skill_unused_days = 90

[sandbox]
mode = "bubblewrap"             # bubblewrap | unsandboxed (only with allow_unsandboxed); env ORG_SANDBOX
allow_unsandboxed = false       # env ORG_ALLOW_UNSANDBOXED
cpu_seconds = 300
memory_mb = 2048
max_processes = 256
output_bytes = 1000000
file_size_mb = 128              # largest file a command may write (RLIMIT_FSIZE)
disk_mb = 2048                  # the workspace's quota (checked after each command) and the private /tmp's size
readonly_binds = []             # more folders shown read-only to every agent command (absolute paths)

[command]                       # the command backend: an agent CLI run once per iteration in the sandbox
binary = "claude"               # Claude Code: claude -p --output-format json
permission_mode = "acceptEdits"
allowed_tools = ["Read", "Edit", "Write", "Glob", "Grep", "Bash"]
timeout_s = 1800
path_prepend = []               # folders put first on the CLI's PATH and shown read-only (a node under ~/.nvm)
readonly_binds = []             # more folders the CLI needs that the sandbox hides, shown read-only

[gate]
ask_for = ["network", "outside_workspace"]
reannounce_after_s = 600

[transport]
endpoint = "ipc"                # ipc, or a tcp://127.0.0.1:PORT base (CURVE is then required); env ORG_TRANSPORT
max_message_bytes = 262144
max_age_s = 600
clock_skew_s = 30
sweep_s = 5.0

[supervisor]
heartbeat_s = 1.0
heartbeat_timeout_s = 10.0
restart_max = 5                 # crashes within restart_window_s before a role is marked failed
restart_window_s = 60.0
stop_timeout_s = 10.0

[logs]
max_bytes = 10485760
backups = 3

[snapshots]
debounce_s = 0.5

[attention]                     # when a human is needed: a decision waits, a batch opens, a run ends
                                # verify_unrunnable, a role fails, the org spend cap trips
webhook_url = ""                # POST {"text": ...} (Slack-compatible) once per event; env ORG_ATTENTION_WEBHOOK
webhook_timeout_s = 5.0
webhook_retries = 3             # further tries of a failed POST, with backoff; then it is given up (counted)
notify_send = true              # a desktop notification too, where notify-send is on PATH
dashboard_url = ""              # the dashboard's address: each message links to the page it is about

[telemetry]                     # OpenTelemetry GenAI traces of every run (off: nothing is imported)
enabled = false                 # also on when otlp_endpoint is set
otlp_endpoint = ""              # OTLP/HTTP base URL, e.g. http://127.0.0.1:4318; env OTEL_EXPORTER_OTLP_ENDPOINT
exporter = "otlp"               # otlp | none (spans are made and dropped: what tracing itself costs)

[mcp]                           # org mcp: what an MCP client (Claude Code, ...) may do
tools = ["status", "show", "diff", "decisions", "candidates", "skills"]
                                # read-only by default; add "submit", "cancel", "continue" to let it
                                # start and steer runs, "decide" to answer decisions, "review" to
                                # approve / reject / defer skill candidates

[retention]                     # applied by 'org gc' and hourly by the supervisor
events_days = 30                # journal events of ended runs older than this are pruned (counts kept)
model_calls_days = 30           # per-call usage rows of ended runs → one summary row per run
eval_snapshots_days = 1         # the eval-agent's snapshots of ended runs
quarantine_days = 14            # copies of bad outbox files

[discover]                      # org discover: a read-only scan proposes work; nothing starts unless accepted
verify = []                     # the commands the scan runs (and proposes) when --verify gives none
limit = 5                       # candidates proposed per scan (--limit)
expire_days = 7                 # an open proposal expires this long after the last scan that found it
auto_start = []                 # kinds started without a human, within limits.daily_spend_usd
                                # (failing_test, bug, fixme, todo, issue)
"""


@dataclass(frozen=True)
class Field:
    kind: type | tuple
    check: Callable[[Any], bool] | None = None
    expect: str = ""
    env: str | None = None


def _positive(v) -> bool:
    return v > 0


def _non_negative(v) -> bool:
    return v >= 0


def _one_of(*choices) -> Callable[[Any], bool]:
    return lambda v: v in choices


def _str_list(v) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


def _abs_paths(v) -> bool:
    return _str_list(v) and all(x.startswith("/") for x in v)


def _bind_paths(v) -> bool:
    return _abs_paths(v) and all(os.path.normpath(x) != "/" and os.path.exists(x) for x in v)


NUM = (int, float)
# what org mcp can expose (mcp.tools); "review" is the write half of the candidates tool
MCP_TOOLS = ("status", "show", "diff", "decisions", "candidates", "skills",
             "submit", "cancel", "continue", "decide", "review")
SCHEMA: dict[str, Field] = {
    "org.loop_agents": Field(int, lambda v: 1 <= v <= 64, "an integer from 1 to 64", "ORG_LOOP_AGENTS"),
    "caps.max_iterations": Field(int, _positive, "an integer ≥ 1"),
    "caps.budget_tokens": Field(int, _positive, "an integer ≥ 1"),
    "caps.budget_usd": Field(NUM, _positive, "a number > 0"),
    "caps.timeout_s": Field(NUM, _positive, "a number of seconds > 0"),
    "limits.total_spend_usd": Field(NUM, _positive, "a number > 0", "ORG_SPEND_CAP_USD"),
    "model.backend": Field(str, _one_of("anthropic", "command", "scripted"), "anthropic, command or scripted"),
    "model.name": Field(str, bool, "a model name listed in [prices]", "ORG_MODEL"),
    "model.base_url": Field(str, lambda v: v == "" or v.startswith(("http://", "https://")),
                            "empty or an http(s) URL", "ANTHROPIC_BASE_URL"),
    "model.max_tokens": Field(int, _positive, "an integer ≥ 1"),
    "model.request_timeout_s": Field(NUM, _positive, "a number of seconds > 0"),
    "model.max_retries": Field(int, _non_negative, "an integer ≥ 0"),
    "loop.recent_iterations": Field(int, _positive, "an integer ≥ 1"),
    "loop.summary_cap_chars": Field(int, lambda v: v >= 200, "an integer ≥ 200"),
    "loop.lessons_max": Field(int, _non_negative, "an integer ≥ 0"),
    "loop.no_progress_repeat": Field(int, lambda v: v >= 2, "an integer ≥ 2"),
    "loop.no_progress_window": Field(int, lambda v: v >= 2, "an integer ≥ 2"),
    "knowledge.raw_notes_to_consolidate": Field(int, _positive, "an integer ≥ 1", "ORG_RAW_NOTES_TO_CONSOLIDATE"),
    "knowledge.notes_per_pattern": Field(int, _positive, "an integer ≥ 1", "ORG_NOTES_PER_PATTERN"),
    "knowledge.candidates_per_batch": Field(int, _positive, "an integer ≥ 1", "ORG_CANDIDATES_PER_BATCH"),
    "knowledge.skill_unused_days": Field(int, _positive, "an integer ≥ 1"),
    "sandbox.mode": Field(str, _one_of("bubblewrap", "unsandboxed"), "bubblewrap or unsandboxed", "ORG_SANDBOX"),
    "sandbox.allow_unsandboxed": Field(bool, None, "true or false", "ORG_ALLOW_UNSANDBOXED"),
    "command.binary": Field(str, bool, "the agent CLI's name or path"),
    "command.permission_mode": Field(str, bool, "a Claude Code permission mode, e.g. acceptEdits"),
    "command.allowed_tools": Field(list, _str_list, "a list of tool names"),
    "command.timeout_s": Field(NUM, _positive, "a number of seconds > 0"),
    "command.path_prepend": Field(list, _abs_paths, "a list of absolute folder paths"),
    "command.readonly_binds": Field(list, _abs_paths, "a list of absolute folder paths"),
    "sandbox.cpu_seconds": Field(int, _positive, "an integer ≥ 1"),
    "sandbox.memory_mb": Field(int, lambda v: v >= 64, "an integer ≥ 64"),
    "sandbox.max_processes": Field(int, _positive, "an integer ≥ 1"),
    "sandbox.output_bytes": Field(int, _positive, "an integer ≥ 1"),
    "sandbox.file_size_mb": Field(int, _positive, "an integer ≥ 1"),
    "sandbox.disk_mb": Field(int, lambda v: v >= 16, "an integer ≥ 16"),
    "sandbox.readonly_binds": Field(list, _bind_paths, "a list of absolute paths other than / that exist"),
    "gate.ask_for": Field(list, _str_list, "a list of strings"),
    "gate.reannounce_after_s": Field(NUM, _positive, "a number of seconds > 0"),
    "transport.endpoint": Field(str, lambda v: v == "ipc" or v.startswith("tcp://"),
                                "\"ipc\" or a tcp://HOST:PORT base", "ORG_TRANSPORT"),
    "transport.max_message_bytes": Field(int, lambda v: 1024 <= v <= 64 * 2**20, "an integer from 1024 to 67108864"),
    "transport.max_age_s": Field(NUM, _positive, "a number of seconds > 0"),
    "transport.clock_skew_s": Field(NUM, _non_negative, "a number of seconds ≥ 0"),
    "transport.sweep_s": Field(NUM, _positive, "a number of seconds > 0"),
    "supervisor.heartbeat_s": Field(NUM, _positive, "a number of seconds > 0"),
    "supervisor.heartbeat_timeout_s": Field(NUM, _positive, "a number of seconds > 0"),
    "supervisor.restart_max": Field(int, _positive, "an integer ≥ 1"),
    "supervisor.restart_window_s": Field(NUM, _positive, "a number of seconds > 0"),
    "supervisor.stop_timeout_s": Field(NUM, _positive, "a number of seconds > 0"),
    "logs.max_bytes": Field(int, lambda v: v >= 4096, "an integer ≥ 4096"),
    "logs.backups": Field(int, _non_negative, "an integer ≥ 0"),
    "snapshots.debounce_s": Field(NUM, _non_negative, "a number of seconds ≥ 0"),
    "attention.webhook_url": Field(str, lambda v: v == "" or v.startswith(("http://", "https://")),
                                   "empty or an http(s) URL", "ORG_ATTENTION_WEBHOOK"),
    "attention.webhook_timeout_s": Field(NUM, _positive, "a number of seconds > 0"),
    "attention.webhook_retries": Field(int, lambda v: 0 <= v <= 20, "an integer from 0 to 20"),
    "attention.notify_send": Field(bool, None, "true or false"),
    "attention.dashboard_url": Field(str, lambda v: v == "" or v.startswith(("http://", "https://")),
                                     "empty or an http(s) URL"),
    "telemetry.enabled": Field(bool, None, "true or false"),
    "telemetry.otlp_endpoint": Field(str, lambda v: v == "" or v.startswith(("http://", "https://")),
                                     "empty or an http(s) URL", "OTEL_EXPORTER_OTLP_ENDPOINT"),
    "telemetry.exporter": Field(str, lambda v: v in ("otlp", "none"), "otlp or none"),
    "mcp.tools": Field(list, lambda v: _str_list(v) and set(v) <= set(MCP_TOOLS),
                       "a list of tool names from " + ", ".join(MCP_TOOLS)),
    "retention.events_days": Field(NUM, _positive, "a number of days > 0"),
    "retention.model_calls_days": Field(NUM, _positive, "a number of days > 0"),
    "retention.eval_snapshots_days": Field(NUM, _non_negative, "a number of days ≥ 0"),
    "retention.quarantine_days": Field(NUM, _non_negative, "a number of days ≥ 0"),
    "discover.verify": Field(list, lambda v: _str_list(v) and all(x.strip() for x in v), "a list of commands"),
    "discover.limit": Field(int, lambda v: 1 <= v <= 100, "an integer from 1 to 100"),
    "discover.expire_days": Field(NUM, _positive, "a number of days > 0"),
    "discover.auto_start": Field(list, lambda v: _str_list(v) and set(v) <= set(ProposalKind),
                                 "a list of kinds from " + ", ".join(ProposalKind)),
}
PRICE_KEYS = ("input", "output", "cache_write", "cache_read")
ENV_OVERRIDES = {f.env: key for key, f in SCHEMA.items() if f.env}


class Config:
    """Validated configuration. ``cfg["caps.max_iterations"]``; ``cfg.prices`` is the price table."""

    def __init__(self, data: dict, source: Path | None = None, overridden: dict | None = None):
        self.data = data
        self.source = source
        self.overridden = overridden or {}

    def __getitem__(self, dotted: str) -> Any:
        section, key = dotted.split(".", 1)
        return self.data[section][key]

    @property
    def prices(self) -> dict[str, dict[str, float]]:
        return self.data["prices"]

    def default_caps(self) -> dict:
        return dict(self.data["caps"])


def defaults() -> dict:
    return tomllib.loads(DEFAULT_TOML)


def write_default(path: Path) -> bool:
    """Create org.toml with the documented defaults if it does not exist. Returns True if written."""
    if path.exists():
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(".org.toml.tmp")
    tmp.write_text(DEFAULT_TOML)
    os.replace(tmp, path)
    return True


def load(path: Path | None, env=os.environ) -> Config:
    """Read, merge over defaults, apply environment overrides and validate.

    Raises:
        ConfigError: unreadable TOML, unknown section/key, wrong type or value; names the key.
    """
    data = defaults()
    if path is not None and path.exists():
        try:
            user = tomllib.loads(path.read_text())
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path} is not valid TOML: {exc}") from exc
        _merge(data, user)
    overridden = {}
    for var, key in ENV_OVERRIDES.items():
        if var in env and env[var] != "":
            section, name = key.split(".", 1)
            data[section][name] = _from_env(key, env[var], var)
            overridden[key] = var
    validate(data)
    return Config(data, path, overridden)


def validate(data: dict) -> None:
    for key, field in SCHEMA.items():
        section, name = key.split(".", 1)
        value = data.get(section, {}).get(name)
        ok_type = isinstance(value, field.kind) and not (field.kind is not bool and isinstance(value, bool))
        if isinstance(value, float) and not math.isfinite(value):
            ok_type = False
        if not ok_type or (field.check is not None and not field.check(value)):
            raise ConfigError(f"{key} must be {field.expect} (got {value!r})", key=key)
    prices = data.get("prices")
    if not isinstance(prices, dict):
        raise ConfigError("prices must be a table of models", key="prices")
    for model, entry in prices.items():
        if not isinstance(entry, dict):
            raise ConfigError(f"prices.{model} must be a table with {', '.join(PRICE_KEYS)}", key=f"prices.{model}")
        for k in PRICE_KEYS:
            v = entry.get(k)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
                raise ConfigError(f"prices.{model}.{k} must be a number ≥ 0 in USD per million tokens (got {v!r})",
                                  key=f"prices.{model}.{k}")
        unknown = set(entry) - set(PRICE_KEYS)
        if unknown:
            raise ConfigError(f"prices.{model} has unknown key(s) {sorted(unknown)}", key=f"prices.{model}")
    model = data["model"]["name"]
    if model not in prices:
        raise ConfigError(f"model.name {model!r} has no entry in [prices]", key="model.name",
                          hint=f"add [prices.\"{model}\"] with input/output/cache_write/cache_read (0 is allowed)")
    if data["sandbox"]["mode"] == "unsandboxed" and not data["sandbox"]["allow_unsandboxed"]:
        raise ConfigError("sandbox.mode = \"unsandboxed\" needs sandbox.allow_unsandboxed = true",
                          key="sandbox.mode")


def _merge(base: dict, user: dict) -> None:
    for section, values in user.items():
        if section not in base:
            raise ConfigError(f"unknown section [{section}]", key=section,
                              hint=f"known sections: {', '.join(sorted(base))}")
        if not isinstance(values, dict):
            raise ConfigError(f"[{section}] must be a table", key=section)
        if section == "prices":
            base[section].update(values)
            continue
        for key, value in values.items():
            if f"{section}.{key}" not in SCHEMA:
                raise ConfigError(f"unknown key {section}.{key}", key=f"{section}.{key}",
                                  hint=f"known keys in [{section}]: {', '.join(sorted(base[section]))}")
            base[section][key] = value


def _from_env(key: str, raw: str, var: str) -> Any:
    field = SCHEMA[key]
    kinds = field.kind if isinstance(field.kind, tuple) else (field.kind,)
    try:
        if bool in kinds:
            if raw.lower() not in ("true", "false", "1", "0"):
                raise ValueError(raw)
            return raw.lower() in ("true", "1")
        if int in kinds and float not in kinds:
            return int(raw)
        if float in kinds:
            return float(raw)
        return raw
    except ValueError:
        raise ConfigError(f"environment {var}={raw!r} is not valid for {key}: expected {field.expect}",
                          key=key, hint=f"fix or unset {var}") from None
