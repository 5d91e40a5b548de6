"""The dashboard's transcript timeline, cost page and knowledge page in a real headless Chromium
against a real org: a scripted run's transcript is read and a tool call expanded to its output;
the run page draws only the caps the run has, with the numbers of ``org show --json``; the cost
page's totals equal ``org cost --json``; the knowledge page's candidate buttons change state.db.
Skipped without the browser, except under CI=true."""
from __future__ import annotations

import json
import os
import time

import pytest

from tests.e2e import dashboard_driver as dd
from tests.support.org import query, wait_for

WHY_NOT = dd.missing()
if WHY_NOT and os.environ.get("CI") != "true":
    pytest.skip(f"no browser for the dashboard test: {WHY_NOT}", allow_module_level=True)

from tests.e2e.test_dashboard import board, browser, dom, org  # noqa: E402,F401 - the org, its dashboard, the browser

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def ended(org):
    """A scripted demo run that failed once, then reached goal_met; its only cap is 5 iterations."""
    wid, _ = dd.submit_demo(org, dd.DEMO / "script.json", "pages-ws",
                            "--no-budget-tokens", "--no-budget-usd", "--no-timeout")
    wait_for(lambda: query(org, "SELECT status FROM work_items WHERE id = ?", (wid,))[0]["status"] == "ended",
             timeout=60, what=f"{wid} to end")
    return wid


def test_the_run_page_reads_the_transcript_and_a_tool_call_opens_to_its_output(org, ended, board, browser):
    shown = json.loads(dd.cli(org, "show", ended, "--transcript", "--json").stdout)
    calls = [(e["data"]["id"], e["data"]["name"]) for a in shown["attempts"] for e in a["entries"] if e["kind"] == "tool_call"]
    results = {e["data"]["id"]: e["data"]["output"] for a in shown["attempts"] for e in a["entries"]
               if e["kind"] == "tool_result"}
    tool_id, name = calls[0]
    browser.get(board.url(f"/runs/{ended}"))
    css = f'#transcript details.tool[data-tool="{tool_id}"]'
    wait_for(lambda: dom(browser, css), timeout=15, what="the transcript's first tool call")
    assert len(dom(browser, "#transcript details.tool")) == len(calls)
    assert [int(n) for n in dom(browser, "#transcript .iteration", "data-iteration")] == [1, 2]
    output = browser.find_element("css selector", css + " pre.output")
    assert not output.is_displayed()                          # folded until asked for
    browser.find_element("css selector", css + " summary").click()
    wait_for(lambda: output.is_displayed(), timeout=5, what="the tool call's output to show")
    first_line = results[tool_id].strip().splitlines()[0].split("\t")[-1]     # (a tab shows as spaces)
    assert first_line and first_line in output.text
    assert name in browser.find_element("css selector", css + " summary").text
    # the verdict of iteration 1 with its failing output, in the timeline
    failing = " ".join(dom(browser, '#transcript .iteration[data-iteration="1"] .failing pre.output'))
    verdict = shown["attempts"][0]["verdict"]
    assert verdict["outcome"] == "fail" and verdict["failing"][0]["output"].strip().splitlines()[-1] in failing


def test_the_run_page_draws_only_the_caps_the_run_has_with_the_numbers_of_org_show(org, ended, board, browser):
    run = json.loads(dd.cli(org, "show", ended, "--json").stdout)["run"]
    browser.get(board.url(f"/runs/{ended}"))
    wait_for(lambda: dom(browser, '[data-cap="tokens"]'), timeout=15, what="the run's caps")
    caps = {name: (used, limit) for name, used, limit in zip(dom(browser, "[data-cap]", "data-cap"),
                                                            dom(browser, "[data-cap]", "data-used"),
                                                            dom(browser, "[data-cap]", "data-limit"))}
    assert caps["iterations"] == (str(run["iteration"]["committed"]), str(run["iteration"]["max"]))
    assert caps["tokens"] == (str(run["tokens"]["used"]), "") and run["tokens"]["cap"] is None
    assert float(caps["cost"][0]) == run["cost_usd"]["used"] and caps["cost"][1] == ""
    assert float(caps["elapsed"][0]) == run["elapsed_s"]["used"] and caps["elapsed"][1] == ""
    text = " ".join(dom(browser, "#summary"))
    assert " of 0" not in text and "null" not in text and "of $0.0000" not in text
    assert "next: the verified change is in the workspace" in " ".join(dom(browser, "#run-hint"))


