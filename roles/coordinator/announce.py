"""Announcements: what the human must see, derived from the journal and journaled themselves.

Each ``announce`` event records the journal id it covers up to, so a restarted coordinator
continues where it left off: nothing is dropped and nothing is announced twice. An unanswered
decision is announced again after ``gate.reannounce_after_s``.

An event that needs a human (``attention.KINDS``: a decision waits, a candidate batch opens, a
run ends ``verify_unrunnable``, a role fails, the org spend cap trips) also gets an ``attention``
row in the same transaction, which ``attention.Delivery`` sends to the desktop and the webhook.
A spend cap trip is one event however many runs it ends (keyed by the cap). Reads are typed
queries (state_db.queries); events travel as ``events.Event``.
"""
from __future__ import annotations

from roles.coordinator.attention import link
from state_db.queries import decisions, work
from state_db.queries.events import Event, after, announced_upto, attention_known, last_id
from state_db.queries.iterations import count
from state_db.queries.usage import of_work
from state_db.vocab import StopReason
from state_db.words import counted
from state_db.writer import StateWriter

WATCHED = ("work_items.ended", "decisions.created", "role_instances.failed", "candidate_batches.created",
           "skills.retirement_proposed")


def cursor(conn) -> int:
    return announced_upto(conn)


def text_for(conn, event: Event) -> str | None:
    kind, subject = event.kind, event.subject
    if kind == "work_items.ended":
        item = work.item(conn, subject)
        if item is None:
            return None
        used = of_work(conn, subject)
        return (f"run {subject} ended: {item.stop_reason} — {item.stop_detail or ''} "
                f"({counted(count(conn, subject), 'iteration')}, {counted(used.tokens, 'token')}, ${used.cost_usd:.4f})").replace(" —  (", " (")
    if kind == "decisions.created":
        d = decisions.decision(conn, subject)
        return None if d is None else (f"decision {subject} waiting for {d.work_id}: {d.question} — "
                                       f"'org decide {subject} approve|reject|edit|respond'")
    if kind == "role_instances.failed":
        data = event.data
        return f"role {subject} failed and is not restarted ({data.get('last_exit', '')}) — see 'org logs --role {subject}'"
    if kind == "candidate_batches.created":
        return f"skill-candidate batch {subject} is open for review — 'org candidates'"
    if kind == "skills.retirement_proposed":
        data = event.data
        days = data.get("unused_days") or data.get("days")
        return (f"skill {subject} unused" + (f" for {days} days" if days else "") +
                f" — proposed for retirement: 'org skills retire {subject}'")
    return None


def attention_for(conn, event: Event, spend_cap_usd: float | None) -> tuple[str, str, str] | None:
    """``(kind, key, dashboard path)`` when ``event`` needs a human, else None."""
    kind, subject = event.kind, event.subject
    if kind == "decisions.created":
        d = decisions.decision(conn, subject)
        return "decision_waiting", f"decision:{subject}", f"runs/{d.work_id}" if d else ""
    if kind == "candidate_batches.created":
        return "batch_open", f"batch:{subject}", ""   # the org page lists open batches
    if kind == "role_instances.failed":
        return "role_failed", f"role_failed:{subject}:{event.id}", ""
    if kind == "work_items.ended":
        item = work.item(conn, subject)
        if item is None:
            return None
        if item.stop_reason == StopReason.VERIFY_UNRUNNABLE:
            return "verify_unrunnable", f"verify_unrunnable:{subject}:{event.id}", f"runs/{subject}"
        if item.stop_reason == StopReason.EVIDENCE_FORGED:
            return "evidence_forged", f"evidence_forged:{subject}:{event.id}", f"runs/{subject}"
        if item.stop_reason == StopReason.ORG_LIMIT:
            return "org_limit", f"org_limit:{spend_cap_usd if spend_cap_usd is not None else ''}", f"runs/{subject}"
    return None


def _attention(tx, event: Event, text: str, dashboard_url: str, spend_cap_usd: float | None) -> bool:
    found = attention_for(tx.conn, event, spend_cap_usd)
    if found is None:
        return False
    kind, key, path = found
    if attention_known(tx.conn, key):
        return False                                  # the same spend cap trip, another run
    if kind == "org_limit":
        text = f"the org spend cap was reached; runs stop with org_limit — raise limits.total_spend_usd. {text}"
    tx.insert("attention", {"key": key, "kind": kind, "subject": event.subject, "text": text,
                            "link": link(dashboard_url, path), "created_at": tx.now}, journal=False)
    return True


def announce(writer: StateWriter, reannounce_after_s: float, *, dashboard_url: str = "",
             spend_cap_usd: float | None = None) -> list[str]:
    """Journal announcements for new events and stale decisions, and an ``attention`` row for
    each new event that needs a human (linked to ``dashboard_url`` when set); returns the texts."""
    conn = writer.conn
    new = after(conn, cursor(conn), *WATCHED)
    upto = last_id(conn)
    texts = []
    with writer.transaction(render=False) as tx:
        for ev in new:
            text = text_for(conn, ev)
            if text:
                tx.journal("announce", ev.subject, {"text": text, "source": ev.kind, "upto": ev.id})
                _attention(tx, ev, text, dashboard_url, spend_cap_usd)
                texts.append(text)
        for d in decisions.unannounced_since(tx.conn, tx.now - reannounce_after_s):
            text = f"still waiting: decision {d.id} for {d.work_id}: {d.question}"
            tx.update("decisions", d.id, announced_at=tx.now)
            tx.journal("announce", d.id, {"text": text, "source": "reannounce", "upto": upto})
            texts.append(text)
    return texts
