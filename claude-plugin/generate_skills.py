"""Write the plugin's skills (claude-plugin/skills/<name>/SKILL.md) with the org's own SKILL.md
writer, the one approved skills and ``org skills export`` use. Run from the repository root:
``python claude-plugin/generate_skills.py``; tests/e2e/test_mcp.py fails when the committed files
differ from what this writes."""
from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from skills.skillmd import SkillText, render  # noqa: E402

# How Claude Code names the tools of this plugin's MCP server: mcp__plugin_<plugin>_<server>__<tool>
# (``claude --plugin-dir``); the server configured alone (``--mcp-config``) gives mcp__<server>__<tool>.
PLUGIN = json.loads((HERE / ".claude-plugin" / "plugin.json").read_text())["name"]
SERVER = next(iter(json.loads((HERE / ".mcp.json").read_text())["mcpServers"]))
T = f"mcp__plugin_{PLUGIN}_{SERVER}__"
ALONE = f"mcp__{SERVER}__"
NAMES = (f"- Tool names: `{T}NAME` when this plugin is loaded (`claude --plugin-dir`); "
         f"`{ALONE}NAME` when the server is configured alone (`claude --mcp-config`).")

SKILLS = [
    SkillText("loop-org-delegate", (
        "Hand a well-specified goal with a verify command to loop-org and follow the run to its end. Use when a "
        "task has a checkable finish line (tests to make pass, a build to fix) that can run unattended in a "
        "workspace folder, instead of iterating on it in this session."), f"""\
# loop-org-delegate

## When to use
- The goal can be checked by a command that exits 0 when it is met (`pytest -q`, `make check`, `npm test`).
- The work is bounded to one folder and can go on without you: fixing failing tests, a refactor under tests.
- Not for open questions, design choices or work whose success only a person can judge.

## Steps
1. Write the goal as what must be true when done ("`word_count` counts words separated by any whitespace").
2. Pick the verify command(s); run them once yourself and confirm they fail now for the right reason.
3. Call `{T}submit` with `goal`, `workspace` (absolute path), `verify` (a list) and caps
   (`max_iterations`, `budget_usd`) sized to the task; pass an `idempotency_key` so a retry submits once.
4. Read the result: `preflight.outcome` `already_passes` means there is nothing to do;
   `unrunnable` means the verify command cannot start (fix it and submit again).
5. Follow the run: subscribe to the resource `org://runs/ID` or call `{T}show` with the id; `{T}status`
   shows every run. Do not poll faster than every few seconds.
6. When it waits for a decision, use the loop-org-decisions skill. When it ends, read `stop_reason`:
   `goal_met` — call `{T}diff` and report the change; a cap or `no_progress` — report it and ask before
   `{T}continue` with a raised cap.

## Criteria and thresholds
- The verify command is fast (under a minute) and deterministic.
- Caps: start with `max_iterations` 5–10 and a `budget_usd` the person agreed to.
- Done means `stop_reason` is `goal_met`, decided by the org's eval-agent, not by the doer's own claim.

## Pitfalls
- A verify command that passes already, or passes on an empty change, proves nothing.
- The workspace must not contain the org home, and tests are protected: the agent may not edit them to pass.
- Writes need `submit` in `[mcp] tools` of org.toml; a `tool_disabled` error says how to enable it.
{NAMES}
"""),
    SkillText("loop-org-decisions", (
        "Answer loop-org's pending decisions: gated actions a run asked a human to allow (network access, a "
        "command outside its workspace) or questions it asked. Use when a run is paused waiting for a decision "
        "or org status reports decisions waiting."), f"""\
# loop-org-decisions

## When to use
- `{T}status` lists `pending_decisions`, or a run's `org://runs/ID` shows it waits for a decision.
- The person asked you to handle the org's decisions, within rules they gave you.

## Steps
1. Call `{T}decisions` to list what waits: each has an `id`, its `work_id`, the exact command and the reason.
2. Read the run (`{T}show` with the `work_id`) to see why it asks.
3. Decide one way with `{T}decide`: `approve` runs the command once; `edit` with `text` runs your command
   instead; `reject` (with `stop: true` to end the run) refuses; `respond` with `text` answers a question.
4. Pass an `idempotency_key` so a retry decides once; then follow the run until it moves on.

## Criteria and thresholds
- Approve only a command you would run yourself: a named host, a read-only fetch, a path you recognise.
- When in doubt, ask the person; an undecided action only pauses the run, nothing is lost by waiting.

## Pitfalls
- Approving is durable and runs the command exactly once; it cannot be taken back.
- `decide` must be enabled in `[mcp] tools` of org.toml; a `tool_disabled` error says how.
- A decision already answered returns `illegal_transition`: read it again with `{T}decisions` (`all: true`).
{NAMES}
"""),
    SkillText("loop-org-review", (
        "Review a batch of skill candidates that loop-org's curator proposed from finished runs: read each "
        "one's text and evidence, then approve, reject or defer it. Use when org status reports a candidate "
        "batch waiting for review."), f"""\
# loop-org-review

## When to use
- `{T}status` lists `open_batches`, or the person asks what the org has learned.

## Steps
1. Call `{T}candidates` (action `list`) to see the pending candidates with their scores.
2. For each, call `{T}candidates` with action `show` and its `id`: read the SKILL.md text, the score out
   of 5 and the per-signal evidence (recurrence, multi-step, trigger, criteria, reusable output).
3. Approve the ones that would help a future run, reject the wrong or trivial ones, defer what needs the
   person's judgement: `{T}candidates` with action `approve` / `reject` / `defer` and `ids`, plus an
   `idempotency_key`.
4. Report what you decided and why; `{T}skills` lists the approved skills and their use.

## Criteria and thresholds
- Approve when the steps are concrete, the trigger is clear and the evidence spans more than one run.
- Reject when it restates a single run, names one repository's paths, or could mislead.

## Pitfalls
- Reviewing needs `review` in `[mcp] tools` of org.toml; a `tool_disabled` error says how to enable it.
- An approved skill is carried by every later run: when unsure, defer and ask the person.
{NAMES}
"""),
]


def main(out: Path = HERE / "skills") -> list[Path]:
    """Write ``out/<name>/SKILL.md`` for each skill (the Agent Skills layout); returns the paths."""
    paths = []
    for skill in SKILLS:
        path = out / skill.name / "SKILL.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(render(skill))
        paths.append(path)
    return paths


if __name__ == "__main__":
    for path in main():
        print(path)
