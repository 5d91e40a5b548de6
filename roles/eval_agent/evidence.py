"""What a verify command's output proves: how many tests ran, passed, failed and were skipped.

An exit code of 0 says only that a process ended well. A pass needs evidence that the tests ran,
so the eval-agent reads the summary the test runner prints and compares it with the baseline's
(``judge``). Runners it can read: pytest, unittest, ``node --test`` (TAP), jest, vitest, mocha,
``go test`` and ``cargo test``. Where none of them printed a summary the verdict says that the
pass rests on the exit code alone.

For pytest — whatever runs it — the eval-agent does not rely on what is printed: it asks pytest
for a JUnit XML report at a fresh, unpredictable path (``PYTEST_ADDOPTS``) and reads the test
ids and outcomes from it (``read_junit``). A run that prints a forged summary and exits before
pytest finishes its session writes no report, and every test id the baseline ran must be there,
not skipped. For the other runners the last summary printed wins: a runner prints its summary at
the very end, so a line printed earlier by the code under test cannot stand in for it.

Code that runs inside the test runner's own process can do anything the runner can, including
rewriting the report where the runner writes it: the canaries (``canaries``) are what the report
is held to against that — tests the eval-agent adds, which an honest report shows as they are.
What no reader of the runner's results can stop is code written against this verifier in
particular (finding the canaries and forging around them); it is in the diff (``org diff``). What
``judge`` guarantees: zero tests, fewer tests than the baseline ran, more skipped or deselected
than the baseline, no summary or report where the baseline had one, or a baseline test that did
not run, is never a pass.

Failure ids (``failing_ids``) give a failure signature that does not change with timings,
numbers or messages that vary from run to run: the same tests failing is the same failure.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from roles.workbench.sandbox.reports import MAX_IDS, read_junit  # noqa: F401 - re-exported: callers read it here

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


@dataclass(frozen=True)
class TestCounts:
    """One runner's summary. ``ran`` counts tests that executed (passed + failed + errors)."""

    __test__ = False                      # not a pytest test class

    runner: str
    passed: int = 0
    failed: int = 0
    errors: int = 0
    skipped: int = 0
    deselected: int = 0

    @property
    def ran(self) -> int:
        return self.passed + self.failed + self.errors

    def encode(self) -> dict:
        return asdict(self)

    @classmethod
    def decode(cls, data: dict | None) -> "TestCounts | None":
        if not data:
            return None
        return cls(**{k: data[k] for k in ("runner", "passed", "failed", "errors", "skipped", "deselected") if k in data})

    def line(self) -> str:
        parts = [f"{self.ran} ran", f"{self.passed} passed"]
        parts += [f"{n} {k}" for k, n in (("failed", self.failed), ("errors", self.errors),
                                          ("skipped", self.skipped), ("deselected", self.deselected)) if n]
        return f"{self.runner}: " + ", ".join(parts)


# -- summaries ---------------------------------------------------------------------------------

# pytest: "==== 1 failed, 2 passed, 1 skipped in 0.12s ====", "2 passed in 0.01s", "no tests ran in 0.01s"
_PYTEST = re.compile(r"^=*\s*((?:\d+ \w+(?:, )?)+|no tests ran)\s+in\s+[\d.]+\s*s(?:econds)?\b.*$")
PYTEST_SUMMARY = _PYTEST        # the line pytest ends a session with
_PYTEST_PART = re.compile(r"(\d+) (passed|failed|errors?|skipped|deselected|xfailed|xpassed|warnings?|rerun)")
# unittest: "Ran 3 tests in 0.001s" then "OK", "OK (skipped=1)", "FAILED (failures=1, errors=1, skipped=2)"
_UNITTEST_RAN = re.compile(r"^Ran (\d+) tests? in [\d.]+s$")
_UNITTEST_END = re.compile(r"^(OK|FAILED)(?: \((.*)\))?$")
# node --test (TAP): "# tests 3" "# pass 2" "# fail 1" "# skipped 0" "# todo 0" "# cancelled 0"
_TAP = re.compile(r"^(?:#|ℹ) (\w+) ([\d.]+)$")
_PYTEST_COLLECTED = re.compile(r"^=*\s*(?:\d+/)?\d+ tests? collected(?: \(.*\))?\s+in\s+[\d.]+\s*s\b")
# jest: "Tests:       1 failed, 1 skipped, 2 passed, 4 total"; vitest: "Tests  1 failed | 2 passed (3)"
_JEST = re.compile(r"^Tests:\s+(.*\d+ total)$")
_VITEST = re.compile(r"^Tests\s+(.*)\((\d+)\)$")
_COUNT_WORD = re.compile(r"(\d+) (passed|failed|skipped|todo|pending)")
# mocha: "  2 passing (5ms)" "  1 failing" "  1 pending"
_MOCHA = re.compile(r"^(\d+) (passing|failing|pending)(?: \(.*\))?$")
# cargo: "test result: FAILED. 1 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.00s"
_CARGO = re.compile(r"^test result: \w+\. (\d+) passed; (\d+) failed; (\d+) ignored; \d+ measured; (\d+) filtered out")
# go test -v: "--- PASS: TestX (0.00s)", "--- FAIL: TestY", "--- SKIP: TestZ"; plain: "ok  pkg 0.1s" / "FAIL pkg"
_GO_CASE = re.compile(r"^\s*--- (PASS|FAIL|SKIP): (\S+)")
_GO_PKG = re.compile(r"^(ok|FAIL|\?)\s+\S+\s+(?:[\d.]+s|\[no test files\])")


