"""``org.toml``: the org's configuration as typed models (pydantic), with coded errors.

``load_config(home)`` (or ``load(path)``) reads the file with ``tomllib``, applies the
environment overrides and validates it against ``Config``: one frozen model per ``[section]``,
each key a typed attribute (``cfg.caps.max_iterations``, ``cfg.prices["scripted"]["input"]``).
A value that breaks the schema is a ``ConfigKeyError`` (code ``config_invalid``) naming the key,
what is expected, and the line of org.toml that wrote it; an unknown key says which known key
was probably meant (``state_db.kernel.config_errors`` puts pydantic's errors in those words). ``json_schema()`` is the same schema for editors (``org config schema``), and
the documented default file (``DEFAULT_TOML``) is generated from the same models, so a key's
default, meaning and constraints are written once.

Secrets (API keys) are never read from or written to this file: they come from the environment
only, where the model backend reads them.

How to add a key: one line in its section's class, e.g. in ``Loop``::

    wrapup_reserve: int = key(1, "iterations kept for wrapping up", ge=0)

``key(default, doc, env=..., **constraints)`` takes pydantic's constraints (``ge``, ``gt``,
``le``, ``lt``, ``min_length``, ``pattern``); ``env="ORG_X"`` makes an environment variable
override it. The error text ("an integer ≥ 0") is derived from the type and constraints; a type
that needs its own words carries an ``Expect(...)`` (see ``HttpUrl``). How to add a section: a
class deriving ``Section`` whose docstring says what it is for, and one line in ``Config``,
``review: Review = section(Review)``; a list of tables (``[[schedules]]``) is
``schedules: list[Schedule] = key([], "...")``. Checks across keys go in
``Config._across_keys``.
"""
from __future__ import annotations

import os
import textwrap
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal, Mapping

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator
from pydantic.fields import FieldInfo
from typing_extensions import TypedDict

from state_db.kernel.config_errors import ConfigKeyError, Expect, expect, explain, fields_of, line_of  # noqa: F401 - re-exported
from state_db.kernel import tomlfile
from state_db.kernel.errors import ConfigError

CONFIG_FILE = "org.toml"


# ---------------------------------------------------------------------------------- the schema

def key(default: Any, doc: str = "", *, env: str | None = None, **constraints: Any) -> Any:
    """One key: its default, what it means (the default file's comment and the schema's
    description), the environment variable that overrides it, and pydantic constraints."""
    doc = "; ".join(x for x in (doc, f"env {env}" if env else "") if x)
    return Field(default, description=doc or None, json_schema_extra={"x-env": env} if env else None,
                 **constraints)


def section(cls: type[BaseModel]) -> Any:
    return Field(default_factory=cls, description=(cls.__doc__ or "").strip() or None)


class Section(BaseModel):
    """A ``[table]`` of org.toml: exact types (a string is not a number), no unknown keys."""

    # defer_build: validators are built when a configuration is first validated, not on import
    # (most CLI commands import this module and never load org.toml)
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False,
                              validate_default=True, defer_build=True)


def _bind_paths(paths: list[str]) -> list[str]:
    for p in paths:
        if os.path.normpath(p) == "/" or not os.path.exists(p):
            raise ValueError(f"{p} is / or does not exist")
    return paths


HttpUrl = Annotated[str, Field(pattern=r"^$|^https?://"), Expect("empty or an http(s) URL")]
AbsPath = Annotated[str, Field(pattern=r"^/")]
AbsPaths = Annotated[list[AbsPath], Expect("a list of absolute folder paths")]
BindPaths = Annotated[list[AbsPath], AfterValidator(_bind_paths),
                      Expect("a list of absolute paths other than / that exist")]
Endpoint = Annotated[str, Field(pattern=r"^ipc$|^tcp://"), Expect("\"ipc\" or a tcp://HOST:PORT base")]
Name = Annotated[str, Field(min_length=1)]
# what org mcp can expose (mcp.tools); "review" is the write half of the candidates tool
MCP_TOOLS = ("status", "show", "diff", "decisions", "candidates", "skills",
             "submit", "cancel", "continue", "decide", "review")
