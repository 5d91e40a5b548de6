"""Loop-agent process: starts, heartbeats, reconciles, answers ping (runs loops once dispatched)."""
from __future__ import annotations

from roles.runtime import RoleProcess


class LoopAgentProcess(RoleProcess):
    pass
