"""``org knowledge``: what the org has learned, raw notes → curated notes → candidates → skills.

Counts at each stage, the evidence behind each item (runs, notes, signals), runs whose retro
was skipped because they failed on their environment, and each skill's uses with the runs that
carried it. ``--json`` prints the same as one object.
"""
from __future__ import annotations

import time

from scripts.cli.output import add_json, emit_json, read_conn, table

NAME = "knowledge"
HELP = "what the org has learned: raw notes → curated notes → candidates → skills, with evidence and use"


def add_arguments(p) -> None:
    add_json(p)


def _runs(ids: list[str], n: int = 4) -> str:
    return ", ".join(ids[:n]) + (f" +{len(ids) - n}" if len(ids) > n else "") if ids else "-"


def run(args) -> int:
    from skills.overview import overview

    conn = read_conn(args)
    try:
        data = overview(conn)
    finally:
        conn.close()
    if args.json:
        emit_json(data)
        return 0
    c, raw = data["counts"], data["raw"]
    print(f"raw notes {c['raw']} → curated {c['curated']} ({c['recommended']} recommended) → "
          f"candidates {c['candidates']} ({c['pending']} pending) → skills {c['skills']}\n")
    status = ", ".join(f"{n} {s}" for s, n in sorted(raw["by_status"].items())) or "none"
    kinds = ", ".join(f"{n} {k}" for k, n in raw["by_kind"].items()) or "none"
    print(f"RAW NOTES: {status}; by kind: {kinds}; from {raw['runs']} run(s)")
    for s in raw["skipped_runs"]:
        print(f"  no notes from {s['run']}: {s['why']}")
    print("\nCURATED NOTES")
    print(table([[x["id"], x["kind"], x["tier"], x["score"] if x["score"] is not None else "-", len(x["notes"]),
                  _runs(x["runs"]), x["topic"][:60]] for x in data["curated"]],
                ["ID", "KIND", "TIER", "SCORE", "NOTES", "RUNS", "TOPIC"]) if data["curated"] else "  none yet")
    for x in data["curated"]:
        if x["tier"] == "recommended":
            for name, s in x["signals"].items():
                print(f"  {x['id']} [{'x' if s.get('ok') else ' '}] {name}: {s.get('why', '')}")
    print("\nCANDIDATES")
    print(table([[x["id"], x["name"], x["status"], x["score"], x["batch"] or "", x["curated"] or "", _runs(x["runs"])]
                 for x in data["candidates"]], ["ID", "NAME", "STATUS", "SCORE", "BATCH", "FROM", "RUNS"])
          if data["candidates"] else "  none yet")
    print("\nSKILLS")
    print(table([[x["name"], x["status"], x["uses"], _when(x["last_used_at"]), _runs(x["used_in"]),
                  _runs(x["learned_from"]), x["candidate"] or ""] for x in data["skills"]],
                ["NAME", "STATUS", "USES", "LAST USED", "USED IN", "LEARNED FROM", "CANDIDATE"])
          if data["skills"] else "  none yet")
    if c["pending"]:
        print("\nnext: 'org candidates list' and 'org candidates show ID' to review, "
              "'org candidates approve ID' to make one a skill")
    return 0


def _when(at) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(at)) if at else "never"