McpTool = Literal[MCP_TOOLS]  # type: ignore[valid-type]
Commands = Annotated[list[Annotated[str, Field(pattern=r"\S")]], Expect("a list of commands")]
# what a discovery scan can find, in rank order: state_db.vocab.ProposalKind's values (the kernel stands
# under the truth layer, so it names them itself; tests/test_kernel.py holds the two equal)
PROPOSAL_KINDS = ("failing_test", "bug", "fixme", "todo", "issue")
ProposalKindName = Literal[PROPOSAL_KINDS]  # type: ignore[valid-type]
HostName = Annotated[str, Field(pattern=r"^$|^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"),
                     Expect("empty or a host name (letters, digits, . _ -)")]
HostPort = Annotated[str, Field(pattern=r"^$|^[^\s:/]+:[0-9]{1,5}$"), Expect("empty or HOST:PORT")]
GitUrl = Annotated[str, Field(pattern=r"^$|^(git|ssh)://([^\s/@]+@)?[^\s/@]+(/\S*)?$"),
                   Expect("empty or a git://HOST:PORT or ssh://[USER@]HOST[:PORT]/ URL")]
TcpBase = Annotated[str, Field(pattern=r"^$|^tcp://[^\s/]+:[0-9]{1,5}$"), Expect("empty or tcp://HOST:PORT")]
CurveKey = Annotated[str, Field(pattern=r"^$|^[0-9A-Za-z.:+=^!/*?&<>()\[\]{}@%$#-]{40}$"),
                     Expect("empty or a 40-character z85 CURVE public key (the coordinator host's 'org hosts' prints it)")]
PriceValue = Annotated[float, Field(ge=0), Expect("a number ≥ 0 in USD per million tokens")]


class Price(TypedDict):
    """USD per million tokens of one model."""

    __pydantic_config__ = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)  # type: ignore[misc]
    input: PriceValue
    output: PriceValue
    cache_write: PriceValue
    cache_read: PriceValue


PRICE_KEYS = tuple(fields_of(Price) or ())
DEFAULT_PRICES: dict[str, Price] = {
    "claude-sonnet-4-5": {"input": 3.0, "output": 15.0, "cache_write": 3.75, "cache_read": 0.30},
    "claude-opus-4-1": {"input": 15.0, "output": 75.0, "cache_write": 18.75, "cache_read": 1.50},
    "claude-haiku-4-5": {"input": 1.0, "output": 5.0, "cache_write": 1.25, "cache_read": 0.10},
    "scripted": {"input": 0, "output": 0, "cache_write": 0, "cache_read": 0},
}


class Org(Section):
    loop_agents: int = key(2, "", env="ORG_LOOP_AGENTS", ge=1, le=256)
    eval_agents: int = key(1, "eval-agents verifying side by side, each owning a share of the work items "
                              "(1: one, named eval-agent)", env="ORG_EVAL_AGENTS", ge=1, le=16)
    idle_release_s: float = key(30.0, "a role process idle this long gives the memory it has freed back to the "
                                      "system, once per idle spell (0: never)", ge=0)


class State(Section):
    """where the org's truth is kept"""
    url: str = key("", "empty: state.db in the org home; postgresql://USER@HOST/DB (or libpq's "
                       "?host=/socket/dir form): a PostgreSQL store shared by every role",
                   env="ORG_STATE_URL", pattern=r"^$|^(postgresql|postgres)://")


class CapDefaults(Section):
    """each run's caps: a submit flag sets the one it names (--no-* removes one), the others keep these"""
    max_iterations: int = key(10, ge=1)
    budget_tokens: int = key(400000, ge=1)
    budget_usd: float = key(5.0, gt=0)
    timeout_s: float = key(3600, gt=0)


class Limits(Section):
    total_spend_usd: float = key(50.0, "org-wide: runs stop with org_limit beyond it", env="ORG_SPEND_CAP_USD", gt=0)
    daily_spend_usd: float = key(10.0, "what work started without a human (schedules, triggers, discovery's auto_start) "
                                 "may spend per local day, open budgets counted; 0: none starts", env="ORG_DAILY_SPEND_USD", ge=0)


