"""Which role instances an org runs, and how their processes are started."""
from __future__ import annotations

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


def org_instances(loop_agents: int) -> list[InstanceSpec]:
    """One coordinator, N loop-agents, one eval-agent, one curator."""
    specs = [InstanceSpec("coordinator", Actor.COORDINATOR)]
    specs += [InstanceSpec(f"loop-agent-{i}", Actor.LOOP_AGENT) for i in range(1, loop_agents + 1)]
    specs += [InstanceSpec("eval-agent", Actor.EVAL_AGENT), InstanceSpec("curator", Actor.CURATOR)]
    return specs
