"""The doer's changes held outside the change scope, for the human: read as a patch
(``org export ID --held``) or applied to the workspace (``org apply ID --held``).

At goal_met the workspace was made to hold the verified tree and the doer's other changes were
kept apart as a commit of the history (``roles.workbench.workspace.delivered``); the work item's
``delivered`` names both. Applying writes the held commit's version of each held path into the
workspace — only where the workspace still holds the verified version, so nothing the human
changed since is overwritten — through libgit2's objects, never a git process.
"""
from __future__ import annotations

import os
from pathlib import Path

from state_db.kernel.errors import NotFound, StateError
from state_db.kernel.home import OrgHome
from state_db.queries import work as work_q


def _delivered(home: OrgHome, conn, work_id: str):
    from roles.workbench.workspace.history import WorkspaceHistory

    item = work_q.item(conn, work_id)
    if item is None:
        raise NotFound(f"no work item {work_id}", hint="list them with 'org status'")
    done = item.delivered or {}
    if not done.get("verified"):
        raise StateError(f"{work_id} has no delivered result: changes are held apart only at goal_met",
                         code="not_delivered", hint=f"see 'org show {work_id}'; 'org diff {work_id}' shows every change")
    return item, done, WorkspaceHistory(home.history_dir / f"{work_id}.git", Path(item.workspace))


def held_patch(home: OrgHome, conn, work_id: str) -> bytes:
    """The held changes as a binary-safe patch against the delivered tree (empty: none were held).
    Raises NotFound, StateError(not_delivered)."""
    _, done, history = _delivered(home, conn, work_id)
    if not done.get("held"):
        return b""
    return history.diff_bytes(done["verified"], done["held"])


def apply_held(home: OrgHome, conn, work_id: str) -> list[str]:
    """Write the held changes into the workspace; returns the paths written or removed.
    Raises NotFound, StateError(not_delivered | nothing_held | held_conflict)."""
    item, done, history = _delivered(home, conn, work_id)
    if not done.get("held"):
        raise StateError(f"{work_id} held nothing back: the workspace already holds the whole change",
                         code="nothing_held", hint=f"'org diff {work_id}' shows it")
    verified, held = done["verified"], done["held"]
    paths = history.changed_paths(verified, held)
    now = set(history.workspace_differences(verified))
    changed = sorted(p for p in paths if p in now or any(n.startswith(p + "/") for n in now))
    if changed:
        raise StateError(f"the workspace changed since delivery at {', '.join(changed[:5])}; nothing was applied",
                         code="held_conflict",
                         hint=f"apply the patch by hand: org export {work_id} --held -o held.patch, then git apply")
    ws = Path(item.workspace)
    want = history.entries(held)
    for p in paths:
        target = ws / p
        entry = want.get(p)
        if target.is_symlink() or target.is_file():
            target.unlink()
        if entry is None:
            continue
        mode, _ = entry
        target.parent.mkdir(parents=True, exist_ok=True)
        data = history.read_path(held, p)
        if mode == 0o120000:
            os.symlink(data, target)
        elif data is not None:
            target.write_bytes(data)
            if mode == 0o100755:
                target.chmod(0o755)
    return paths