class Model(Section):
    backend: Literal["anthropic", "command", "scripted"] = key("anthropic")
    name: Name = key("claude-sonnet-4-5", "must be in [prices]", env="ORG_MODEL")
    base_url: HttpUrl = key("", "any Anthropic-compatible server", env="ANTHROPIC_BASE_URL")
    max_tokens: int = key(4096, ge=1)
    request_timeout_s: float = key(120, gt=0)
    max_retries: int = key(6, ge=0)


class Loop(Section):
    recent_iterations: int = key(3, "iterations shown in detail in each prompt", ge=1)
    summary_cap_chars: int = key(2000, "rolling summary of older iterations", ge=200)
    lessons_max: int = key(5, ge=0)
    no_progress_repeat: int = key(3, "same fingerprint this many times ...", ge=2)
    no_progress_window: int = key(5, "... within this many iterations", ge=2)
    wrapup_reserve: float = key(0.05, "fraction of a token, cost or time budget kept for one wrap-up act that "
                                "writes a hand-off note when the budget trips; 0: none", ge=0, lt=0.5)
    transcript_bytes: int = key(4_000_000, "a run's transcript (every act's turns, tool calls and results) is kept "
                                "up to this size; later entries are dropped, and a 'cut' entry says so", ge=10_000)
    ladder: list[Name] = key([], "models, weakest first: a run that would stop on repeated_failure or no_progress "
                                 "goes on with the next one, within the same caps (each must be in [prices]); "
                                 "--ladder on submit overrides")


class Knowledge(Section):
    raw_notes_to_consolidate: int = key(5, env="ORG_RAW_NOTES_TO_CONSOLIDATE", ge=1)
    notes_per_pattern: int = key(3, env="ORG_NOTES_PER_PATTERN", ge=1)
    candidates_per_batch: int = key(5, env="ORG_CANDIDATES_PER_BATCH", ge=1)
    skill_unused_days: int = key(90, ge=1)


class Learning(Section):
    """Skill replays: each new candidate is run on the items it came from (and similar ones),
    with and without it, before a human reviews it. Off for paid models until a budget is set."""
    replay: Literal["auto", "on", "off"] = key("auto", "auto: on when the model costs nothing (a local or "
                                                "scripted server) or a replay budget is set; on; off",
                                                env="ORG_LEARNING_REPLAY")
    replay_items: int = key(2, "ended items replayed per candidate (each twice: with and without)", ge=1, le=20)
    replay_concurrency: int = key(2, "replay runs active at once, across all candidates", ge=1, le=64)
    replay_budget_tokens: int = key(0, "tokens all replays of one candidate may spend; 0: the items' own caps",
                                    ge=0)
    replay_budget_usd: float = key(0.0, "dollars all replays of one candidate may spend; 0: none set", ge=0)


class Sandbox(Section):
    mode: Literal["bubblewrap", "unsandboxed"] = key("bubblewrap", "unsandboxed only with allow_unsandboxed",
                                                     env="ORG_SANDBOX")
    allow_unsandboxed: bool = key(False, env="ORG_ALLOW_UNSANDBOXED")
    cpu_seconds: int = key(300, ge=1)
    memory_mb: int = key(2048, ge=64)
    max_processes: int = key(256, ge=1)
    output_bytes: int = key(1000000, ge=1)
    file_size_mb: int = key(128, "largest file a command may write (RLIMIT_FSIZE)", ge=1)
    disk_mb: int = key(2048, "the workspace's quota (checked after each command) and the private /tmp's size",
                       ge=16)
    readonly_binds: BindPaths = key([], "more folders shown read-only to every agent command (absolute paths)")


class Command(Section):
    """the command backend: an agent CLI run once per iteration in the sandbox"""
    binary: Name = key("claude", "Claude Code: claude -p --output-format json")
    permission_mode: Name = key("acceptEdits")
    allowed_tools: list[str] = key(["Read", "Edit", "Write", "Glob", "Grep", "Bash"])
    timeout_s: float = key(1800, gt=0)
    path_prepend: AbsPaths = key([], "folders put first on the CLI's PATH and shown read-only (a node under ~/.nvm)")
    readonly_binds: AbsPaths = key([], "more folders the CLI needs that the sandbox hides, shown read-only")


class Gate(Section):
    ask_for: list[str] = key(["network", "outside_workspace"])
    reannounce_after_s: float = key(600, gt=0)


