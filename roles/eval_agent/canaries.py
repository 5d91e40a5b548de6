"""Canary tests: evidence that the code under test cannot know.

A test runner's report is written by the runner, inside the process that runs the code under
test; that code can rewrite it (flip every failure to a pass, write a fresh report, exit 0). So
at every verification the eval-agent adds tests of its own to the snapshot — some that must
pass, some that must fail — and reads back what the report says of them. An honest runner
reports each exactly as it is; a report in which a must-fail canary passed, or a canary the
runner collected is missing, was not written by an honest runner: the verdict says
``evidence_forged`` and the run ends so (``verifier``).

How a canary is made so that the doer cannot tell it from the project's tests:

- it is appended to a test file of the project that the doer left as it was at the baseline,
  among that file's own tests, with a name drawn at random from words tests are named with;
- names, bodies and places change at every verification, and the snapshot (where canaries live)
  is never the doer's workspace, nor shown in its prompt; what reaches the doer (the check's
  output in the feedback) has every line naming a canary, and the failure blocks of the
  must-fail ones, taken out, and the runner's summary counts put back to the project's own.

Where canaries can be trusted to appear is learnt on the baseline (``calibrate``): the preflight
plants them in every candidate file, and a file whose canaries came out as they should there is
a host for that command from then on. A file the baseline did not collect (an import error, a
``-k`` that leaves it out, a runner that is not pytest) is never a host, so an honest run is
never judged against canaries its command could not run. A check that fails anyway is never
called forged for a canary that is missing (its module may not import): only a must-fail canary
that passed — which no honest run can produce — or a missing canary in a check that would pass.

The must-fail canary does not change the command's exit status: in its own teardown it takes
its failure back out of pytest's count (and out of ``-x``/``--maxfail``), so a verify command
that runs more after pytest (``pytest && mypy``) runs exactly as it does without canaries.

Canaries need pytest's JUnit report (``checks.run_check`` asks every pytest for one); other
runners get none, and the verdict's evidence line says what the pass rests on. What this cannot
stop: code that reads the snapshot, finds the canaries by content and forges around them — that
is code written against this verifier in particular, and it is in the diff.
"""
from __future__ import annotations

import os
import random
import re
import stat
import xml.etree.ElementTree as ET
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Iterable, Iterator, Mapping

from roles.eval_agent.evidence import PYTEST_SUMMARY

MUST_PASS, MUST_FAIL = "pass", "fail"
MAX_HOSTS = 12                # files a preflight plants in (and calibrates)
MAX_FAILING = 2               # must-fail canaries per verification
MAX_HOST_BYTES = 512 * 1024   # a test file larger than this is not a host
MAX_REPORT_BYTES = 64 * 1024 * 1024
_TEST_FILE = re.compile(r"^(test_\w+|\w+_test)\.py$")
# folders where tests are installed or generated, not written: never a host
_NOT_HOSTS = frozenset({"site-packages", "dist-packages", "node_modules", "__pycache__", "build", "dist"})
_VERBS = ("handles", "returns", "accepts", "rejects", "keeps", "parses", "formats", "matches", "preserves",
          "normalizes", "raises_on", "supports", "ignores", "strips", "converts", "computes", "splits",
          "merges", "sorts", "limits", "encodes", "decodes", "reads", "writes", "counts", "finds")
_NOUNS = ("empty_input", "unicode", "whitespace", "none", "defaults", "large_values", "negative_numbers",
          "nested_items", "duplicates", "order", "trailing_separator", "single_item", "long_strings",
          "boundaries", "zero", "mixed_case", "separators", "prefix", "suffix", "spaces", "tabs",
          "repeated_calls", "key_order", "multiple_values", "round_trip", "edge_cases", "ascii", "numbers")


@dataclass(frozen=True)
class Canary:
    host: str           # the test file, relative to the snapshot
    name: str           # the test function's name
    must: str           # MUST_PASS or MUST_FAIL


@dataclass(frozen=True)
class Planted:
    """The canaries of one verification."""

    canaries: tuple[Canary, ...] = ()

    @property
    def names(self) -> frozenset[str]:
        return frozenset(c.name for c in self.canaries)

    def of(self, hosts: Iterable[str]) -> tuple[Canary, ...]:
        hosts = set(hosts)
        return tuple(c for c in self.canaries if c.host in hosts)