def test_the_cost_page_totals_equal_org_cost_json_for_each_grouping(org, ended, board, browser):
    browser.get(board.url("/cost"))
    for by in ("item", "goal", "model", "day"):
        expected = json.loads(dd.cli(org, "cost", "--by", by, "--json").stdout)
        if by != "item":
            browser.find_element("css selector", f'button[data-by="{by}"]').click()
        wait_for(lambda: dom(browser, f'#cost button.primary[data-by="{by}"]'), timeout=10, what=f"the page by {by}")
        total = wait_for(lambda: dom(browser, "#cost-total", "data-cost"), timeout=10, what="the total")[0]
        assert float(total) == pytest.approx(expected["total"]["cost_usd"], abs=1e-6)
        assert int(dom(browser, "#cost-total", "data-tokens")[0]) == expected["total"]["tokens"]
        assert dom(browser, "#cost tr[data-key]", "data-key") == [r["key"] for r in expected["rows"]]
        assert int(dom(browser, f'svg[data-plot="cost-{by}"]', "data-points")[0]) == min(24, len(expected["rows"]))


def _candidates(org) -> list[str]:
    """An open batch of three candidates, as the curator writes them."""
    from state_db.vocab import Actor
    from state_db.writer import StateWriter
    curator = StateWriter(org.db_path, Actor.CURATOR)
    now = time.time()
    ids = [f"c-pages-{name}" for name in ("run-tests-first", "read-before-edit", "small-diffs")]
    with curator.transaction() as tx:
        tx.insert("candidate_batches", {"id": "b-pages", "status": "open", "created_at": now})
        for cid in ids:
            name = cid.removeprefix("c-pages-")
            tx.insert("skill_candidates", {"id": cid, "name": name, "description": f"When to {name.replace('-', ' ')}.",
                                           "body": f"# {name}\n\nDo it.\n", "score": 4, "status": "pending",
                                           "batch_id": "b-pages", "created_at": now})
    curator.close()
    return ids


def test_the_knowledge_page_s_candidate_buttons_change_state_db(org, board, browser):
    approve, reject, edit = _candidates(org)
    browser.get(board.url("/knowledge"))
    wait_for(lambda: dom(browser, f'#knowledge-batches [data-candidate="{approve}"]'), timeout=15,
             what="the open batch with its candidates")
    stages = dict(zip(dom(browser, "#pipeline [data-stage]", "data-stage"), dom(browser, "#pipeline [data-stage] b")))
    counts = json.loads(dd.cli(org, "knowledge", "--json").stdout)["counts"]
    assert stages == {"raw": str(counts["raw"]), "curated": str(counts["curated"]),
                      "candidates": str(counts["candidates"]), "skills": str(counts["skills"])}

    def click(cid: str, label: str) -> None:
        """Click a candidate's button; a form the poll has just drawn again is found again."""
        from selenium.common.exceptions import StaleElementReferenceException

        def clicked() -> bool:
            try:
                form = browser.find_element("css selector", f'#knowledge-batches [data-candidate="{cid}"]')
                next(b for b in form.find_elements("css selector", "button") if b.text == label).click()
                return True
            except StaleElementReferenceException:
                return False
        wait_for(clicked, timeout=10, what=f"{label} clicked on {cid}")

    def shown(cid: str, status: str) -> None:
        wait_for(lambda: status in " ".join(dom(browser, f'#knowledge-batches [data-candidate="{cid}"] .pill')),
                 timeout=10, what=f"the page to show {cid} {status}")

    def status(cid: str) -> str:
        return query(org, "SELECT status FROM skill_candidates WHERE id = ?", (cid,))[0]["status"]

    click(approve, "approve")
    wait_for(lambda: status(approve) == "approved", timeout=10, what=f"{approve} approved in state.db")
    click(reject, "reject")
    wait_for(lambda: status(reject) == "rejected", timeout=10, what=f"{reject} rejected in state.db")
    shown(approve, "approved")
    shown(reject, "rejected")               # drawn again with both: the edit below is not redrawn away
    click(edit, "edit…")
    form = browser.find_element("css selector", f'#knowledge-batches [data-candidate="{edit}"]')
    field = form.find_elements("css selector", "input[type=text]")[1]          # name, description
    field.clear()
    field.send_keys("When a change is small, keep it small.")
    click(edit, "save edit")
    wait_for(lambda: query(org, "SELECT description FROM skill_candidates WHERE id = ?", (edit,))[0]["description"]
             == "When a change is small, keep it small.", timeout=10, what=f"{edit}'s description edited in state.db")
    assert status(edit) == "pending"
    assert (org.skills_dir / "run-tests-first" / "SKILL.md").is_file()        # approved: a skill now
