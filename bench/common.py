"""What every benchmark's command line shares: quiet logs, and the closing figures."""
from __future__ import annotations

import json
import socket
import threading
from pathlib import Path


class BenchError(Exception):
    """An expected failure: printed as one line, ``error[code]: what — what to do``."""

    def __init__(self, code: str, what: str, todo: str) -> None:
        super().__init__(what)
        self.code, self.what, self.todo = code, what, todo

    def line(self) -> str:
        return f"error[{self.code}]: {self.what} — {self.todo}"


def quiet_logs() -> None:
    """Library logs go nowhere below warnings: the figures are the output."""
    import logging

    from state_db.kernel.logsetup import configure
    configure(None, "bench", "bench")
    logging.getLogger().setLevel(logging.WARNING)


def at_most(figures: dict, targets: dict) -> dict[str, bool]:
    """Each target an upper bound; a figure that was not measured fails."""
    return {k: figures.get(k) is not None and figures[k] <= v for k, v in targets.items()}


def finish(figures: dict, targets: dict, passes: dict[str, bool], *, as_json: bool) -> int:
    """Print the figures with their targets and results; the exit code says whether all held."""
    figures["targets"] = targets
    figures["pass"] = passes
    print(json.dumps(figures, ensure_ascii=False, indent=None if as_json else 2))
    return 0 if all(passes.values()) else 1


def unix_listener(path: Path, reply: bytes) -> socket.socket:
    """A host process's Unix socket at ``path`` that answers ``reply`` to whoever connects (the
    escape probes and the sandbox tests reach for one); close it to stop."""
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    listener.listen(8)

    def answer() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            conn.sendall(reply)
            conn.close()
    threading.Thread(target=answer, name=f"listener {path.name}", daemon=True).start()
    return listener


def junit_cases(report: Path) -> tuple[list[str], list[str], list[str]]:
    """The test cases of a pytest JUnit report as (passed, failed or errored, skipped) names."""
    import xml.etree.ElementTree as ET
    passed, failed, skipped = [], [], []
    for case in ET.parse(report).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        if case.find("skipped") is not None:
            skipped.append(name)
        elif case.find("failure") is not None or case.find("error") is not None:
            failed.append(name)
        else:
            passed.append(name)
    return passed, failed, skipped
