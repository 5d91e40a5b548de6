"""Whether a verify command reached its test runner: the machine's failures, told apart from the
doer's.

A check can fail because the code is wrong, or because its command never got as far as running
a test: the tool could not fetch what it needs (no network in the sandbox), the interpreter
lacks a module the project depends on, the runner was called wrongly or found nothing to run.
The second kind is the machine's, never the doer's:

- on the baseline (``baseline_never_ran``) it ends the work item ``verify_unrunnable`` at the
  preflight, before any token is spent, quoting the tool's own words and how to fix it (for uv:
  ``--frozen --no-sync`` or an environment synced before the run; for a missing module: the
  interpreter that has it);
- during the run (``environment_failed``) it is an ``error`` verdict with the code
  ``environment_failed``: it never counts towards ``repeated_failure``, never becomes a lesson
  and never reaches knowledge (the run ends ``verify_unrunnable``: the machine must be fixed).

What counts as "reached the runner" is built from what the runner leaves behind, not from a list
of failures: pytest's report (which ``checks`` asks every pytest for) or any runner's summary
line. A check with neither, where its command runs a test runner, never reached it. The tool's
own messages only say *why*: network and resolver errors, a module missing from the
interpreter that the project declares as a dependency or that an installed package imports,
and pytest's own exit statuses for "usage error" (4), "no tests collected" (5) and "internal
error" (3).
"""
from __future__ import annotations

import re
import tomllib
from typing import Callable, Iterable

ENVIRONMENT_FAILED = "environment_failed"

# pytest's exit statuses that say no test was judged (pytest.ExitCode)
_PYTEST_STATUS = {3: "pytest stopped with an internal error", 4: "pytest was called wrongly (usage error)",
                  5: "pytest collected no tests"}
# runners that print a summary (or write pytest's report) even when the code under test does not
# import or build; a compiled language's test command (go test, cargo test) prints none when the
# baseline does not compile, which is often where the work starts, so it is not one of them
_RUNNERS = re.compile(r"(?:^|[\s/;&|(])(?:py\.test|pytest|unittest|nose2|tox|nox|jest|vitest|mocha)"
                      r"(?:$|[\s;&|)])|\bnode\s+--test\b")
_NETWORK = re.compile(r"temporary failure in name resolution|name or service not known|could not resolve host|"
                      r"failed to (?:fetch|resolve|download)|dns error|network is unreachable|"
                      r"getaddrinfo (?:ENOTFOUND|EAI_AGAIN)|\bEAI_AGAIN\b|no route to host|"
                      r"failed to establish a new connection|connection (?:timed out|reset)|"
                      r"error sending request|could not connect to|unable to access 'https?://", re.IGNORECASE)
# the sandbox's memory bound (an address-space limit) refused the runtime before any test ran
_MEMORY = re.compile(r"Cannot allocate Wasm memory|JavaScript heap out of memory|"
                     r"^(?:\S*Error: )?(?:MemoryError|std::bad_alloc)\b|fatal error: runtime: out of memory|"
                     r"Cannot allocate memory", re.IGNORECASE | re.MULTILINE)
_MISSING = re.compile(r"(?:ModuleNotFoundError|ImportError): No module named '([\w.]+)'")
# a traceback's frame: Python's ('File "/x.py", line 3, in m') or pytest's ('/x.py:3: in m')
_FRAME = re.compile(r"^\s*(?:File \"([^\"]+)\", line \d+|(\S+\.py):\d+: in )", re.MULTILINE)
_PYTEST_SAID = re.compile(r"^(?:ERROR: |INTERNALERROR>|no tests ran|usage: )", re.MULTILINE)
_DEP_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def runs_a_runner(command: str) -> bool:
    """Whether ``command`` names a test runner (directly, through ``python -m``, ``uv run``,
    ``npx`` and the like): one that reached it leaves a report or a summary."""
    return bool(_RUNNERS.search(command))


def declared(read: Callable[[str], bytes | None], paths: Iterable[str]) -> set[str]:
    """The project's declared dependencies (normalised names) from the baseline's
    ``pyproject.toml``, ``setup.cfg``, ``setup.py`` and ``requirements*.txt`` at its root
    (``read``: path -> content or None)."""
    names: set[str] = set()
    for path in paths:
        if "/" in path or not (path in ("pyproject.toml", "setup.cfg", "setup.py")
                               or (path.startswith("requirements") and path.endswith(".txt"))):
            continue
        text = (read(path) or b"").decode("utf-8", "replace")
        if path == "pyproject.toml":
            try:
                data = tomllib.loads(text)
            except tomllib.TOMLDecodeError:
                continue
            project = data.get("project", {}) if isinstance(data.get("project"), dict) else {}
            deps = list(project.get("dependencies", []) or [])
            for extra in (project.get("optional-dependencies", {}) or {}).values():
                deps += list(extra or [])
            for group in (data.get("dependency-groups", {}) or {}).values():
                deps += [d for d in group or [] if isinstance(d, str)]
            poetry = data.get("tool", {}).get("poetry", {}) if isinstance(data.get("tool"), dict) else {}
            for key in ("dependencies", "dev-dependencies"):
                deps += list((poetry.get(key) or {}).keys())
            for g in (poetry.get("group") or {}).values():
                deps += list((g.get("dependencies") or {}).keys()) if isinstance(g, dict) else []
            names.update(_norm(m.group(1)) for d in deps if isinstance(d, str) and (m := _DEP_NAME.match(d)))
        else:
            for m in re.finditer(r"""['"]?\b([A-Za-z][A-Za-z0-9._-]+)\s*(?:[<>=!~;\[,'"]|$)""", text, re.MULTILINE):
                names.add(_norm(m.group(1)))
    return names


