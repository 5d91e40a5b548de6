"""``org decisions``: gated actions waiting for a human (and recent ones with --all)."""
from __future__ import annotations

from scripts.cli.output import add_json, emit_json, read_conn, table
from state_db.queries import decisions
from state_db.queries.decisions import ASKED_AGAIN
from state_db.queries.base import plain
from state_db.text import command_shown, one_line

NAME = "decisions"
HELP = "list decisions waiting for a human (approve / edit / reject / respond with 'org decide')"


def add_arguments(p) -> None:
    p.add_argument("--all", action="store_true", help="include decided ones")
    add_json(p)


def run(args) -> int:
    conn = read_conn(args)
    try:
        rows = decisions.recent(conn, 100) if args.all else decisions.pending(conn)
    finally:
        conn.close()
    if args.json:
        emit_json(plain(rows))
    elif not rows:
        print("no decisions waiting")
    else:
        print(table([[d.id, d.work_id, d.status, one_line(d.question.split("\n", 1)[0])[:90]] for d in rows],
                    ["DECISION", "WORK", "STATUS", "QUESTION"]))
        # the command a decision would run, whole: the question's line above is only its head
        for d in rows:
            if d.command:
                print(f"\n{d.id} runs this command ({len(d.command)} characters), exactly as shown:\n"
                      f"{command_shown(d.command)}")
        for d in rows:       # an action asked again says what happened the first time: in whole
            if d.status == "pending" and d.question.startswith(ASKED_AGAIN):
                print(f"{d.id}: {d.question}")
        print("answer with: org decide ID approve | reject [--stop] [REASON] | edit NEW_COMMAND | respond TEXT")
    return 0
