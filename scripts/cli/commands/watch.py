"""``org watch``: a live terminal view of the org, grouped as *needs you*, *running* and
*recently ended*; open a run, approve or reject a decision, quit.

It reads state.db only, through one read-only connection polled every ``--interval`` seconds
(no transaction is held between polls, so writers and checkpoints never wait for it), and sends
the org nothing: watching costs the org nothing. A decision taken here is the same durable
``human`` write as ``org decide`` (``roles.operations.decide``), with its own idempotency key.
Drawn with rich's Live on the alternate screen; fits 80×24 and works over SSH.
"""
from __future__ import annotations

import os
import select
import sys
import termios
import tty
import uuid
from dataclasses import dataclass, field

from scripts.cli.commands.status import of
from scripts.cli.output import home_of
from state_db import views
from state_db.queries import decisions
from state_db.queries.iterations import recent as recent_iterations
from state_db.queries.verdicts import latest_eval_verdicts
from state_db.connection import connect
from state_db.errors import OrgError, StateError
from state_db.vocab import DecisionStatus

NAME = "watch"
HELP = "live view of the org: what needs you, what runs, what ended; open a run, approve or reject a decision"
KEYS = "↑↓ select · enter open · a approve · r reject · b back · q quit"
_UP, _DOWN, _ENTER = {b"\x1b[A", b"k"}, {b"\x1b[B", b"j"}, {b"\r", b"\n", b"o"}


class NotATerminal(StateError):
    code = "not_a_terminal"


def add_arguments(p) -> None:
    p.add_argument("--interval", type=float, default=1.0, help="seconds between reads of state.db (default 1)")


@dataclass
class Screen:
    """What the viewer looks at: the selection, an open run, a question awaiting y/n, a message."""

    cursor: int = 0
    open_run: str | None = None
    confirm: tuple[str, str] | None = None        # (verdict, decision id)
    message: str = ""
    items: list[tuple[str, str]] = field(default_factory=list)    # selectable: ("decision"|"run", id)


def run(args) -> int:
    from rich.console import Console
    from rich.live import Live

    home = home_of(args).require()
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise NotATerminal("org watch needs a terminal", hint="use 'org status' (or 'org status --json') instead")
    conn = connect(home.db_path, readonly=True)
    console = Console()
    screen = Screen()
    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    interval = max(0.1, args.interval)
    try:
        tty.setcbreak(fd)
        with Live(console=console, screen=True, auto_refresh=False) as live:
            while True:
                live.update(draw(conn, screen, console.size.width, console.size.height), refresh=True)
                key = read_key(fd, interval)
                if key and not handle(key, screen, conn, home):
                    return 0
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
        conn.close()


def read_key(fd: int, timeout: float) -> bytes | None:
    """One key press (an escape sequence whole), or None after ``timeout`` seconds."""
    ready, _, _ = select.select([fd], [], [], timeout)
    return os.read(fd, 16) if ready else None


def handle(key: bytes, screen: Screen, conn, home) -> bool:
    """Apply one key press to the screen; False to quit."""
    if screen.confirm is not None:
        verdict, did = screen.confirm
        screen.confirm = None
        screen.message = decide(home, did, verdict) if key in (b"y", b"Y") else f"{did}: not {verdict}d"
        return True
    if key in (b"q", b"Q", b"\x03"):
        return False
    if key in (b"b", b"\x1b", b"\x7f"):
        screen.open_run, screen.message = None, ""
    elif key in _UP:
        screen.cursor = max(0, screen.cursor - 1)
    elif key in _DOWN:
        screen.cursor = min(max(0, len(screen.items) - 1), screen.cursor + 1)
    elif key in _ENTER and screen.open_run is None and screen.items:
        kind, ident = screen.items[min(screen.cursor, len(screen.items) - 1)]
        screen.open_run = ident if kind == "run" else _run_of(conn, ident)
    elif key in (b"a", b"r"):
        did = _selected_decision(screen, conn)
        verdict = "approve" if key == b"a" else "reject"
        if did is None:
            screen.message = "select a decision first (needs you), or open a run that waits for one"
        else:
            screen.confirm = (verdict, did)
    return True


