"""``org chat``: talk with the coordinator; announcements appear as they happen."""
from __future__ import annotations

import os
import sys
import threading

from scripts.cli.output import home_of
from state_db.connection import connect
from state_db.queries.events import after, last_id

NAME = "chat"
HELP = "an interactive session with the coordinator: slash commands always work, free text goes to its model"


def add_arguments(p) -> None:
    p.add_argument("--no-announcements", action="store_true", help="do not print announcements as they happen")


def _model(cfg, home: str | None):
    """The chat model when one is configured and reachable in principle; else None."""
    from scripts.cli.chat import ChatModel

    base_url = cfg.model.base_url or os.environ.get("ANTHROPIC_BASE_URL")
    if not (os.environ.get("ANTHROPIC_API_KEY") or base_url):
        return None
    if cfg.model.name not in cfg.prices:
        return None

    def client():
        import anthropic  # lazily: only when the human actually talks to the model
        return anthropic.Anthropic(api_key=os.environ.get("ANTHROPIC_API_KEY") or "local", base_url=base_url or None,
                                   max_retries=2, timeout=cfg.model.request_timeout_s)

    return ChatModel(client, cfg.model.name, home)


def _announcements(db_path, last: int, stop: threading.Event, out) -> None:
    conn = connect(db_path, readonly=True)
    while not stop.wait(0.3):
        for ev in after(conn, last, "announce"):
            last = ev.id
            out(f"\n[coordinator] {ev.data.get('text')}")
    conn.close()


def _respond(line: str, model, home: str | None) -> str:
    """The answer to one line: a slash command's output, or the model's reply and what it did."""
    from scripts.cli.chat import handle_slash

    if line.startswith("/"):
        return handle_slash(line, home)
    if model is None:
        return "no chat model is configured (set ANTHROPIC_API_KEY or ANTHROPIC_BASE_URL) — /help lists the commands"
    try:
        reply, done = model.ask(line)
    except Exception as exc:  # noqa: BLE001 - the model failing must not end the session
        return f"error[model_error]: the chat model failed ({type(exc).__name__}) — slash commands still work"
    return "\n".join([*(f"  did: {d}" for d in done), reply])


def run(args) -> int:
    from scripts.cli.chat import PROMPT, converse, line_reader
    from state_db.kernel import config as config_mod

    home = home_of(args).require()
    cfg = config_mod.load_config(home)
    model = _model(cfg, args.home)
    interactive = sys.stdin.isatty() and sys.stdout.isatty()
    read_line = line_reader(home.run_dir / "chat_history" if home.run_dir.is_dir() else None, interactive)
    stop = threading.Event()
    say = lambda text: print(text, flush=True)  # noqa: E731

    def announce(text: str) -> None:
        say(text)
        if interactive:              # the prompt and the half-typed line, again below the news
            try:
                import readline
                typed = readline.get_line_buffer()
            except ImportError:
                typed = ""
            print(PROMPT + typed, end="", flush=True)

    if not args.no_announcements:
        conn = connect(home.db_path, readonly=True)
        since = last_id(conn)  # before the banner
        conn.close()
        threading.Thread(target=_announcements, args=(home.db_path, since, stop, announce), daemon=True).start()
    say("loop-org chat — /help for commands" + ("" if model else "; no model configured, so slash commands only"))
    try:
        converse(read_line, say, lambda line: _respond(line, model, args.home))
    finally:
        stop.set()
    return 0
