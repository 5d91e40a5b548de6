"""``org candidates [list|show ID|approve ID…|reject ID…|defer ID…|edit ID]``: review skill candidates.

Each action is an operation (roles/operations/candidates.py) whose result this prints, as text
or with ``--json`` as data: a decision or an edit is a durable write as actor ``human`` (the OS
user and the time are recorded with it), idempotent under ``--idempotency-key``, then a wake to
the coordinator. An approved candidate becomes ``skills/<name>/SKILL.md`` in the org home.
"""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from roles.operations import candidates as ops
from roles.operations.candidates import CandidateDecisions, CandidateList, CandidateView
from scripts.cli.output import add_json, emit_json, home_of, table
from state_db.kernel.config import load_config
from state_db.kernel.errors import OrgError
from state_db.vocab import CandidateStatus

NAME = "candidates"
HELP = "review skill candidates: list, show, approve, reject, defer or edit them"
STATUSES = list(ops.STATUSES)


class EditorFailed(OrgError):
    code = "editor_failed"


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
        d.add_argument("--reason", help="why, in your words: kept with the decision and shown by 'org candidates show'")
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
    home = home_of(args).require()
    if getattr(args, "queued", False):
        found = ops.queued(home)
        if args.json:
            emit_json(found.as_data())
        else:
            print(table([[r["id"], r["score"], r["topic"][:70]] for r in found.rows], ["CURATED", "SCORE", "TOPIC"])
                  if found.rows else "no queued patterns")
        return 0
    result = ops.listing(home, getattr(args, "status", None), every=getattr(args, "all", False))
    if args.json:
        emit_json(result.as_data())
    else:
        print(listing_text(result, every=getattr(args, "all", False)))
    return 0


def listing_text(result: CandidateList, *, every: bool = False) -> str:
    if not result.rows:
        return "no candidates" + ("" if every else f" ({', '.join(result.statuses)})")
    return table([[r["id"], r["name"], _status(r), r["score"], len(r["source_notes"] or []), r["batch_id"] or "",
                   time.strftime("%Y-%m-%d", time.localtime(r["created_at"])), _measured(r.get("replay"))]
                  for r in result.rows],
                 ["ID", "NAME", "STATUS", "SCORE", "NOTES", "BATCH", "CREATED", "WITH / WITHOUT / Δ GOALS"])


def _measured(summary: dict | None) -> str:
    """The replay's goal rates in a table cell: ``2/2 / 1/2 / +0.5``, or what holds it up."""
    if not summary or not summary["items"]:
        plan = (summary or {}).get("plan")
        return "not replayed" if plan and plan["status"] == "skipped" else "—"
    if not summary["measured"]:
        return f"replaying ({summary['running']} running)"
    w, wo, d = summary["with"], summary["without"], summary["delta"]["goal_rate"]
    return f"{w['goals']}/{w['ended']} / {wo['goals']}/{wo['ended']} / {d:+g}"


def _status(r: dict) -> str:
    if r["status"] == CandidateStatus.MERGED and r["merged_into"]:
        return f"merged-into-{r['merged_into'].removeprefix('skill:')}"
    return r["status"]


def _show(args) -> int:
    result = ops.show(home_of(args).require(), args.id)
    if args.json:
        emit_json(result.as_data())
    else:
        print(show_text(result))
    return 0


def show_text(result: CandidateView) -> str:
    c = result.candidate
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(c["decided_at"])) if c["decided_at"] else ""
    decided = f", {c['status']} by {c['decided_by']} on {when}" if when else ""
    if when and c.get("decided_reason"):
        decided += f": {c['decided_reason']}"
    lines = [f"{c['id']}  {_status(c)}  score {c['score']}/5{decided}"]
    signals = c["signals"] or {}
    for name in ("recurrence", "multi_step", "trigger", "criteria", "reusable_output"):
        s = signals.get(name)
        if isinstance(s, dict):
            lines.append(f"  [{'x' if s.get('ok') else ' '}] {name}: {s.get('why', '')}")
    lines.append(f"  source notes: {', '.join(c['source_notes'] or [])}")
    if c.get("replay") is not None:
        from skills.replay import line
        lines.append(f"  replayed: {line(c['replay'])}")
        for r in c["replay"]["runs"]:
            lines.append(f"    {r['arm']:<7} {r['work_id']}  of {r['source']} ({r['relation']})  {r['status']}"
                         f"{'  ' + r['stop_reason'] if r['stop_reason'] else ''}  {r['iterations']} iteration(s), "
                         f"{r['tokens']:,} tokens")
    lines.append("")
    lines.append(result.skill_md)
    return "\n".join(lines)


def _decide(args, action: str) -> int:
    home = home_of(args).require()
    result = ops.decide(home, load_config(home), args.ids, action, idempotency_key=args.idempotency_key,
                        reason=args.reason)
    if args.json:
        emit_json(result.as_data())
    else:
        print(decisions_text(result))
    return 0


def decisions_text(result: CandidateDecisions) -> str:
    lines = []
    for r in result.results:
        note = "" if r["changed"] else " (already)"
        extra = f" → {r['skill']['file']}" if r.get("skill") else ""
        lines.append(f"{r['id']} ({r['name']}): {r['status']}{note}{extra}")
    for bid in result.closed_batches:
        lines.append(f"batch {bid} closed: nothing left to review in it")
    return "\n".join(lines)


def _edit(args) -> int:
    home = home_of(args).require()
    fields: dict = {}
    if args.name is None and args.description is None and args.body_file is None:
        fields["skill_md"] = _in_editor(ops.show(home, args.id).skill_md)
    else:
        body = None
        if args.body_file is not None:
            body = (sys.stdin.read() if args.body_file == "-" else Path(args.body_file).read_text())
        fields.update(name=args.name, description=args.description, body=body)
    result = ops.edit(home, load_config(home), args.id, idempotency_key=args.idempotency_key, **fields)
    if args.json:
        emit_json(result.as_data())
    else:
        print(f"{result.id}: " + (f"changed {', '.join(result.changed)}" if result.changed else "no change"))
    return 0


def _in_editor(text: str) -> str:
    """Open ``text`` in $VISUAL / $EDITOR (default vi) and return what was saved."""
    editor = os.environ.get("VISUAL") or os.environ.get("EDITOR") or "vi"
    with tempfile.TemporaryDirectory(prefix="org-candidate-") as tmp:
        path = Path(tmp) / "SKILL.md"
        path.write_text(text)
        proc = subprocess.run(shlex.split(editor) + [str(path)])
        if proc.returncode != 0:
            raise EditorFailed(f"the editor ({editor}) exited with {proc.returncode}; nothing was changed",
                               hint="fix $EDITOR or use --name/--description/--body-file")
        return path.read_text()
