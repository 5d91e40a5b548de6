"""Errors of the dashboard. Each carries a machine-readable ``code`` and says what to do."""
from __future__ import annotations

from state_db.kernel.errors import StateError


class DashboardError(StateError):
    """Base of every dashboard error; ``code`` is stable, ``hint`` says what to do."""

    code = "dashboard_error"


class PortInUse(DashboardError):
    code = "port_in_use"

    def __init__(self, host: str, port: int, why: str):
        self.host, self.port = host, port
        super().__init__(f"cannot listen on {host}:{port} ({why})",
                         hint="pick another port with --port N, or --port 0 for a free one")


class Refused(DashboardError):
    """A request the guard turns away (HTTP 403): no token, a wrong one, or a cross-site write."""

    code = "forbidden"

    def __init__(self, code: str, message: str, hint: str):
        super().__init__(message, hint=hint, code=code)


class BadRequest(DashboardError):
    code = "bad_request"


class ConfirmNeeded(DashboardError):
    """A gated command (network, outside the workspace) approved without the page asking again."""

    code = "confirm_needed"

    def __init__(self, decision_id: str, kind: str):
        super().__init__(f"{decision_id} lets a command run with {kind} allowed: it is approved only once "
                         "confirmed", hint="approve it from the dashboard page, which shows the whole command "
                                           "and asks again")
