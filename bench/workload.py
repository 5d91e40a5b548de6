"""Work for the chaos and soak runs: a small workspace template, scripted acts, a real org.

Every act leaves a trace that a replay would duplicate: its first turn runs
``echo it<N> >> trail.txt``, so a committed checkpoint of iteration n must hold exactly the lines
``it1`` .. ``itn`` (of the acts whose command ran; see ``bench/chaos_audit.py``). An act cut by a
crash and re-run without the workspace being reset would leave ``itn`` twice. The answer file
decides the verdict:

- ``pass`` k: wrong answers (each wrong differently) until iteration k writes ``right``
  → ``goal_met``;
- ``never``: a different wrong answer every iteration → ``max_iterations``;
- ``same``: the same wrong answer twice → ``repeated_failure``;
- ``gated``: iteration 1 also asks a human (``request_action``, of kind ``gate``) to run
  ``sleep 0.3; echo approved >> gate.log``; whatever the human decides, iteration k writes ``right``
  → ``goal_met``. An approved action appends one line to gate.log (an edited one, ``edited``),
  so a line twice is an action run twice.

``reads`` extra ``read_file`` turns make an act longer, so kills land mid-act more often.
"""
from __future__ import annotations

import json
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

VERIFY = 'a=$(cat answer.txt); [ "$a" = right ] || { echo "FAIL: the answer is $a"; exit 1; }'
SCOPE = ("answer.txt",)   # the fix edits a data file: outside the default (code only) change scope
NOTES = "".join(f"line {i}: the answer must be the word right, on its own line.\n" for i in range(60))
CAPS = {"pass": 6, "never": 3, "same": 5, "gated": 6}
EXPECTED_STOP = {"pass": "goal_met", "never": "max_iterations", "same": "repeated_failure", "gated": "goal_met"}
WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
GATE_LOG = "gate.log"
# what a gated item asks a human to run, and what the human runs instead when editing; each
# takes a moment, so a kill can land while it runs
GATE_COMMAND = f"sleep 0.3; echo approved >> {GATE_LOG}"
EDITED_COMMAND = f"sleep 0.3; echo edited >> {GATE_LOG}"
GATE_KINDS = ("outside_workspace", "network")


@dataclass(frozen=True)
class ItemSpec:
    """What one work item's model does: ``kind`` (pass / never / same / gated), ``k`` (the
    passing iteration of ``pass`` and ``gated``), ``reads`` (extra read turns per act), ``gate``
    (the kind of block a ``gated`` item asks to lift)."""

    kind: str
    k: int
    reads: int
    gate: str = ""

    @property
    def name(self) -> str:
        return f"{self.kind}{self.k}-r{self.reads}" + (f"-{self.gate}" if self.gate else "")

    @property
    def max_iterations(self) -> int:
        return CAPS[self.kind]

    @property
    def expected_stop(self) -> str:
        return EXPECTED_STOP[self.kind]

    def answer(self, i: int) -> str:
        if self.kind in ("pass", "gated"):
            return "right" if i >= self.k else _wrong(i)
        if self.kind == "same":
            return "wrong"
        return _wrong(i)


def _wrong(i: int) -> str:
    """A wrong answer of its own per iteration. In words: failure signatures leave numbers out,
    so ``wrong-1`` and ``wrong-2`` would be the same failure (``repeated_failure``)."""
    return "wrong-" + "-".join(WORDS[int(d)] for d in str(i))


def random_spec(rng: random.Random, max_reads: int = 3, gated: float = 0.0) -> ItemSpec:
    """Mostly items that pass after 1-4 iterations, some that hit a cap or fail the same way;
    a ``gated`` share asks a human in iteration 1 and passes at iteration 2 or 3."""
    if gated and rng.random() < gated:
        return ItemSpec("gated", rng.randint(2, 3), rng.randint(0, max_reads), rng.choice(GATE_KINDS))
    roll = rng.random()
    kind = "pass" if roll < 0.7 else "never" if roll < 0.85 else "same"
    return ItemSpec(kind, rng.randint(1, 4) if kind == "pass" else 0, rng.randint(0, max_reads))


def act(spec: ItemSpec, i: int) -> list[dict]:
    turns = [{"text": f"Iteration {i}: recording that I ran.",
              "tool_uses": [{"name": "run_command", "input": {"command": f"echo it{i} >> trail.txt"}}]}]
    if spec.kind == "gated" and i == 1:
        turns += [{"tool_uses": [{"name": "request_action", "input": {
            "kind": spec.gate, "command": GATE_COMMAND, "reason": "the answer is in a file outside"}}]}]
    turns += [{"tool_uses": [{"name": "read_file", "input": {"path": "notes.md"}}]}] * spec.reads
    turns += [{"tool_uses": [{"name": "write_file", "input": {"path": "answer.txt",
                                                                "content": spec.answer(i) + "\n"}}]},
              {"text": f"Wrote {spec.answer(i)} to answer.txt."}]
    return turns


def write_script(folder: Path, spec: ItemSpec) -> Path:
    """The script file of ``spec`` (one per distinct spec; shared by the items that use it)."""
    path = folder / f"{spec.name}.json"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        acts = [act(spec, i) for i in range(1, spec.max_iterations + 1)]
        path.write_text(json.dumps({"version": 1, "acts": acts}))
    return path


def make_template(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "answer.txt").write_text("unset\n")
    (path / "trail.txt").write_text("")
    (path / "notes.md").write_text(NOTES)
    return path


