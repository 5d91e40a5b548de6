"""``org watch``: a live terminal view of the org, grouped as *needs you*, *running* and
*recently ended*; open a run, approve or reject a decision, quit.

It reads state.db only, through one read-only connection polled every ``--interval`` seconds
(no transaction is held between polls, so writers and checkpoints never wait for it), and sends
the org nothing: watching costs the org nothing. A decision taken here is the same durable
``human`` write as ``org decide`` (``roles.operations.decide``), with its own idempotency key.
Drawn with rich's Live on the alternate screen; fits 80×24 and works over SSH. Every key that
arrives is handled, in order (``scripts/cli/keys.py``), however many come between two draws. A
run's page keeps its stop reason, the hint and the failing output on top, and its transcript in a
pane below that scrolls.
"""
from __future__ import annotations

import sys
import termios
import tty
import uuid
from dataclasses import dataclass, field

from scripts.cli.commands.status import of, place
from scripts.cli.keys import KeyReader
from scripts.cli.output import home_of
from state_db import views
from state_db.queries import decisions
from state_db.connection import connect
from state_db.kernel.errors import OrgError, StateError
from state_db.text import one_line, visible
from state_db.vocab import DecisionStatus

NAME = "watch"
HELP = "live view of the org: what needs you, what runs, what ended; open a run, approve or reject a decision"
KEYS = "↑↓ select · enter open · a approve · r reject · x dismiss · b back · q quit"
RUN_KEYS = "↑↓ scroll · PgUp/PgDn · g/G top/end · a approve · r reject · b back · q quit"
_UP, _DOWN, _ENTER = {b"\x1b[A", b"\x1bOA", b"k"}, {b"\x1b[B", b"\x1bOB", b"j"}, {b"\r", b"\n", b"o"}
_PAGE_UP, _PAGE_DOWN = {b"\x1b[5~", b"u"}, {b"\x1b[6~", b" ", b"d"}
_PAGE = 10
_FAILING_TAIL = 5          # lines of the failing check's output the run page keeps on top


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
    items: list[tuple[str, str]] = field(default_factory=list)    # selectable: ("decision"|"run"|"unrunnable", id)
    scroll: int | None = None                     # the run page's transcript: first line shown (None: its end)
    pane_room: int = 10                           # lines the transcript pane had at the last draw
    pane_lines: int = 0                           # lines the transcript had at the last draw
    pane_cache: tuple | None = None               # (what it was read at, its lines)


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
    keys = KeyReader(fd)
    try:
        tty.setcbreak(fd)
        with Live(console=console, screen=True, auto_refresh=False) as live:
            while True:
                live.update(draw(conn, screen, console.size.width, console.size.height), refresh=True)
                # every key that came since the last draw, in order (a burst is never cut to one)
                for key in keys.read(interval):
                    if not handle(key, screen, conn, home):
                        return 0
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
        conn.close()


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
        screen.open_run, screen.message, screen.scroll = None, "", None
    elif screen.open_run is not None and key in _UP | _DOWN | _PAGE_UP | _PAGE_DOWN | {b"g", b"G"}:
        scroll_pane(screen, key)
    elif key in _UP:
        screen.cursor = max(0, screen.cursor - 1)
    elif key in _DOWN:
        screen.cursor = min(max(0, len(screen.items) - 1), screen.cursor + 1)
    elif key in _ENTER and screen.open_run is None and screen.items:
        kind, ident = screen.items[min(screen.cursor, len(screen.items) - 1)]
        screen.open_run = _run_of(conn, ident) if kind == "decision" else ident
    elif key == b"x":
        screen.message = _dismiss(home, screen)
    elif key in (b"a", b"r"):
        did = _selected_decision(screen, conn)
        verdict = "approve" if key == b"a" else "reject"
        if did is None:
            screen.message = "select a decision first (needs you), or open a run that waits for one"
        else:
            screen.confirm = (verdict, did)
    return True


