"""Chaos run: a real org (4 loop-agents, scripted model) under kill -9, suspend and resume.

Usage: ``bench/chaos.py --json [--items N] [--kills K] [--seconds S] [--suspends U] [--gated F]
[--seed X] [--store sqlite|postgresql]``.
The default run stays under 45 s; the claim is proven with e.g. ``--items 120 --kills 14
--seconds 70``.

Items (``bench/workload.py``) need one to several iterations, each on its own workspace, and
are submitted over the first part of the chaos phase. During ``S`` seconds, ``K`` kills -9 land
at random moments: a busy loop-agent mid-act, or any role, or the supervisor (then the org is
recovered the way ``org resume`` does it: ``control.start_background``). ``U`` times the whole
org is suspended (graceful, then forced) and resumed. Each kill waits for recovery before the
next: the killed role ready again with a new process (or, for the supervisor and suspends,
every role ready with processes started after the event) — that time is ``max_recovery_ms``.

A share of the items (``--gated``) asks a human in its first iteration (``request_action``);
the benchmark decides each pending decision at a random moment — approve, reject, edit or
respond — so decisions land before, during (while the org is down or recovering) and after
kills and suspends. A question asked again (its action was cut by a kill) is rejected: the
benchmark never approves one action twice, so an action's line twice in its log is a rerun.

After the org settles (every submitted item ended, or a timeout), the org is stopped and
``bench/chaos_audit.py`` checks every item against state.db, the journal, the shadow
histories and the scripted servers' logs. Exit 1 when a count is not zero, integrity is not
"ok", or fewer kills or suspends happened than asked for.
"""
from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import workload  # noqa: E402

ZERO = ("lost_items", "iterations_committed_twice", "usage_counted_twice", "acts_replayed_without_reset",
        "runs_without_stop_reason", "usage_without_served_request", "iteration_usage_mismatches",
        "iteration_gaps", "foreign_key_violations", "recovery_timeouts", "gated_actions_run_twice",
        "gated_actions_lost", "paused_runs_stuck", "elapsed_undercounted_runs")
VERDICTS = ("approve", "reject", "edit", "respond")
LOOP_AGENTS = 4


def targets(kills: int, suspends: int) -> dict:
    out = {k: "== 0" for k in ZERO}
    out.update({"sqlite_integrity": "== ok", "kills": f">= {kills}", "suspend_resumes": f">= {suspends}"})
    return out


def passes(figures: dict, kills: int, suspends: int) -> dict:
    out = {k: figures.get(k) == 0 for k in ZERO}
    out.update({"sqlite_integrity": figures.get("sqlite_integrity") == "ok",
                "kills": figures.get("kills", 0) >= kills,
                "suspend_resumes": figures.get("suspend_resumes", 0) >= suspends})
    return out


# -- recovery -----------------------------------------------------------------------------------

def _wanted(home) -> list[str]:
    from roles.base.instances import org_instances

    return [s.instance for s in org_instances(LOOP_AGENTS)]


def org_ready_since(home, since_wall: float) -> bool:
    """Every role ready in a live process started after ``since_wall``, under a live supervisor."""
    from roles.supervisor import procs

    session = workload.query(home, "SELECT status, supervisor_pid, supervisor_start FROM org_session")
    if not session or session[0]["status"] != "running" or \
            not procs.is_alive(session[0]["supervisor_pid"], session[0]["supervisor_start"]):
        return False
    rows = {r["instance"]: r for r in workload.query(
        home, "SELECT instance, status, pid, pid_start, started_at FROM role_instances")}
    return all(rows[i]["status"] == "ready" and (rows[i]["started_at"] or 0) >= since_wall
               and procs.is_alive(rows[i]["pid"], rows[i]["pid_start"]) for i in _wanted(home))


def role_ready_again(home, instance: str, old_pid: int) -> bool:
    from roles.supervisor import procs

    row = workload.query(home, "SELECT status, pid, pid_start FROM role_instances WHERE instance = ?", (instance,))[0]
    return row["status"] == "ready" and row["pid"] != old_pid and procs.is_alive(row["pid"], row["pid_start"])


