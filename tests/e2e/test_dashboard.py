"""``org dashboard`` in a real headless Chromium (Debian's chromium + chromium-driver, through
selenium), against a real org: the token guards every page and API, a scripted run is watched
live to goal_met, its plots draw its points, a decision approved on the page lets the parked run
continue, and a cross-site POST is refused. Skipped without the browser, except under CI=true."""
from __future__ import annotations

import json
import os
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.e2e import dashboard_driver as dd
from tests.support.org import query, running_org, wait_for

WHY_NOT = dd.missing()
if WHY_NOT and os.environ.get("CI") != "true":
    pytest.skip(f"no browser for the dashboard test: {WHY_NOT}", allow_module_level=True)

from tests.support.org import ONE_AGENT as CONFIG  # noqa: E402


@pytest.fixture(scope="module")
def org():
    assert WHY_NOT is None, f"CI=true needs the browser: {WHY_NOT}"
    with running_org(CONFIG) as home:
        yield home


@pytest.fixture(scope="module")
def browser():
    with dd.chromium() as driver:
        yield driver


@pytest.fixture(scope="module")
def board(org, browser):
    with dd.dashboard(org) as d:
        _refused_before_the_link(d)
        d.open(browser)
        yield d


def _refused_before_the_link(board):
    """Before its link is opened, every page and API is refused, a guessed ticket too."""
    for path in ("/", "/runs/w-x", "/api/org", "/api/plots", "/api/decisions", "/api/candidates", "/api/runs/w-x"):
        page = not path.startswith("/api")
        status, body = http(board, path + ("?again=1" if page else ""))
        assert status == 403 and "no_session" in body, (path, status, body)
        status, body = http(board, path + "?token=" + board.ticket)
        if page:     # a link followed from another site: one reload from this origin, and no data
            assert status == 200 and 'http-equiv="refresh"' in body and "again=1" in body and "data-" not in body
        else:
            assert status == 403, path
    assert http(board, "/?ticket=wrong")[0] == 403


@pytest.fixture(scope="module")
def parked(org, tmp_path_factory):
    """A run parked on its one pending decision: (work id, workspace, decision id)."""
    wid, ws = dd.submit_demo(org, dd.gated_demo_script(tmp_path_factory.mktemp("gated")), "gated-ws")

    def parked_on():
        w = query(org, "SELECT status, assigned_to FROM work_items WHERE id = ?", (wid,))[0]
        ds = query(org, "SELECT id, status FROM decisions WHERE work_id = ?", (wid,))
        return w["status"] == "paused" and w["assigned_to"] is None and len(ds) == 1 and ds[0]["status"] == "pending" \
            and ds[0]["id"]
    return wid, ws, wait_for(parked_on, timeout=40, what=f"{wid} parked on a pending decision")


def http(board, path, *, method="GET", headers=None, body=None):
    req = urllib.request.Request(board.base + path, method=method, headers=headers or {}, data=body)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _alert(driver):
    from selenium.common.exceptions import NoAlertPresentException
    try:
        return driver.switch_to.alert
    except NoAlertPresentException:
        return None


def dom(driver, css, attr=None):
    """Text (or an attribute) of every element matching ``css`` now; [] while the page redraws."""
    from selenium.common.exceptions import StaleElementReferenceException
    try:
        return [e.get_attribute(attr) if attr else e.text for e in driver.find_elements("css selector", css)]
    except StaleElementReferenceException:
        return []


def test_the_link_opens_once_and_leaves_only_a_cookie_no_script_reads(board, browser):
    """The printed link, spent by the browser, opens nothing again (another user who read it from
    the browser's command line gets a refusal); the browser's session is an HttpOnly cookie that the
    page's script cannot see, and the page's address holds no secret."""
    browser.get(board.url("/"))
    wait_for(lambda: dom(browser, "#live.down") == [] and "live" in " ".join(dom(browser, "#live")) and dom(browser, "#runs"),
             timeout=10, what="the org page with its session to go live")
    assert "ticket" not in browser.current_url and board.ticket not in browser.current_url
    assert browser.execute_script("return document.cookie") == ""
    status, body = http(board, f"/?ticket={board.ticket}")                  # the link, read off argv
    assert status == 403 and "link_used" in body
    assert http(board, "/api/decisions")[0] == 403                          # and no cookie: nothing
    assert http(board, "/api/decisions", headers=board.cookie)[0] == 200


def test_the_api_returns_what_the_cli_json_returns(org, board):
    auth = board.cookie
    status = json.loads(http(board, "/api/org", headers=auth)[1])
    assert set(status) == set(json.loads(dd.cli(org, "status", "--json").stdout))
    assert [r["instance"] for r in status["roles"]] == [r["instance"] for r in
                                                         json.loads(dd.cli(org, "status", "--json").stdout)["roles"]]


