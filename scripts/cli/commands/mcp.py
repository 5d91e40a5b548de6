"""``org mcp``: serve the org's tools and resources to an MCP client (Claude Code, ...) over stdio."""
from __future__ import annotations

from scripts.cli.output import home_of

NAME = "mcp"
HELP = ("serve the org to an MCP client over stdio: tools (submit, status, show, diff, decide, ...) as chosen "
        "by [mcp] tools in org.toml, and resources org://status and org://runs/ID with change notifications")


def add_arguments(p) -> None:
    p.add_argument("--poll", type=float, default=0.5, metavar="S",
                   help="seconds between reads of the journal while a resource is subscribed (default 0.5)")


def run(args) -> int:
    import anyio

    from scripts.cli.mcp_server import OrgServer
    from state_db.kernel import config as config_mod

    home = home_of(args)
    cfg = config_mod.load_config(home)
    anyio.run(OrgServer(home, cfg, poll_s=max(0.05, args.poll)).serve_stdio)
    return 0
