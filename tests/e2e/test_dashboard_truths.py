"""The dashboard tells the truth about a run that ended early, in a real headless Chromium: an
ended run's page never says "yet" of what will not come; plot labels are whole (a stop reason
is never cut) and the plots' text is readable at a desktop window's size."""
from __future__ import annotations

import os

import pytest

from state_db.ending import StopDecision, end_run
from state_db.vocab import Actor, StopReason
from tests.e2e import dashboard_driver as dd
from tests.support.loop import submit
from tests.support.org import wait_for

WHY_NOT = dd.missing()
if WHY_NOT and os.environ.get("CI") != "true":
    pytest.skip(f"no browser for the dashboard test: {WHY_NOT}", allow_module_level=True)

pytestmark = pytest.mark.timeout(120)
REASONS = (StopReason.VERIFY_UNRUNNABLE, StopReason.REPEATED_FAILURE, StopReason.MAX_ITERATIONS)


@pytest.fixture
def ended(org_home, tmp_path, writer_for):
    """Three runs that ended before any iteration, one per stop reason with a long name."""
    for k, reason in enumerate(REASONS):
        ws = tmp_path / f"ws{k}"
        ws.mkdir()
        submit(org_home, ws, f"w-{k}")
        with writer_for(Actor.COORDINATOR).transaction() as tx:
            end_run(tx, f"w-{k}", StopDecision(reason, f"ended as {reason}"))
    return org_home


def texts(driver, css):
    return driver.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0])).map(e => e.textContent)", css)


def test_an_ended_run_never_says_yet_and_plot_labels_are_whole_and_readable(ended):
    assert WHY_NOT is None, f"CI=true needs the browser: {WHY_NOT}"
    with dd.dashboard(ended) as board, dd.chromium() as browser:
        board.open(browser)                                 # the printed link: its ticket becomes the session
        browser.get(board.url("/runs/w-0"))
        wait_for(lambda: texts(browser, "#verdict div") and texts(browser, "svg.plot[data-plot='run-tokens'] text"),
                 timeout=20, what="the run page drawn")
        page = browser.find_element("css selector", "body").text
        assert "yet" not in page and "no data" not in page, page
        assert "never verified: the run ended verify_unrunnable" in page, page

        browser.get(board.url("/"))
        wait_for(lambda: len(texts(browser, "svg.plot[data-plot='stop-reasons'] text[data-label]")) == len(REASONS),
                 timeout=20, what="the stop-reasons plot drawn with its labels")
        shown = dict(zip(texts(browser, "#runs tr[data-run] a"), texts(browser, "#runs tr[data-run] td.workspace")))
        assert shown == {f"w-{k}": str(ended.root.parent / f"ws{k}") for k in range(len(REASONS))}, shown
        labels = browser.execute_script(
            "return Array.from(document.querySelectorAll(\"svg.plot[data-plot='stop-reasons'] text[data-label]\"))"
            ".map(e => [e.getAttribute('data-label'), e.textContent, e.getBoundingClientRect().height,"
            " e.getBoundingClientRect().width])")
        assert sorted(label for label, _, _, _ in labels) == sorted(str(r) for r in REASONS)
        assert all(shown == label for label, shown, _, _ in labels), labels          # whole, never cut
        lines = browser.execute_script(
            "return Array.from(document.querySelectorAll(\"svg.plot[data-plot='stop-reasons'] tspan\"))"
            ".map(e => e.getBoundingClientRect().height)")
        assert min(lines) >= 11, lines                    # each line at least 11 CSS px tall: readable