def busy_agents(home) -> list[str]:
    """Loop-agents inside an act or running an approved action right now (an open attempt, or
    an executing decision, of the item assigned to them)."""
    return [r["instance"] for r in workload.query(
        home, """SELECT DISTINCT a.instance FROM attempts a JOIN work_items w ON w.id = a.work_id
                  WHERE a.ended_at IS NULL AND w.assigned_to = a.instance AND w.status = 'running'
                 UNION SELECT w.assigned_to FROM decisions d JOIN work_items w ON w.id = d.work_id
                  WHERE d.status = 'executing' AND w.assigned_to IS NOT NULL""")]


# -- events -------------------------------------------------------------------------------------

class Chaos:
    def __init__(self, home, cfg, rng: random.Random, timeout_s: float = 60.0):
        self.home, self.cfg, self.rng, self.timeout_s = home, cfg, rng, timeout_s
        self.kills: list[dict] = []
        self.suspends: list[dict] = []
        self.timeouts: list[str] = []
        self.phase = "before"           # before / during (a kill or suspend under way) / between / after
        self.events = 0                 # kills and suspends begun

    def kill(self, want_supervisor: bool) -> None:
        """Kill -9 one process (a busy loop-agent mid-act more often than not), then wait until
        it is replaced: the role ready in a new process, or the whole org after 'org resume'."""
        from scripts import control
        from roles.supervisor import procs

        home, wanted = self.home, _wanted(self.home)
        alive = {r["instance"]: r for r in workload.query(home, "SELECT instance, pid, pid_start FROM role_instances")
                 if r["instance"] in wanted and procs.is_alive(r["pid"], r["pid_start"])}
        busy = [a for a in busy_agents(home) if a in alive]
        if want_supervisor:
            victim = "supervisor"
        elif busy and self.rng.random() < 0.6:
            victim = self.rng.choice(busy)
        else:
            victim = self.rng.choice(sorted(alive) + ["supervisor"])
        wall, t0 = time.time(), time.monotonic()
        if victim == "supervisor":
            pid, started = procs.read_pidfile(home.run_dir / "supervisor.pid")
            os.kill(pid, signal.SIGKILL)
            workload.wait(lambda: not procs.is_alive(pid, started), 10, "the supervisor to die")
            control.start_background(home, timeout_s=self.timeout_s)          # what 'org resume' does
            workload.wait(lambda: org_ready_since(home, wall), self.timeout_s, "the org to serve again")
        else:
            row = alive[victim]
            os.kill(row["pid"], signal.SIGKILL)
            workload.wait(lambda: role_ready_again(home, victim, row["pid"]), self.timeout_s,
                          f"{victim} to be ready again")
        self.kills.append({"victim": victim, "mid_act": victim in busy,
                           "recovery_ms": round((time.monotonic() - t0) * 1000, 1)})

    def suspend_resume(self, force: bool) -> None:
        from scripts import control
        from roles.supervisor import procs

        t0 = time.monotonic()
        result = control.request(self.home, "suspend", force=force, timeout_s=self.timeout_s)
        left = [r for r in workload.query(self.home, "SELECT pid, pid_start FROM role_instances")
                if procs.is_alive(r["pid"], r["pid_start"])]
        t1, wall = time.monotonic(), time.time()
        control.start_background(self.home, timeout_s=self.timeout_s)
        workload.wait(lambda: org_ready_since(self.home, wall), self.timeout_s, "the org to resume")
        self.suspends.append({"force": force, "status": result["status"], "processes_left": len(left),
                              "suspend_ms": round((t1 - t0) * 1000, 1),
                              "resume_ms": round((time.monotonic() - t1) * 1000, 1)})