class Transport(Section):
    endpoint: Endpoint = key("ipc", "ipc, or a tcp://127.0.0.1:PORT base (CURVE is then required)",
                             env="ORG_TRANSPORT")
    max_message_bytes: int = key(262144, ge=1024, le=64 * 2**20)
    max_age_s: float = key(600, gt=0)
    clock_skew_s: float = key(30, ge=0)
    sweep_s: float = key(5.0, gt=0)


class Hosts(Section):
    """roles on other machines: what the coordinator host serves, and where a joined host joined
    (org join writes the second half)"""
    name: HostName = key("", "this host's name in the store's peers table (empty: the machine's hostname)")
    loop_agents_here: bool = key(True, "false: this host runs no loop-agent of its own; they all join from "
                                       "other hosts")
    git_listen: HostPort = key("", "coordinator host: serve the work items' histories to joined hosts with git "
                                   "daemon at HOST:PORT (e.g. 10.0.0.5:9418)")
    git_url: GitUrl = key("", "coordinator host: the URL joined hosts fetch and push histories at, in place of "
                              "git://<git_listen> (e.g. ssh://org@10.0.0.5:22/ through sshd's forced command "
                              "'org git-shell'; the path part is what git-shell maps: / or <home>/history)")
    git_unauthenticated: bool = key(False, "coordinator host: true lets git_listen serve git:// with no "
                                           "authentication (a private network or a tunnel only); ssh:// scopes each "
                                           "host to its own work items")
    git_max_push_mb: int = key(256, "coordinator host: the largest push a joined host may make over ssh (MB)",
                               ge=1)
    coordinator: TcpBase = key("", "joined host: the coordinator's tcp://HOST:PORT")
    coordinator_key: CurveKey = key("", "joined host: the coordinator's CURVE public key")


class Supervisor(Section):
    heartbeat_s: float = key(1.0, gt=0)
    heartbeat_timeout_s: float = key(10.0, gt=0)
    restart_max: int = key(5, "crashes within restart_window_s before a role is marked failed", ge=1)
    restart_window_s: float = key(60.0, gt=0)
    stop_timeout_s: float = key(10.0, gt=0)
    spawn: Literal["fork", "exec"] = key("fork", "fork: each role is a fork of a pre-imported template (fast start, "
                                         "shared pages); exec: one interpreter per role", env="ORG_SPAWN")


class Logs(Section):
    max_bytes: int = key(10485760, ge=4096)
    backups: int = key(3, ge=0)


class Snapshots(Section):
    debounce_s: float = key(0.5, ge=0)


class Attention(Section):
    """when a human is needed: a decision waits, a batch opens, a run ends verify_unrunnable, a role
    fails, the org spend cap trips"""
    webhook_url: HttpUrl = key("", "POST {\"text\": ...} (Slack-compatible) once per event",
                               env="ORG_ATTENTION_WEBHOOK")
    webhook_timeout_s: float = key(5.0, gt=0)
    webhook_retries: int = key(3, "further tries of a failed POST, with backoff; then it is given up (counted)",
                               ge=0, le=20)
    notify_send: bool = key(True, "a desktop notification too, where notify-send is on PATH")
    dashboard_url: HttpUrl = key("", "the dashboard's address: each message links to the page it is about")


class Telemetry(Section):
    """OpenTelemetry GenAI traces of every run (off: nothing is imported)"""
    enabled: bool = key(False, "also on when otlp_endpoint is set")
    otlp_endpoint: HttpUrl = key("", "OTLP/HTTP base URL, e.g. http://127.0.0.1:4318",
                                 env="OTEL_EXPORTER_OTLP_ENDPOINT")
    exporter: Literal["otlp", "none"] = key("otlp", "none: spans are made and dropped (what tracing itself costs)")


class Mcp(Section):
    """org mcp: what an MCP client (Claude Code, ...) may do"""
    tools: list[McpTool] = key(["status", "show", "diff", "decisions", "candidates", "skills"],
                               "read-only by default; add \"submit\", \"cancel\", \"continue\" to let it start and "
                               "steer runs, \"decide\" to answer decisions, \"review\" to approve / reject / defer "
                               "skill candidates")