def org_config(loop_agents: int, extra: str = "", transport: str = "", eval_agents: int = 1,
               quick: bool = True) -> str:
    """org.toml for a bench org: a quick stop, restarts never given up (a chaos run kills the same
    role many times within a minute on purpose). ``quick``: heartbeats every 0.2 s (a killed role
    found within 4 s) and the outbox swept every second; False keeps org.toml's defaults for both,
    what a user's org runs with. ``transport``: more lines of the [transport] table; ``extra``:
    more tables."""
    beats = "heartbeat_s = 0.2\nheartbeat_timeout_s = 4.0\n" if quick else ""
    sweep = "sweep_s = 1.0\n" if quick else ""
    return (f"[org]\nloop_agents = {loop_agents}\neval_agents = {eval_agents}\n"
            f"[supervisor]\n{beats}stop_timeout_s = 3.0\nrestart_max = 1000\nrestart_window_s = 60.0\n"
            f"[transport]\n{sweep}" + transport + extra)


def new_org(root: Path, loop_agents: int, extra_config: str = "", transport: str = "", eval_agents: int = 1,
            quick: bool = True):
    """An initialised org home under ``root`` (short path: ipc sockets live in it); ``quick`` as
    for ``org_config``."""
    from state_db.bootstrap import init_home
    from state_db.kernel.home import OrgHome

    home = OrgHome(root / "org")
    home.root.mkdir(parents=True)
    home.config_path.write_text(org_config(loop_agents, extra_config, transport, eval_agents, quick))
    cfg, _ = init_home(home)
    return home, cfg


def submit_item(home, cfg, template: Path, workspace: Path, script: Path, spec: ItemSpec) -> str:
    """Copy the template to ``workspace`` and submit it; returns the work item id."""
    from roles.operations.submit import SubmitRequest, submit
    from state_db.queries.work import Caps

    shutil.copytree(template, workspace)
    req = SubmitRequest(goal=f"make answer.txt say right ({spec.name})", workspace=str(workspace),
                        verify=[VERIFY], scope=list(SCOPE), caps=Caps(max_iterations=spec.max_iterations),
                        backend=f"scripted:{script}")
    return submit(home, cfg, req)["id"]


def query(home, sql: str, params=()) -> list[dict]:
    from state_db.connection import read_rows
    return read_rows(home.db_path, sql, params)


def wait(predicate, timeout: float, what: str, interval: float = 0.02):
    """Poll ``predicate`` until truthy; raise TimeoutError naming ``what`` and the last value."""
    from transport.probe import wait_until
    return wait_until(predicate, timeout=timeout, what=what, interval=interval)


def unfinished(home, ids: list[str]) -> list[str]:
    if not ids:
        return []
    ended = {r["id"] for r in query(home, "SELECT id FROM work_items WHERE status = 'ended'")}
    return [i for i in ids if i not in ended]


def kill_everything(home) -> None:
    """Kill -9 the supervisor and every role process recorded for ``home`` (pid + start time)."""
    from roles.supervisor import procs
    procs.kill_org(home)


def add_history(home, items: int, iterations: int = 3) -> None:
    """Give the org ``items`` ended work items of the past, each with a preflight and
    ``iterations`` committed, verified iterations (their attempts and two model calls each), as
    a store that has served months of work holds them: what an org reads per iteration must
    not grow with them. Written straight into state.db before the org starts; every row is one
    the org itself would write (the vocabularies' guards hold)."""
    import sqlite3

    conn = sqlite3.connect(home.db_path)
    t = time.time() - 86400.0
    try:
        conn.execute("BEGIN")
        for k in range(items):
            wid = f"past-{k:06d}"
            at = t + k * 0.01
            conn.execute("INSERT INTO work_items (id, goal, workspace, verify, backend, status, stop_reason, "
                         "stop_detail, attempt, created_by, created_at, updated_at, ended_at) "
                         "VALUES (?, ?, ?, ?, 'anthropic', 'ended', 'goal_met', 'verified', ?, 'bench', ?, ?, ?)",
                         (wid, f"past goal {k}: make answer.txt say right", f"/srv/past/{k}", json.dumps([VERIFY]),
                          iterations, at, at, at + 30))
            conn.execute("INSERT INTO preflights (work_id, outcome, checks, detail, written_by, at) "
                         "VALUES (?, 'ready', '[]', 'baseline: 0 passed, 1 failed', 'eval-agent', ?)", (wid, at))
            for n in range(1, iterations + 1):
                conn.execute("INSERT INTO attempts (work_id, attempt, iteration, instance, started_at, ended_at, "
                             "outcome) VALUES (?, ?, ?, 'loop-agent-1', ?, ?, 'committed')", (wid, n, n, at, at + 1))
                conn.execute("INSERT INTO iterations (work_id, n, attempt, act_status, act_summary, committed_at, "
                             "verdict_id, checkpoint) VALUES (?, ?, ?, 'ok', 'wrote the answer', ?, ?, ?)",
                             (wid, n, n, at + 1, f"v-{wid}-{n}", f"{k:032x}{n:08x}"))
                conn.execute("INSERT INTO verdicts (id, work_id, iteration, outcome, feedback, written_by, at) "
                             "VALUES (?, ?, ?, ?, 'FAIL: the answer is wrong', 'eval-agent', ?)",
                             (f"v-{wid}-{n}", wid, n, "pass" if n == iterations else "fail", at + 2))
                for call in (1, 2):
                    conn.execute("INSERT INTO model_calls (request_id, work_id, iteration, attempt, instance, model, "
                                 "input_tokens, output_tokens, at) VALUES (?, ?, ?, ?, 'loop-agent-1', 'scripted', "
                                 "1200, 40, ?)", (f"req-{wid}-{n}-{call}", wid, n, n, at + 1))
        conn.execute("COMMIT")
    finally:
        conn.close()
