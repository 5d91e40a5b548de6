"""Which work items' histories a joined host may reach over ``org git-shell --host NAME``.

Each joined host's key has its own forced command naming the host (``org hosts ssh-line KEYFILE
--host NAME``), so the git service knows who asks; the store says what that host holds. Built
from what the host did, never from what it asks for:

- it may **fetch** a work item's history when one of its instances holds the work item now
  (``work_items.assigned_to``), ran an attempt of it (``attempts.instance``), wrote a verdict on
  it, or is the eval-agent the org's sharding gives it to (``roles.base.instances``);
- it may **push** only while one of its loop-agents holds the work item and the run has not
  ended, and then only the iteration it is about to commit (the next after the last committed
  one, ``NEXT_ENV`` for the ``pre-receive`` hook) — a committed iteration's ref never moves again.

Everything else, an unknown host included, reaches nothing.
"""
from __future__ import annotations

from dataclasses import dataclass

from state_db.kernel.errors import OrgError


class ScopeError(OrgError):
    code = "git_shell_not_yours"


@dataclass(frozen=True)
class Scope:
    """What ``host`` may do with the history of ``work_id``."""

    host: str
    work_id: str
    fetch: bool
    push: bool
    next_iteration: int

    def require(self, service: str) -> None:
        """Raises ScopeError unless ``service`` (``upload-pack``/``receive-pack``) is allowed."""
        if service == "receive-pack" and not self.push:
            raise ScopeError(f"host {self.host!r} does not hold {self.work_id} now: it pushes nothing there",
                             hint="a host pushes only the checkpoints of the work item one of its loop-agents runs")
        if not self.fetch:
            raise ScopeError(f"host {self.host!r} never worked on {self.work_id}: its history is not served to it",
                             hint="a host fetches only the histories of work items it holds or held")


def scope_of(conn, host: str, work_id: str, *, heartbeat_timeout_s: float = 10.0) -> Scope:
    """The scope of ``host`` on ``work_id`` as the store has it now (read-only)."""
    from state_db.queries.peers import host_touch, instances_of_host
    mine = instances_of_host(conn, host)
    touch = host_touch(conn, work_id, mine)
    row, nxt = touch["item"], touch["next"]
    if not mine or row is None:
        return Scope(host, work_id, False, False, nxt)
    holds = row[0] in mine and row[1] != "ended"
    ran, judged = touch["ran"], touch["judged"]
    verifies = False
    if not (holds or ran or judged) and "eval-agent" in mine.values():
        from roles.base.instances import stored_eval_agents
        verifies = stored_eval_agents(conn, heartbeat_timeout_s=heartbeat_timeout_s).owner(work_id, 1) in mine
    return Scope(host, work_id, holds or ran or judged or verifies, holds, nxt)
