"""Screenshots of ``org dashboard``: bench/dashboard.png (the org page) and bench/run.png (a run).

A real org runs three scripted demo runs (two reach goal_met, one waits for a human on a gated
action), ``org dashboard`` serves them, and Debian's headless Chromium takes the pictures once
the page has drawn its plots.

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
loop_agents = 2
[supervisor]
heartbeat_s = 0.2
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
        gated, _ = dd.submit_demo(home, dd.gated_demo_script(scripts), "ws-3")
        wait_for(lambda: query(home, "SELECT 1 FROM decisions WHERE work_id = ? AND status = 'pending'", (gated,)),
                 timeout=60, what=f"{gated} to wait for a human")
        with dd.dashboard(home) as board, dd.chromium(WIDTH, 1000) as driver:
            board.open(driver)
            _settle(driver, 'svg[data-plot="org-tokens"] circle.pt', "the org plots")
            _full_page(driver, args.out / "dashboard.png")
            driver.get(board.url(f"/runs/{first}"))
            _settle(driver, 'svg[data-plot="run-tokens"] circle.pt', "the run's plots")
            driver.find_element("css selector", 'button[data-diff="2"]').click()
            wait_for(lambda: driver.find_elements("css selector", "#diff pre.diff"), timeout=10, what="the diff")
            _full_page(driver, args.out / "run.png")
    print(f"wrote {args.out / 'dashboard.png'} and {args.out / 'run.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