def _missing_module(output: str, dependencies: set[str], workspace_modules: set[str]) -> str | None:
    """The module the interpreter lacks, when the project does not provide it itself and either
    declares it as a dependency (``dependencies``; empty: only what installed packages import)
    or an installed package imports it."""
    for m in _MISSING.finditer(output):
        top = m.group(1).split(".")[0]
        if top in workspace_modules:
            continue                              # the project's own module: the code's business
        frames = _FRAME.findall(output[:m.start()])
        importer = (frames[-1][0] or frames[-1][1]) if frames else ""
        if _norm(top) in dependencies or re.search(r"/(?:site|dist)-packages/", importer):
            return top
    return None


def modules_of(paths: Iterable[str]) -> set[str]:
    """Top-level module names the workspace provides (``pkg/…``, ``mod.py``, ``src/pkg/…``)."""
    out = set()
    for p in paths:
        parts = p.split("/")
        for i, part in enumerate(parts):
            name = part[:-3] if part.endswith(".py") else part
            if name.isidentifier():
                out.add(name)
            if i >= 2:
                break
    return out


def _reached(check) -> bool:
    return check.junit is not None or check.tests is not None


def _said(output: str, pattern: re.Pattern) -> str:
    """The line of ``output`` that matches ``pattern``, trimmed."""
    for line in output.splitlines():
        if pattern.search(line):
            return " ".join(line.split())[:300]
    return ""


def why_not_ran(check, *, dependencies: set[str], workspace_modules: set[str]) -> tuple[str, str] | None:
    """Why ``check`` (a failed run) shows that its command never reached its test runner: (what
    happened, quoting the tool, and what to do); None when it reached it or nothing says it
    did not."""
    if check.passed or check.timed_out or check.code:
        return None
    out = check.output_tail
    module = _missing_module(out, dependencies, workspace_modules)
    if module is not None:
        return (f"the interpreter lacks the module '{module}' ({_said(out, _MISSING)})",
                f"run the checks with an interpreter that has '{module}' installed (the project's virtual "
                "environment, e.g. .venv/bin/python -m pytest), or install it there")
    if _reached(check) and (check.counts is None or check.counts.ran > 0):
        return None
    if _NETWORK.search(out):
        hint = "the sandbox has no network: make the command work offline"
        if re.search(r"(?:^|\s)uv(?:x)?\s", check.command + " "):
            hint = ("uv cannot reach the network in the sandbox: use 'uv run --frozen --no-sync …' (or "
                    "'--offline') with an environment synced before the run")
        return f"it needed the network ({_said(out, _NETWORK)})", hint
    if _MEMORY.search(out):
        return (f"the sandbox's memory bound stopped it ({_said(out, _MEMORY)})",
                "raise sandbox.memory_mb in org.toml (an address-space limit: WebAssembly and some runtimes "
                "reserve far more than they use)")
    status = _PYTEST_STATUS.get(check.exit_code or 0)
    if status and (_PYTEST_SAID.search(out) or check.junit is not None):
        return (f"{status} ({_said(out, _PYTEST_SAID) or 'exit ' + str(check.exit_code)})",
                "run the verify command by hand in the workspace and fix how it is called (paths, options, "
                "test selection)")
    if runs_a_runner(check.command) and not _reached(check):
        last = " / ".join(ln.strip() for ln in out.strip().splitlines()[-2:] if ln.strip())[:300]
        return (f"its test runner never ran: no report and no test summary (exit {check.exit_code}: "
                f"{last or 'no output'})", "run the verify command by hand in the workspace; it must run the tests "
                                          "offline, with nothing to install")
    return None


def environment_failed(check, baseline, *, workspace_modules: set[str]) -> str | None:
    """Why a failed check during the run is the machine's failure, not the doer's: it did not
    reach its runner for a reason of the environment (network, a module the interpreter lost)
    where the baseline's run of the same command did reach it. None: the doer's failure."""
    if baseline is None or not _reached(baseline):
        return None
    # during the run a declared dependency the doer's code newly imports is the doer's choice: only
    # an installed package that lost a module it imports is the environment's
    found = why_not_ran(check, dependencies=set(), workspace_modules=workspace_modules)
    if found is None:
        return None
    what, _ = found
    if not what.startswith(("it needed the network", "the interpreter lacks", "the sandbox's memory bound")):
        return None                        # a runner called wrongly now: the doer's change did that
    return what
