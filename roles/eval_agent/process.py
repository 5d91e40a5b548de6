"""Eval-agent process: starts, heartbeats, reconciles, answers ping."""
from __future__ import annotations

from roles.runtime import RoleProcess


class EvalAgentProcess(RoleProcess):
    pass
