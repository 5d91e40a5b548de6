"""Turning journal events into lines a human reads as they happen (demo, org watch, chat)."""
from __future__ import annotations

from state_db.queries import verdicts, work
from state_db.queries.events import Event
from state_db.queries.iterations import count
from state_db.views import run_view
from state_db.words import counted


def line_for(conn, ev: Event) -> str | None:
    """The line a human reads for journal entry ``ev`` (None: nothing worth a line)."""
    kind, subject, data = ev.kind, ev.subject, ev.data
    if kind == "work_items.created":
        return f"submitted {subject}: {data.get('goal', '')[:80]}"
    if kind == "work_items.waiting":
        return f"{subject} waits: {data.get('stop_detail') or 'its workspace is busy'}"
    if kind == "work_items.dispatched":
        return f"coordinator dispatched {subject} to {data.get('assigned_to')}"
    if kind == "attempts.created":
        return f"{data.get('instance')}: iteration {data.get('iteration')} of {data.get('work_id')} — acting (attempt {data.get('attempt')})"
    if kind == "iterations.created":
        tokens = sum(int(data.get(k) or 0) for k in ("input_tokens", "output_tokens", "cache_write_tokens", "cache_read_tokens"))
        changed = data.get("changed_paths") or []
        changed = ", ".join(changed) if isinstance(changed, list) else changed
        return (f"{ev.instance}: iteration {data.get('n')} committed ({data.get('act_status')}, {tokens} tokens, "
                f"changed {changed or 'nothing'}) — asking the eval-agent")
    if kind == "preflights.created":
        return f"eval-agent: verify commands checked on the baseline of {subject} — {data.get('detail', '')}"
    if kind == "verdicts.created":
        outcome = str(data.get("outcome", "")).upper()
        text = f"eval-agent: iteration {data.get('iteration')} {outcome}"
        if data.get("outcome") != "pass":
            found = verdicts.verdict(conn, subject)
            detail = found.feedback if found else ""
            lines = [ln for ln in detail.splitlines() if ln.strip()][:8]
            text += "\n      " + "\n      ".join(lines)
        return text
    if kind == "iterations.updated" and data.get("lesson"):
        return f"{ev.instance}: lesson for the next iteration: {data['lesson']}"
    if kind == "work_items.ended":
        item = work.item(conn, subject)
        if item is None:
            return None
        # the run's figures as every view shows them (state_db.views.run_view): org status, org show
        run = run_view(conn, subject)
        return (f"{subject} ended by {ev.actor}: {item.stop_reason} — {item.stop_detail or ''}\n"
                f"      {counted(count(conn, subject), 'iteration')}, {run['tokens']['used']} budget tokens "
                f"({run['tokens']['total']} in all), ${run['cost_usd']['used']:.4f}")
    if kind == "announce" and data.get("source") in ("role_instances.failed", "decisions.created", "reannounce",
                                                     "candidate_batches.created"):
        return f"coordinator: {data.get('text')}"
    return None
