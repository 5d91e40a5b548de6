"""``org show ID``: one work item with its iterations, verdicts and usage."""
from __future__ import annotations

import orjson

from roles.operations.caps import line as caps_line
from scripts.cli.output import add_json, emit_json, read_conn, table
from state_db import queries, views
from state_db.queries import decisions, verdicts, work
from state_db.queries.base import plain
from state_db.queries.iterations import attempts, of_work as iterations_of
from state_db.queries import loop as loop_queries, review as review_queries
from state_db.kernel.errors import NotFound
from state_db.queries.work import Caps, Ladder

NAME = "show"
HELP = "show one work item: status, stop reason, iterations with verdicts, tokens and cost"


def add_arguments(p) -> None:
    p.add_argument("id", help="work item id")
    p.add_argument("--sandbox", action="store_true",
                   help="also list what this run's sandbox shows (read-only) and hides, and why")
    p.add_argument("--transcript", action="store_true",
                   help="show what the doer did, act by act: the prompt, the model's words, each tool call with "
                        "its input and result, the verdict with its failing output, the lesson")
    p.add_argument("--iteration", type=int, metavar="N", help="with --transcript: only iteration N's acts")
    add_json(p)


def load(conn, work_id: str) -> dict:
    item = queries.work_item(conn, work_id)
    if item is None:
        raise NotFound(f"no work item {work_id}", hint="list them with 'org status'")
    item["run"] = views.run_view(conn, work_id, item=dict(item))
    item["iterations_detail"] = plain(iterations_of(conn, work_id))
    item["decisions"] = plain(decisions.of_work(conn, work_id))
    item["verdicts"] = plain(verdicts.of_work(conn, work_id))
    item["attempts"] = plain(attempts(conn, work_id))
    item["stop_history"] = plain(work.stop_history(conn, work_id))
    item["handoffs"] = [h.encode() for h in loop_queries.handoffs(conn, work_id)]
    item["preflight"] = plain(verdicts.preflight(conn, work_id))
    item["review"] = {**review_queries.work_review(conn, work_id), "usage": review_queries.review_usage(conn, work_id),
                      "reviews": review_queries.reviews(conn, work_id)}
    return item


def review_lines(review: dict) -> list[str]:
    """The eval-agent's reviews of this run: criteria, each answer, and their usage (the eval-agent's,
    under its own budget; the totals above include it)."""
    u = review["usage"]
    if not review.get("criteria") and not u["calls"]:
        return []
    lines = [f"review: {review.get('criteria') or '(of the doer’s claims only)'}"]
    for r in review["reviews"]:
        lines.append(f"  iteration {r['iteration']}: {r['verdict']} by {r['model']}"
                     + (" (on the doer's claim that the goal is impossible)" if r.get("claim") is not None else "")
                     + f" — {'; '.join(r['reasons'])[:200]}")
    lines.append(f"  review usage (eval-agent): {u['calls']} calls, {u['budget_tokens']} tokens "
                 f"(input {u['input_tokens']}, output {u['output_tokens']}), ${u['cost_usd']:.4f} — under the "
                 "review budget, not the doer's caps")
    return lines


def _evidence(verdict: dict) -> str:
    """What the verdict rests on: test counts read from the runner, or the exit code alone."""
    parts = []
    for c in verdict["checks"]:
        if c.get("code"):
            parts.append(f"`{c['command']}` could not run ({c['code']})")
        elif c.get("tests"):
            t = c["tests"]
            ran = t["passed"] + t["failed"] + t["errors"]
            parts.append(f"`{c['command']}`: {t['runner']} ran {ran}, {t['passed']} passed"
                         + (f", {t['skipped']} skipped" if t["skipped"] else ""))
        elif c.get("command", "").startswith("("):
            continue
        else:
            parts.append(f"`{c['command']}`: the exit code alone (no test summary to read)")
    return "; ".join(parts) or "-"


def acts_per_iteration(attempts: list[dict], wrapups: set[int] = frozenset()) -> dict[int, int]:
    """How many acts each iteration took: more than one when an act was cut (a crash, a forced
    suspend) and redone. Attempt numbers count acts over the whole run, not per iteration; the
    wrap-up acts (attempts in ``wrapups``) belong to no iteration."""
    counts: dict[int, int] = {}
    for a in attempts:
        if a["attempt"] not in wrapups:
            counts[a["iteration"]] = counts.get(a["iteration"], 0) + 1
    return counts