def decide(home, decision_id: str, verdict: str) -> str:
    """The human's decision, exactly as ``org decide`` records it; a one-line outcome."""
    from roles.operations.decide import decide as record
    from state_db import config as config_mod

    try:
        cfg = config_mod.load_config(home)
        result = record(home, cfg, decision_id, verdict, idempotency_key=f"watch-{uuid.uuid4().hex}")
    except OrgError as exc:          # shown on the screen; the watch goes on
        return exc.line()
    wake = "" if result.wake in ("push", "outbox") else f" ({result.wake})"
    return f"{decision_id}: {result.status}{wake}"


def _run_of(conn, decision_id: str) -> str | None:
    found = decisions.decision(conn, decision_id)
    return found.work_id if found else None


def _selected_decision(screen: Screen, conn) -> str | None:
    if screen.open_run is not None:
        waiting = decisions.of_work(conn, screen.open_run, DecisionStatus.PENDING)
        return waiting[0].id if waiting else None
    if not screen.items:
        return None
    kind, ident = screen.items[min(screen.cursor, len(screen.items) - 1)]
    return ident if kind == "decision" else None


# -- drawing ---------------------------------------------------------------------------------

def draw(conn, screen: Screen, width: int, height: int):
    """The whole screen as a rich renderable, cut to ``height`` lines of ``width`` columns."""
    from rich.console import Group
    from rich.text import Text

    st = views.org_view(conn)
    lines = detail_lines(conn, screen.open_run) if screen.open_run else overview_lines(st, screen)
    head = _line(_header(st))
    foot = Text(_footer(screen), style="reverse", overflow="ellipsis", no_wrap=True)
    room = max(1, height - 2)
    selected = next((i for i, (_, key) in enumerate(lines) if key is not None and key == _cursor_key(screen)), 0)
    start = max(0, min(selected - room // 2, len(lines) - room))
    shown = [_line(text) for text, _ in lines[start:start + room]]
    shown += [Text("")] * (room - len(shown))          # the keys stay on the last line
    return Group(head, *shown, foot)


def _line(markup: str):
    """One screen line: cut with an ellipsis at the terminal's width, never wrapped."""
    from rich.text import Text
    text = Text.from_markup(markup, overflow="ellipsis")
    text.no_wrap = True
    return text


def _cursor_key(screen: Screen):
    return screen.items[screen.cursor] if screen.items and screen.cursor < len(screen.items) else None


def _header(st: dict) -> str:
    session = (st["session"] or {}).get("status", "never started")
    if (st["session"] or {}).get("alive") is False:
        session = "not running (its processes are gone: scripts/start-org)"
    busy = [r for r in st["roles"] if r["activity"] == "busy"]
    u = st["usage"]
    return (f"[bold]org watch[/]  session {session} · {len(st['roles'])} roles, {len(busy)} busy · "
            f"{u['calls']} model calls · ${u['cost_usd']:.4f}")


def _footer(screen: Screen) -> str:
    if screen.confirm is not None:
        verdict, did = screen.confirm
        return f" {verdict} {did}? y / n "
    return f" {screen.message} · {KEYS}" if screen.message else f" {KEYS}"


def overview_lines(st: dict, screen: Screen) -> list[tuple[str, tuple | None]]:
    """Lines of the main screen, each with the selectable item it stands for (or None)."""
    lines: list[tuple[str, tuple | None]] = []
    needs = st["needs_you"]
    items: list[tuple[str, str]] = []

    def pick(kind: str, ident: str, text: str) -> None:
        items.append((kind, ident))
        lines.append((f"  {text}", (kind, ident)))

    count = (len(needs["decisions"]) + len(needs["batches"]) + len(needs["unrunnable"]) + len(needs["failed_roles"])
             + len(needs.get("proposals", [])))
    lines.append((f"[bold yellow]NEEDS YOU[/] ({count})", None))
    for d in needs["decisions"]:
        pick("decision", d["id"], f"[yellow]{d['id']}[/] {d['work_id']}  {_esc(d['question'])}")
    for b in needs["batches"]:
        lines.append((f"  batch {b['id']}: skill candidates to review — 'org candidates'", None))
    for r in needs["unrunnable"]:
        pick("run", r["id"], f"{r['id']} verify_unrunnable: {_esc(r['stop']['detail'] or '')}")
    for inst in needs["failed_roles"]:
        lines.append((f"  [red]{inst} failed[/]: not restarted — 'org doctor'", None))
    proposals = needs.get("proposals", [])
    if proposals:
        lines.append((f"  {len(proposals)} work proposal(s), recommended {proposals[0]['id']}: "
                      f"{_esc(proposals[0]['title'])} — 'org discover list'", None))
    running = st["runs"]["running"]
    lines.append(("", None))
    lines.append((f"[bold green]RUNNING[/] ({len(running)})", None))
    for r in running:
        pick("run", r["id"], _run_row(r))
        now = r["current_tool"]["call"] if r["current_tool"] else ""
        verdict = r["verdict"]["line"] if r["verdict"] else (r["baseline"] or {}).get("line", "")
        lines.append(("    " + _esc(" · ".join(x for x in (now, verdict) if x) or r["goal"]), None))
    ended = st["runs"]["recent_ended"]
    lines.append(("", None))
    lines.append((f"[bold]RECENTLY ENDED[/] ({len(ended)})", None))
    for r in ended:
        pick("run", r["id"], f"{r['id']}  {r['stop']['reason']:<17} {r['iteration']['committed']} it  "
                             f"${r['cost_usd']['used']:.4f}  {_esc(r['goal'])}")
    screen.items = items
    screen.cursor = min(screen.cursor, max(0, len(items) - 1))
    if items:
        lines = [(("[reverse]›[/] " + t[2:]) if k == items[screen.cursor] else t, k) for t, k in lines]
    return lines


def _run_row(r: dict) -> str:
    it, tok, cost, el = r["iteration"], r["tokens"], r["cost_usd"], r["elapsed_s"]
    return (f"{r['id']}  [cyan]{r['phase']:<9}[/] {of(it['n'], it['max']):<5} "
            f"tok {bar(tok['used'], tok['cap'], str(tok['used']))} "
            f"$ {bar(cost['used'], cost['cap'], format(cost['used'], '.4f'))} "
            f"{_time(el)}")


def _time(el: dict) -> str:
    return f"{el['used']:.0f}s" if el["cap"] is None else f"{el['used']:.0f}/{el['cap']:g}s"


def bar(used: float, cap: float | None, shown: str, width: int = 6) -> str:
    """``███░░░ 52%`` against a cap; ``shown`` (the amount used) without one."""
    if not cap:
        return shown
    share = min(1.0, used / cap)
    full = round(share * width)
    color = "red" if share >= 0.9 else "yellow" if share >= 0.7 else "green"
    return f"[{color}]{'█' * full}{'░' * (width - full)}[/] {share * 100:.0f}%"


def detail_lines(conn, work_id: str) -> list[tuple[str, None]]:
    """A run's page: phase and caps, baseline, verdict, current tool, decisions, iterations."""
    from scripts.cli.commands.show import run_line
    try:
        r = views.run_view(conn, work_id)
    except StateError as exc:
        return [(f"error[{exc.code}]: {exc}", None)]
    out = [f"[bold]{r['id']}[/]  {_esc(r['goal'])}", run_line(r)]
    if r["stop"]:
        out.append(f"stop: {r['stop']['reason']} — {_esc(r['stop']['detail'] or '')}")
    if r["baseline"]:
        line = r["baseline"]["line"]
        out.append(_esc(line if line.startswith("baseline") else f"baseline: {line}"))
    if r["verdict"]:
        out.append(f"verdict (iteration {r['verdict']['iteration']}): {_esc(r['verdict']['line'])}")
    if r["current_tool"]:
        out.append(f"now: {_esc(r['current_tool']['call'])} ({r['current_tool']['for_s']:.0f}s)")
    for d in decisions.of_work(conn, work_id, DecisionStatus.PENDING):
        out.append(f"[yellow]waits for {d.id}[/]: {_esc(d.question)}  (a approve · r reject)")
    its = recent_iterations(conn, work_id, 12)
    if its:
        judged = latest_eval_verdicts(conn, work_id, after=its[-1].n - 1)
        out.append("")
        out.append("[bold]ITER  ACT      VERDICT  TOKENS   COST     LESSON[/]")
        out += [f"{i.n:<5} {i.act_status:<8} {judged[i.n].outcome if i.n in judged else '-':<8} "
                f"{i.input_tokens + i.output_tokens:<8} ${i.cost_usd:<7.4f} {_esc(i.lesson or '')}" for i in its]
    return [(line, None) for line in out]


def _esc(text: str) -> str:
    """Text shown as it is (no rich markup), on one line."""
    from rich.markup import escape
    return escape(" ".join(str(text).split()))