def scroll_pane(screen: Screen, key: bytes) -> None:
    """Move the run page's transcript pane; at its end it follows new entries again."""
    last = max(0, screen.pane_lines - screen.pane_room)
    top = last if screen.scroll is None else screen.scroll
    step = {**dict.fromkeys(_UP, -1), **dict.fromkeys(_DOWN, 1), **dict.fromkeys(_PAGE_UP, -_PAGE),
            **dict.fromkeys(_PAGE_DOWN, _PAGE)}
    top = 0 if key == b"g" else last if key == b"G" else top + step[key]
    top = max(0, min(last, top))
    screen.scroll = None if top >= last else top


def decide(home, decision_id: str, verdict: str) -> str:
    """The human's decision, exactly as ``org decide`` records it; a one-line outcome."""
    from roles.operations.decide import decide as record
    from state_db.kernel import config as config_mod

    try:
        cfg = config_mod.load_config(home)
        result = record(home, cfg, decision_id, verdict, idempotency_key=f"watch-{uuid.uuid4().hex}")
    except OrgError as exc:          # shown on the screen; the watch goes on
        return exc.line()
    wake = "" if result.wake in ("push", "outbox") else f" ({result.wake})"
    return f"{decision_id}: {result.status}{wake}"


def _dismiss(home, screen: Screen) -> str:
    """Take the selected verify_unrunnable run out of "needs you", as ``org dismiss`` does."""
    from roles.operations.dismiss import dismiss

    key = _cursor_key(screen) if screen.open_run is None else None
    if key is None or key[0] != "unrunnable":
        return "select a verify_unrunnable run under needs you first"
    try:
        done = dismiss(home, key[1], idempotency_key=f"watch-{uuid.uuid4().hex}")
    except OrgError as exc:          # shown on the screen; the watch goes on
        return exc.line()
    return f"{done.id}: dismissed"


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
    head = _line(_header(st))
    foot = Text(one_line(_footer(screen)), style="reverse", overflow="ellipsis", no_wrap=True)
    room = max(1, height - 2)
    if screen.open_run:
        return Group(head, *run_page(conn, screen, width, room), foot)
    lines = overview_lines(st, screen)
    selected = next((i for i, (_, key) in enumerate(lines) if key is not None and key == _cursor_key(screen)), 0)
    start = max(0, min(selected - room // 2, len(lines) - room))
    shown = [_line(text) for text, _ in lines[start:start + room]]
    shown += [Text("")] * (room - len(shown))          # the keys stay on the last line
    return Group(head, *shown, foot)


def _line(markup: str):
    """One screen line: cut with an ellipsis at the terminal's width, never wrapped. Every line
    drawn passes ``one_line``, so no control character an agent wrote reaches the terminal, from
    whichever field it came (markup never needs one)."""
    from rich.text import Text
    text = Text.from_markup(one_line(markup), overflow="ellipsis")
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
    keys = RUN_KEYS if screen.open_run else KEYS
    return f" {screen.message} · {keys}" if screen.message else f" {keys}"


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
        pick("unrunnable", r["id"], f"{r['id']} verify_unrunnable: {_esc(r['stop']['detail'] or '')}  (x dismiss)")
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
                             f"${r['cost_usd']['used']:.4f}  {_esc(place(r['workspace']))}  {_esc(r['goal'])}")
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
            f"{_time(el)}  {_esc(place(r['workspace']))}")


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