def handoff_lines(handoff: dict) -> list[str]:
    """A hand-off note (the wrap-up after a budget tripped): what was done, remains, was learned."""
    slice_ = ", ".join(f"{k} {v:.4g}" for k, v in (handoff["allowance"] or {}).items() if v is not None) or "none"
    act = handoff.get("act") or ("the wrap-up act ran" if handoff.get("attempt") else "no wrap-up act")
    how = ("written by the wrap-up act" if handoff["source"] == "wrapup" else f"from the record; wrap-up act: {act}") \
        + f"; it used {handoff['tokens']} budget tokens, ${handoff['cost_usd']:.4f} of a slice of {slice_}"
    return [f"hand-off (ending {handoff['ending']}, {how}):", f"  done: {handoff['done']}",
            f"  remains: {handoff['remains']}", f"  learned: {handoff['learned']}"]


def left_in_workspace(args, work_id: str) -> str | None:
    """What an ended run that did not meet its goal left in the workspace, and the way back."""
    from roles.operations.restore import left, left_line
    from scripts.cli.output import home_of
    conn = read_conn(args)
    try:
        item = work.item(conn, work_id)
        if item is None or not item.ended or item.stop_reason == "goal_met":
            return None
        try:
            paths = left(home_of(args), conn, item)
        except Exception:  # noqa: BLE001 - a history that cannot be read leaves the line out, never the show
            return None
        return left_line(paths, item)
    finally:
        conn.close()


def run_line(run: dict) -> str:
    """Phase, iteration n of max, and what is used against each cap, in one line."""
    from scripts.cli.commands.status import progress_cells
    n, tokens, cost, elapsed = progress_cells({}, run)
    return f"phase: {run['phase']}  iteration {n}  budget tokens {tokens}  cost {cost}  elapsed {elapsed}"


def now_lines(run: dict) -> list[str]:
    """The current tool call while acting, and decisions the run waits for."""
    lines = []
    if run["current_tool"]:
        lines.append(f"now: {run['current_tool']['call']} (for {run['current_tool']['for_s']:.0f}s)")
    if run["pending_decisions"]:
        lines.append(f"waits for: {', '.join(run['pending_decisions'])} ('org decide ID approve|reject|…')")
    return lines


def show_transcript(args) -> int:
    """``--transcript``: the run's acts in order (``--json``: the attempts as data)."""
    from scripts.cli.transcript_text import lines
    from state_db.queries.transcript import of_work as transcript_of
    conn = read_conn(args)
    try:
        if queries.work_item(conn, args.id) is None:
            raise NotFound(f"no work item {args.id}", hint="list them with 'org status'")
        attempts = transcript_of(conn, args.id, iteration=args.iteration)
    finally:
        conn.close()
    if args.json:
        emit_json({"id": args.id, "iteration": args.iteration, "attempts": attempts})
        return 0
    if not attempts:
        print(f"{args.id}: no act yet" + (f" in iteration {args.iteration}" if args.iteration is not None else ""))
        return 0
    for line in lines(attempts):
        print(line)
    return 0


