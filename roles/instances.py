"""Which role instances an org runs, and how their processes are started.

Several eval-agents (``[org] eval_agents``) split the work items between them by a stable hash
of the work item's id (``eval_agent_for``): each verifies only its own share (the preflight and
every iteration of a work item go to the same one, so one snapshot directory has one writer),
and a loop-agent sends its verify requests to that one. One eval-agent keeps the name
``eval-agent``; several are ``eval-agent-1`` .. ``eval-agent-K``.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass

from state_db.vocab import Actor

ROLE_MODULES = {
    Actor.COORDINATOR: "roles.coordinator",
    Actor.LOOP_AGENT: "roles.loop_agent",
    Actor.EVAL_AGENT: "roles.eval_agent",
    Actor.CURATOR: "roles.curator",
}


@dataclass(frozen=True)
class InstanceSpec:
    instance: str
    role: str

    @property
    def module(self) -> str:
        return ROLE_MODULES[Actor(self.role)]


def org_instances(loop_agents: int, eval_agents: int = 1) -> list[InstanceSpec]:
    """One coordinator, N loop-agents, K eval-agents (one by default), one curator."""
    specs = [InstanceSpec("coordinator", Actor.COORDINATOR)]
    specs += [InstanceSpec(f"loop-agent-{i}", Actor.LOOP_AGENT) for i in range(1, loop_agents + 1)]
    specs += [InstanceSpec(name, Actor.EVAL_AGENT) for name in eval_agent_names(eval_agents)]
    specs += [InstanceSpec("curator", Actor.CURATOR)]
    return specs


def eval_agent_names(count: int) -> list[str]:
    return ["eval-agent"] if count <= 1 else [f"eval-agent-{i}" for i in range(1, count + 1)]


def eval_agent_for(work_id: str, count: int) -> str:
    """The eval-agent that verifies ``work_id`` when the org runs ``count`` of them."""
    return eval_agent_names(count)[shard_of(work_id, count)]


def shard_of(work_id: str, count: int) -> int:
    """Which of ``count`` shares ``work_id`` is in (stable across processes and restarts)."""
    return zlib.crc32(work_id.encode("utf-8")) % count if count > 1 else 0


def eval_agent_shard(instance: str, count: int) -> tuple[int, int] | None:
    """The share an eval-agent instance verifies: (its index, ``count``), or None for all."""
    names = eval_agent_names(count)
    if count <= 1 or instance not in names:
        return None
    return names.index(instance), count
