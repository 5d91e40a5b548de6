"""Driving ``org dashboard`` in Debian's headless Chromium: shared by tests/e2e/test_dashboard.py
and bench/screenshots.py. The browser and its driver come from Debian's packages (chromium,
chromium-driver); nothing is downloaded at run time."""
from __future__ import annotations

import json
import os
import selectors
import shutil
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
DEMO = Path(__file__).resolve().parents[2] / "scripts" / "demo"
# as root on this kind of machine: no sandbox, no GPU, and no background calls to Google's hosts
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", "--hide-scrollbars")


def missing() -> str | None:
    """Why the browser cannot run here, or None."""
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not os.access(path, os.X_OK):
            return f"{path} is missing: install Debian's {package} package (.ci/run does)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed: pip install -e '.[test]'"
    return None


@dataclass
class Dashboard:
    proc: subprocess.Popen
    base: str            # http://127.0.0.1:PORT
    ticket: str          # the printed link's one-time ticket
    session: str = ""    # the cookie the link became, once a browser opened it
    token: str = ""      # the page's write token (served inside the page)

    @property
    def link(self) -> str:
        return f"{self.base}/?ticket={self.ticket}"

    def url(self, path: str = "/") -> str:
        return f"{self.base}{path}"

    def open(self, driver) -> None:
        """Open the printed link in ``driver`` (spending its ticket) and keep what it became: the
        session cookie (for requests made beside the browser) and the page's write token."""
        driver.get(self.link)
        cookie = driver.get_cookie("org_session")
        assert cookie and cookie.get("httpOnly") and cookie.get("sameSite") == "Strict", cookie
        self.session = cookie["value"]
        self.token = driver.find_element("css selector", "body").get_attribute("data-token")

    @property
    def cookie(self) -> dict:
        return {"Cookie": f"org_session={self.session}"}


@contextmanager
def dashboard(home, timeout: float = 20.0):
    """``org dashboard --port 0`` as a real process; yields once it printed its link."""
    proc = subprocess.Popen([sys.executable, "-m", "scripts.cli.main", "dashboard", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "ORG_HOME": str(home.root)})
    try:
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        line = proc.stdout.readline() if sel.select(timeout) else ""
        sel.close()
        if not line.startswith("dashboard: http://"):
            proc.kill()
            raise AssertionError(f"org dashboard printed {line!r} within {timeout} s; stderr: {proc.stderr.read()}")
        base, ticket = line.split(" ", 1)[1].strip().split("/?ticket=")
        yield Dashboard(proc, base, ticket)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def chromium(width: int = 1400, height: int = 1000):
    """A headless Chromium driven through ChromeDriver, with a fresh profile; quit after."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="lo-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in CHROMIUM_FLAGS + (f"--user-data-dir={profile}", f"--window-size={width},{height}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def cli(home, *argv) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "scripts.cli.main", *argv], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "ORG_HOME": str(home.root)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def slow_demo_script(folder: Path, delay_s: float = 0.4, reads: int = 4) -> Path:
    """The demo script whose first act reads a few times, each answer taking ``delay_s``: the run
    lasts long enough to be watched."""
    script = json.loads((DEMO / "script.json").read_text())
    script["acts"][0] = [{"tool_uses": [{"name": "read_file", "input": {"path": "textstats.py"}}],
                          "delay_s": delay_s} for _ in range(reads)] + script["acts"][0]
    path = folder / "slow.json"
    path.write_text(json.dumps(script))
    return path


def gated_demo_script(folder: Path) -> Path:
    """Iteration 1 asks a human to run ``echo fetched >> fetched.txt``; iteration 2 fixes the code."""
    fix = {"name": "edit_file", "input": {"path": "textstats.py", "old_string": '    return text.count(" ") + 1',
                                          "new_string": "    return len(text.split())"}}
    path = folder / "gated.json"
    path.write_text(json.dumps({"version": 1, "acts": [
        [{"tool_uses": [{"name": "request_action", "input": {
            "kind": "network", "command": "echo fetched >> fetched.txt", "reason": "needs the upstream file"}}]},
         {"text": "Asked a human for network access."}],
        [{"tool_uses": [fix]}, {"text": "word_count now splits on any run of whitespace."}]]}))
    return path


def submit_demo(home, script: Path, name: str, *flags: str) -> tuple[str, Path]:
    """Submit the demo goal on a fresh copy of the demo project, with 5 iterations and the default other caps
    (``flags`` adds more, e.g. ``--no-budget-tokens``); returns (work id, workspace)."""
    ws = home.root.parent / name
    shutil.copytree(DEMO / "project", ws)
    out = cli(home, "submit", "make word_count right", "--workspace", str(ws), "--verify", "python3 -m unittest -q",
              "--backend", f"scripted:{script}", "--max-iterations", "5", *flags, "--no-wait", "--json")
    return json.loads(out.stdout)["id"], ws
