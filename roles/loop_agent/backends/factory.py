"""Build the act backend a work item asks for.

``scripted:FILE`` starts the scripted Messages API server on 127.0.0.1 and reaches it through the
anthropic backend (the real SDK over HTTP); nothing else in the loop knows it is scripted.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from roles.loop_agent.backends.base import Backend, BackendConfigError
from state_db.kernel.config import Config
from state_db.kernel.home import OrgHome

SCRIPTED_MODEL = "scripted"


@dataclass
class BuiltBackend:
    backend: Backend
    label: str                      # shown to the user: "anthropic claude-…", "scripted (…)"
    close: Callable[[], None]


def build(spec: str, cfg: Config, home: OrgHome, instance: str, *, runner=None) -> BuiltBackend:
    """Return the backend for ``spec`` (``anthropic`` | ``scripted:FILE`` | ``command``).

    ``runner`` runs the model's commands (default: the sandbox org.toml asks for).
    Raises BackendConfigError (unknown model price, missing key, unknown backend).
    """
    from roles.loop_agent.backends.anthropic_backend import AnthropicBackend, AnthropicConfig
    from roles.loop_agent.backends.retry import FileRateGate, RetryPolicy
    from roles.workbench.sandbox import runner_from_config

    if runner is None:
        runner = runner_from_config(cfg, home)

    gate = FileRateGate(home.run_dir)
    retry = RetryPolicy(max_attempts=cfg.model.max_retries + 1)
    if spec.startswith("scripted:"):
        from roles.workbench.scripted.script import ScriptError
        from roles.workbench.scripted.server import ScriptedServer
        try:
            server = ScriptedServer(Path(spec.split(":", 1)[1]), home.logs_dir / f"scripted-{instance}.jsonl")
        except ScriptError as exc:      # will not fix itself: the run ends (model_error) with the file's line
            raise BackendConfigError(str(exc), code=exc.code) from exc
        url = server.start()
        conf = AnthropicConfig(model=SCRIPTED_MODEL, max_tokens=cfg.model.max_tokens, base_url=url,
                               timeout_s=30.0, retry=RetryPolicy(max_attempts=2, base_delay_s=0.05))
        backend = AnthropicBackend(conf, cfg.prices, gate=gate, runner=runner)
        return BuiltBackend(backend, f"scripted model ({Path(spec.split(':', 1)[1]).name}, served at {url})",
                            server.stop)
    if spec == "anthropic":
        conf = AnthropicConfig(model=cfg.model.name, max_tokens=cfg.model.max_tokens,
                               base_url=cfg.model.base_url or None, timeout_s=cfg.model.request_timeout_s,
                               retry=retry)
        backend = AnthropicBackend(conf, cfg.prices, gate=gate, runner=runner)
        return BuiltBackend(backend, f"anthropic {cfg.model.name} at {backend.base_url}", lambda: None)
    if spec == "command":
        from roles.loop_agent.backends.command_backend import CommandBackend, CommandConfig
        conf = CommandConfig(binary=cfg.command.binary, model=cfg.model.name,
                             permission_mode=cfg.command.permission_mode,
                             allowed_tools=tuple(cfg.command.allowed_tools), timeout_s=cfg.command.timeout_s,
                             upstream=cfg.model.base_url or None, max_retries=cfg.model.max_retries,
                             path_prepend=tuple(cfg.command.path_prepend),
                             readonly_binds=tuple(cfg.command.readonly_binds))
        backend = CommandBackend(conf, cfg.prices, make_runner=lambda ws: runner_from_config(cfg, home, ws),
                                 state_dir=home.run_dir / "cli" / instance)
        return BuiltBackend(backend, f"command: {cfg.command.binary} in the sandbox", lambda: None)
    raise BackendConfigError(f"unknown backend {spec!r}", code="unknown_backend")