class Retention(Section):
    """applied by 'org gc' and hourly by the supervisor"""
    events_days: float = key(30, "journal events of ended runs older than this are pruned (counts kept)", gt=0)
    model_calls_days: float = key(30, "per-call usage rows of ended runs → one summary row per run", gt=0)
    eval_snapshots_days: float = key(1, "the eval-agent's snapshots of ended runs", ge=0)
    quarantine_days: float = key(14, "copies of bad outbox files", ge=0)
    transcript_days: float = key(30, "the transcripts of ended runs older than this are deleted", gt=0)


class Review(Section):
    """the eval-agent's review of a passing iteration (roles/eval_agent/review.py): it can only veto"""
    criteria: str = key("", "review every work item against this; empty: only those submitted with --review")
    default_on: bool = key(True, "review every pass wherever a review model can be reached (an API key, a loopback "
                                 "base_url, or a scripted run whose script answers reviews); 'org submit --no-review' "
                                 "turns it off for one work item")
    model: str = key("", "empty: a model from [prices] other than the doer's")
    base_url: HttpUrl = key("", "empty: model.base_url / ANTHROPIC_BASE_URL (a loopback server needs no key)")
    max_tokens: int = key(1024, "per review answer", ge=1)
    budget: int = key(50000, "review tokens (input + output) per work item; past it a review cannot run", ge=1)
    retries: int = key(2, "further tries of a review that errs or gives no structured answer", ge=0, le=10)


Globs = Annotated[list[Annotated[str, Field(pattern=r"\S")]], Expect("a list of globs")]


class Verify(Section):
    """how the eval-agent verifies (roles/eval_agent/verifier.py)"""
    # -- the change scope and the verified tree (roles/eval_agent/scope.py) --------------------
    scope: Globs = key([], "globs that widen every work item's change scope (--scope adds per work item); the "
                               "default scope is edits to existing code and new code files in existing packages")
    # -- end of the change scope's keys ---------------------------------------------------------
    # -- evidence: canaries and held-out checks (roles/eval_agent/canaries.py, hidden.py) --
    canaries: bool = key(True, "plant canary tests at every verification; a report that contradicts them ends "
                               "the run evidence_forged")
    hidden: str = key("", "a folder of held-out checks outside every workspace, copied into each snapshot only "
                          "(--verify-hidden per run); empty: none", pattern=r"^$|^/")
    # -- end of evidence --


class Discover(Section):
    """org discover: a read-only scan proposes work; nothing starts unless accepted"""
    verify: Commands = key([], "the commands the scan runs (and proposes) when --verify gives none")
    limit: int = key(5, "candidates proposed per scan (--limit)", ge=1, le=100)
    expire_days: float = key(7, "an open proposal expires this long after the last scan that found it", gt=0)
    auto_start: list[ProposalKindName] = key([], "kinds started without a human, within limits.daily_spend_usd "
                                                 "(" + ", ".join(PROPOSAL_KINDS) + ")")


