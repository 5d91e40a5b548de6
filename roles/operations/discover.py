"""Discovery: a read-only, deterministic scan of a workspace that proposes work candidates.

``scan(workspace, verify, issues_file, limit)`` reads three sources it can reach offline and
returns the candidates ranked, exactly one recommended. No model is called and nothing in the
workspace is written: the same tree, commands and issue list give the same list, to the byte.

Sources:
- the verify commands' failures on the current tree: each command runs in the sandbox the
  eval-agent's preflight uses (``runner_from_config``), on a snapshot of the workspace written
  from a throwaway shadow history (``WorkspaceHistory``), with pytest asked for a JUnit report
  whose failing test ids name what fails (``roles/workbench/sandbox/reports.py``);
- ``TODO`` / ``FIXME`` markers that open a comment in the files git tracks (libgit2 reads the
  index: no git process, no hook), text files only, vendored and cache folders left out;
- an issue list exported as JSON: ``gh issue list --json number,title,body,labels`` (an array)
  or JSON lines of ``{title, body, labels}``.

Ranking (``RANK``, documented in the README): failing verify commands first (in the order given),
then issues labelled as bugs, FIXMEs, TODOs, other issues; within a kind by command order, issue
number, or path and line. The first is recommended. Each candidate has a fingerprint built from
what it is about (the command and its failing ids, the marker's path and text, the issue's
number) and not from where it sits, so a re-scan recognises an open proposal however lines moved.
"""
from __future__ import annotations

import hashlib
import json
import re
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable

from roles.workbench.sandbox import run_check_command, runner_from_config
from roles.workbench.sandbox.hostile import HostileFile, read_regular
from roles.workbench.sandbox.reports import ReportFile
from roles.workbench.workspace import safegit
from roles.workbench.workspace.errors import RepositoryError
from roles.workbench.workspace.history import WorkspaceHistory
from state_db.kernel import config as config_mod
from state_db.kernel.config import Config
from state_db.kernel.errors import OrgError
from state_db.kernel.home import resolve_home
from state_db.queries.work import Caps
from state_db.vocab import ProposalKind as K

RANK = (K.FAILING_TEST, K.BUG, K.FIXME, K.TODO, K.ISSUE)
# iterations a candidate of each kind is given (at most org.toml's caps.max_iterations)
KIND_ITERATIONS = {K.FAILING_TEST: 10, K.BUG: 10, K.ISSUE: 10, K.FIXME: 6, K.TODO: 6}
SKIPPED_DIRS = frozenset({"node_modules", "vendor", "vendored", "third_party", "third-party", ".venv", "venv",
                          "env", "site-packages", "__pycache__", ".git", ".tox", ".nox", ".mypy_cache",
                          ".pytest_cache", ".ruff_cache", ".cache", "dist", "build", "target", ".eggs"})
MAX_FILE_BYTES = 1_000_000
MAX_FAILING_SHOWN = 20
STALE_SCRATCH_S = 6 * 3600           # a scan's snapshot older than this was left by a killed scan
# a marker opens a comment, or a comment's continuation line (after #, //, /*, *, --, <!--, ;, %),
# or stands first on a line followed by a colon; prose that only names the words, and code that
# names them (an enum member), are not markers (tests/test_discover.py lists examples)
_IN_COMMENT = re.compile(rb"(?:^\s*\*|#|//|/\*|<!--|--|;|%)[ \t*#/!-]*\b(TODO|FIXME)\b(?:\([^)]*\))?[\s:\-]*(.*)")
_OWN_LINE = re.compile(rb"^\s*(TODO|FIXME)(?:\([^)]*\))?:\s*(.*)")
_BUG_LABEL = re.compile(r"\bbug\b", re.IGNORECASE)
_CANNOT_START = (126, 127)


class DiscoverError(OrgError):
    code = "discover_failed"


@dataclass(frozen=True)
class Proposal:
    """One work candidate: what it is (``kind``), where it was found (``source``: ``verify:CMD``,
    ``markers`` or ``issues``), the evidence, and the work it suggests (goal, verify, caps)."""

    kind: str
    source: str
    title: str
    goal: str
    verify: tuple[str, ...]
    caps: dict
    evidence: dict
    fingerprint: str
    rank: int = 0
    recommended: bool = False

    def encode(self) -> dict:
        out = asdict(self)
        out["verify"] = list(self.verify)
        return out


@dataclass(frozen=True)
class ScanResult:
    """``proposals``: every candidate found, ranked (``limit`` applies where they are recorded);
    ``sources``: what was read (a later scan expires only what the same sources no longer show);
    ``notes``: what could not be read, one line each."""

    proposals: list[Proposal]
    sources: list[str]
    notes: list[str] = field(default_factory=list)


