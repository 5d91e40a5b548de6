"""``org skills [list|show NAME|retire NAME|export NAME --to DIR|eval NAME]``: approved skills, their
use and their origin; ``eval`` replays ended items with and without a skill (or a pending candidate)
and shows goal rate, iterations to goal and tokens with, without and the difference; ``export`` writes ``DIR/NAME/SKILL.md`` in the Agent Skills layout, ready to drop into a
Claude Code project's ``.claude/skills/`` (or ``~/.claude/skills/``).

A skill no run has carried for ``knowledge.skill_unused_days`` (default 90) is shown as
proposed for retirement; only a human retires it (a durable write as actor ``human``). Each
action is an operation (roles/operations/skills.py) whose result this prints, as text or data.
"""
from __future__ import annotations

import time

from roles.operations import skills as ops
from roles.operations.skills import Exported, SkillList, SkillView
from scripts.cli.main import UsageError
from scripts.cli.output import add_json, emit_json, home_of, table
from state_db.kernel.config import load_config

NAME = "skills"
HELP = "list approved skills with use counts and last use, show one, retire one, or export one"


def add_arguments(p) -> None:
    add_json(p)
    sub = p.add_subparsers(dest="action", metavar="ACTION", help="what to do (default: list)")
    ls = sub.add_parser("list", help="active skills (or --all), with use counts, last use and retirement proposals")
    ls.add_argument("--all", action="store_true", help="include retired skills")
    add_json(ls)
    show = sub.add_parser("show", help="one skill: SKILL.md, use and origin (candidate, notes, runs)")
    show.add_argument("name", help="skill name")
    add_json(show)
    retire = sub.add_parser("retire", help="retire a skill: loop-agents stop carrying it")
    retire.add_argument("name", help="skill name")
    retire.add_argument("--idempotency-key", help="the same key twice retires once")
    add_json(retire)
    export = sub.add_parser("export", help="write DIR/NAME/SKILL.md (Agent Skills layout, e.g. for .claude/skills/)")
    export.add_argument("name", help="skill name")
    export.add_argument("--to", required=True, metavar="DIR", help="folder to write the skill's folder into")
    add_json(export)
    ev = sub.add_parser("eval", help="replay ended items with and without a skill (or candidate): WITH / WITHOUT / Δ")
    ev.add_argument("name", help="skill name (or a pending candidate's name or id)")
    ev.add_argument("--items", type=int, metavar="N", help="ended items to replay (default: [learning] replay_items)")
    ev.add_argument("--item", action="append", default=[], metavar="ID",
                    help="replay this ended work item (repeatable; instead of choosing)")
    ev.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                    help="wait up to this long for the replays to end and print the figures")
    add_json(ev)


def _when(at) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(at)) if at else "never"


def run(args) -> int:
    action = args.action or "list"
    home = home_of(args).require()
    if action == "eval":
        if args.items is not None and args.items < 1:
            raise UsageError("--items must be at least 1")
        from roles.operations import replays
        result = replays.evaluate(home, load_config(home), args.name, items=args.items, only=args.item or None,
                                  wait_s=max(args.wait, 0.0))
        text = eval_text(result)
    elif action == "retire":
        result = ops.retire(home, args.name, idempotency_key=args.idempotency_key)
        text = f"{result.name}: retired" + ("" if result.changed else " (already)")
    elif action == "export":
        result = ops.export(home, args.name, args.to)
        text = export_text(result)
    elif action == "show":
        result = ops.show(home, load_config(home), args.name)
        text = show_text(result, home.root)
    else:
        result = ops.listing(home, load_config(home), include_retired=getattr(args, "all", False))
        text = listing_text(result)
    if args.json:
        emit_json(result.as_data())
    else:
        print(text)
    return 0


def show_text(result: SkillView, root) -> str:
    from skills.replay import line
    row = result.skill
    o = row["origin"]
    return "\n".join([
        f"{row['name']}  {row['status']}  used by {row['use_count']} run(s), last {_when(row['last_used_at'])}"
        + ("  — proposed for retirement" if row.get("retirement_proposed") else ""),
        f"origin: candidate {o.get('candidate')}, approved by {o.get('approved_by')}; "
        f"runs {', '.join(o.get('runs', []))}; notes {', '.join(o.get('source_notes', []))}",
        *[f"replayed ({r['subject']}): {line(r)}" for r in row.get("replays") or []],
        f"file: {root / row['path']}\n", result.skill_md])


def listing_text(result: SkillList) -> str:
    if not result.rows:
        return "no skills yet"
    return table([[r["name"], r["status"], r["use_count"], _when(r["last_used_at"]), r["idle_days"],
                   f"proposed for retirement (unused {result.unused_days}+ days)" if r["retirement_proposed"] else ""]
                  for r in result.rows], ["NAME", "STATUS", "USES", "LAST USED", "IDLE DAYS", "NOTE"])


def eval_text(result) -> str:
    from skills.replay import line
    if not result.items:
        return f"{result.id}: {result.name} not replayed: {result.reason}"
    head = (f"{result.id}: replaying {result.name} on {len(result.items)} item(s) "
            f"({', '.join(i['id'] for i in result.items)}), each with and without it; "
            f"{len(result.submitted)} run(s) submitted now, the rest as replays end")
    if result.summary is None:
        return head + f"\n  the figures: org skills show {result.name}  (or wait for them: --wait SECONDS)"
    return head + "\n  " + line(result.summary)


def export_text(result: Exported) -> str:
    from pathlib import Path
    folder = Path(result.file).parent.name
    return (f"{result.name}: wrote {result.file}" + ("" if result.status == "active" else f" (the skill is {result.status})")
            + f"\n  for Claude Code: put the folder {folder}/ in a project's .claude/skills/ (or ~/.claude/skills/)")
