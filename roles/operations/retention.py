"""Applying retention to an org home as the human (``org gc``): state.db bookkeeping and the
files beside it. The work is ``state_db.retention.collect``, which the supervisor's automatic
retention calls too; this passes it the transport's facts (the ledger's keep time, the stale CLI
wakes in the outbox)."""
from __future__ import annotations

import time
from pathlib import Path

from transport.outbox import CLI_OUTBOX_STALE_S

__all__ = ["CLI_OUTBOX_STALE_S", "collect", "stale_cli_outbox"]


def stale_cli_outbox(home, *, now: float | None = None, older_than_s: float = CLI_OUTBOX_STALE_S) -> list[Path]:
    """The outbox files of ``home`` a CLI (human) instance sent over ``older_than_s`` ago
    (``transport.outbox.stale_cli_outbox``), oldest first."""
    from transport.outbox import stale_cli_outbox as stale
    return stale(home.outbox_dir, now=now, older_than_s=older_than_s)


def collect(home, cfg, *, dry_run: bool, history: bool, older_than_days: float, actor: str = "human",
            rows: bool = True) -> dict:
    """``state_db.retention.collect`` for ``home`` (its parameters and counts), with the ledger's
    keep time from org.toml's [transport] and the CLI's stale wakes in the outbox."""
    from state_db.retention import collect as collect_home
    from transport.envelope import Limits

    return collect_home(home, cfg, dry_run=dry_run, history=history, older_than_days=older_than_days, actor=actor,
                        rows=rows, ledger_keep_s=Limits.from_config(cfg.data["transport"]).ledger_keep_s,
                        stale_outbox=stale_cli_outbox(home, now=time.time()))