def test_a_scripted_run_is_watched_live_to_goal_met_and_its_plots_draw_its_points(org, board, browser, tmp_path):
    browser.get(board.url("/"))
    wid, _ = dd.submit_demo(org, dd.slow_demo_script(tmp_path), "live-ws")
    seen: list[str] = []

    def watched_to_the_end():
        row = dom(browser, f'tr[data-run="{wid}"] td.status') + dom(browser, f'tr[data-run="{wid}"] td.phase')
        if row and (not seen or seen[-1] != " ".join(row)):
            seen.append(" ".join(row))
        return "goal_met" in " ".join(dom(browser, f'tr[data-run="{wid}"] td.reason')) and seen
    wait_for(watched_to_the_end, timeout=40, what=f"{wid} to reach goal_met on the page (seen {seen})")
    assert any("ended" not in s for s in seen), f"the page never showed the run before it ended: {seen}"

    calls = query(org, "SELECT COUNT(*) AS c FROM model_calls WHERE work_id = ?", (wid,))[0]["c"]
    browser.get(board.url(f"/runs/{wid}"))
    wait_for(lambda: "goal_met" in " ".join(dom(browser, "#run-status")), timeout=10, what="the run page")
    points = wait_for(lambda: dom(browser, 'svg[data-plot="run-tokens"]', "data-points"), timeout=10, what="the run's plot")
    assert int(points[0]) == calls > 0
    assert len(browser.find_elements("css selector", 'svg[data-plot="run-tokens"] circle.pt')) == calls
    assert int(dom(browser, 'svg[data-plot="run-iterations"]', "data-points")[0]) == 2
    browser.find_element("css selector", 'button[data-diff="2"]').click()
    diff = wait_for(lambda: " ".join(dom(browser, "#diff pre.diff")), timeout=10, what="iteration 2's diff")
    assert "+    return len(text.split())" in diff

    browser.get(board.url("/"))
    org_points = wait_for(lambda: dom(browser, 'svg[data-plot="org-tokens"]', "data-points"), timeout=10, what="org plots")
    assert int(org_points[0]) >= calls
    assert wid[-4:] in " ".join(dom(browser, 'svg[data-plot="runs-iterations"] text'))


class _Attacker(BaseHTTPRequestHandler):
    """Another site's page: a form that posts an approval to the dashboard, with the right token."""
    page = b""

    def do_GET(self):
        self.send_response(200)
        self.send_header("content-type", "text/html")
        self.end_headers()
        self.wfile.write(self.page)

    def log_message(self, *args):
        pass


def test_a_cross_site_post_is_refused_even_with_the_token(org, board, browser, parked):
    wid, ws, decision = parked
    target = f"{board.base}/api/decisions/{decision}"
    _Attacker.page = (f'<form id="f" method="POST" action="{target}"><input name="token" value="{board.token}">'
                      f'<input name="verdict" value="approve"></form><script>document.getElementById("f").submit()'
                      f'</script>').encode()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Attacker)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        browser.get(f"http://localhost:{server.server_address[1]}/")      # localhost is another site than 127.0.0.1
        refused = wait_for(lambda: "cross_site" in browser.page_source and browser.page_source, timeout=10,
                           what="the dashboard's answer to the cross-site form")
        assert "error[cross_site]" in refused
    finally:
        server.shutdown()
        server.server_close()
    body = json.dumps({"verdict": "approve", "idempotency_key": "x", "confirm": decision}).encode()
    json_post = {"X-Org-Token": board.token, "Content-Type": "application/json", **board.cookie}
    own = {"Origin": board.base}
    assert http(board, f"/api/decisions/{decision}", method="POST", body=body,
                headers={**json_post, "Origin": "http://evil.example"})[0] == 403
    assert http(board, f"/api/decisions/{decision}", method="POST", body=body,
                headers={**json_post, **own, "Sec-Fetch-Site": "cross-site"})[0] == 403
    status, said = http(board, f"/api/decisions/{decision}", method="POST", body=body, headers=json_post)
    assert status == 403 and "cross_site" in said                       # no Origin: refused, cookie or not
    no_cookie = {k: v for k, v in json_post.items() if k != "Cookie"}
    assert http(board, f"/api/decisions/{decision}", method="POST", body=body, headers={**no_cookie, **own})[0] == 403
    status, said = http(board, f"/api/decisions/{decision}", method="POST", headers={**json_post, **own},
                        body=json.dumps({"verdict": "approve", "idempotency_key": "y"}).encode())
    assert status == 409 and "confirm_needed" in said                   # a gated command: the page asks again
    assert query(org, "SELECT status FROM decisions WHERE id = ?", (decision,))[0]["status"] == "pending"
    assert not (ws / "fetched.txt").exists()