def fingerprint(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode("utf-8", "surrogateescape")).hexdigest()[:16]


def caps_for(kind: str, cfg: Config) -> dict:
    """The caps a candidate of ``kind`` proposes (org.toml's, its iterations at most the kind's),
    as they are shown and stored on the proposal."""
    caps = Caps.from_config(cfg.caps)
    return replace(caps, max_iterations=min(caps.max_iterations, KIND_ITERATIONS[K(kind)])).encode()


def scan(workspace, verify: list[str] | None, issues_file, limit: int | None = None, *,
         cfg: Config | None = None, home=None, runner_factory: Callable | None = None) -> list[Proposal]:
    """The ranked candidates of ``workspace``, the first ``limit`` (all when None), the first one
    recommended. ``verify``: commands to run (None or empty: org.toml's ``discover.verify``);
    ``issues_file``: a JSON / JSONL issue list or None. See ``scan_all`` for the rest.
    Raises DiscoverError (``workspace_missing``, ``bad_issues_file``, ``issues_file_missing``)."""
    found = scan_all(workspace, verify, issues_file, cfg=cfg, home=home, runner_factory=runner_factory).proposals
    return found if limit is None else found[:limit]


def scan_all(workspace, verify: list[str] | None, issues_file, *, cfg: Config | None = None, home=None,
             runner_factory: Callable | None = None) -> ScanResult:
    """Every candidate, ranked, with the sources read and notes on what could not be read.

    ``cfg`` defaults to org.toml's defaults; ``home`` (an OrgHome, hidden from the sandbox; the
    snapshot is written under it) defaults to the resolved org home; ``runner_factory``
    (snapshot, workspace) -> runner replaces the sandbox org.toml asks for (tests)."""
    cfg = cfg or config_mod.load(None)
    if "\0" in str(workspace) or "\0" in str(issues_file or ""):
        raise DiscoverError("a path holds a NUL byte", code="bad_path", hint="give the path as it is on disk")
    ws = Path(workspace).expanduser().resolve()
    if not ws.is_dir():
        raise DiscoverError(f"workspace {ws} is not a directory", code="workspace_missing",
                            hint="pass an existing --workspace")
    if any(not c.strip() for c in verify or ()):
        raise DiscoverError("a --verify command is empty: it would run nothing", code="empty_verify",
                            hint="give each --verify a command, or leave the flag out")
    commands = list(verify or cfg.discover.verify)
    issues = read_issues(Path(issues_file).expanduser()) if issues_file else None
    home = home or resolve_home()
    found, sources, notes = [], [], []
    if commands:
        runner_factory = runner_factory or (lambda snap, at: runner_from_config(cfg, home, snap, present_at=at))
        failing, ran_notes = verify_failures(ws, commands, cfg, home, runner_factory)
        found += failing
        notes += ran_notes
        sources += [f"verify:{c}" for c in commands]
    markers, marker_note = marker_candidates(ws, commands, cfg)
    if marker_note:
        notes.append(marker_note)
    else:
        sources.append("markers")
        found += markers
    if issues is not None:
        found += issue_candidates(issues, commands, cfg)
        sources.append("issues")
    return ScanResult(ranked(found), sources, notes)


def ranked(found: list[Proposal]) -> list[Proposal]:
    """``found`` in ``RANK`` order (stable within a kind: each source lists its own in order),
    numbered from 1, the first recommended."""
    order = {k: i for i, k in enumerate(RANK)}
    out = sorted(found, key=lambda p: order[K(p.kind)])
    return [replace(p, rank=i + 1, recommended=i == 0) for i, p in enumerate(out)]


# -- the verify commands ------------------------------------------------------------------------