def run_page(conn, screen: Screen, width: int, room: int) -> list:
    """A run's page in ``room`` lines: what must always be seen on top (phase and caps, the stop
    reason with its hint, wrapped, never cut; the failing check's output), then the transcript
    pane, scrollable, in the lines left."""
    top = [_line(text) for text in run_top(conn, screen.open_run, width)]
    top = top[:max(1, room - 4)]                   # the pane keeps a few lines whatever happens
    pane = transcript_pane(conn, screen)
    pane_room = room - len(top) - 1
    screen.pane_room, screen.pane_lines = pane_room, len(pane)
    last = max(0, len(pane) - pane_room)
    first = last if screen.scroll is None else min(screen.scroll, last)
    shown = pane[first:first + pane_room]
    where = f"{first + 1}-{first + len(shown)} of {len(pane)}" if pane else "empty"
    lines = [*top, _line(f"[bold]TRANSCRIPT[/] ({where}{', following' if screen.scroll is None else ''})"),
             *(_line(_esc_keep(text)) for text in shown)]
    from rich.text import Text
    return lines + [Text("")] * (room - len(lines))


def run_top(conn, work_id: str, width: int) -> list[str]:
    """The run page's fixed part as markup lines, long text wrapped to ``width``."""
    from scripts.cli.commands.show import run_line
    from state_db.queries.transcript import failing_output
    from state_db.queries.verdicts import latest_eval_verdict
    try:
        r = views.run_view(conn, work_id)
    except StateError as exc:
        return [_esc(f"error[{exc.code}]: {exc}")]
    out = [f"[bold]{_esc(r['id'])}[/]  {_esc(r['goal'])}", _esc_keep(run_line(r))]
    if r["stop"]:
        out += wrapped(f"stop: {r['stop']['reason']} — {r['stop']['detail'] or ''}", width, "[bold red]", "      ")
        out += wrapped(f"next: {r['stop']['hint']}", width, "", "      ")
    if r["baseline"] and not r["verdict"]:
        line = r["baseline"]["line"]
        out += wrapped(line if line.startswith("baseline") else f"baseline: {line}", width)
    if r["verdict"]:
        out += wrapped(f"verdict (iteration {r['verdict']['iteration']}): {r['verdict']['line']}", width)
        for f in failing_output(latest_eval_verdict(conn, work_id))[:1]:
            out += wrapped(f"failing: {f['command'] or f['name']}", width, "[yellow]", "  ")
            tail = [ln for ln in visible(f["output"]).splitlines() if ln.strip()][-_FAILING_TAIL:]
            out += [_esc_keep("  " + ln) for ln in tail]
    if r["current_tool"]:
        out.append(f"now: {_esc(r['current_tool']['call'])} ({r['current_tool']['for_s']:.0f}s)")
    for d in decisions.of_work(conn, work_id, DecisionStatus.PENDING):
        out.append(f"[yellow]waits for {d.id}[/]: {_esc(d.question)}  (a approve · r reject)")
    return out


def transcript_pane(conn, screen: Screen) -> list[str]:
    """The open run's transcript as short lines (outputs cut to a few lines) for the pane, read
    again only when it changed (``transcript.version``)."""
    from scripts.cli.transcript_text import lines
    from state_db.queries.transcript import of_work, version
    key = (screen.open_run, version(conn, screen.open_run))
    if screen.pane_cache is None or screen.pane_cache[0] != key:
        screen.pane_cache = (key, lines(of_work(conn, screen.open_run), full=False))
    return screen.pane_cache[1]


def wrapped(text: str, width: int, style: str = "", indent: str = "  ") -> list[str]:
    """``text`` (shown as text, not markup) wrapped to ``width`` columns; the first line styled."""
    import textwrap
    rows = textwrap.wrap(" ".join(visible(str(text)).split()), width=max(20, width - 1),
                         subsequent_indent=indent) or [""]
    first = f"{style}{_esc_keep(rows[0])}[/]" if style else _esc_keep(rows[0])
    return [first, *(_esc_keep(r) for r in rows[1:])]


def _esc_keep(text: str) -> str:
    """Text shown as it is (no rich markup), its spacing kept."""
    from rich.markup import escape
    return escape(visible(text).replace("\t", "    "))


def _esc(text: str) -> str:
    """Text shown as it is (no rich markup), on one line."""
    from rich.markup import escape
    return escape(one_line(" ".join(str(text).split())))

