"""What a run left in the user's workspace, and the human's two ways back: ``org revert ID``
restores the baseline, ``org apply ID [--iteration N]`` one of the run's checkpoints.

A run that ends without ``goal_met`` leaves its last checkpoint in the workspace: the views say so
(``left``). Either command is a human write on an ended run: the workspace is set with libgit2
from the run's shadow history (``WorkspaceHistory.reset_to``: no git command runs on the
workspace), then a journal event records the commit it now holds. Each refuses to overwrite what
someone changed since — the workspace must hold exactly what the run (or the last revert or
apply) left there — and refuses while another run holds the workspace. A crash between the two
writes leaves the workspace set and the journal behind: the next command then sees changes and
refuses, so nothing is overwritten unseen.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from roles.operations import Result, human_writer, signed
from state_db.kernel.errors import NotFound, StateError
from state_db.kernel.home import OrgHome
from state_db.queries import decisions as decision_q, work as work_q
from state_db.queries.iterations import checkpoints
from state_db.queries.work import WORKSPACE_SET, WorkItem
from state_db.vocab import StopReason


class RestoreError(StateError):
    code = "cannot_restore"


@dataclass(frozen=True)
class Restored(Result):
    """What ``org revert`` / ``org apply`` did: the workspace of ``id`` now holds ``commit`` (``what``:
    ``baseline`` or ``iteration N``); ``changed``: the paths that changed in it."""

    id: str
    workspace: str
    what: str
    commit: str
    changed: list


def _history(home: OrgHome, item: WorkItem):
    from roles.workbench.workspace.history import WorkspaceHistory
    return WorkspaceHistory(home.history_dir / f"{item.id}.git", Path(item.workspace))


def left_commit(conn, item: WorkItem, baseline: str) -> str:
    """The commit the workspace should hold now: the last revert or apply, else what the run
    settled on (its last checkpoint, or an approved action's after it), else the baseline."""
    done = work_q.workspace_set(conn, item.id)
    if done:
        return done
    its = checkpoints(conn, item.id)
    last = max(its) if its else 0
    return decision_q.settled_checkpoint(conn, item.id, last) or (its[last] if its else baseline)


def left(home: OrgHome, conn, item: WorkItem) -> list[str] | None:
    """The paths the run left changed in its workspace against the baseline (None: its history is
    gone or it has none)."""
    history = _history(home, item)
    baseline = history.baseline_commit()
    if baseline is None:
        return None
    return history.changed_paths(baseline, left_commit(conn, item, baseline))


def restore(home: OrgHome, work_id: str, *, iteration: int | None = None, baseline: bool = False,
            via: str | None = None) -> Restored:
    """Set the workspace of the ended run ``work_id`` to its baseline (``baseline``) or to the
    checkpoint of ``iteration`` (None: its last). Raises NotFound, RestoreError (``not_ended``,
    ``workspace_busy``, ``workspace_changed``, ``no_checkpoint``, ``no_history``)."""
    writer = human_writer(home.db_path, via)
    try:
        item = work_q.item(writer.conn, work_id)
        if item is None:
            raise NotFound(f"no work item {work_id}", hint="list them with 'org status'")
        if not item.ended:
            raise RestoreError(f"{work_id} is {item.status}: its loop-agent owns the workspace until it ends",
                               code="not_ended", hint=f"wait for it, or 'org cancel {work_id}' first")
        holder = work_q.lock_holder(writer.conn, item.workspace)
        if holder is not None and holder != work_id:
            raise RestoreError(f"{item.workspace} is held by {holder}", code="workspace_busy",
                               hint=f"wait until {holder} ends")
        history = _history(home, item)
        base = history.baseline_commit()
        if base is None:
            raise RestoreError(f"{work_id} has no history any more", code="no_history",
                               hint="nothing to restore from (retention may have removed it)")
        its = checkpoints(writer.conn, work_id)
        if baseline:
            target, what = base, "baseline"
        else:
            n = iteration if iteration is not None else (max(its) if its else None)
            if n is None or n not in its:
                raise RestoreError(f"{work_id} has no committed iteration {n}", code="no_checkpoint",
                                   hint=f"committed: {sorted(its) or 'none'}")
            target, what = its[n], f"iteration {n}"
        expected = left_commit(writer.conn, item, base)
        since = history.changed_in_workspace(expected)
        if since:
            shown = ", ".join(since[:10]) + (f" and {len(since) - 10} more" if len(since) > 10 else "")
            raise RestoreError(f"{item.workspace} changed since {work_id} left it: {shown}", code="workspace_changed",
                               hint="commit or move those changes first; nothing was overwritten")
        changed = history.changed_paths(expected, target)
        history.reset_to(target)
        with writer.transaction() as tx:
            tx.journal(WORKSPACE_SET, work_id, {"commit": target, "what": what, "from": expected,
                                                "changed": changed[:200], "by": signed(writer)})
        return Restored(work_id, item.workspace, what, target, changed)
    finally:
        writer.close()


def left_line(paths: list[str] | None, item: WorkItem) -> str | None:
    """One line for a run that ended without goal_met: what it left in the workspace and the way
    back; None for a run that met its goal or is not over."""
    if not item.ended or item.stop_reason == StopReason.GOAL_MET or paths is None:
        return None
    if not paths:
        return f"workspace: {item.workspace} holds the baseline (nothing of the run is left in it)"
    shown = ", ".join(paths[:8]) + (f" and {len(paths) - 8} more" if len(paths) > 8 else "")
    return (f"workspace: the run left {len(paths)} changed file(s) in {item.workspace}: {shown} — "
            f"'org revert {item.id}' restores the baseline, 'org apply {item.id} --iteration N' a checkpoint")