def candidates(base_ids: Mapping[str, str], now_ids: Mapping[str, str] | None = None) -> list[str]:
    """Test files that can host canaries: named as pytest collects them by default, outside
    hidden and installed folders, regular files, unchanged since the baseline (``now_ids``: the
    checkpoint's files; a file the doer changed is never a host)."""
    out = []
    for path, oid in base_ids.items():
        parts = PurePosixPath(path).parts
        if not _TEST_FILE.match(parts[-1]) or not oid.startswith("100"):
            continue
        if any(p.startswith(".") or p in _NOT_HOSTS for p in parts[:-1]):
            continue
        if now_ids is not None and now_ids.get(path) != oid:
            continue
        out.append(path)
    return sorted(out)


def _name(rng: random.Random, taken: set[str], avoid: frozenset[str] = frozenset()) -> str:
    """A fresh test name that contains none of ``avoid`` (the words of the verify commands'
    ``-k`` expressions): whether ``-k`` selects a canary then depends on its file alone, as on
    the baseline, never on the name it happens to get (``keyword_words``)."""
    for _ in range(1000):
        name = f"test_{rng.choice(_VERBS)}_{rng.choice(_NOUNS)}"
        if rng.random() < 0.3:
            name += f"_{rng.randint(2, 9)}"
        if name not in taken and not any(w in name for w in avoid):
            taken.add(name)
            return name
    raise ValueError("no canary name avoids the -k words")


def keyword_words(commands: Iterable[str]) -> frozenset[str]:
    """The words of every ``-k`` expression in ``commands`` (lower case; ``and``/``or``/``not``
    and words every test name contains, such as ``test``, left out). A ``-k`` is found wherever
    a shell or pytest would read one (``_command_lines``): its own argument or joined
    (``-kfoo``, ``-k=foo``, ``-vk foo``), also inside ``bash -c "pytest -k foo"`` or
    ``PYTEST_ADDOPTS="-k foo"``; text the shell cannot split gives every word after its ``-k``.
    More words than pytest would read only narrow the names canaries may take."""
    words: set[str] = set()
    for command in commands:
        for argv in _command_lines(command):
            if isinstance(argv, str):
                exprs = [m.group(1) for m in _LOOSE_K.finditer(argv)]
            else:
                exprs = [m.group(1).lstrip("=") or (argv[i + 1] if i + 1 < len(argv) else "")
                         for i, m in enumerate(map(_JOINED_K.match, argv)) if m]
            words.update(w.lower() for expr in exprs for w in re.findall(r"\w+", expr))
    return frozenset(w for w in words if w not in ("and", "or", "not") and w not in "test_")


# -k, -kEXPR, -k=EXPR, and -k after pytest's short flags that take no value (-vk, -xqkEXPR)
_JOINED_K = re.compile(r"^-[vqxslV]*k(.*)$", re.S)
_LOOSE_K = re.compile(r"(?:^|[\s\"'=\[,])-[vqxslV]*k(.*)", re.S)     # the same, in text the shell cannot split
_NESTED = 4             # command lines inside arguments followed this deep


def _command_lines(text: str, depth: int = 0) -> Iterator[list[str] | str]:
    """``text`` as the shell splits it, then every argument that is itself a command line
    (``bash -c "pytest -k foo"``) or an assignment whose value may be one (``PYTEST_ADDOPTS="-k
    foo"``), split the same way, ``_NESTED`` deep; text the shell cannot split is given as it is."""
    import shlex
    try:
        argv = shlex.split(text)
    except ValueError:
        yield text
        return
    yield argv
    if depth >= _NESTED:
        return
    for arg in argv:
        name, eq, value = arg.partition("=")
        if eq and not any(ch.isspace() for ch in name):
            yield from _command_lines(value, depth + 1)
        elif any(ch.isspace() for ch in arg):
            yield from _command_lines(arg, depth + 1)


