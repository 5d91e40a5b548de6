"""Curator process: starts, heartbeats, reconciles, answers ping."""
from __future__ import annotations

from roles.runtime import RoleProcess


class CuratorProcess(RoleProcess):
    tick_s = 5.0
