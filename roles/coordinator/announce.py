"""Announcements: what the human must see, derived from the journal and journaled themselves.

Each ``announce`` event records the journal id it covers up to, so a restarted coordinator
continues where it left off: nothing is dropped and nothing is announced twice. An unanswered
decision is announced again after ``gate.reannounce_after_s``.

An event that needs a human (``attention.KINDS``: a decision waits, a candidate batch opens, a
run ends ``verify_unrunnable``, a role fails, the org spend cap trips) also gets an ``attention``
row in the same transaction, which ``attention.Delivery`` sends to the desktop and the webhook.
A spend cap trip is one event however many runs it ends (keyed by the cap).
"""
from __future__ import annotations

import orjson

from roles.coordinator.attention import link
from state_db import queries
from state_db.vocab import DecisionStatus, StopReason
from state_db.writer import StateWriter

WATCHED = ("work_items.ended", "decisions.created", "role_instances.failed", "candidate_batches.created",
           "skills.retirement_proposed")


def cursor(conn) -> int:
    row = conn.execute("SELECT MAX(CAST(json_extract(data, '$.upto') AS INTEGER)) FROM events WHERE kind = 'announce'").fetchone()
    return row[0] or 0


def text_for(conn, event: dict) -> str | None:
    kind, subject = event["kind"], event["subject"]
    if kind == "work_items.ended":
        item = queries.work_item(conn, subject)
        if item is None:
            return None
        return (f"run {subject} ended: {item['stop_reason']} — {item['stop_detail'] or ''} "
                f"({item['iterations']} iterations, {item['tokens']} tokens, ${item['cost_usd']:.4f})").replace(" —  (", " (")
    if kind == "decisions.created":
        d = conn.execute("SELECT * FROM decisions WHERE id = ?", (subject,)).fetchone()
        return None if d is None else (f"decision {subject} waiting for {d['work_id']}: {d['question']} — "
                                       f"'org decide {subject} approve|reject|edit|respond'")
    if kind == "role_instances.failed":
        data = orjson.loads(event["data"])
        return f"role {subject} failed and is not restarted ({data.get('last_exit', '')}) — see 'org logs --role {subject}'"
    if kind == "candidate_batches.created":
        return f"skill-candidate batch {subject} is open for review — 'org candidates'"
    if kind == "skills.retirement_proposed":
        data = orjson.loads(event["data"])
        days = data.get("unused_days") or data.get("days")
        return (f"skill {subject} unused" + (f" for {days} days" if days else "") +
                f" — proposed for retirement: 'org skills retire {subject}'")
    return None


def attention_for(conn, event: dict, spend_cap_usd: float | None) -> tuple[str, str, str] | None:
    """``(kind, key, dashboard path)`` when ``event`` needs a human, else None."""
    kind, subject = event["kind"], event["subject"]
    if kind == "decisions.created":
        d = conn.execute("SELECT work_id FROM decisions WHERE id = ?", (subject,)).fetchone()
        return "decision_waiting", f"decision:{subject}", f"runs/{d['work_id']}" if d else ""
    if kind == "candidate_batches.created":
        return "batch_open", f"batch:{subject}", ""   # the org page lists open batches
    if kind == "role_instances.failed":
        return "role_failed", f"role_failed:{subject}:{event['id']}", ""
    if kind == "work_items.ended":
        item = queries.work_item(conn, subject)
        if item is None:
            return None
        if item["stop_reason"] == StopReason.VERIFY_UNRUNNABLE:
            return "verify_unrunnable", f"verify_unrunnable:{subject}:{event['id']}", f"runs/{subject}"
        if item["stop_reason"] == StopReason.ORG_LIMIT:
            return "org_limit", f"org_limit:{spend_cap_usd if spend_cap_usd is not None else ''}", f"runs/{subject}"
    return None


def _attention(tx, event: dict, text: str, dashboard_url: str, spend_cap_usd: float | None) -> bool:
    found = attention_for(tx.conn, event, spend_cap_usd)
    if found is None:
        return False
    kind, key, path = found
    if tx.one("SELECT 1 FROM attention WHERE key = ?", (key,)):
        return False                                  # the same spend cap trip, another run
    if kind == "org_limit":
        text = f"the org spend cap was reached; runs stop with org_limit — raise limits.total_spend_usd. {text}"
    tx.insert("attention", {"key": key, "kind": kind, "subject": event["subject"], "text": text,
                            "link": link(dashboard_url, path), "created_at": tx.now}, journal=False)
    return True


def announce(writer: StateWriter, reannounce_after_s: float, *, dashboard_url: str = "",
             spend_cap_usd: float | None = None) -> list[str]:
    """Journal announcements for new events and stale decisions, and an ``attention`` row for
    each new event that needs a human (linked to ``dashboard_url`` when set); returns the texts."""
    conn = writer.conn
    after = cursor(conn)
    new = conn.execute(f"SELECT * FROM events WHERE id > ? AND kind IN ({','.join('?' * len(WATCHED))}) ORDER BY id",
                       (after, *WATCHED)).fetchall()
    upto = conn.execute("SELECT COALESCE(MAX(id), 0) FROM events").fetchone()[0]
    texts = []
    with writer.transaction(render=False) as tx:
        for ev in new:
            text = text_for(conn, dict(ev))
            if text:
                tx.journal("announce", ev["subject"], {"text": text, "source": ev["kind"], "upto": ev["id"]})
                _attention(tx, dict(ev), text, dashboard_url, spend_cap_usd)
                texts.append(text)
        stale = tx.conn.execute("""SELECT id, work_id, question FROM decisions WHERE status = ?
                                     AND COALESCE(announced_at, created_at) < ?""",
                                (DecisionStatus.PENDING, tx.now - reannounce_after_s)).fetchall()
        for d in stale:
            text = f"still waiting: decision {d['id']} for {d['work_id']}: {d['question']}"
            tx.update("decisions", d["id"], announced_at=tx.now)
            tx.journal("announce", d["id"], {"text": text, "source": "reannounce", "upto": upto})
            texts.append(text)
    return texts