class Config(Section):
    """The org's configuration (org.toml). Secrets never go here: the model backend reads
    ANTHROPIC_API_KEY from the environment.

    ``Config(data)`` validates a dict shaped like the file (``defaults()``); ``load`` reads the file.
    Raises ``ConfigKeyError`` for a value that breaks the schema.
    """

    model_config = ConfigDict(title="org.toml")

    org: Org = section(Org)
    state: State = section(State)
    caps: CapDefaults = section(CapDefaults)
    limits: Limits = section(Limits)
    model: Model = section(Model)
    prices: dict[str, Price] = Field(
        default_factory=lambda: {m: dict(p) for m, p in DEFAULT_PRICES.items()},  # type: ignore[misc]
        description="USD per million tokens. A model missing here is a configuration error; 0 is allowed "
                    "(local models, the scripted demo server).")
    loop: Loop = section(Loop)
    knowledge: Knowledge = section(Knowledge)
    learning: Learning = section(Learning)
    sandbox: Sandbox = section(Sandbox)
    command: Command = section(Command)
    gate: Gate = section(Gate)
    transport: Transport = section(Transport)
    hosts: Hosts = section(Hosts)
    supervisor: Supervisor = section(Supervisor)
    logs: Logs = section(Logs)
    snapshots: Snapshots = section(Snapshots)
    attention: Attention = section(Attention)
    telemetry: Telemetry = section(Telemetry)
    mcp: Mcp = section(Mcp)
    retention: Retention = section(Retention)
    discover: Discover = section(Discover)
    review: Review = section(Review)
    verify: Verify = section(Verify)

    _source: Path | None = PrivateAttr(None)
    _overridden: dict[str, str] = PrivateAttr(default_factory=dict)

    def __init__(self, data: Mapping[str, Any] | None = None, source: Path | None = None,
                 overridden: Mapping[str, str] | None = None, /, **fields: Any) -> None:
        try:
            super().__init__(**{**(data or {}), **fields})
        except ValidationError as exc:      # an unknown key first: a misspelt key also leaves one missing
            errors = sorted(exc.errors(), key=lambda e: e["type"] != "extra_forbidden")
            raise explain(errors[0], type(self)) from None
        self._source, self._overridden = source, dict(overridden or {})

    @model_validator(mode="before")
    @classmethod
    def _user_prices_extend_the_defaults(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("prices"), dict):
            data = {**data, "prices": {**DEFAULT_PRICES, **data["prices"]}}
        return data

    @model_validator(mode="after")
    def _across_keys(self) -> Config:
        if self.model.name not in self.prices:
            raise ConfigKeyError(f"model.name {self.model.name!r} has no entry in [prices]", key="model.name",
                                 hint=f"add [prices.\"{self.model.name}\"] with input/output/cache_write/cache_read "
                                      "(0 is allowed)")
        for rung in self.loop.ladder:
            if rung not in self.prices:
                raise ConfigKeyError(f"loop.ladder names {rung!r}, which has no entry in [prices]", key="loop.ladder",
                                     hint=f"add [prices.\"{rung}\"] or drop it from the ladder")
        if self.sandbox.mode == "unsandboxed" and not self.sandbox.allow_unsandboxed:
            raise ConfigKeyError("sandbox.mode = \"unsandboxed\" needs sandbox.allow_unsandboxed = true",
                                 key="sandbox.mode")
        return self

    @property
    def source(self) -> Path | None:
        """The file read, or None when only defaults and the environment apply."""
        return self._source

    @property
    def overridden(self) -> dict[str, str]:
        """``{"section.key": "ENV_VAR"}`` for each value the environment set."""
        return dict(self._overridden)

    @property
    def data(self) -> dict[str, Any]:
        """The effective values as plain data (TOML/JSON shaped)."""
        return self.model_dump()

    def __getitem__(self, dotted: str) -> Any:
        """A value by its dotted name (``cfg["caps.max_iterations"]``), for code that iterates keys;
        code that knows its key reads the attribute (``cfg.caps.max_iterations``)."""
        section_name, name = dotted.split(".", 1)
        table = getattr(self, section_name)
        return table[name] if isinstance(table, dict) else getattr(table, name)


SECTIONS: dict[str, type[Section]] = {
    name: f.annotation for name, f in Config.model_fields.items()
    if isinstance(f.annotation, type) and issubclass(f.annotation, Section)}
SCHEMA: dict[str, FieldInfo] = {f"{s}.{k}": f for s, cls in SECTIONS.items() for k, f in cls.model_fields.items()}
ENV_OVERRIDES: dict[str, str] = {f.json_schema_extra["x-env"]: k for k, f in SCHEMA.items()  # type: ignore[index]
                                 if isinstance(f.json_schema_extra, dict)}


# ---------------------------------------------------------------------------------- loading

def load_config(home) -> Config:
    """The configuration of the org at ``home`` (an ``OrgHome``): its org.toml if it exists,
    else the defaults, with the environment's overrides. Raises ``ConfigKeyError``/``ConfigError``."""
    path = home.config_path
    return load(path if path.exists() else None)


