"""The doors where the org meets people and other machines, against agent-written text, a second
local user and a second host: every attempt tallied, 0 escapes the target.

Usage: ``bench/doors.py --json`` (≈ 3–6 min; ``--probes-only``: the terminal and notification
probes alone, ≈ 30 s).

Probes, each (payload, front end) pair one attempt, run here:

- **terminal**: each payload of ``PAYLOADS`` (OSC 52 clipboard write, title change, screen clear,
  C1 CSI, DCS query, device-status query, bidi override, NUL, OSC 8 hyperlink) is written by a
  scripted doer into its goal, gated request, workspace file and a log line; ``org decisions``,
  ``show``, ``status``, ``logs``, ``diff``, ``export`` (to a terminal) and ``watch`` run in a real
  pseudo-terminal. An escape: the payload's control sequence reaches the terminal whole.
- **notifications**: the same payloads and Slack's own syntax (``<!channel>``, ``<@U…>``, a
  labelled link, ``@here``) through the webhook body and the ``notify-send`` text. An escape: a
  control, a mention or a link of the agent's reaches the receiver.

Same-run baseline ``raw_terminal_escapes`` / ``raw_notification_escapes``: the same payloads
through the unguarded paths of this very run — ``org diff --raw`` in the same terminal, and the
body a receiver got before (the agent text pasted into ``text`` as it was).

Suites, each test case one attempt (a failing case is an escape): the dashboard's one-time link
read off a browser's arguments by a second local user (``nobody``), cross-site and Origin-less
writes and the re-asked network approval (real Chromium); two hosts in network namespaces against
a real sshd (another host's history, a planted or rewritten iteration ref, an oversized push); an
idempotency key reused for another decision (CLI and MCP); a store password on ``org join``'s
command line and secret files readable by others.

Targets: ``door_attempts`` ≥ 60, ``escapes`` == 0, ``probe_escapes`` == 0.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# payload -> the part that must never reach a receiver whole (a text tail makes each one unique, so
# org watch's own drawing sequences never count)
PAYLOADS = {
    "osc52_clipboard": ("\x1b]52;c;cHduZWQ=\x07", "\x1b]52;c;cHduZWQ="),
    "title_change": ("\x1b]0;pwned-title\x1b\\", "\x1b]0;pwned-title"),
    "screen_clear": ("\x1b[2Jpwned-clear", "\x1b[2Jpwned-clear"),
    "c1_csi": ("\u009b31mpwned-red", "\u009b31mpwned-red"),
    "dcs_query": ("\x1bP+q544e\x1b\\", "\x1bP+q544e"),
    "status_query": ("\x1b[6npwned-dsr", "\x1b[6npwned-dsr"),
    "bidi_override": ("\u202epwned-bidi", "\u202epwned-bidi"),
    "nul": ("pwned\x00nul", "pwned\x00nul"),
    "osc8_link": ("\x1b]8;;http://evil.example\x1b\\pwned-link\x1b]8;;\x1b\\", "\x1b]8;;http://evil.example"),
}
SLACK = {"channel": "<!channel>", "user": "<@U024BE7LH>", "labelled_link": "<http://evil.example|open in the dashboard>",
         "here": "@here", "everyone": "@everyone"}
FRONT_ENDS = (("decisions",), ("show", "w1"), ("status",), ("logs",), ("diff", "w1"), ("export", "w1", "--patch"))
SUITES = (("tests/e2e/test_dashboard_link.py", None), ("tests/e2e/test_host_scope.py", None),
          ("tests/e2e/test_idempotency_keys.py", None), ("tests/test_credentials.py", None),
          ("tests/e2e/test_dashboard.py", "cross_site or link or conflict"),
          ("tests/test_attention.py", "agent_text or notify_send_gets"))
TARGETS = {"door_attempts": ">= 60", "escapes": "== 0", "probe_escapes": "== 0"}


def _reached(out: str, marks: dict[str, str]) -> list[str]:
    return sorted(name for name, mark in marks.items() if mark in out)


def terminal_probes() -> tuple[dict, dict]:
    """Each front end in a pseudo-terminal; returns ({front end: payloads that reached it},
    {"diff --raw": payloads}) — the second is the same-run baseline."""
    from state_db.bootstrap import init_home
    from state_db.kernel.home import OrgHome
    from tests.e2e.test_terminal_doors import make_hostile_run, run_in_pty

    corpus = " ".join(p for p, _ in PAYLOADS.values())
    marks = {name: mark for name, (_, mark) in PAYLOADS.items()}
    with tempfile.TemporaryDirectory(prefix="doors-") as tmp:
        home = OrgHome(Path(tmp) / "org")
        init_home(home)
        env = make_hostile_run(home, Path(tmp), corpus)
        org = [sys.executable, "-m", "scripts.cli.main"]
        seen = {}
        for argv in FRONT_ENDS:
            seen[" ".join(argv[:1])] = _reached(run_in_pty([*org, *argv], env).decode("utf-8", "replace"), marks)
        watch = run_in_pty([*org, "watch", "--interval", "0.2"], env, keys=b"q", until=b"NEEDS YOU")
        seen["watch"] = _reached(watch.decode("utf-8", "replace"), marks)
        raw = _reached(run_in_pty([*org, "diff", "w1", "--raw"], env).decode("utf-8", "replace"),
                       {k: v for k, v in marks.items() if k != "nul"})          # git shows a file with NUL as binary
    return seen, {"diff --raw": raw}


def notification_probes() -> tuple[dict, dict]:
    """The webhook body and the notify-send text for each payload; returns ({receiver: what
    reached it}, {receiver: what reached it as the agent text was pasted before})."""
    from roles.coordinator.attention import message, plain

    marks = {name: mark for name, (_, mark) in PAYLOADS.items()} | SLACK
    texts = {name: payload for name, (payload, _) in PAYLOADS.items()} | SLACK
    url = "http://127.0.0.1:9/runs/w1"
    webhook, desktop, raw_webhook, raw_desktop = [], [], [], []
    for name, text in texts.items():
        body = message(f"w1 waits: {text}", url)
        shown = body["text"].rsplit("\n<" + url, 1)[0]               # the agent's part, before the real link
        # Slack's syntax in a plain_text block is drawn as text: only a control counts there
        in_blocks = name not in SLACK and marks[name] in json.dumps(body.get("blocks", []), ensure_ascii=False)
        if marks[name] in shown or in_blocks:
            webhook.append(name)
        # a desktop has no mentions: Slack's syntax counts there only as markup (<, &)
        if (name not in SLACK and marks[name] in plain(text)) or (name in SLACK and set("<&") & set(plain(text))):
            desktop.append(name)
        before = f"w1 waits: {text}\n<{url}|open in the dashboard>"   # the body as it was posted before
        if marks[name] in before:
            raw_webhook.append(name)
        if (name not in SLACK and marks[name] in text) or (name in SLACK and set("<&") & set(text)):
            raw_desktop.append(name)
    return {"webhook": webhook, "notify-send": desktop}, {"webhook": raw_webhook, "notify-send": raw_desktop}


def run_suites() -> dict:
    """Run the door suites; returns attempts (test cases run), escapes (failed or errored) and names."""
    from bench.common import junit_cases
    attempts, escapes, skipped = 0, [], []
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="doors-") as tmp:
        for n, (suite, select) in enumerate(SUITES):
            report = Path(tmp) / f"junit-{n}.xml"
            argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}", suite]
            got = subprocess.run(argv + (["-k", select] if select else []), cwd=ROOT, capture_output=True,
                                 text=True, timeout=1200, env={**os.environ, "PYTHONPATH": str(ROOT)})
            if not report.exists():
                raise SystemExit(f"error[no_report]: pytest wrote no report for {suite} (exit {got.returncode}) — "
                                 f"{got.stdout[-400:]} {got.stderr[-400:]}")
            passed, failed, left = junit_cases(report)
            attempts += len(passed) + len(failed)
            escapes += failed
            skipped += left
    return {"suite_cases": attempts, "suite_escapes": len(escapes), "escaped": escapes, "skipped": skipped,
            "suites_s": round(time.monotonic() - t0, 1)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--probes-only", action="store_true", help="skip the test suites")
    args = parser.parse_args(argv)
    from bench.common import finish, quiet_logs
    quiet_logs()
    terminal, raw_terminal = terminal_probes()
    notified, raw_notified = notification_probes()
    probe_attempts = len(PAYLOADS) * (len(FRONT_ENDS) + 1) + (len(PAYLOADS) + len(SLACK)) * 2
    probe_escapes = sum(map(len, terminal.values())) + sum(map(len, notified.values()))
    figures = {"probe_attempts": probe_attempts, "probe_escapes": probe_escapes,
               "raw_terminal_escapes": sum(map(len, raw_terminal.values())),
               "raw_notification_escapes": sum(map(len, raw_notified.values())),
               "probe_detail": {**{f"terminal {k}": v or "none" for k, v in terminal.items()},
                                **{k: v or "none" for k, v in notified.items()}}}
    passes = {"probe_escapes": probe_escapes == 0}
    if not args.probes_only:
        suites = run_suites()
        figures.update(suites)
        figures["door_attempts"] = probe_attempts + suites["suite_cases"]
        figures["escapes"] = probe_escapes + suites["suite_escapes"]
        passes.update({"door_attempts": figures["door_attempts"] >= 60, "escapes": figures["escapes"] == 0})
    return finish(figures, {k: v for k, v in TARGETS.items() if k in passes}, passes, as_json=args.json)


if __name__ == "__main__":
    sys.exit(main())