def _passing(name: str, rng: random.Random) -> str:
    a, b = rng.randint(2, 97), rng.randint(2, 97)
    body = rng.choice([f"    assert {a} + {b} == {a + b}\n",
                       f"    assert sorted([{b}, {a}]) == {sorted([a, b])}\n",
                       f"    assert str({a}).zfill(4) == {str(a).zfill(4)!r}\n",
                       f"    assert len({'x' * (a % 9 + 1)!r}) == {a % 9 + 1}\n"])
    return f"\n\ndef {name}():\n{body}"


def _failing(name: str, rng: random.Random) -> str:
    a, b = rng.randint(2, 97), rng.randint(2, 97)
    # the teardown takes this failure back out of pytest's count (exit status, -x, --maxfail); a
    # pytest-xdist worker's count is not the one the exit status comes from, so there it skips
    return (f"\n\ndef {name}(request):\n"
            f"    if hasattr(request.config, 'workerinput'):\n"
            f"        import pytest\n"
            f"        pytest.skip('{rng.choice(_NOUNS).replace('_', ' ')}')\n"
            f"    session = request.session\n"
            f"    before, stopping = session.testsfailed, session.shouldfail\n\n"
            f"    def settle():\n"
            f"        if session.testsfailed == before + 1:\n"
            f"            session.testsfailed = before\n"
            f"            if session.shouldfail and not stopping:\n"
            f"                if '_shouldfail' in vars(session):\n"
            f"                    session._shouldfail = False\n"
            f"                else:\n"
            f"                    session.shouldfail = False\n"
            f"    request.addfinalizer(settle)\n"
            f"    assert {a} + {b} == {a + b + rng.randint(1, 9)}\n")


