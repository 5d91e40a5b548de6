"""``org dashboard``: a local web page beside the CLI.

A Starlette app served by uvicorn on 127.0.0.1, opened by a one-time link printed at start that
becomes an HttpOnly, SameSite=Strict cookie (``guard.py``).
It reads state.db through the same loaders as the CLI's ``--json`` (``data.py``), writes only
through the same human operations as the CLI (``actions.py``), and draws its plots in the
browser with a small SVG helper shipped in ``static/`` (no CDN; it works offline).

Nothing here is imported by the other CLI commands: ``scripts/cli/commands/dashboard.py``
imports ``scripts.cli.dashboard.server`` only when the command runs.
"""