def verify_failures(ws: Path, commands: list[str], cfg: Config, home,
                    runner_factory) -> tuple[list[Proposal], list[str]]:
    """Run each command on a snapshot of ``ws`` in the sandbox; a candidate per failing command."""
    root = Path(home.root) / "discover" if Path(home.root).is_dir() else None     # no stray org home
    if root is not None:
        root.mkdir(exist_ok=True)
        for old in root.glob("scan-*"):             # left by a scan that was killed
            if old.stat().st_mtime < time.time() - STALE_SCRATCH_S:
                shutil.rmtree(old, ignore_errors=True)
    scratch = Path(tempfile.mkdtemp(prefix="scan-", dir=root))
    try:
        history = WorkspaceHistory(scratch / "history.git", ws)
        snapshot = scratch / "tree"
        history.materialize(history.baseline(), snapshot, paths=[])
        runner = runner_factory(snapshot, ws)
        out, notes = [], []
        for cmd in commands:
            report = ReportFile.create(scratch / "reports", runner)
            try:
                res = run_check_command(runner, cmd, snapshot, timeout_s=float(cfg.sandbox.cpu_seconds),
                                        max_output=int(cfg.sandbox.output_bytes),
                                        env={"PYTEST_ADDOPTS": f"--junitxml={report.inside}"}, binds=report.binds)
            except OrgError as exc:
                notes.append(f"`{cmd}` could not run in the sandbox ({exc.code}): {exc}")
                continue
            junit, _refused = report.read()
            if res.exit_code == 0 and not res.timed_out:
                continue
            if res.exit_code in _CANNOT_START and junit is None:
                notes.append(f"`{cmd}` cannot start in the sandbox (exit {res.exit_code}); "
                             "check it with 'org doctor'")
                continue
            out.append(_failing(cmd, commands, res.exit_code, res.timed_out, junit, cfg))
        return out, notes
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _failing(cmd: str, commands: list[str], exit_code, timed_out: bool, junit: dict | None, cfg: Config) -> Proposal:
    failing = sorted(i for i, o in (junit or {}).get("ids", {}).items() if o in ("failed", "error"))
    evidence = {"command": cmd, "exit_code": None if timed_out else exit_code, "timed_out": timed_out,
                "tests": junit["counts"] if junit else None, "failing": failing[:MAX_FAILING_SHOWN],
                "failing_total": len(failing)}
    if failing:
        shown = ", ".join(failing[:5]) + (f" and {len(failing) - 5} more" if len(failing) > 5 else "")
        title = f"{len(failing)} failing test(s) in `{cmd}`"
        goal = f"Make `{cmd}` pass: {len(failing)} test(s) fail on the current tree ({shown})."
    else:
        why = "times out" if timed_out else f"exits {exit_code}"
        title = f"`{cmd}` fails"
        goal = f"Make `{cmd}` pass: it {why} on the current tree."
    key = ",".join(failing) if failing else f"exit={evidence['exit_code']} timeout={timed_out}"
    return Proposal(K.FAILING_TEST, f"verify:{cmd}", title, goal, tuple(commands), caps_for(K.FAILING_TEST, cfg),
                    evidence, fingerprint(K.FAILING_TEST, cmd, key))


# -- markers in tracked files ----------------------------------------------------------------

def tracked_files(ws: Path) -> list[str]:
    """Regular files git tracks under ``ws``, relative to it, sorted; vendored and cache folders
    left out. Raises RepositoryError (not a repository)."""
    repo = safegit.open_repository(ws)
    top = Path(repo.workdir).resolve() if repo.workdir else None
    if top is None or not ws.is_relative_to(top):
        raise RepositoryError(f"{ws} is not in a git work tree", code="not_a_repository")
    prefix = ws.relative_to(top).as_posix()
    out = []
    for entry in repo.index:
        if entry.mode not in (0o100644, 0o100755):          # no symlinks, no nested repositories
            continue
        path = entry.path
        if prefix != ".":
            if not path.startswith(prefix + "/"):
                continue
            path = path[len(prefix) + 1:]
        if SKIPPED_DIRS.intersection(path.split("/")[:-1]):
            continue
        out.append(path)
    return sorted(out)


def marker_candidates(ws: Path, commands: list[str], cfg: Config) -> tuple[list[Proposal], str | None]:
    """A candidate per TODO / FIXME marker (FIXMEs first when ranked), or a note why none were read."""
    try:
        paths = tracked_files(ws)
    except RepositoryError as exc:
        return [], f"markers not read: {exc}"
    out, seen = [], {}
    for path in paths:
        try:
            # what a doer left in the workspace is hostile input: no link followed on the way,
            # no FIFO waited on, nothing past the bound read (``hostile.read_regular``)
            data = read_regular(ws / path, limit=MAX_FILE_BYTES, beneath=ws, single_link=False)
        except HostileFile:
            continue
        if b"\0" in data[:8192]:                             # a binary file
            continue
        for n, line in enumerate(data.splitlines(), 1):
            found = marker(line)
            if found is None:
                continue
            word, text = found
            kind = K.FIXME if word == "FIXME" else K.TODO
            nth = seen[(kind, path, text)] = seen.get((kind, path, text), 0) + 1
            about = f": {text}" if text else ""
            out.append(Proposal(
                kind, "markers", f"{word} {path}:{n}{about}"[:200],
                f"Resolve the {word} in {path} (line {n}){about}. Remove the marker once it is done, "
                "and keep the verify commands passing.",
                tuple(commands), caps_for(kind, cfg),
                {"path": path, "line": n, "marker": word, "text": text},
                fingerprint(kind, path, text, str(nth))))
    return out, None