def _pytest(line: str) -> TestCounts | None:
    if _PYTEST_COLLECTED.match(line):          # --collect-only: nothing ran
        return TestCounts("pytest")
    m = _PYTEST.match(line)
    if not m:
        return None
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0, "deselected": 0}
    for n, word in _PYTEST_PART.findall(m.group(1)):
        key = {"error": "errors", "errors": "errors", "xfailed": "skipped", "xpassed": "passed"}.get(word, word)
        if key in counts:
            counts[key] += int(n)
    return TestCounts("pytest", **counts)


def _lines(output: str) -> list[str]:
    return [_ANSI.sub("", ln).strip() for ln in output.splitlines()]


def parse(output: str) -> TestCounts | None:
    """The last test summary in ``output``, or None when no runner printed one."""
    lines = _lines(output)
    for i in range(len(lines) - 1, -1, -1):
        found = _summary_at(lines, i)
        if found is not None:
            return found
    return None


def _summary_at(lines: list[str], i: int) -> TestCounts | None:
    line = lines[i]
    if (got := _pytest(line)) is not None:
        return got
    m = _UNITTEST_END.match(line)
    if m and i >= 1:
        ran = next((int(r.group(1)) for j in range(i - 1, max(-1, i - 4), -1)
                    if (r := _UNITTEST_RAN.match(lines[j]))), None)
        if ran is not None:
            detail = dict(kv.split("=", 1) for kv in (m.group(2) or "").split(", ") if "=" in kv)
            failed, errors = int(detail.get("failures", 0)), int(detail.get("errors", 0))
            skipped = int(detail.get("skipped", 0)) + int(detail.get("expected failures", 0))
            return TestCounts("unittest", passed=max(0, ran - failed - errors - skipped), failed=failed,
                              errors=errors, skipped=skipped)
    if _TAP.match(line):
        block = {}
        j = i
        while j >= 0 and (t := _TAP.match(lines[j])):
            block.setdefault(t.group(1), int(float(t.group(2))))
            j -= 1
        if "tests" in block and "pass" in block:
            return TestCounts("node-test", passed=block["pass"], failed=block.get("fail", 0) + block.get("cancelled", 0),
                              skipped=block.get("skipped", 0) + block.get("todo", 0))
    if (m := _JEST.match(line)) or (m := _VITEST.match(line)):
        words = {w: int(n) for n, w in _COUNT_WORD.findall(m.group(1))}
        return TestCounts("jest" if line.startswith("Tests:") else "vitest", passed=words.get("passed", 0),
                          failed=words.get("failed", 0),
                          skipped=words.get("skipped", 0) + words.get("todo", 0) + words.get("pending", 0))
    if (m := _MOCHA.match(line)):
        block = {}
        for j in range(max(0, i - 3), min(len(lines), i + 3)):
            if (t := _MOCHA.match(lines[j])):
                block[t.group(2)] = int(t.group(1))
        if "passing" in block:
            return TestCounts("mocha", passed=block["passing"], failed=block.get("failing", 0),
                              skipped=block.get("pending", 0))
    if (m := _CARGO.match(line)):
        total = TestCounts("cargo", passed=int(m.group(1)), failed=int(m.group(2)), skipped=int(m.group(3)),
                           deselected=int(m.group(4)))
        for j in range(i - 1, -1, -1):      # one "test result" per test binary: add them up
            if (o := _CARGO.match(lines[j])):
                total = TestCounts("cargo", passed=total.passed + int(o.group(1)), failed=total.failed + int(o.group(2)),
                                   skipped=total.skipped + int(o.group(3)), deselected=total.deselected + int(o.group(4)))
        return total
    if _GO_PKG.match(line):
        cases = [m.group(1) for ln in lines[: i + 1] if (m := _GO_CASE.match(ln))]
        if cases:
            return TestCounts("go", passed=cases.count("PASS"), failed=cases.count("FAIL"), skipped=cases.count("SKIP"))
    return None


# -- the runner's own report ---------------------------------------------------------------------

# ``read_junit``: one reader serves the eval-agent and the discovery scan (roles/workbench/sandbox/reports.py)


# -- failing test ids --------------------------------------------------------------------------

