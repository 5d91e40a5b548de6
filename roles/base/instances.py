"""Which role instances an org runs, and how their processes are started.

Several eval-agents (``[org] eval_agents``) split the work items between them by a stable hash
of the work item's id (``eval_agent_for``): each verifies only its own share (the preflight and
every iteration of a work item go to the same one, so one snapshot directory has one writer),
and a loop-agent sends its verify requests to that one. One eval-agent keeps the name
``eval-agent``; several are ``eval-agent-1`` .. ``eval-agent-K``.

Over tcp, eval-agents may also run on joined hosts (``org join --role eval-agent``:
``eval-agent-50`` and up), so the list is not the coordinator host's ``[org] eval_agents`` but the
store's: the registered eval-agents that are ready and heartbeating, by name (``EvalAgents``),
read the same way by the loop-agent that sends a verify request and by every eval-agent choosing
its share. Preflights record the baseline from the real workspace, which only the coordinator
host has: they are split between the coordinator host's eval-agents only; iterations between
all. While the membership changes two processes may disagree for a moment: a verdict is then
late (nobody took it yet) or raced for, and the verdict write refuses a second verdict for an
iteration (``Verifier.record``), so none is lost or doubled, and the eval-agents of one home
take a work item's snapshot one at a time (``roles.eval_agent.process.WorkLocks``). Over ipc
nothing is read from the store: the list is ``[org] eval_agents``'s names.
"""
from __future__ import annotations

import time
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


@dataclass(frozen=True)
class EvalAgents:
    """Who verifies what: iterations (n >= 1) are split between ``everyone``, preflights (n = 0)
    between ``preflights`` (the coordinator host's), each by ``shard_of`` over the sorted names."""

    everyone: tuple[str, ...]
    preflights: tuple[str, ...]

    def owner(self, work_id: str, n: int) -> str | None:
        """The eval-agent that verifies iteration ``n`` of ``work_id``; None while there is none."""
        names = self.preflights if n == 0 else self.everyone
        return names[shard_of(work_id, len(names))] if names else None


def configured_eval_agents(count: int) -> EvalAgents:
    """The single-host list: ``[org] eval_agents``'s names, every one of them doing both."""
    names = tuple(eval_agent_names(count))
    return EvalAgents(names, names)


def stored_eval_agents(conn, *, heartbeat_timeout_s: float, now: float | None = None) -> EvalAgents:
    """The org's list over tcp: the live eval-agents registered in the store's ``peers`` table,
    preflights going to those on the coordinator's host."""
    from state_db.queries.peers import live_eval_agents, peer
    live = live_eval_agents(conn, heartbeat_timeout_s=heartbeat_timeout_s, now=time.time() if now is None else now)
    coordinator = peer(conn, "coordinator")
    here = tuple(p.instance for p in live if coordinator is not None and p.host == coordinator.host)
    return EvalAgents(tuple(p.instance for p in live), here)


class OrgEvalAgents:
    """The org's ``EvalAgents`` as one process sees it: ``[org] eval_agents`` over ipc (no store
    query), the store's list over tcp, read again at most every ``max_age_s``.

    Args:
        cfg: the process's configuration (``[transport] endpoint``, ``[org] eval_agents``,
            ``[supervisor] heartbeat_timeout_s``).
        conn: a connection to the store, used from one thread only (None over ipc).
    """

    def __init__(self, cfg, conn=None, *, max_age_s: float = 1.0, clock=time.monotonic) -> None:
        self.cfg = cfg
        self.conn = conn
        self.stored = cfg.transport.endpoint not in ("", "ipc") and conn is not None
        self.max_age_s = max_age_s
        self.clock = clock
        self._fixed = configured_eval_agents(cfg.org.eval_agents)
        self._read: EvalAgents | None = None
        self._read_at = 0.0

    def current(self) -> EvalAgents:
        if not self.stored:
            return self._fixed
        now = self.clock()
        if self._read is None or now - self._read_at >= self.max_age_s:
            self._read = stored_eval_agents(self.conn, heartbeat_timeout_s=self.cfg.supervisor.heartbeat_timeout_s)
            self._read_at = now
        return self._read

    def target(self, work_id: str, n: int = 1) -> str:
        """Where a verify request for iteration ``n`` of ``work_id`` goes. With no live
        eval-agent in the store, the configured owner (a request is only a wake-up: the owner
        finds the work in the store on its tick whatever it was sent)."""
        return self.current().owner(work_id, n) or self._fixed.owner(work_id, n) or "eval-agent"


def host_name(cfg) -> str:
    """This host's name among the org's hosts: ``[hosts] name``, else the machine's short name."""
    import socket
    return cfg.hosts.name or socket.gethostname().split(".")[0] or "host"
