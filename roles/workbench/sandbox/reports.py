"""What a test runner run in the sandbox reported about itself: pytest's JUnit XML report.

The eval-agent reads it to judge a pass (``roles/eval_agent/evidence.py``) and a discovery scan
reads it to name the failing tests (``roles/operations/discover.py``): one reader serves both,
here in the workbench that both stand on. ElementTree is enough for the handful of attributes
read (expat bounds entity expansion; the bytes it parses are bounded first).

Where the report lives (``ReportFile``): the host creates an empty regular file in a folder of
its own that no sandbox sees (inside the org home, hidden from every sandbox) and binds that one
file into the sandbox, at a fresh path in its private ``/tmp``. The command can write the
file's bytes and nothing else: the path inside is a mount point, which can be neither renamed
over nor unlinked (``EBUSY``), and the system-call filter refuses every mount call, so the host's
path always names the file the host made — never a link to a host file, never a FIFO. Its
contents are still hostile: ``hostile.read_regular`` reads them (no link followed, a regular
file only, bounded in size), and a report over ``MAX_REPORT_BYTES`` is refused, never cut.
"""
from __future__ import annotations

import os
import uuid
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from roles.workbench.sandbox.hostile import HostileFile, read_regular

MAX_IDS = 5000
MAX_REPORT_BYTES = 32 * 2**20      # ~30 times the report of a 5,000-test suite


@dataclass(frozen=True)
class ReportFile:
    """One runner report: ``host`` the file the host made and reads, ``inside`` the path the
    command is given, ``binds`` the (host, inside) bind the sandbox needs (none for a runner
    without a sandbox, where both paths are the same)."""

    host: Path
    inside: Path
    binds: tuple[tuple[Path, Path], ...] = ()

    @classmethod
    def create(cls, folder: Path, runner=None) -> "ReportFile":
        """A fresh, empty report file in ``folder`` (made 0700 if missing), presented to
        ``runner``'s commands: at a fresh path in the sandbox's private ``/tmp`` for bubblewrap,
        at its own path otherwise."""
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        token = uuid.uuid4().hex
        host = folder / f"junit-{token}.xml"
        os.close(os.open(host, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
        if getattr(runner, "kind", None) == "bubblewrap":
            inside = Path("/tmp") / f".loop-org-report-{token}" / "junit.xml"
            return cls(host, inside, ((host, inside),))
        return cls(host, host)

    def read(self) -> tuple[dict | None, HostileFile | None]:
        """(the report as ``read_junit`` gives it, or None; the refusal, when the file was refused)."""
        try:
            return parse_junit(read_regular(self.host, limit=MAX_REPORT_BYTES)), None
        except HostileFile as exc:
            return None, exc

    def discard(self) -> None:
        self.host.unlink(missing_ok=True)

    @staticmethod
    def sweep(folder: Path, older_than_s: float = 3600.0) -> int:
        """Remove the report files a killed process left in ``folder`` (none is in use that
        long: a check is bounded by its timeout). Returns how many were removed."""
        import time
        removed, cutoff = 0, time.time() - older_than_s
        try:
            entries = list(os.scandir(folder))
        except OSError:
            return 0
        for entry in entries:
            try:
                if entry.name.startswith("junit-") and entry.stat(follow_symlinks=False).st_mtime < cutoff:
                    os.unlink(entry.path)
                    removed += 1
            except OSError:
                continue
        return removed


def read_junit(path, *, beneath=None) -> dict | None:
    """The JUnit report at ``path`` (see ``parse_junit``), read as hostile input
    (``hostile.read_regular``, below ``beneath`` when given); None when it is missing, refused
    or unreadable."""
    try:
        return parse_junit(read_regular(path, limit=MAX_REPORT_BYTES, beneath=beneath))
    except HostileFile:
        return None


def parse_junit(data: bytes) -> dict | None:
    """A JUnit XML report (pytest's ``--junitxml``) as {"counts", "ids", "truncated"}: ids map
    ``classname::name`` to passed / failed / error / skipped; counts are a test summary
    (``evidence.TestCounts`` encoded: runner, passed, failed, errors, skipped, deselected).
    None when there is no readable report (empty: the runner did not finish its session)."""
    if not data.strip():
        return None
    try:
        root = ET.fromstring(data)
    except (ET.ParseError, ValueError):
        return None
    ids, n = {}, {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    for case in root.iter("testcase"):
        if case.find("failure") is not None:
            outcome, key = "failed", "failed"
        elif case.find("error") is not None:
            outcome, key = "error", "errors"
        elif case.find("skipped") is not None:
            outcome, key = "skipped", "skipped"
        else:
            outcome, key = "passed", "passed"
        n[key] += 1
        if len(ids) < MAX_IDS:
            ids[f"{case.get('classname', '')}::{case.get('name', '')}"] = outcome
    total = sum(n.values())
    return {"counts": {"runner": "pytest", **n, "deselected": 0}, "ids": ids, "truncated": total > len(ids)}