_FAILING = [
    re.compile(r"^(?:FAILED|ERROR) ([^\s(]\S*?)(?: - .*)?$"),             # pytest -rfE (not unittest's "FAILED (…)")
    re.compile(r"^(?:FAIL|ERROR): (\S+) \(([^)]+)\)"),                    # unittest
    re.compile(r"^not ok \d+ - (.+?)(?:\s+#.*)?$"),                        # TAP
    re.compile(r"^✕ (.+?)(?: \(\d+ ?m?s\))?$"),                            # jest
    re.compile(r"^× (.+?)(?: \d+ ?m?s)?$"),                                # vitest
    re.compile(r"^--- FAIL: (\S+)"),                                       # go
    re.compile(r"^test (\S+) \.\.\. FAILED$"),                             # cargo
    re.compile(r"^(\S+\.py::\S+) FAILED"),                                 # pytest -v
]


def failing_ids(output: str) -> list[str]:
    """The ids of the tests the output says failed, sorted and without duplicates."""
    ids = set()
    for line in _lines(output):
        for rx in _FAILING:
            m = rx.match(line)
            if m:
                if rx is _FAILING[1]:       # "FAIL: test_a (mod.Class.test_a)" or "(mod.Class)" before 3.11
                    name, where = m.groups()
                    ids.add(where if where.endswith("." + name) else f"{where}.{name}")
                else:
                    ids.add(m.group(1))
                break
    return sorted(ids)


def failing_tests(junit: dict | None, output_tail: str) -> list[str]:
    """The ids of the tests a failing check failed, as its check record stores them
    (``failing_tests``, read by the retro in ``knowledge/findings.py``): the runner's report when
    it named them, else what its stored output says (``failing_ids``)."""
    ids = (junit or {}).get("ids") or {}
    found = sorted(k for k, v in ids.items() if v in ("failed", "error"))
    # unittest's closing "FAILED (failures=1)" reads as a pytest summary line to failing_ids
    return found or [i for i in failing_ids(output_tail) if not i.startswith("(")]


# -- the judgement ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Evidence:
    """How far a check's pass can be trusted. ``basis`` is ``tests`` (a summary was read and
    compared with the baseline's) or ``exit_code`` (no runner summary: the pass rests on the
    exit code alone). ``problem`` is why an exit code of 0 is still not a pass (None: it is)."""

    basis: str
    problem: str | None = None


def _uncollected(test_id: str, outcome: str) -> str | None:
    """The module a report entry names when it is pytest's record of a test module it could not
    collect (an error whose classname is empty: ``::tests.test_calc``), else None."""
    classname, _, name = test_id.partition("::")
    return name if not classname and outcome == "error" and name else None


def _not_run(baseline: dict[str, str], now: dict[str, str]) -> list[str]:
    """The baseline's report entries that this run's report does not show run (skipped is not
    run). A module the baseline could not collect had no tests to name: it counts as run when
    a test of that module ran now (the fix that made it importable), never when none did."""
    ran = {i for i, o in now.items() if o != "skipped"}
    classes = {i.partition("::")[0] for i in ran}
    missing = []
    for test_id, outcome in baseline.items():
        if outcome == "skipped" or test_id in ran:
            continue
        module = _uncollected(test_id, outcome)
        if module is not None and any(c == module or c.startswith(module + ".") for c in classes):
            continue
        missing.append(test_id)
    return missing


def judge(counts: TestCounts | None, baseline: TestCounts | None, *, baseline_known: bool,
          junit: dict | None = None, baseline_junit: dict | None = None) -> Evidence:
    """Whether a check that exited 0 has evidence that its tests ran, against the baseline's run
    of the same command (``baseline_known``: the baseline ran it at all; ``junit`` /
    ``baseline_junit``: the runner's own reports, when it wrote them)."""
    if baseline_junit is not None and junit is None:
        return Evidence("tests", "wrote no test report, where the baseline's run wrote one (the test runner "
                                 "did not finish its session)")
    if junit is not None and baseline_junit is not None and not (junit["truncated"] or baseline_junit["truncated"]):
        missing = _not_run(baseline_junit["ids"], junit["ids"])
        if missing:
            return Evidence("tests", f"did not run {len(missing)} test(s) the baseline ran (first: {missing[0]})")
    if counts is None:
        if baseline is not None:
            return Evidence("tests", f"printed no test summary, where the baseline printed one ({baseline.line()})")
        return Evidence("exit_code")
    if counts.ran == 0:
        return Evidence("tests", f"ran no tests ({counts.line()})")
    if counts.failed or counts.errors:
        return Evidence("tests", f"reported failures despite exit 0 ({counts.line()})")
    if baseline is not None:
        if counts.ran < baseline.ran:
            return Evidence("tests", f"ran {counts.ran} tests where the baseline ran {baseline.ran}")
        if counts.skipped > baseline.skipped:
            return Evidence("tests", f"skipped {counts.skipped} tests where the baseline skipped {baseline.skipped}")
        if counts.deselected > baseline.deselected:
            return Evidence("tests", f"deselected {counts.deselected} tests where the baseline deselected "
                                     f"{baseline.deselected}")
    return Evidence("tests")
