"""``verify-fails``: the verify commands on a copy of the current tree, in the sandbox, through
the function the eval-agent's checks run through (``roles/operations/watch.Observer.run_checks``).
The state is the tree plus which commands failed, so one failing state fires once. A command that
cannot start (exit 126/127, a timeout, the sandbox refusing) is not a failure: it is recorded on
the trigger, nothing fires. A state is the org's when the whole tree is as a checkpoint has it."""
from __future__ import annotations

import hashlib
from pathlib import Path

from roles.coordinator.triggers.seen import PASSING, Seen
from roles.operations.watch import Observer, fingerprint
from state_db.queries import schedules as q


def look(observer: Observer, order: q.Schedule, ws: Path) -> Seen:
    tree = fingerprint(observer.files(ws))
    failing, ran = [], []
    for r in observer.run_checks(order.id, ws, order.request["verify"]):
        if r.cannot:
            return Seen(None, why=f"`{r.command}` {r.cannot}", tree=tree)
        ran.append(r.command)
        if r.exit_code != 0:
            failing.append((r.command, r.exit_code, "\n".join(r.output.strip().splitlines()[-15:])))
    if not failing:
        return Seen(PASSING, detail="every verify command passes", tree=tree)
    detail = "; ".join(f"`{c}` failed (exit {code}):\n{tail}" for c, code, tail in failing)
    return Seen(f"fail:{tree}:" + hashlib.sha256("\n".join(c for c, _, _ in failing).encode()).hexdigest()[:16],
                detail=f"{len(failing)} of {len(ran)} verify commands fail on the current tree: {detail}", tree=tree)


def org_made(observer: Observer, order: q.Schedule, seen: Seen, states: list[dict[str, str]]) -> bool:
    return any(fingerprint(s) == seen.tree for s in states)