def _read_host(snapshot: Path, path: str) -> bytes | None:
    """A host file's bytes, read without following a link; None when it cannot host."""
    try:
        fd = os.open(snapshot / path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_HOST_BYTES:
            return None
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read(MAX_HOST_BYTES + 1)
    finally:
        os.close(fd)


def plant(snapshot: Path, hosts: Iterable[str], baseline: Mapping[str, bytes | None],
          rng: random.Random | None = None, failing: int = MAX_FAILING, avoid: frozenset[str] = frozenset(),
          known: Iterable[str] = ()) -> Planted:
    """Append canaries to ``hosts`` in ``snapshot``: one must-pass canary in each, and up to
    ``failing`` must-fail ones in hosts chosen at random. A host whose bytes in the snapshot
    are not its ``baseline`` bytes (the doer changed it), that does not compile with them, or
    that cannot be read as a plain file, is left as it was and hosts none.

    Every canary's name is its own in the whole snapshot: no other canary, no test of any host
    and none of ``known`` (the names the baseline's reports hold) has it. A report names a test
    by its module and name, but a canary is read back by its name alone (``observe``, ``strip``):
    two canaries of one name, or a canary named as a project test elsewhere, would be counted
    once or take that test out of the comparison with the baseline."""
    rng = rng or random.SystemRandom()
    hosts = [h for h in hosts if baseline.get(h) is not None]
    hosts = [h for h in hosts if (text := _read_host(snapshot, h)) is not None and text == baseline[h]]
    failing = set(rng.sample(hosts, min(failing, len(hosts))))
    planted = []
    taken = {t.decode("ascii", "replace") for h in hosts for t in re.findall(rb"\b(test_\w+)", baseline[h])}
    taken |= set(known)
    for host in hosts:
        text = baseline[host]
        if b"\0" in text:
            continue
        try:
            mine = [Canary(host, _name(rng, taken, avoid), MUST_PASS)]
            if host in failing:
                mine.append(Canary(host, _name(rng, taken, avoid), MUST_FAIL))
        except ValueError:
            return Planted()                # -k words that every name would contain: no canaries

        rng.shuffle(mine)
        code = "".join(_passing(c.name, rng) if c.must == MUST_PASS else _failing(c.name, rng) for c in mine)
        new = text + (b"" if text.endswith(b"\n") or not text else b"\n") + code.encode("ascii")
        try:
            compile(new, host, "exec", dont_inherit=True)
        except (SyntaxError, ValueError):
            continue
        dest = snapshot / host
        dest.unlink()                       # a fresh file: never written through a link or a shared inode
        dest.write_bytes(new)
        planted.extend(mine)
    return Planted(tuple(planted))


def observe(report: Path, planted: Planted) -> dict[str, str]:
    """What the JUnit report at ``report`` says of each planted canary: name -> passed / failed /
    error / skipped (a canary it does not list is absent). Read without following a link, within
    ``MAX_REPORT_BYTES``; an unreadable report lists none."""
    names = planted.names
    if not names:
        return {}
    try:
        fd = os.open(report, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return {}
    seen: dict[str, str] = {}
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_REPORT_BYTES:
            return {}
        with os.fdopen(os.dup(fd), "rb") as f:
            for _, el in ET.iterparse(f, events=("end",)):
                if el.tag != "testcase":
                    continue
                name = el.get("name", "")
                if name in names:
                    outcome = ("failed" if el.find("failure") is not None else "error" if el.find("error") is not None
                               else "skipped" if el.find("skipped") is not None else "passed")
                    # a canary listed twice keeps its worst showing
                    if seen.get(name) in (None, "passed"):
                        seen[name] = outcome
                el.clear()
    except (OSError, ET.ParseError):
        return {}
    finally:
        os.close(fd)
    return seen


def calibrate(planted: Planted, seen: Mapping[str, str], junit: dict | None) -> dict:
    """What the baseline showed of this command's canaries: ``hosts``, the files whose canaries
    all came out as they should (where the command is held to them from now on; none without a
    report), and ``failing``, whether its must-fail canaries fail there (under pytest-xdist
    they skip, and the command is held to its must-pass canaries only)."""
    if junit is None:
        return {"hosts": [], "failing": False}
    hosts: dict[str, bool] = {}
    for c in planted.canaries:
        ok = seen.get(c.name) == "passed" if c.must == MUST_PASS else seen.get(c.name) in ("failed", "skipped")
        hosts[c.host] = hosts.get(c.host, True) and ok
    good = sorted(h for h, ok in hosts.items() if ok)
    fails = [seen.get(c.name) for c in planted.of(good) if c.must == MUST_FAIL]
    return {"hosts": good, "failing": bool(fails) and all(o == "failed" for o in fails)}


def forged(planted: Planted, hosts: Iterable[str], seen: Mapping[str, str], *, would_pass: bool,
           failing: bool = True) -> str | None:
    """Why the report cannot have come from an honest run of the command whose calibrated
    ``hosts`` are given (None: nothing contradicts it). ``would_pass``: the check passes on its
    exit code and report alone; ``failing``: its must-fail canaries fail (else they skip)."""
    mine = planted.of(hosts)
    for c in mine:
        if c.must == MUST_FAIL and seen.get(c.name) == "passed":
            return "a test that cannot pass is reported as passed"
    if not would_pass:
        return None
    for c in mine:
        got = seen.get(c.name)
        if got is None:
            return "a test the runner collected on the baseline is missing from its report"
        if c.must == MUST_FAIL and got != ("failed" if failing else "skipped"):
            return f"a test that must fail is reported as {got}"
    return None


def strip(junit: dict | None, planted: Planted, seen: Mapping[str, str]) -> dict | None:
    """``junit`` (``read_junit``'s form) without the canaries: the project's own tests only."""
    if junit is None or not planted.canaries:
        return junit
    names = planted.names
    ids = {i: o for i, o in junit["ids"].items() if i.rsplit("::", 1)[-1] not in names}
    counts = dict(junit["counts"])
    key = {"passed": "passed", "failed": "failed", "error": "errors", "skipped": "skipped"}
    for outcome in seen.values():
        counts[key[outcome]] = max(0, counts.get(key[outcome], 0) - 1)
    return {**junit, "ids": ids, "counts": counts}


_SUMMARY = re.compile(r"(\d+) (passed|failed)")
_ZERO = re.compile(r"(?<![\d])0 failed, |, 0 failed\b")
_BLOCK_START = re.compile(r"^_{3,} (\S+) _{3,}\s*$")
_SECTION = re.compile(r"^(?:={3,}|_{3,}|-{3,}) ")


def without(text: str, names: Iterable[str]) -> str:
    """``text`` (a runner's output) without the lines that mention any of ``names`` and without
    the failure blocks (``____ name ____`` up to the next section) of the tests they name."""
    names = sorted(n for n in names if n)
    if not names or not text:
        return text
    pattern = re.compile(r"(?<![\w])(?:" + "|".join(map(re.escape, names)) + r")(?![\w])")
    out, skipping = [], False
    for line in text.splitlines(keepends=True):
        m = _BLOCK_START.match(line.strip())
        if m:
            skipping = bool(pattern.search(m.group(1)))
            if skipping:
                continue
        elif skipping and _SECTION.match(line.strip() + " "):
            skipping = False
        if skipping or pattern.search(line):
            continue
        out.append(line)
    return "".join(out)


def scrub(text: str, planted: Planted, seen: Mapping[str, str] | None = None) -> str:
    """``text`` (a check's output) as the doer may see it: no line naming a canary, no failure
    block of one, and pytest's summary line counting the project's tests only (``seen``: what
    the report said of each canary; None: there was no report, and the counts stay as printed)."""
    if not planted.names or not text:
        return text
    out = without(text, planted.names).splitlines(keepends=True)
    if seen is None:
        return "".join(out)         # no report: nobody can say what the printed counts hold
    less = {"passed": sum(o == "passed" for o in seen.values()), "failed": sum(o == "failed" for o in seen.values())}

    def fix(m: re.Match) -> str:
        return f"{max(0, int(m.group(1)) - less[m.group(2)])} {m.group(2)}"
    return "".join(_ZERO.sub("", _SUMMARY.sub(fix, ln)) if PYTEST_SUMMARY.match(ln.strip()) else ln for ln in out)


# -- the verifier's use: the preflight calibrates, every verification is held to it ------------------

FORGED_SIGNATURE = "evidence:forged"


_ADDOPTS = re.compile(r"^\s*addopts\s*=\s*(.+)$", re.MULTILINE)
_CONFIGS = ("pytest.ini", ".pytest.ini", "pyproject.toml", "setup.cfg", "tox.ini")
MAX_CONFIGS = 200       # config files read for addopts (a vendored tree can hold thousands)


def _selections(history, commands: Iterable[str]) -> list[str]:
    """The verify commands and every ``addopts`` pytest may read (where a ``-k`` may stand
    too): of each config file of the baseline at any depth (pytest takes the one nearest the
    paths it is given: ``pytest sub/`` reads ``sub/pytest.ini``), of the files a command names
    (``-c FILE``, ``--config-file=FILE``) and the arguments files it expands (``@FILE``). An
    ``addopts`` counts as the file's own parser reads it (a TOML list joined as one command line,
    an ini value over several lines) and as its line is written (a file pytest would read
    otherwise than ours)."""
    import shlex

    from roles.eval_agent import held
    commands = list(commands)
    found = list(commands)
    named: list[str] = []
    for command in commands:
        for argv in _command_lines(command):
            for i, arg in enumerate(argv if isinstance(argv, list) else ()):
                if arg in ("-c", "--config-file") and i + 1 < len(argv):
                    named.append(argv[i + 1])
                elif arg.startswith("--config-file="):
                    named.append(arg.split("=", 1)[1])
                elif arg.startswith("@") and len(arg) > 1:
                    lines = (history.read_path(None, _relative(arg[1:])) or b"").decode("utf-8", "replace")
                    found.append(shlex.join(ln.strip() for ln in lines.splitlines() if ln.strip()))  # a line each
    # every verification reads this: a name test, not a path object per file (10,000 files: ~1 ms)
    configs = [p for p in history.file_ids(None) if p.rpartition("/")[2] in _CONFIGS][:MAX_CONFIGS]
    for name in configs + [_relative(n) for n in named]:
        text = (history.read_path(None, name) or b"").decode("utf-8", "replace")
        if not text:
            continue
        found += [m.group(1).strip() for m in _ADDOPTS.finditer(text)]
        parse = held.runner_sections_toml if name.endswith(".toml") else held.runner_sections_ini
        tables = list(parse(text).values())
        while tables:                       # [tool.pytest] holds [tool.pytest.ini_options]
            table = tables.pop()
            if not isinstance(table, dict):
                continue
            tables += [v for v in table.values() if isinstance(v, dict)]
            value = table.get("addopts")
            if isinstance(value, str):
                found.append(value)
            elif isinstance(value, list):
                found.append(shlex.join(str(v) for v in value))
    return found


def _relative(path: str) -> str:
    """A path a command names, as the snapshot's own (``./a/b`` -> ``a/b``; a path outside it
    reads as nothing, or as a file of the snapshot: either only adds words to avoid)."""
    return str(PurePosixPath(path.removeprefix("./").lstrip("/")))


def for_preflight(history, snapshot: Path, commands: Iterable[str] = (), rng: random.Random | None = None
                  ) -> Planted:
    """Canaries in up to ``MAX_HOSTS`` of the baseline's test files (chosen at random), written
    into ``snapshot`` (the baseline's)."""
    rng = rng or random.SystemRandom()
    hosts = candidates(history.file_ids(None))
    hosts = sorted(rng.sample(hosts, min(MAX_HOSTS, len(hosts))))
    # a must-fail canary in every host: the baseline learns of each host whether it fails there
    return plant(snapshot, hosts, {h: history.read_path(None, h) for h in hosts}, rng, failing=len(hosts),
                 avoid=keyword_words(_selections(history, commands)))


def calibrated(checks: list, planted: Planted) -> tuple[list, bool]:
    """The preflight's ``checks`` with each one's canary hosts (``canary = {"hosts": [...]}``),
    and whether the baseline must run again without canaries: a command that wrote no report
    but whose output named a canary ran them where the eval-agent cannot read them, and its
    printed counts would include them."""
    out, again = [], False
    for c in checks:
        seen = (c.canary or {}).get("seen", {})
        if c.junit is None and (c.canary or {}).get("named"):
            again = True
        out.append(replace(c, canary=calibrate(planted, seen, c.junit)))
    return out, again


def for_iteration(history, snapshot: Path, baseline_checks: Mapping | None, commands: Iterable[str] = (),
                  rng: random.Random | None = None) -> tuple[Planted, dict[str, dict]]:
    """The canaries of one verification, in the hosts the baseline calibrated (those the doer
    left unchanged), and each command's calibration (``calibrate``)."""
    by_command = {cmd: {"hosts": list((c.canary or {}).get("hosts", [])), "failing": (c.canary or {}).get("failing", True)}
                  for cmd, c in (baseline_checks or {}).items()}
    hosts = sorted({h for cal in by_command.values() for h in cal["hosts"]})
    if not hosts:
        return Planted(), by_command
    known = {i.rsplit("::", 1)[-1].split("[", 1)[0] for c in (baseline_checks or {}).values()
             for i in ((c.junit or {}).get("ids") or {})}
    return plant(snapshot, hosts, {h: history.read_path(None, h) for h in hosts}, rng,
                 avoid=keyword_words(_selections(history, commands)), known=known), by_command


def judged(check, planted: Planted, calibration: Mapping | None):
    """``check`` (judged on its exit code and evidence) held to its canaries (``calibration``:
    the baseline's, ``calibrate``): a forged report is not a pass, and says so without naming
    them (``canary = {"planted": n, "forged": why}``)."""
    hosts = (calibration or {}).get("hosts", ())
    mine = planted.of(hosts)
    if not mine:
        return replace(check, canary=None)
    seen = (check.canary or {}).get("seen", {})
    why = forged(planted, hosts, seen, would_pass=check.passed, failing=(calibration or {}).get("failing", True))
    if why is None:
        return replace(check, canary={"planted": len(mine), "forged": None})
    note = (f"\n[eval-agent] evidence forged: {why} — the eval-agent added tests of its own to the "
            "snapshot, and the report contradicts them: it was not written by an honest run")
    return replace(check, passed=False, signature=FORGED_SIGNATURE, output_tail=(check.output_tail + note)[-2000:],
                   canary={"planted": len(mine), "forged": why})


def forged_checks(checks: Iterable) -> list:
    return [c for c in checks if (c.canary or {}).get("forged")]
