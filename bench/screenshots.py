"""Screenshots of ``org dashboard``: bench/dashboard.png (the org page), bench/run.png (a run with
its transcript, a tool call opened), bench/cost.png (cost per goal family) and bench/knowledge.png
(the learning pipeline with an open batch).

A real org runs scripted demo runs (two reach goal_met, one waits for a human on a gated action)
and the learning scenario of tests/e2e/test_learning_loop.py (three runs fail the same check the
same way, the curator opens a batch of candidates), ``org dashboard`` serves them, and Debian's
headless Chromium takes the pictures once each page has drawn.

    .venv/bin/python -m bench.screenshots [--out bench/]
"""
from __future__ import annotations

import argparse
import base64
import sys
import tempfile
from pathlib import Path

from tests.e2e import dashboard_driver as dd
from tests.support.org import query, running_org, wait_for

CONFIG = """
[org]
loop_agents = 3
[supervisor]
heartbeat_s = 0.2
[knowledge]
raw_notes_to_consolidate = 3
notes_per_pattern = 3
candidates_per_batch = 1
"""
WIDTH = 1400


def _settle(driver, css: str, what: str) -> None:
    wait_for(lambda: driver.find_elements("css selector", css), timeout=20, what=what)
    wait_for(lambda: "live" in driver.find_element("css selector", "#live").text, timeout=10, what="the page to be live")


def _full_page(driver, path: Path) -> None:
    """The whole page, below the fold too (Chromium's DevTools screenshot beyond the viewport)."""
    shot = driver.execute_cdp_cmd("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})
    path.write_bytes(base64.b64decode(shot["data"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent, help="folder for the PNGs")
    args = parser.parse_args(argv)
    why = dd.missing()
    if why:
        print(f"error[no_browser]: {why}", file=sys.stderr)
        return 1
    scripts = Path(tempfile.mkdtemp(prefix="lo-shots-"))
    with running_org(CONFIG) as home:
        first, _ = dd.submit_demo(home, dd.slow_demo_script(scripts, delay_s=0.2), "ws-1")
        second, _ = dd.submit_demo(home, dd.DEMO / "script.json", "ws-2")
        for wid in (first, second):
            wait_for(lambda: query(home, "SELECT status FROM work_items WHERE id = ?", (wid,))[0]["status"] == "ended",
                     timeout=60, what=f"{wid} to end")
        learning = _learning_runs(home, scripts)
        wait_for(lambda: query(home, "SELECT 1 FROM candidate_batches WHERE status = 'open'"), timeout=60,
                 what="the curator to open a batch of candidates")
        gated, _ = dd.submit_demo(home, dd.gated_demo_script(scripts), "ws-3")
        wait_for(lambda: query(home, "SELECT 1 FROM decisions WHERE work_id = ? AND status = 'pending'", (gated,)),
                 timeout=60, what=f"{gated} to wait for a human")
        with dd.dashboard(home) as board, dd.chromium(WIDTH, 1000) as driver:
            board.open(driver)
            _settle(driver, 'svg[data-plot="org-tokens"] circle.pt', "the org plots")
            _full_page(driver, args.out / "dashboard.png")
            driver.get(board.url(f"/runs/{learning}"))
            _settle(driver, 'svg[data-plot="run-tokens"] circle.pt', "the run's plots")
            _settle(driver, "#transcript details.tool", "the run's transcript")
            driver.find_elements("css selector", "#transcript details.tool summary")[1].click()
            _full_page(driver, args.out / "run.png")
            driver.get(board.url("/cost"))
            _settle(driver, "#cost-total", "the cost page")
            driver.find_element("css selector", 'button[data-by="goal"]').click()
            _settle(driver, '#cost button.primary[data-by="goal"]', "the cost page by goal family")
            _full_page(driver, args.out / "cost.png")
            driver.get(board.url("/knowledge"))
            _settle(driver, "#knowledge-batches [data-candidate]", "the open batch's candidates")
            _full_page(driver, args.out / "knowledge.png")
    names = ", ".join(str(args.out / f"{n}.png") for n in ("dashboard", "run", "cost", "knowledge"))
    print(f"wrote {names}")
    return 0


def _learning_runs(home, folder: Path) -> str:
    """The learning scenario's three runs (each fails the same check the same way twice, then
    passes); returns the first one's id once all have ended."""
    from tests.e2e import test_learning_loop as L
    ids = L.submit(home, [L.settings_item(L.workspace(folder, svc, t), svc, L.recurring_script(folder / f"{svc}.json", t, s))
                          for svc, t, s in L.RUNS])
    L.ended(home, ids, timeout=90)
    return ids[0]


if __name__ == "__main__":
    sys.exit(main())
