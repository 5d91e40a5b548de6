"""``org cancel ID``: stop a run; a running act is cut and discarded, the reason is ``cancelled``."""
from __future__ import annotations

import uuid

from scripts.cli.output import add_json, emit_json, home_of, print_unsent
from state_db.errors import NotFound
from state_db.vocab import Actor, StopReason, WorkStatus

NAME = "cancel"
HELP = "cancel a work item (recorded as stop reason 'cancelled')"


def add_arguments(p) -> None:
    p.add_argument("id", help="work item id")
    p.add_argument("--idempotency-key", help="the same key twice cancels once")
    add_json(p)


def run(args) -> int:
    from roles.operations.wake import wake_coordinator
    from state_db import config as config_mod
    from state_db.writer import StateWriter

    home = home_of(args).require()
    writer = StateWriter(home.db_path, Actor.HUMAN)

    def do(tx):
        item = tx.get("work_items", args.id)
        if item is None:
            raise NotFound(f"no work item {args.id}", hint="list them with 'org status'")
        if item["status"] == WorkStatus.ENDED:
            return {"id": args.id, "status": "ended", "stop_reason": item["stop_reason"], "changed": False}
        if item["status"] in (WorkStatus.QUEUED, WorkStatus.WAITING):
            tx.set_status("work_items", args.id, WorkStatus.ENDED, stop_reason=StopReason.CANCELLED,
                          stop_detail=f"cancelled by {writer.os_user} before it started")
            return {"id": args.id, "status": "ended", "stop_reason": "cancelled", "changed": True}
        tx.update("work_items", args.id, cancel_requested=1, updated_at=tx.now)
        return {"id": args.id, "status": item["status"], "stop_reason": None, "changed": True,
                "note": "the loop-agent stops at its next model call or iteration boundary"}

    try:
        result, _ = writer.run_once(args.idempotency_key or uuid.uuid4().hex, "cancel", do)
    finally:
        writer.close()
    cfg = config_mod.load(home.config_path if home.config_path.exists() else None)
    result["wake"] = wake_coordinator(home, cfg, {"work_id": args.id})
    if args.json:
        emit_json(result)
    elif not result["changed"]:
        print(f"{args.id} had already ended ({result['stop_reason']})")
    else:
        print(f"{args.id}: cancel recorded" + (f" — {result['note']}" if result.get("note") else " (ended)"))
    if result["changed"]:
        print_unsent(result["wake"], "the cancel is recorded and takes effect when the org runs", args.json)
    return 0
