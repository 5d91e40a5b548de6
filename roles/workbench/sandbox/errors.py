"""Errors of the sandbox package. Each carries a machine-readable ``code``; the message says what
to do about it."""
from __future__ import annotations

from state_db.kernel.errors import OrgError


class SandboxError(OrgError):
    """Base error: an agent command could not be run inside the sandbox."""

    code = "sandbox_error"


class SandboxUnavailable(SandboxError):
    """bubblewrap is missing and org.toml does not explicitly allow unsandboxed mode."""

    code = "sandbox_unavailable"


class SandboxFailed(SandboxError):
    """bubblewrap is installed but cannot build the sandbox (user namespaces disabled, a bind
    source missing, …). The message carries bubblewrap's own words."""

    code = "sandbox_failed"


class SandboxConfigError(SandboxError):
    """The caller asked for an impossible sandbox (a missing workspace, a relative path, …)."""

    code = "sandbox_config"