class Decider:
    """The human of a chaos run. Each pending decision, when first seen, gets a moment at random:
    ``soon`` (up to ``max_delay_s`` later), ``next_event`` (while the next kill or suspend is
    under way: the org is down or recovering) or ``after_chaos``; a decision whose moment does
    not come before the chaos phase ends is decided then. Records verdicts and phases."""

    def __init__(self, home, cfg, chaos: Chaos, rng: random.Random, max_delay_s: float = 3.0):
        self.home, self.cfg, self.chaos, self.rng, self.max_delay_s = home, cfg, chaos, rng, max_delay_s
        self.due: dict[str, tuple[str, float, int]] = {}     # id -> (moment, not before, events seen)
        self.made: list[dict] = []
        self.errors: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.1):
            try:
                self.step(time.monotonic())
            except Exception as exc:  # noqa: BLE001 - state.db busy: the next round retries
                self.errors.append(f"{type(exc).__name__}: {exc}"[:300])

    def step(self, now: float) -> None:
        from roles.operations.decide import decide

        chaos = self.chaos
        for d in workload.query(self.home, "SELECT id, result FROM decisions WHERE status = 'pending'"):
            if d["id"] not in self.due:
                moment = self.rng.choice(("soon", "next_event", "after_chaos"))
                self.due[d["id"]] = (moment, now + self.rng.uniform(0, self.max_delay_s), chaos.events)
            moment, at, seen = self.due[d["id"]]
            ready = (chaos.phase == "after" or (moment == "soon" and now >= at)
                     or (moment == "next_event" and chaos.phase == "during" and chaos.events > seen))
            if not ready:
                continue
            asked_again = "interrupted" in (d["result"] or "")
            verdict = "reject" if asked_again else self.rng.choice(VERDICTS)
            text = {"edit": workload.EDITED_COMMAND, "respond": "the file is in vendor/",
                    "reject": "not on this machine"}.get(verdict)
            phase = self.chaos.phase
            decide(self.home, self.cfg, d["id"], verdict, text)
            self.made.append({"id": d["id"], "verdict": verdict, "phase": phase, "asked_again": asked_again})

    def figures(self) -> dict:
        return {"gated_decisions_made": len(self.made),
                "gated_decisions_by_verdict": _count(m["verdict"] for m in self.made),
                "gated_decisions_by_phase": _count(m["phase"] for m in self.made),
                "gated_questions_asked_again": sum(m["asked_again"] for m in self.made),
                "decide_errors": len(self.errors), "decide_error_samples": self.errors[:3]}


def schedule(rng: random.Random, kills: int, suspends: int, seconds: float) -> list[tuple[float, str]]:
    """Event times in the chaos phase; at least one kill is the supervisor's."""
    times = sorted(rng.uniform(0.5, seconds) for _ in range(kills + suspends))
    kinds = ["kill"] * kills + ["suspend"] * suspends
    rng.shuffle(kinds)
    if kills and "supervisor" not in kinds:
        kinds[kinds.index("kill")] = "kill-supervisor"
    return list(zip(times, kinds))


def submitter(home, cfg, root: Path, specs: list, span_s: float, out: list, errors: list) -> None:
    template = workload.make_template(root / "template")
    t0 = time.monotonic()
    for n, spec in enumerate(specs):
        time.sleep(max(0.0, t0 + span_s * n / max(1, len(specs)) - time.monotonic()))
        try:
            wid = workload.submit_item(home, cfg, template, root / "ws" / f"i{n:04d}",
                                       workload.write_script(root / "scripts", spec), spec)
            out.append((wid, spec))
        except Exception as exc:  # noqa: BLE001 - a refused submit is reported, not fatal
            errors.append(f"{type(exc).__name__}: {exc}")


# -- the run ------------------------------------------------------------------------------------

