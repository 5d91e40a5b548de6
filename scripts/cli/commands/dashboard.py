"""``org dashboard [--port N] [--host H]``: a local web page of the org, live, with plots and actions."""
from __future__ import annotations

from scripts.cli.output import home_of

NAME = "dashboard"
HELP = "serve a live web dashboard on 127.0.0.1 and print a one-time link to it (it opens one browser, then nothing); Ctrl-C stops it"


def add_arguments(p) -> None:
    p.add_argument("--port", type=int, default=0, help="TCP port (default: a free one, printed at start)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1, this machine only)")


def run(args) -> int:
    from scripts.cli.dashboard.server import serve   # the web stack loads only for this command

    serve(home_of(args).require(), args.host, args.port)
    return 0
