"""bench/report.py's rendering of RESULTS.md."""
from __future__ import annotations

from bench import report


def _rendered(figures: dict) -> list[str]:
    results = {"scale": {"_error": None, "_exit": 0, "_seconds": 1.0, "targets": {}, "pass": {}, **figures}}
    text, _ = report.render(results, "now")
    return [line for line in text.splitlines() if line.startswith("- **scale**")]


def test_repeated_measurements_are_listed_among_the_other_figures():
    line, = _rendered({"startup_ms": 437.7, "startup_ms_runs": [545.7, 455.9, 414]})
    assert line == "- **scale** (exit 0, 1.0 s): `startup_ms` 437.7; `startup_ms_runs` 545.7, 455.9, 414"


def test_lists_of_names_and_empty_lists_stay_out_of_the_line():
    line, = _rendered({"escaped": [], "fooled_tricks": ["conftest_autouse_skip"], "flags": [True, False],
                       "escapes": 0})
    assert line == "- **scale** (exit 0, 1.0 s): `escapes` 0"