def run(args) -> int:
    if args.transcript:
        return show_transcript(args)
    if args.iteration is not None:
        from scripts.cli.main import UsageError
        raise UsageError("--iteration goes with --transcript: 'org show ID --transcript --iteration N'")
    conn = read_conn(args)
    try:
        item = load(conn, args.id)
    finally:
        conn.close()
    if args.sandbox:
        item["sandbox_view"] = sandbox_view(args, item)
    if args.json:
        emit_json(item)
        return 0
    print(f"{item['id']}  {item['status']}" + (f"  stop: {item['stop_reason']} — {item['stop_detail'] or ''}"
                                                if item["stop_reason"] else ""))
    if item["run"]["stop"]:
        print(f"next: {item['run']['stop']['hint']}")
    print(f"goal: {item['goal']}")
    origin = item["run"].get("origin") or {}
    if origin.get("kind") == "replay" and origin.get("subject"):
        print(f"replay: {origin['subject']} ({origin['skill']}), {origin['arm']} it, of {origin['source']} — "
              "it measures the skill: no knowledge comes of it and it is no use of the skill")
    elif origin.get("kind") not in (None, "human"):
        print(f"started by: {origin['kind']} {origin.get('id') or ''}".rstrip())
    left = left_in_workspace(args, item["id"])
    if left:
        print(left)
    print(run_line(item["run"]))
    for line in now_lines(item["run"]):
        print(line)
    print(f"workspace: {item['workspace']}  backend: {item['backend']}  assigned: {item['assigned_to'] or '-'}")
    print(f"caps: {caps_line(Caps.from_json(item['caps']))}")
    ladder = Ladder.parse(item.get("ladder"))
    if ladder.models:
        print(f"ladder: {' → '.join(ladder.models)} ({ladder.label()}"
              + (f", since iteration {ladder.since + 1}: {ladder.why[:200]})" if ladder.rung else ")"))
    print(f"used: {item['run']['tokens']['used']} budget tokens, "
          f"${item['run']['cost_usd']['used']:.4f}, "
          f"{item['elapsed_s']:.1f}s" + (f" ({item['discarded_s']:.1f}s of it in discarded attempts)"
                                         if item.get("discarded_s") else ""))
    print(f"tokens: input {item['input_tokens']}, output {item['output_tokens']}, cache write "
          f"{item['cache_write_tokens']}, cache read {item['cache_read_tokens']} (not in the token budget; in the cost)")
    for line in review_lines(item["review"]):
        print(line)
    for h in item["stop_history"]:
        print(f"ending {h['seq']}: {h['stop_reason']} after {h['iterations']} iterations — {h['stop_detail'] or ''}; "
              f"continued by {h['continued_by']} with {caps_line(Caps.from_json(h['new_caps']))}")
    for h in item["handoffs"]:
        for line in handoff_lines(h):
            print(line)
    pre = item["preflight"]
    line = pre["detail"] if pre else ("not checked yet (the eval-agent runs the verify commands on the baseline "
                                      "before the first act)")
    print(line if line.startswith("baseline") else f"baseline: {line}")
    verdicts = {v["iteration"]: v for v in item["verdicts"]}
    tries = acts_per_iteration(item["attempts"], {h["attempt"] for h in item["handoffs"] if h["attempt"]})
    redone = any(n > 1 for n in tries.values())   # else the column would only repeat ITER
    rows = []
    for it in item["iterations_detail"]:
        v = verdicts.get(it["n"])
        rows.append([it["n"], *([tries.get(it["n"], 1)] if redone else []), it["act_status"], it["input_tokens"],
                     it["output_tokens"], it["cache_write_tokens"], it["cache_read_tokens"],
                     v["outcome"] if v else "pending", len(it["changed_paths"]),
                     (it["lesson"] or "")[:60]])
    if rows:
        print()
        print(table(rows, ["ITER", *(["ACTS"] if redone else []), "ACT", "IN", "OUT", "CACHE-W", "CACHE-R",
                           "VERDICT", "CHANGED", "LESSON"]))
        if redone:
            print("(ACTS: how many times the iteration's act ran; the earlier ones were cut and discarded)")
    if item["verdicts"]:
        last = item["verdicts"][-1]
        print(f"\nlatest verdict (iteration {last['iteration']}): {views.verdict_line(last)}; evidence: "
              + _evidence(last))
        if last["held_back"]:
            print("held back from verification: " + ", ".join(f"{h['path']} ({h['kind']}: {h['treatment']})"
                                                              for h in last["held_back"]))
        if last["outcome"] != "pass":
            print("\nlatest feedback:\n" + last["feedback"][:1500])
    for line in delivered_lines(item):
        print(line)
    if args.sandbox:
        print("\nsandbox view (what its commands see, read-only unless said, and why):")
        for entry in item["sandbox_view"]:
            print(f"  {entry['path']}: {entry['reason']}")
    else:
        print(f"\n(what this run's sandbox shows and hides: 'org show {item['id']} --sandbox')")
    return 0


def delivered_lines(item: dict) -> list[str]:
    """What the workspace was made to hold at goal_met, and what was kept apart."""
    raw = item.get("delivered")
    done = orjson.loads(raw) if isinstance(raw, (str, bytes)) else raw
    if not done:
        return []
    if done.get("error"):
        return [f"delivered: not done ({done['error']}: {done.get('detail', '')})"]
    line = (f"delivered: the workspace holds the verified tree {str(done['verified'])[:12]}"
            + (", proved file by file" if done.get("proved") else
               f" — delivery_differs: it still differs at {', '.join(done.get('differs', [])[:5])}"))
    out = [line]
    if done.get("held"):
        out.append(f"held apart (outside the change scope): {', '.join(done['held_paths'][:12])}"
                   f"{' …' if len(done['held_paths']) > 12 else ''} — see 'org export {item['id']} --held', "
                   f"apply with 'org apply {item['id']} --held'")
    if done.get("removed"):
        out.append(f"taken out (never recorded, so never verified): {', '.join(done['removed'][:12])}"
                   f"{' …' if len(done['removed']) > 12 else ''}")
    return out


def sandbox_view(args, item: dict) -> list[dict]:
    """What the sandbox of this run's commands shows and hides, for the toolchain recorded at
    submit (its PATH, HOME, the paths its verify commands name)."""
    from roles.workbench.sandbox import exposed
    from roles.workbench.sandbox.toolchains import Toolchain
    from scripts.cli.output import home_of
    from state_db.kernel import config as config_mod
    home = home_of(args)
    cfg = config_mod.load_config(home)
    raw = item.get("toolchain")
    toolchain = Toolchain.decode(orjson.loads(raw) if isinstance(raw, str) else raw)
    return [{"path": str(path), "reason": reason} for path, reason in exposed(cfg, home, toolchain)]