def test_approving_a_decision_on_the_page_lets_the_parked_run_continue(org, board, browser, parked):
    wid, ws, decision = parked
    browser.get(board.url("/"))
    button = f'button[data-decision="{decision}"][data-verdict="approve"]'
    wait_for(lambda: dom(browser, button), timeout=10, what="the approve button")
    browser.find_element("css selector", button).click()
    asked = wait_for(lambda: _alert(browser), timeout=10, what="the page to ask again before approving")
    assert "echo fetched >> fetched.txt" in asked.text and "network" in asked.text      # the whole command
    asked.accept()
    wait_for(lambda: f"{decision}: approved" in " ".join(dom(browser, ".decision .note")) or
             query(org, "SELECT status FROM decisions WHERE id = ?", (decision,))[0]["status"] != "pending",
             timeout=10, what="the approval to be recorded")
    ended = wait_for(lambda: (w := query(org, "SELECT * FROM work_items WHERE id = ?", (wid,))[0])["status"] == "ended"
                     and w, timeout=40, what=f"{wid} to continue and end")
    assert ended["stop_reason"] == "goal_met"
    assert (ws / "fetched.txt").read_text() == "fetched\n"                     # the approved action ran once
    d = query(org, "SELECT status, decided_by FROM decisions WHERE id = ?", (decision,))[0]
    assert d["status"] == "executed" and d["decided_by"]
    writes = query(org, "SELECT actor FROM events WHERE subject = ? AND actor = 'human'", (decision,))
    assert writes, "the approval is not a durable human write"
    wait_for(lambda: "goal_met" in " ".join(dom(browser, f'tr[data-run="{wid}"] td.reason')), timeout=10,
             what="the page to show the continued run's end")


def test_a_busy_port_is_one_coded_line_and_other_commands_never_load_the_web_stack(org, board):
    import subprocess
    import sys
    port = board.base.rsplit(":", 1)[1]
    busy = subprocess.run([sys.executable, "-m", "scripts.cli.main", "dashboard", "--port", port], capture_output=True,
                          text=True, timeout=30, env={**os.environ, "ORG_HOME": str(org.root)})
    assert busy.returncode == 1 and busy.stderr.startswith("error[port_in_use]") and len(busy.stderr.splitlines()) == 1
    probe = ("import sys; from scripts.cli.main import build_parser; build_parser(); "
             "print(sorted(m for m in ('starlette', 'uvicorn') if m in sys.modules))")
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=30).stdout.strip() == "[]"


def test_schedules_and_triggers_are_drawn_on_the_org_page(org, board, browser):
    ws = org.root.parent / "orders-ws"
    ws.mkdir()
    dd.cli(org, "schedule", "add", "yearly", "--cron", "0 3 1 1 *", "--", "keep it green", "--workspace", str(ws),
           "--verify", "true", "--backend", "command")
    browser.get(board.url("/"))
    row = wait_for(lambda: " ".join(dom(browser, 'tr[data-order="yearly"] td')) or None, timeout=10,
                   what="the schedule's row on the org page")
    assert "schedule" in row and "cron 0 3 1 1 *" in row and "active" in row and "0 busy · 0 cap" in row
    dd.cli(org, "schedule", "remove", "yearly")
    wait_for(lambda: dom(browser, 'tr[data-order="yearly"]') == [], timeout=10, what="the removed schedule to go")


def test_a_link_followed_from_another_site_opens_the_page_in_the_browser_that_has_the_session(board, browser):
    """A chat's link (another site) arrives without the SameSite=Strict cookie; the page reloads
    itself once from its own origin and opens, with no secret in the link."""
    _Attacker.page = f'<a id="go" href="{board.url("/")}">open in the dashboard</a>'.encode()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Attacker)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        browser.get(f"http://localhost:{server.server_address[1]}/")
        browser.find_element("css selector", "#go").click()
        wait_for(lambda: dom(browser, "#runs"), timeout=15, what="the org page opened from the other site's link")
        assert "ticket" not in browser.current_url
    finally:
        server.shutdown()
        server.server_close()


def test_a_key_reused_for_another_decision_is_a_conflict_on_the_dashboard_too(org, board, tmp_path):
    """The page's writes are bound to their arguments like every front end's: the same key for a
    second decision answers 409 idempotency_conflict, and that decision stays pending (rejections:
    no command runs)."""
    runs = []
    for i in range(2):
        (tmp_path / f"s{i}").mkdir()
        runs.append(dd.submit_demo(org, dd.gated_demo_script(tmp_path / f"s{i}"), f"key-ws-{i}")[0])

    def pending():
        rows = [query(org, "SELECT id FROM decisions WHERE work_id = ? AND status = 'pending'", (w,)) for w in runs]
        return all(rows) and [r[0]["id"] for r in rows]
    first, second = wait_for(pending, timeout=60, what="both runs waiting on a decision")
    headers = {"X-Org-Token": board.token, "Content-Type": "application/json", "Origin": board.base, **board.cookie}

    def reject(decision):
        body = json.dumps({"verdict": "reject", "idempotency_key": "same-key", "confirm": decision}).encode()
        return http(board, f"/api/decisions/{decision}", method="POST", body=body, headers=headers)
    assert reject(first)[0] == 200
    status, said = reject(second)
    assert status == 409 and "idempotency_conflict" in said, (status, said)
    assert query(org, "SELECT status FROM decisions WHERE id = ?", (second,))[0]["status"] == "pending"
    assert reject(first)[0] == 200                                      # the same write again: replayed
