"""Attention outside the chat: a desktop notification and a webhook POST per attention event.

``announce`` writes one ``attention`` row per event that needs a human (in the transaction of
the announcement itself); this module delivers the rows from a background thread, so a slow or
failing receiver never holds up the coordinator's reconcile. What was delivered is recorded in
the row (``notified_at``, ``posted_at``, ``post_attempts``), so a restarted coordinator neither
repeats nor drops a delivery. A POST that fails is logged, counted (``webhook_failed`` in
``transport_counters``, shown by ``org status``) and tried again ``attention.webhook_retries``
times with backoff; then it is given up (``webhook_gave_up``). A crash between a receiver's
answer and the write of ``posted_at`` repeats that one POST: delivery is at least once, and
exactly once otherwise.

The POST body is Slack-compatible: ``{"text": "..."}`` with the dashboard link in Slack's
``<url|label>`` form; receivers other than Slack read the same ``text``.

Every text here is agent-derived (a doer's question, a goal, a verifier's message) and is data on
every door (``state_db.text``): controls are shown visibly; the desktop gets plain text (no
markup a notification server would draw: ``<``, ``>`` and ``&`` become look-alikes); the webhook's
``text`` has Slack's ``&``, ``<`` and ``>`` escaped, so agent text can form no ``<!channel>``, no
``<@user>`` and no ``<url|label>`` link, and no ``@`` of its own; Slack draws the agent text as a
``plain_text`` block (no links, no mentions) with the dashboard link in its own block after it.
The link is the dashboard page without any query: no token ever travels into a chat.
"""
from __future__ import annotations

import shutil
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Callable
from urllib.parse import urlsplit, urlunsplit

import structlog

from state_db.text import one_line, visible
from state_db.queries.events import Attention, attention_undelivered
from state_db.vocab import AttentionKind
from state_db.writer import StateWriter

KINDS = tuple(AttentionKind)
FAILED, GAVE_UP = "webhook_failed", "webhook_gave_up"     # transport_counters names, per instance
BACKOFF_S, BACKOFF_MAX_S = 1.0, 30.0
STALE_S = 3600.0            # an event older than this is not posted (a webhook configured later)
NOTIFY_TIMEOUT_S = 5.0
_ADD = ("INSERT INTO transport_counters(instance, name, value) VALUES (?, ?, 1) "
        "ON CONFLICT(instance, name) DO UPDATE SET value = transport_counters.value + 1")


@dataclass(frozen=True)
class Settings:
    """``attention.*`` of org.toml."""

    webhook_url: str = ""
    webhook_timeout_s: float = 5.0
    webhook_retries: int = 3
    notify_send: bool = True
    dashboard_url: str = ""

    @classmethod
    def from_config(cls, cfg) -> "Settings":
        return cls(webhook_url=cfg.attention.webhook_url, webhook_timeout_s=float(cfg.attention.webhook_timeout_s),
                   webhook_retries=cfg.attention.webhook_retries, notify_send=cfg.attention.notify_send,
                   dashboard_url=cfg.attention.dashboard_url)


def link(dashboard_url: str, path: str = "") -> str | None:
    """The dashboard page at ``path`` (``runs/w-1``): the base's scheme, host and path only — a
    query or fragment (a token someone put in the configured address) never reaches a message."""
    if not dashboard_url:
        return None
    parts = urlsplit(dashboard_url)
    base = parts.path.rstrip("/")
    netloc = parts.netloc.rpartition("@")[2]          # no user:password either
    return urlunsplit((parts.scheme, netloc, f"{base}/{path}" if path else (parts.path or "/"), "", ""))


_PLAIN = str.maketrans({"<": "\u2039", ">": "\u203a", "&": "\uff06"})     # ‹ › ＆
_SLACK = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;", "@": "\uff20"})   # ＠: no mention


def plain(text: str) -> str:
    """Agent text for a desktop notification: visible controls, no markup a server could draw."""
    return visible(text).translate(_PLAIN)


def slack_escaped(text: str) -> str:
    """Agent text for Slack's ``mrkdwn``: visible controls; ``&``, ``<``, ``>`` escaped as Slack
    says, ``@`` as a look-alike: no labelled link, mention or command can be formed from it. A
    bare address is shown as ``http[:]//…`` (a second line: receivers that link bare addresses)."""
    return visible(text).translate(_SLACK).replace("://", "[:]//")


def message(text: str, url: str | None) -> dict:
    """The Slack-compatible body of one POST: ``text`` (escaped) for every receiver, and blocks
    where Slack draws the agent text as plain text and the link, built here, after it."""
    shown = slack_escaped(text)
    blocks = [{"type": "section", "text": {"type": "plain_text", "text": visible(text)[:3000] or "-",
                                           "emoji": False}}]
    if url:
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": f"<{url}|open in the dashboard>"}})
    return {"text": f"{shown}\n<{url}|open in the dashboard>" if url else shown, "blocks": blocks,
            "unfurl_links": False, "unfurl_media": False}


