"""``org candidates [list|show ID|approve ID…|reject ID…|defer ID…|edit ID]``: review skill candidates.

Each decision and edit is a durable write as actor ``human`` (the OS user and the time are
recorded with it), idempotent under ``--idempotency-key``, then a wake to the coordinator.
An approved candidate becomes ``skills/<name>/SKILL.md`` in the org home, rendered from state.db.
"""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scripts.cli.output import add_json, emit_json, home_of, read_conn, table
from skills.errors import SkillError
from state_db.vocab import Actor, CandidateStatus

NAME = "candidates"
HELP = "review skill candidates: list, show, approve, reject, defer or edit them"
STATUSES = [str(s) for s in CandidateStatus]


def add_arguments(p) -> None:
    add_json(p)
    sub = p.add_subparsers(dest="action", metavar="ACTION", help="what to do (default: list)")
    ls = sub.add_parser("list", help="pending candidates (default), or --all / --status")
    ls.add_argument("--all", action="store_true", help="every candidate, whatever its status")
    ls.add_argument("--status", action="append", choices=STATUSES, help="only these statuses (repeatable)")
    ls.add_argument("--queued", action="store_true", help="patterns that scored 2: queued, not proposed")
    add_json(ls)
    show = sub.add_parser("show", help="one candidate: SKILL.md text, score and per-signal evidence")
    show.add_argument("id", help="candidate id (or the name of a pending/deferred one)")
    add_json(show)
    for action, what in (("approve", "make them skills"), ("reject", "turn them down"),
                         ("defer", "not now; they are not asked again and never count toward a batch")):
        d = sub.add_parser(action, help=f"{action} candidates: {what}")
        d.add_argument("ids", nargs="+", metavar="ID", help="candidate ids (or names)")
        d.add_argument("--idempotency-key", help="the same key twice decides once")
        add_json(d)
    e = sub.add_parser("edit", help="edit a candidate's SKILL.md in $EDITOR, or with --name/--description/--body-file")
    e.add_argument("id", help="candidate id (or name)")
    e.add_argument("--name", help="new skill name (a-z, 0-9, single hyphens)")
    e.add_argument("--description", help="new description (what it does and when to use it)")
    e.add_argument("--body-file", help="file with the new Markdown body ('-' for stdin)")
    e.add_argument("--idempotency-key", help="the same key twice edits once")
    add_json(e)


def run(args) -> int:
    action = args.action or "list"
    if action == "list":
        return _list(args)
    if action == "show":
        return _show(args)
    if action == "edit":
        return _edit(args)
    return _decide(args, action)


def _list(args) -> int:
    from knowledge.patterns import queued
    from skills import candidates as C

    conn = read_conn(args)
    try:
        if getattr(args, "queued", False):
            rows = queued(conn)
            if args.json:
                emit_json(rows)
            else:
                print(table([[r["id"], r["score"], r["topic"][:70]] for r in rows], ["CURATED", "SCORE", "TOPIC"])
                      if rows else "no queued patterns")
            return 0
        statuses = STATUSES if getattr(args, "all", False) else (getattr(args, "status", None) or ["pending"])
        rows = C.listing(conn, statuses)
    finally:
        conn.close()
    if args.json:
        emit_json(rows)
        return 0
    if not rows:
        print("no candidates" + ("" if getattr(args, "all", False) else f" ({', '.join(statuses)})"))
        return 0
    print(table([[r["id"], r["name"], _status(r), r["score"], len(r["source_notes"] or []), r["batch_id"] or "",
                  time.strftime("%Y-%m-%d", time.localtime(r["created_at"]))] for r in rows],
                ["ID", "NAME", "STATUS", "SCORE", "NOTES", "BATCH", "CREATED"]))
    return 0


def _status(r: dict) -> str:
    if r["status"] == CandidateStatus.MERGED and r["merged_into"]:
        return f"merged-into-{r['merged_into'].removeprefix('skill:')}"
    return r["status"]


def _show(args) -> int:
    from skills import candidates as C
    from skills.skillmd import render

    conn = read_conn(args)
    try:
        c = C.get(conn, args.id)
    finally:
        conn.close()
    if args.json:
        emit_json(c)
        return 0
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(c["decided_at"])) if c["decided_at"] else ""
    decided = f", {c['status']} by {c['decided_by']} on {when}" if when else ""
    print(f"{c['id']}  {_status(c)}  score {c['score']}/5{decided}")
    signals = c["signals"] or {}
    for name in ("recurrence", "multi_step", "trigger", "criteria", "reusable_output"):
        s = signals.get(name)
        if isinstance(s, dict):
            print(f"  [{'x' if s.get('ok') else ' '}] {name}: {s.get('why', '')}")
    print(f"  source notes: {', '.join(c['source_notes'] or [])}\n")
    print(render(C.as_text(c)))
    return 0


def _writer(args):
    from state_db.writer import StateWriter
    home = home_of(args).require()
    return home, StateWriter(home.db_path, Actor.HUMAN)


def _wake(home) -> None:
    from roles.operations.wake import wake_coordinator
    from state_db import config as config_mod
    wake_coordinator(home, config_mod.load_config(home))


def _decide(args, action: str) -> int:
    from skills import review

    home, writer = _writer(args)
    try:
        out = review.decide(writer, args.ids, action, home.skills_dir, key=args.idempotency_key)
    finally:
        writer.close()
    _wake(home)
    if args.json:
        emit_json(out)
        return 0
    for r in out["results"]:
        note = "" if r["changed"] else " (already)"
        extra = f" → {r['skill']['file']}" if r.get("skill") else ""
        print(f"{r['id']} ({r['name']}): {r['status']}{note}{extra}")
    for bid in out["closed_batches"]:
        print(f"batch {bid} closed: nothing left to review in it")
    return 0


def _edit(args) -> int:
    from skills import candidates as C, review
    from skills.skillmd import parse, render

    home, writer = _writer(args)
    try:
        current = C.get(writer.conn, args.id)
        if args.name is None and args.description is None and args.body_file is None:
            text = parse(_in_editor(render(C.as_text(current))))
            fields = {"name": text.name, "description": text.description, "body": text.body}
        else:
            body = None
            if args.body_file is not None:
                body = (sys.stdin.read() if args.body_file == "-" else Path(args.body_file).read_text())
            fields = {"name": args.name, "description": args.description, "body": body}
        out = review.edit(writer, current["id"], key=args.idempotency_key, **fields)
    finally:
        writer.close()
    _wake(home)
    if args.json:
        emit_json(out)
    else:
        print(f"{out['id']}: " + (f"changed {', '.join(out['changed'])}" if out["changed"] else "no change"))
    return 0


def _in_editor(text: str) -> str:
    """Open ``text`` in $VISUAL / $EDITOR (default vi) and return what was saved."""
    editor = os.environ.get("VISUAL") or os.environ.get("EDITOR") or "vi"
    with tempfile.TemporaryDirectory(prefix="org-candidate-") as tmp:
        path = Path(tmp) / "SKILL.md"
        path.write_text(text)
        proc = subprocess.run(shlex.split(editor) + [str(path)])
        if proc.returncode != 0:
            raise SkillError(f"the editor ({editor}) exited with {proc.returncode}; nothing was changed",
                             code="editor_failed", hint="fix $EDITOR or use --name/--description/--body-file")
        return path.read_text()