def run(root: Path, *, items: int, kills: int, seconds: float, suspends: int, seed: int,
        settle_s: float, gated: float = 0.2, store_url: str = "") -> dict:
    from bench.chaos_audit import audit
    from scripts import control

    rng = random.Random(seed)
    home, cfg = workload.new_org(root, LOOP_AGENTS, extra_config=f'[state]\nurl = "{store_url}"\n' if store_url else "")
    t_start = time.monotonic()
    control.start_background(home, timeout_s=60)
    startup_ms = round((time.monotonic() - t_start) * 1000, 1)
    specs = [workload.random_spec(rng, gated=gated) for _ in range(items)]
    submitted: list = []
    submit_errors: list = []
    feeder = threading.Thread(target=submitter, args=(home, cfg, root, specs, 0.7 * seconds, submitted,
                                                      submit_errors), daemon=True)
    chaos = Chaos(home, cfg, rng)
    decider = Decider(home, cfg, chaos, random.Random(seed + 1))
    human = threading.Thread(target=decider.run, name="decider", daemon=True)
    t0 = time.monotonic()
    feeder.start()
    human.start()
    suspend_no = 0
    try:
        for at, kind in schedule(rng, kills, suspends, seconds):
            time.sleep(max(0.0, t0 + at - time.monotonic()))
            chaos.events += 1
            chaos.phase = "during"
            try:
                if kind == "suspend":
                    chaos.suspend_resume(force=suspend_no % 2 == 1)
                    suspend_no += 1
                else:
                    chaos.kill(want_supervisor=kind == "kill-supervisor")
            except TimeoutError as exc:                       # the org did not recover: counted, run on
                chaos.timeouts.append(str(exc)[:300])
            chaos.phase = "between"
        chaos.phase = "after"
        feeder.join()
        chaos_s = time.monotonic() - t0
        ids = [wid for wid, _ in submitted]
        try:
            workload.wait(lambda: not workload.unfinished(home, ids), settle_s, "every item to end", interval=0.2)
        except TimeoutError:
            pass                                                # counted as lost_items by the audit
        settled_s = time.monotonic() - t0
    finally:
        decider.stop.set()
        human.join(timeout=30)
        control.request(home, "stop", force=True, timeout_s=60)
    figures = audit(home, dict(submitted))
    figures.update(decider.figures())
    recoveries = [k["recovery_ms"] for k in chaos.kills] + [s["resume_ms"] for s in chaos.suspends]
    figures.update({
        "kills": len(chaos.kills), "kills_mid_act": sum(k["mid_act"] for k in chaos.kills),
        "kills_by_role": _count(_role_of(k["victim"]) for k in chaos.kills),
        "suspend_resumes": len(chaos.suspends), "suspends": chaos.suspends,
        "max_recovery_ms": max(recoveries, default=None),
        "max_role_recovery_ms": max((k["recovery_ms"] for k in chaos.kills if k["victim"] != "supervisor"), default=None),
        "max_supervisor_recovery_ms": max((k["recovery_ms"] for k in chaos.kills if k["victim"] == "supervisor"),
                                          default=None),
        "recovery_timeouts": len(chaos.timeouts), "recovery_timeout_samples": chaos.timeouts[:3],
        "submit_errors": len(submit_errors), "submit_error_samples": submit_errors[:3],
        "startup_ms": startup_ms, "chaos_phase_s": round(chaos_s, 1), "settled_s": round(settled_s, 1),
    })
    return figures


def _role_of(victim: str) -> str:
    return "loop-agent" if victim.startswith("loop-agent-") else victim


def _count(values) -> dict:
    out: dict = {}
    for v in values:
        out[v] = out.get(v, 0) + 1
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--items", type=int, default=16, help="work items to submit")
    p.add_argument("--kills", type=int, default=4, help="kill -9 events (at least one hits the supervisor)")
    p.add_argument("--seconds", type=float, default=8.0, help="length of the chaos phase")
    p.add_argument("--suspends", type=int, default=1, help="whole-org suspend/resume cycles (graceful, forced, ...)")
    p.add_argument("--gated", type=float, default=0.2,
                   help="share of items that ask a human (request_action) in their first iteration")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: from the clock; printed)")
    p.add_argument("--settle", type=float, default=None, help="seconds to wait for every item to end afterwards")
    p.add_argument("--keep", action="store_true", help="keep the org home and workspaces (path printed)")
    p.add_argument("--store", choices=("sqlite", "postgresql"), default="sqlite",
                   help="postgresql: the org's state in a throwaway PostgreSQL server (Debian's postgresql "
                        "package, on a Unix socket), integrity checked by PostgreSQL's own constraints")
    p.add_argument("--root", help="an empty folder to work in, with a short path (ipc sockets live there); "
                                  "default: a new one under the temp folder")
    args = p.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))   # run the cleanup below when stopped
    seed = args.seed if args.seed is not None else int(time.time() * 1000) % 1_000_000
    from bench.common import quiet_logs
    quiet_logs()
    root = Path(args.root) if args.root else Path(tempfile.mkdtemp(prefix="lo-"))
    server = None
    try:
        url = ""
        if args.store == "postgresql":
            from tests.support.pg import PgServer
            server = PgServer.start(root / "pg")
            url = server.fresh_url()
        figures = run(root, items=args.items, kills=args.kills, seconds=args.seconds, suspends=args.suspends,
                      seed=seed, settle_s=args.settle if args.settle is not None else 30.0 + args.items * 0.5,
                      gated=args.gated, store_url=url)
        figures["store"] = args.store
    finally:
        from state_db.kernel.home import OrgHome
        workload.kill_everything(OrgHome(root / "org"))
        if server is not None:
            server.stop()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    figures["seed"] = seed
    figures["home"] = str(root) if args.keep else None
    from bench.common import finish
    return finish(figures, targets(args.kills, args.suspends), passes(figures, args.kills, args.suspends),
                  as_json=args.json)


if __name__ == "__main__":
    sys.exit(main())
