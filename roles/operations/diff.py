"""``org diff``: what a run changed, read from its shadow history.

The patch of a work item since its baseline — at ``goal_met`` the tree the workspace was made to
hold (``delivered.verified``), else its last committed iteration — or of one iteration against
the one before it. The CLI, ``org export``, the MCP tool and the dashboard all read it here.
"""
from __future__ import annotations

from pathlib import Path

from state_db.connection import connect
from state_db.kernel.errors import NotFound
from state_db.kernel.home import OrgHome
from state_db.queries import work
from state_db.queries.iterations import checkpoints


def patch(home: OrgHome, work_id: str, iteration: int | None = None) -> bytes:
    """The patch of ``work_id`` (of its ``iteration`` only, when given), as git writes it.

    Raises:
        NotFound: no such work item, or it has no committed iteration ``iteration``.
    Returns:
        the patch's bytes, exactly (b"" when nothing was committed).
    """
    from roles.workbench.workspace.history import WorkspaceHistory

    home = home.require()
    conn = connect(home.db_path, readonly=True)
    try:
        item = work.item(conn, work_id)
        if item is None:
            raise NotFound(f"no work item {work_id}", hint="list them with 'org status'")
        its = checkpoints(conn, work_id)
    finally:
        conn.close()
    history = WorkspaceHistory(home.history_dir / f"{work_id}.git", Path(item.workspace))
    if iteration is not None:
        if iteration not in its:
            raise NotFound(f"{work_id} has no committed iteration {iteration}",
                           hint=f"committed: {sorted(its) or 'none'}")
        return history.diff_bytes(its.get(iteration - 1) or history.baseline_commit(), its[iteration])
    if not its:
        return b""
    delivered = (item.delivered or {}).get("verified")     # at goal_met: what the workspace was made to hold
    return history.diff_bytes(history.baseline_commit(), delivered or its[max(its)])
