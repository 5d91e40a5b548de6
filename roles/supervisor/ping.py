"""Ping role instances through the real transport and wait for their pongs."""
from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from roles.base.instances import org_instances
from roles.base.transport_link import keyring_file
from state_db.kernel.config import Config
from state_db.kernel.home import OrgHome
from transport.endpoints import Endpoints
from transport.envelope import Limits
from transport.keys import Keyring
from transport.ledger import Counters, Ledger
from transport.outbox import SUFFIX
from transport.receiver import Receiver
from transport.sender import Sender


def ping_all(home: OrgHome, cfg: Config, instances: list[str] | None = None, *, timeout_s: float = 3.0) -> list[dict]:
    """Send ``ping`` as ``human`` to each instance; pongs come back to a temporary inbox.

    Returns one row per instance: {"instance", "result": "pong in X ms" | "no answer", "ms"}.
    """
    targets = instances or [s.instance for s in org_instances(cfg.org.loop_agents, cfg.org.eval_agents)]
    me = f"human-{os.getpid() % 9000 + 1}"
    keyring = Keyring.load(keyring_file(home))
    limits = Limits.from_config(cfg.data["transport"])
    answers: dict[str, float] = {}
    sent_at: dict[str, float] = {}

    def on_pong(env):
        if env.kind == "pong":
            answers.setdefault(env.sender, time.monotonic())

    counters = Counters(me)
    ledger = Ledger(home.db_path, me, counters=counters, limits=limits, background_checkpoint=False)
    endpoints = Endpoints(home.run_dir, tcp_base=cfg.transport.endpoint)
    receiver = Receiver(me, run_dir=home.run_dir, outbox_root=home.outbox_dir, keyring=keyring,
                        handler=on_pong, ledger=ledger, endpoint=endpoints(me), limits=limits, watch=False,
                        sweep_s=0.2)
    filed: list[Path] = []
    receiver.start()
    try:
        with Sender("human", keyring, endpoints, home.outbox_dir, counters=counters, limits=limits) as sender:
            for t in targets:
                sent_at[t] = time.monotonic()
                env = sender.envelope(t, "ping", {"reply_to": me})
                if "outbox" in sender.send_envelope(env):
                    filed.append(home.outbox_dir / t / f"{env.id}{SUFFIX}")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not set(targets) <= set(answers):
            receiver.poll(50)
    finally:
        receiver.close()
        shutil.rmtree(home.outbox_dir / me, ignore_errors=True)
        # a ping is only worth answering now: one still filed (its recipient is down or
        # suspended) would be answered, to nobody, whenever the recipient starts again
        for f in filed:
            f.unlink(missing_ok=True)
    rows = []
    for t in targets:
        if t in answers:
            ms = (answers[t] - sent_at[t]) * 1000
            rows.append({"instance": t, "result": f"pong in {ms:.1f} ms", "ms": round(ms, 2)})
        else:
            rows.append({"instance": t, "result": "no answer", "ms": None})
    return rows