def post_json(url: str, body: dict, timeout_s: float) -> None:
    """POST ``body`` as JSON (the standard library's client: one small request needs no other);
    raises on a transport error or a status other than 2xx."""
    import json
    import urllib.request
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", "User-Agent": "loop-org"})
    with urllib.request.urlopen(req, timeout=timeout_s) as got:    # raises HTTPError on 4xx/5xx
        if not 200 <= got.status < 300:
            raise RuntimeError(f"HTTP {got.status} from the webhook")


def notify_send(title: str, text: str) -> bool:
    """A desktop notification where ``notify-send`` is on PATH; False (never an error) elsewhere.
    Both are shown as plain text (``plain``); ``--`` keeps a text beginning with ``-`` a text."""
    binary = shutil.which("notify-send")
    if binary is None:
        return False
    try:
        subprocess.run([binary, "--app-name=loop-org", "--", one_line(title).translate(_PLAIN), plain(text)],
                       timeout=NOTIFY_TIMEOUT_S, check=False,
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return False
    return True


class Delivery:
    """Delivers undelivered ``attention`` rows from one background thread.

    Args:
        db_path: state.db; the thread writes through its own StateWriter as ``instance``.
        instance: the coordinator's instance name (the counters' owner).
        settings: ``attention.*``.
        post: ``post(url, body, timeout_s)``, raises on failure (injectable for tests).
        notify: ``notify(title, text) -> bool``.
        clock: monotonic clock for the backoff.
    """

    def __init__(self, db_path, instance: str, settings: Settings, *, post: Callable = post_json,
                 notify: Callable = notify_send, clock: Callable[[], float] = time.monotonic):
        self.db_path, self.instance, self.settings = db_path, instance, settings
        self.post, self.notify, self.clock = post, notify, clock
        self.log = structlog.get_logger("attention").bind(instance=instance)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._due: dict[str, float] = {}     # key -> monotonic time of the next POST attempt

    @property
    def active(self) -> bool:
        return bool(self.settings.webhook_url or self.settings.notify_send)

    def kick(self) -> None:
        """New rows may wait: deliver them soon (starts the thread on first use)."""
        if not self.active:
            return
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="attention", daemon=True)
            self._thread.start()
        self._wake.set()

    def stop(self, timeout_s: float = 2.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _run(self) -> None:
        writer = StateWriter(self.db_path, "coordinator", self.instance)
        try:
            while not self._stop.is_set():
                try:
                    wait = self.deliver(writer)
                except Exception as exc:  # noqa: BLE001 - attention never stops coordination
                    self.log.error("attention_delivery_failed", error=str(exc), next="try again in 5 s")
                    wait = 5.0
                self._wake.wait(wait)
                self._wake.clear()
        finally:
            writer.close()

    def deliver(self, writer: StateWriter) -> float | None:
        """One pass over undelivered rows; returns seconds until a retry is due (None: none)."""
        s = self.settings
        rows = attention_undelivered(writer.conn, s.webhook_retries)
        soonest = None
        for row in rows:
            if self._stop.is_set():
                break
            if row.notified_at is None:
                sent = s.notify_send and self.notify("loop-org needs you", row.text)
                with writer.transaction(render=False) as tx:
                    tx.update("attention", row.key, notified_at=tx.now)
                if sent:
                    self.log.info("notified", key=row.key, next="nothing: shown on the desktop")
            if not s.webhook_url or row.posted_at is not None or row.post_attempts > s.webhook_retries:
                continue
            if time.time() - row.created_at > STALE_S:
                with writer.transaction(render=False) as tx:
                    tx.update("attention", row.key, post_attempts=s.webhook_retries + 1,
                              last_error="not posted: older than the webhook")
                continue
            due = self._due.get(row.key, 0.0) - self.clock()
            if due > 0:
                soonest = due if soonest is None else min(soonest, due)
                continue
            wait = self._post(writer, row)
            if wait is not None:
                soonest = wait if soonest is None else min(soonest, wait)
        return soonest

    def _post(self, writer: StateWriter, row: Attention) -> float | None:
        s, key = self.settings, row.key
        tries = row.post_attempts + 1
        try:
            self.post(s.webhook_url, message(row.text, row.link), s.webhook_timeout_s)
        except Exception as exc:  # noqa: BLE001 - any failure of the receiver is counted, never raised
            error = f"{type(exc).__name__}: {exc}"[:500]
            last = tries > s.webhook_retries
            with writer.transaction(render=False) as tx:
                tx.update("attention", key, post_attempts=tries, last_error=error)
                tx.execute(_ADD, (self.instance, FAILED))
                if last:
                    tx.execute(_ADD, (self.instance, GAVE_UP))
            if last:
                self._due.pop(key, None)
                self.log.error("webhook_gave_up", key=key, attempts=tries, error=error,
                               next="nothing: the event stays in the chat and in 'org status'")
                return None
            wait = min(BACKOFF_MAX_S, BACKOFF_S * 2 ** (tries - 1))
            self._due[key] = self.clock() + wait
            self.log.warning("webhook_failed", key=key, attempt=tries, of=s.webhook_retries + 1, error=error,
                             next=f"retry in {wait:.0f} s")
            return wait
        with writer.transaction(render=False) as tx:
            tx.update("attention", key, post_attempts=tries, posted_at=tx.now, last_error=None)
        self._due.pop(key, None)
        self.log.info("webhook_posted", key=key, attempt=tries, next="nothing: the receiver has it")
        return None
