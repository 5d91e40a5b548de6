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


def _report(results: dict) -> str:
    full = {name: {"_error": None, "_exit": 0, "_seconds": 1.0, **r} for name, r in results.items()}
    return report.render(full, "now")[0]


def test_an_update_replaces_one_benchmarks_lines_and_keeps_the_others():
    """``--update``: a long benchmark's figures measured apart go into the report without running
    (or losing) the others; lists of case names get a section of their own."""
    old = _report({"loop": {"targets": {"p99": 5}, "pass": {"p99": True}, "p99": 3, "raw_p99": 9},
                   "verifier": {"targets": {"false_pass": 0}, "pass": {"false_pass": True}, "false_pass": 0}})
    new = _report({"verifier": {"targets": {"false_pass": 0}, "pass": {"false_pass": False}, "false_pass": 2,
                                "raw_plain_false_pass": 7, "false_pass_cases": ["a", "b"]}})
    text, ok = report.merge(old, new, ["verifier"])
    lines = text.splitlines()
    assert not ok and lines[-1] == "Overall: **a target failed**."
    assert "| loop | `p99` | 3 | <= 5 | pass |" in lines and "- loop `raw_p99`: 9" in lines
    assert "| verifier | `false_pass` | 2 | <= 0 | **FAIL** |" in lines
    assert "| verifier | `false_pass` | 0 | <= 0 | pass |" not in lines
    assert "- verifier `raw_plain_false_pass`: 7" in lines
    assert lines[lines.index("## verifier: cases") + 2] == "- `false_pass_cases` (2): a, b"
    assert sum(ln.startswith("- **verifier**") for ln in lines) == 1 and "- **loop** (exit 0, 1.0 s)" in text
    assert sum(ln.startswith("- updated: verifier at now, commit ") for ln in lines) == 1
    again, _ = report.merge(text, new, ["verifier"])
    assert again == text
