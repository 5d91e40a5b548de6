"""The dashboard's secret never sits in a URL that stays usable: a real Chromium opened with the
printed link on its command line (as a desktop's ``xdg-open`` does) spends it; another local user
(``nobody``) who read that link from ``/proc/<pid>/cmdline`` gets nothing with it — not the page,
not the pending decisions, not an approval: the link is spent, and the dashboard asks the kernel
whose each loopback connection is. The control: that user does read the link off the
browser's arguments, so the link is exposed and only its being spent protects the org."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time

import pytest

from tests.e2e import dashboard_driver as dd
from tests.support.org import ONE_AGENT, query, running_org, wait_for

WHY_NOT = dd.missing() or (None if os.geteuid() == 0 and shutil.which("runuser") else "needs root and runuser "
                                                                                       "for a second local user")
if WHY_NOT and os.environ.get("CI") != "true":
    pytest.skip(f"cannot run the second-user dashboard test: {WHY_NOT}", allow_module_level=True)

OTHER_USER = "nobody"
ATTACK = r"""
import json, sys, urllib.request, urllib.error
base, ticket, decision = sys.argv[1:4]
def go(path, method="GET", body=None, headers=None):
    req = urllib.request.Request(base + path, method=method, data=body, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
approve = json.dumps({"verdict": "approve", "idempotency_key": "stolen", "confirm": decision}).encode()
print(json.dumps({
    "link": go(f"/?ticket={ticket}"),
    "decisions": go("/api/decisions"),
    "decisions_with_ticket": go(f"/api/decisions?ticket={ticket}&token={ticket}"),
    "approve": go(f"/api/decisions/{decision}", "POST", approve,
                  {"Content-Type": "application/json", "X-Org-Token": ticket}),
    "approve_with_origin": go(f"/api/decisions/{decision}", "POST", approve,
                              {"Content-Type": "application/json", "X-Org-Token": ticket, "Origin": base}),
}))
"""


@pytest.mark.timeout(240)
def test_a_link_read_off_the_browsers_arguments_by_another_user_opens_nothing(tmp_path):
    assert WHY_NOT is None, WHY_NOT
    with running_org(ONE_AGENT) as org:
        wid, _ = dd.submit_demo(org, dd.gated_demo_script(tmp_path), "gated-ws")
        decision = wait_for(lambda: (d := query(org, "SELECT id FROM decisions WHERE work_id=? AND status='pending'",
                                                (wid,))) and d[0]["id"], timeout=60, what="a pending decision")
        with dd.dashboard(org) as board:
            profile = tempfile.mkdtemp(prefix="lo-chromium-")
            browser = subprocess.Popen([str(dd.CHROMIUM), *dd.CHROMIUM_FLAGS, f"--user-data-dir={profile}",
                                        "--dump-dom", board.link], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            try:
                seen = ""
                deadline = time.monotonic() + 30
                while not seen and time.monotonic() < deadline and browser.poll() is None:
                    read = subprocess.run(["runuser", "-u", OTHER_USER, "--", "cat", f"/proc/{browser.pid}/cmdline"],
                                          capture_output=True, timeout=10)
                    seen = next((a.decode() for a in read.stdout.split(b"\0") if b"ticket=" in a), "")
                dom, _ = browser.communicate(timeout=60)
            finally:
                if browser.poll() is None:
                    browser.kill()
                    browser.wait()
                shutil.rmtree(profile, ignore_errors=True)
            assert seen == board.link, f"the control: {OTHER_USER} reads the browser's arguments (saw {seen!r})"
            assert b'data-page="org"' in dom, dom[-500:]                     # the browser got in with it
            attack = subprocess.run(["runuser", "-u", OTHER_USER, "--", "/usr/bin/python3", "-c", ATTACK,
                                     board.base, board.ticket, decision], capture_output=True, text=True, timeout=60)
            got = json.loads(attack.stdout)
        # every door refuses the other user: the kernel says whose the connection is
        assert all(status == 403 and "other_user" in body for status, body in got.values()), got
        assert "echo fetched" not in json.dumps(got)                             # no decision disclosed
        assert query(org, "SELECT status FROM decisions WHERE id=?", (decision,))[0]["status"] == "pending"
