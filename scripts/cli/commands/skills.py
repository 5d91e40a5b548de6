"""``org skills [list|show NAME|retire NAME|export NAME --to DIR]``: approved skills, their use and
their origin; ``export`` writes ``DIR/NAME/SKILL.md`` in the Agent Skills layout, ready to drop into a
Claude Code project's ``.claude/skills/`` (or ``~/.claude/skills/``).

A skill no run has carried for ``knowledge.skill_unused_days`` (default 90) is shown as
proposed for retirement; only a human retires it (a durable write as actor ``human``).
"""
from __future__ import annotations

import time

from scripts.cli.output import add_json, emit_json, home_of, read_conn, table
from state_db.vocab import Actor

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


def _unused_days(args) -> int:
    from state_db import config as config_mod
    home = home_of(args)
    return config_mod.load_config(home).knowledge.skill_unused_days


def _when(at) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(at)) if at else "never"


def run(args) -> int:
    from skills import registry

    action = args.action or "list"
    if action == "retire":
        return _retire(args)
    if action == "export":
        return _export(args)
    days = _unused_days(args)
    conn = read_conn(args)
    try:
        if action == "show":
            row = registry.skill(conn, args.name)
            row.update(next((d for d in registry.listing(conn, time.time(), days, include_retired=True)
                             if d["name"] == args.name), {}))
        else:
            rows = registry.listing(conn, time.time(), days, include_retired=getattr(args, "all", False))
    finally:
        conn.close()
    if action == "show":
        if args.json:
            emit_json(row)
            return 0
        from skills.skillmd import render
        print(f"{row['name']}  {row['status']}  used by {row['use_count']} run(s), last {_when(row['last_used_at'])}"
              + ("  — proposed for retirement" if row.get("retirement_proposed") else ""))
        o = row["origin"]
        print(f"origin: candidate {o.get('candidate')}, approved by {o.get('approved_by')}; "
              f"runs {', '.join(o.get('runs', []))}; notes {', '.join(o.get('source_notes', []))}")
        print(f"file: {home_of(args).root / row['path']}\n")
        print(render(registry.text_of(row)))
        return 0
    if args.json:
        emit_json(rows)
        return 0
    if not rows:
        print("no skills yet")
        return 0
    print(table([[r["name"], r["status"], r["use_count"], _when(r["last_used_at"]), r["idle_days"],
                  f"proposed for retirement (unused {days}+ days)" if r["retirement_proposed"] else ""]
                 for r in rows], ["NAME", "STATUS", "USES", "LAST USED", "IDLE DAYS", "NOTE"]))
    return 0


def _retire(args) -> int:
    from skills import review
    from state_db.writer import StateWriter

    home = home_of(args).require()
    writer = StateWriter(home.db_path, Actor.HUMAN)
    try:
        out = review.retire(writer, args.name, key=args.idempotency_key)
    finally:
        writer.close()
    if args.json:
        emit_json(out)
    else:
        print(f"{out['name']}: retired" + ("" if out["changed"] else " (already)"))
    return 0


def _export(args) -> int:
    from pathlib import Path

    from skills import registry
    from skills.skillmd import write_folder

    conn = read_conn(args)
    try:
        row = registry.skill(conn, args.name)
    finally:
        conn.close()
    from skills.errors import SkillError
    try:
        path = write_folder(registry.text_of(row), Path(args.to).expanduser())
    except OSError as exc:
        raise SkillError(f"cannot write {args.name} into {args.to}: {exc.strerror or exc}", code="export_failed",
                         hint="give --to a folder you can write to") from None
    if args.json:
        emit_json({"name": row["name"], "file": str(path), "status": row["status"]})
    else:
        print(f"{row['name']}: wrote {path}" + ("" if row["status"] == "active" else f" (the skill is {row['status']})"))
        print(f"  for Claude Code: put the folder {path.parent.name}/ in a project's .claude/skills/ "
              "(or ~/.claude/skills/)")
    return 0
