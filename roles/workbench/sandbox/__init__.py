"""The trust boundary: every agent command runs here (DESIGN.md, "Trust boundary").

``runner_from_config`` picks the runner org.toml asks for; ``run_check_command`` runs one check with
it (every check of the org goes through it); ``run_sandboxed`` runs one command in a
sandbox built for it; ``describe_mode`` is the one line start-up and ``org doctor`` print.
``view.exposed`` lists what the sandbox shows and why (``org doctor``).
``ModelEndpoint`` gives a sandboxed agent CLI exactly one way out: the model API.
"""
from __future__ import annotations

from roles.workbench.sandbox.bwrap import SANDBOX_GID, SANDBOX_UID, BwrapRunner, bubblewrap, probe, run_sandboxed
from roles.workbench.sandbox.capture import Captured
from roles.workbench.sandbox.check import run_check_command
from roles.workbench.sandbox.environment import clean_env
from roles.workbench.sandbox.errors import SandboxConfigError, SandboxError, SandboxFailed, SandboxUnavailable
from roles.workbench.sandbox.limits import Limits, process_limit_kind
from roles.workbench.sandbox.mode import (RefusingRunner, UnsandboxedRunner, default_hidden, default_visible, describe_mode,
                                runner_from_config, unsandboxed_allowed)
from roles.workbench.sandbox.toolchains import Toolchain
from roles.workbench.sandbox.view import exposed

SandboxResult = Captured

__all__ = [
    "SANDBOX_GID", "SANDBOX_UID", "BwrapRunner", "Captured", "Limits", "RefusingRunner", "SandboxConfigError",
    "SandboxError", "SandboxFailed", "SandboxResult", "SandboxUnavailable", "Toolchain", "UnsandboxedRunner",
    "bubblewrap", "exposed",
    "clean_env", "default_hidden", "default_visible", "describe_mode", "probe", "process_limit_kind",
    "run_check_command", "run_sandboxed", "runner_from_config", "unsandboxed_allowed",
]
