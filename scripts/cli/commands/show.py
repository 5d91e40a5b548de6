"""``org show ID``: one work item with its iterations, verdicts and usage."""
from __future__ import annotations

import orjson

from scripts.cli.output import add_json, emit_json, read_conn, table
from state_db import queries
from state_db.errors import NotFound

NAME = "show"
HELP = "show one work item: status, stop reason, iterations with verdicts, tokens and cost"


def add_arguments(p) -> None:
    p.add_argument("id", help="work item id")
    add_json(p)


def load(conn, work_id: str) -> dict:
    item = queries.work_item(conn, work_id)
    if item is None:
        raise NotFound(f"no work item {work_id}", hint="list them with 'org status'")
    item["iterations_detail"] = queries.iterations(conn, work_id)
    item["verdicts"] = queries.rows(conn, "SELECT * FROM verdicts WHERE work_id = ? ORDER BY iteration, at", (work_id,))
    item["attempts"] = queries.rows(conn, "SELECT * FROM attempts WHERE work_id = ? ORDER BY attempt", (work_id,))
    return item


def run(args) -> int:
    conn = read_conn(args)
    try:
        item = load(conn, args.id)
    finally:
        conn.close()
    if args.json:
        emit_json(item)
        return 0
    print(f"{item['id']}  {item['status']}" + (f"  stop: {item['stop_reason']} — {item['stop_detail'] or ''}"
                                                if item["stop_reason"] else ""))
    print(f"goal: {item['goal']}")
    print(f"workspace: {item['workspace']}  backend: {item['backend']}  assigned: {item['assigned_to'] or '-'}")
    print(f"caps: {item['caps']}  used: {item['tokens']} tokens, ${item['cost_usd']:.4f}, {item['elapsed_s']:.1f}s")
    verdicts = {v["iteration"]: v for v in item["verdicts"]}
    rows = []
    for it in item["iterations_detail"]:
        v = verdicts.get(it["n"])
        rows.append([it["n"], it["attempt"], it["act_status"],
                     it["input_tokens"] + it["output_tokens"] + it["cache_write_tokens"] + it["cache_read_tokens"],
                     v["outcome"] if v else "pending", len(orjson.loads(it["changed_paths"])),
                     (it["lesson"] or "")[:60]])
    if rows:
        print()
        print(table(rows, ["ITER", "ATTEMPT", "ACT", "TOKENS", "VERDICT", "CHANGED", "LESSON"]))
    if item["verdicts"] and item["verdicts"][-1]["outcome"] != "pass":
        print("\nlatest feedback:\n" + item["verdicts"][-1]["feedback"][:1500])
    return 0
