"""What a test runner run in the sandbox reported about itself: pytest's JUnit XML report.

The eval-agent reads it to judge a pass (``roles/eval_agent/evidence.py``) and a discovery scan
reads it to name the failing tests (``roles/operations/discover.py``): one reader serves both,
here in the workbench that both stand on. ElementTree is enough for the handful of attributes
read; the report is the runner's, written at a path the command was given.
"""
from __future__ import annotations

import xml.etree.ElementTree as ET

MAX_IDS = 5000


def read_junit(path) -> dict | None:
    """A JUnit XML report (pytest's ``--junitxml``) as {"counts", "ids", "truncated"}: ids map
    ``classname::name`` to passed / failed / error / skipped; counts are a test summary
    (``evidence.TestCounts`` encoded: runner, passed, failed, errors, skipped, deselected).
    None when there is no readable report (the runner did not finish its session)."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
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