def marker(line: bytes) -> tuple[str, str] | None:
    """(``TODO`` or ``FIXME``, its text cleaned) when ``line`` holds a marker, else None."""
    m = _IN_COMMENT.search(line) or _OWN_LINE.match(line)
    return None if m is None else (m.group(1).decode(), _clean(m.group(2).decode("utf-8", "replace")))


def _clean(text: str) -> str:
    """The marker's text without a closing comment and extra spaces, at most 200 characters."""
    text = re.sub(r"\s*(\*/|-->|\"\"\"|''')\s*$", "", text)
    return " ".join(text.split())[:200]


# -- issue lists -------------------------------------------------------------------------------

def read_issues(path: Path) -> list[dict]:
    """An issue list as [{number, title, body, labels, url}]: a JSON array (``gh issue list
    --json number,title,body,labels``) or JSON lines of ``{title, body, labels}``; labels are
    names or ``{"name": ...}`` objects. Raises DiscoverError ``issues_file_missing`` or
    ``bad_issues_file`` (which item, and what is wrong with it)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DiscoverError(f"issues file {path} does not exist", code="issues_file_missing",
                            hint="export one with: gh issue list --json number,title,body,labels > issues.json"
                            ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DiscoverError(f"issues file {path} cannot be read: {exc}", code="bad_issues_file",
                            hint="give a UTF-8 JSON or JSON-lines file") from None
    stripped = text.lstrip()
    try:
        if stripped.startswith("["):
            items = json.loads(text)
            where = [f"item {i + 1}" for i in range(len(items))]
        else:
            lines = [(n, ln) for n, ln in enumerate(text.splitlines(), 1) if ln.strip()]
            items = [json.loads(ln) for _, ln in lines]
            where = [f"line {n}" for n, _ in lines]
    except json.JSONDecodeError as exc:
        raise DiscoverError(f"issues file {path} is not JSON or JSON lines: {exc.msg} (line {exc.lineno})",
                            code="bad_issues_file",
                            hint="give gh issue list --json number,title,body,labels output, or one "
                                 "{\"title\", \"body\", \"labels\"} object per line") from None
    return [_issue(item, w, path) for item, w in zip(items, where)]


def _issue(item, where: str, path: Path) -> dict:
    def bad(what: str):
        return DiscoverError(f"issues file {path}, {where}: {what}", code="bad_issues_file",
                             hint="each issue needs a non-empty \"title\"; \"body\" is text, \"labels\" a list "
                                  "of names or {\"name\": ...}")
    if not isinstance(item, dict):
        raise bad("not an object")
    title, body = item.get("title"), item.get("body") or ""
    if not isinstance(title, str) or not title.strip():
        raise bad("no title")
    if not isinstance(body, str):
        raise bad("body is not text")
    labels = []
    for label in item.get("labels") or []:
        name = label.get("name") if isinstance(label, dict) else label
        if not isinstance(name, str):
            raise bad("a label is neither a name nor {\"name\": ...}")
        labels.append(name)
    number = item.get("number")
    if number is not None and (not isinstance(number, int) or isinstance(number, bool)):
        raise bad("number is not an integer")
    return {"number": number, "title": " ".join(title.split()), "body": body.strip(), "labels": labels,
            "url": item.get("url") if isinstance(item.get("url"), str) else None}


def issue_candidates(issues: list[dict], commands: list[str], cfg: Config) -> list[Proposal]:
    """A candidate per issue: a bug when a label says so, else an issue; by number, then file order."""
    ordered = sorted(enumerate(issues), key=lambda t: (t[1]["number"] is None, t[1]["number"] or 0, t[0]))
    out = []
    for _, issue in ordered:
        kind = K.BUG if any(_BUG_LABEL.search(label) for label in issue["labels"]) else K.ISSUE
        name = f"#{issue['number']}" if issue["number"] is not None else "issue"
        body = issue["body"][:1500] + (" …" if len(issue["body"]) > 1500 else "")
        goal = f"Resolve {name}: {issue['title']}" + (f"\n\n{body}" if body else "")
        key = str(issue["number"]) if issue["number"] is not None else issue["title"]
        out.append(Proposal(kind, "issues", f"{name} {issue['title']}"[:200], goal, tuple(commands),
                            caps_for(kind, cfg), {k: issue[k] for k in ("number", "title", "labels", "url")},
                            fingerprint("issue", key)))
    return out
