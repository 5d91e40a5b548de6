"""``org logs``: the roles' JSON-lines logs, merged by time; ``-f`` follows them."""
from __future__ import annotations

import time
from pathlib import Path

import orjson

from scripts.cli.output import add_json, home_of
from state_db.text import one_line

NAME = "logs"
HELP = "show the roles' logs (merged by time); -f follows new lines"


def add_arguments(p) -> None:
    p.add_argument("-f", "--follow", action="store_true", help="keep printing new lines")
    p.add_argument("--role", help="only this role or instance (e.g. loop-agent or loop-agent-1)")
    p.add_argument("-n", "--lines", type=int, default=50, help="how many recent lines (default 50)")
    add_json(p)


def _files(logs_dir: Path, role: str | None) -> list[Path]:
    files = sorted(logs_dir.glob("*.log"))
    if role:
        files = [f for f in files if f.stem == role or f.stem.startswith(role + "-") or f.stem.rsplit("-", 1)[0] == role]
    return files


def _known(home, files: list[Path]) -> list[str]:
    """The names ``--role`` accepts: every role, the configured instances, the logs there are."""
    from roles.base.instances import org_instances
    from state_db.kernel import config as config_mod
    from state_db.vocab import Actor

    cfg = config_mod.load_config(home)
    names = {str(a) for a in Actor if a != Actor.HUMAN} | {s.instance for s in org_instances(cfg.org.loop_agents, cfg.org.eval_agents)}
    return sorted(names | {f.stem for f in files})


def _check_role(home, role: str) -> None:
    """Raises NotFound ``unknown_role`` when ``role`` names no role, instance or log file."""
    from state_db.kernel.errors import NotFound

    every = sorted(home.logs_dir.glob("*.log")) if home.logs_dir.is_dir() else []
    known = _known(home, every)
    if role not in known and not _files(home.logs_dir, role):
        raise NotFound(f"no role or instance named {role!r}", code="unknown_role",
                       hint=f"use one of: {', '.join(known)} (or leave out --role)")


def _parse(line: str, source: str) -> dict:
    """One log line as a dict; a line that does not name its instance (an older line, a plain
    traceback) is named after its file, ``<instance>.log``."""
    try:
        value = orjson.loads(line)
        entry = value if isinstance(value, dict) else {"event": line}
    except orjson.JSONDecodeError:
        entry = {"event": line.rstrip()}
    entry.setdefault("instance", source)
    return entry


def _show(entry: dict, as_json: bool) -> None:
    if as_json:
        print(orjson.dumps(entry).decode())
        return
    rest = {k: v for k, v in entry.items() if k not in ("timestamp", "instance", "event", "level", "role")}
    extra = " ".join(f"{k}={v}" for k, v in rest.items())
    # one line per entry: a newline inside an agent's text would otherwise forge an entry
    print(one_line(f"{entry.get('timestamp', '')} {entry.get('instance', '?'):<14} {entry.get('level', ''):<7} "
                   f"{entry.get('event', '')} {extra}".rstrip()))


def run(args) -> int:
    home = home_of(args).require()
    if args.role:
        _check_role(home, args.role)
    files = _files(home.logs_dir, args.role) if home.logs_dir.is_dir() else []
    entries = []
    for f in files:
        for line in f.read_text(errors="replace").splitlines()[-max(args.lines, 0):]:
            if line.strip():
                entries.append(_parse(line, f.stem))
    entries.sort(key=lambda e: str(e.get("timestamp", "")))
    for e in entries[-max(args.lines, 0):] if args.lines else []:
        _show(e, args.json)
    if not args.follow:
        return 0
    offsets = {f: f.stat().st_size for f in files}
    while True:  # until Ctrl-C
        for f in _files(home.logs_dir, args.role):
            size = f.stat().st_size
            start = offsets.get(f, 0)
            if size < start:  # rotated
                start = 0
            if size > start:
                with open(f, "rb") as fh:
                    fh.seek(start)
                    for line in fh.read().decode(errors="replace").splitlines():
                        if line.strip():
                            _show(_parse(line, f.stem), args.json)
                offsets[f] = size
        time.sleep(0.3)