def load(path: Path | None, env: Mapping[str, str] = os.environ) -> Config:
    """Read ``path`` (None: defaults only), apply environment overrides (``ENV_OVERRIDES``), validate.

    Raises:
        ConfigError: the file is not TOML (tomllib's message gives line and column).
        ConfigKeyError: an unknown section or key, a wrong type or value; names the key, its line
            in the file and, for an unknown key, the known key probably meant.
    """
    text, data = None, {}
    if path is not None and path.exists():
        try:
            text = path.read_text()
            data = tomlfile.loads(text)
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path} is not valid TOML: {exc}") from exc
    overridden = {}
    for var, dotted in ENV_OVERRIDES.items():
        if env.get(var, "") != "":
            section_name, name = dotted.split(".", 1)
            table = data.setdefault(section_name, {})
            if isinstance(table, dict):
                table[name] = _from_env(dotted, env[var], var)
                overridden[dotted] = var
    try:
        return Config(data, path, overridden)
    except ConfigKeyError as exc:
        var = overridden.get(exc.key)
        if var is not None:
            raise ConfigKeyError(f"{exc.what} (from ${var})", key=exc.key, hint=f"fix or unset {var}") from None
        raise exc.at(path, text) from None


def validate(data: Mapping[str, Any]) -> Config:
    """``data`` (shaped like the file) as a ``Config``. Raises ``ConfigKeyError``."""
    return Config(data)


def defaults() -> dict:
    """The default configuration as plain data (a fresh copy)."""
    return Config().model_dump()


def write_default(path: Path) -> bool:
    """Create org.toml with the documented defaults if it does not exist. Returns True if written."""
    if path.exists():
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    from state_db.kernel.credentials import write_private
    write_private(path, render_default())      # 0600: org.toml may come to hold a webhook's secret URL
    return True


def json_schema() -> dict:
    """A JSON Schema (draft 2020-12) of org.toml for editors (taplo, Even Better TOML)."""
    schema = Config.model_json_schema()
    schema["description"] = ("loop-org's configuration (org.toml). Secrets never go here: the model backend "
                             "reads ANTHROPIC_API_KEY from the environment.")
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}


def _from_env(dotted: str, raw: str, var: str) -> Any:
    field = SCHEMA[dotted]
    kind = field.annotation
    try:
        if kind is bool:
            if raw.lower() not in ("true", "false", "1", "0"):
                raise ValueError(raw)
            return raw.lower() in ("true", "1")
        if kind is int:
            return int(raw)
        if kind is float:
            return float(raw)
        return raw
    except ValueError:
        raise ConfigKeyError(f"environment {var}={raw!r} is not valid for {dotted}: expected {expect(field)}",
                             key=dotted, hint=f"fix or unset {var}") from None


# ---------------------------------------------------------------------------------- the default file

def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return repr(value)


def _commented(line: str, doc: str) -> list[str]:
    """``line`` with ``doc`` as a comment from column 33, wrapped; below a line too long for it."""
    if not doc:
        return [line]
    chunks = [" " * 32 + "# " + c for c in textwrap.wrap(doc, 100 - 34)]
    if len(line) >= 32:
        return [line, *chunks]
    return [line.ljust(32) + chunks[0].lstrip(), *chunks[1:]]


def render_default() -> str:
    """The documented default org.toml, generated from the models."""
    out = ["# loop-org configuration. `org config check` validates it; `org config show` prints the",
           "# effective values (after environment overrides); `org config schema` prints its JSON Schema.",
           "# Secrets never go here: the model backend reads ANTHROPIC_API_KEY from the environment."]
    for name, field in Config.model_fields.items():
        out.append("")
        if name == "prices":
            out += ["# " + c for c in textwrap.wrap(field.description or "", 96)]
            for model, price in DEFAULT_PRICES.items():
                out += [f"[prices.\"{model}\"]", *(f"{k} = {v!r}" for k, v in price.items()), ""]
            out.pop()
            continue
        cls = SECTIONS.get(name)
        if cls is None:                      # a list of tables: documented, none by default
            out += _commented(f"# [[{name}]]", field.description or "")
            continue
        out += _commented(f"[{name}]", " ".join((cls.__doc__ or "").split()))
        for k, f in cls.model_fields.items():
            out += _commented(f"{k} = {_toml(f.default)}", f.description or "")
    return "\n".join(out) + "\n"


def __getattr__(name: str) -> str:
    # DEFAULT_TOML is rendered when first asked for, not on import: ~2.5 ms of every process's
    # start, and only 'org init' and 'org config' write or show it
    if name == "DEFAULT_TOML":
        globals()["DEFAULT_TOML"] = text = render_default()
        return text
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
