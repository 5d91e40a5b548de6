"""Workspace tools the model may call during an act.

Tools: ``list_files``, ``read_file`` (ranged), ``write_file``, ``edit_file`` (exact string
replace, must match exactly once), ``search_files`` (substring or regex, bounded) and
``run_command`` (time- and output-bounded, executed by an injected ``CommandRunner`` from
``commands``: the sandbox's, or ``SubprocessRunner`` where no sandbox is asked for). A command's
time limit is the smallest of what the model asks, the org's per-command cap and the time the run
has left (``time_left``), so a run's timeout cuts a command short instead of waiting for it.

Every problem the model causes — a bad path, a path leading out of the workspace (``../``, an
absolute path, a symlink pointing outside), malformed input, an ambiguous edit — comes back as a
``ToolResult`` with ``is_error=True`` and a ``code``, which the backend sends to the model as an
``is_error`` tool result. ``WorkspaceTools.call`` never raises.
"""
from __future__ import annotations

import os
import re
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Iterator, Mapping

from roles.loop_agent.commands import CommandRunner, SubprocessRunner
from roles.workbench.sandbox.hostile import HostileFile, read_regular
from state_db.kernel.errors import OrgError
from state_db.vocab import GATE_KINDS
from state_db.text import clean

_SKIP_DIRS = frozenset({".git"})
_BINARY_PROBE = 8192
_MAX_LINE_CHARS = 2000


class ToolError(OrgError):
    """A tool refused or failed; becomes an ``is_error`` tool result (never leaves the tools)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message, code=code)


@dataclass(frozen=True)
class ToolLimits:
    read_max_lines: int = 400
    read_max_bytes: int = 64_000
    write_max_bytes: int = 2_000_000
    list_max_entries: int = 500
    search_max_results: int = 100
    search_max_file_bytes: int = 1_000_000
    command_timeout_s: float = 120.0
    command_max_output_bytes: int = 32_000


@dataclass(frozen=True)
class ToolResult:
    content: str
    is_error: bool = False
    code: str | None = None


def _tool(name: str, description: str, props: dict[str, tuple[str, str]], required: tuple[str, ...]) -> dict:
    return {"name": name, "description": description,
            "input_schema": {"type": "object", "required": list(required),
                             "properties": {k: {"type": t, "description": d} for k, (t, d) in props.items()}}}


_PATH = ("string", "path relative to the workspace root")
TOOL_SCHEMAS: tuple[dict[str, Any], ...] = (
    _tool("list_files", "List a directory of the workspace (directories end with '/', symlinks with '@').",
          {"path": ("string", "directory relative to the workspace root (default '.')"),
           "recursive": ("boolean", "list subdirectories too (default false)")}, ()),
    _tool("read_file", "Read a text file; lines come numbered. Use offset/limit for long files.",
          {"path": _PATH, "offset": ("integer", "first line, 1-based (default 1)"),
           "limit": ("integer", "number of lines (default and maximum 400)")}, ("path",)),
    _tool("write_file", "Create or overwrite a text file with the given content.",
          {"path": _PATH, "content": ("string", "the whole new file content")}, ("path", "content")),
    _tool("edit_file", "Replace an exact string in a file. old_string must occur exactly once "
          "(include surrounding lines to make it unique); line-number prefixes from read_file are not part of it.",
          {"path": _PATH, "old_string": ("string", "exact text to replace"),
           "new_string": ("string", "replacement text")}, ("path", "old_string", "new_string")),
    _tool("search_files", "Search text files for a substring (or a regular expression).",
          {"pattern": ("string", "text or regular expression to find"),
           "path": ("string", "file or directory to search (default '.')"),
           "regex": ("boolean", "treat pattern as a Python regular expression (default false)")}, ("pattern",)),
    _tool("run_command", "Run a shell command in the workspace root; time- and output-bounded.",
          {"command": ("string", "shell command line"),
           "timeout_s": ("number", "seconds before the command is killed (capped by the org)")}, ("command",)),
    _tool("request_action", "Ask a human to lift a block for one command: commands run in a sandbox with "
          "no network and no access outside the workspace. The request is recorded as a decision; a human "
          "approves, edits, rejects or answers it, and you see the outcome in the next iteration. With kind "
          "scope it asks to widen the change scope instead (command: a glob such as 'docs/**'): changes "
          "outside it are held back from verification and not delivered. End your turn after asking.",
          {"kind": ("string", "network | outside_workspace | scope | other"),
           "command": ("string", "the exact shell command to run once approved (kind scope: the glob)"),
           "reason": ("string", "why the goal needs it")}, ("kind", "command", "reason")),
    _tool("declare_impossible", "Declare that the goal cannot be met as stated (it contradicts itself or its "
          "verify commands, or needs what the workspace cannot have). The eval-agent reviews the claim itself; "
          "if it agrees, a human decides whether the run ends. If it does not, you are told so and go on. "
          "End your turn after declaring.",
          {"reason": ("string", "why the goal cannot be met, specifically (what contradicts what)")}, ("reason",)),
)
MAX_ACTION_COMMAND = 4000           # characters of a gated command: longer ones are refused, never cut
TEXT_MAX_BYTES = 128 * 2**20        # a file the tools read (the sandbox's own file-size limit by default)
_SCHEMA_BY_NAME = {s["name"]: s["input_schema"] for s in TOOL_SCHEMAS}
_TYPES: dict[str, Callable[[object], bool]] = {
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
}


def check_input(name: str, tool_input: object) -> dict[str, Any]:
    """The tool's keyword arguments from the model's input, checked against its schema.
    Errors: ``ToolError`` code ``bad_tool_input`` naming the field. Unknown fields are dropped."""
    schema = _SCHEMA_BY_NAME[name]
    if not isinstance(tool_input, Mapping):
        raise ToolError("bad_tool_input", f"{name} input must be a JSON object, got {type(tool_input).__name__}")
    missing = [f for f in schema["required"] if f not in tool_input]
    if missing:
        raise ToolError("bad_tool_input", f"{name} input lacks required field(s): {', '.join(missing)}")
    args = {}
    for field, spec in schema["properties"].items():
        if field in tool_input and tool_input[field] is not None:
            if not _TYPES[spec["type"]](tool_input[field]):
                raise ToolError("bad_tool_input", f"{name} field {field!r} must be a {spec['type']}")
            args[field] = tool_input[field]
    return args


class WorkspaceTools:
    """The tools of one workspace.

    Params: ``root`` the workspace directory; ``runner`` executes ``run_command`` (default: plain
    subprocess); ``limits`` bounds reads, listings, searches and commands; ``time_left`` returns
    the seconds the run has left (None: no timeout) and bounds each command too.
    """

    def __init__(self, root: Path, runner: CommandRunner | None = None,
                 limits: ToolLimits | None = None, *,
                 time_left: Callable[[], float | None] = lambda: None) -> None:
        self.root = Path(root).resolve()
        self.runner = runner if runner is not None else SubprocessRunner()
        self.limits = limits or ToolLimits()
        self.time_left = time_left
        self._handlers: dict[str, Callable[..., str]] = {
            "list_files": self._list, "read_file": self._read, "write_file": self._write,
            "edit_file": self._edit, "search_files": self._search, "run_command": self._run,
            "request_action": self._request, "declare_impossible": self._declare_impossible,
        }
        self.requests: list[dict[str, str]] = []
        if getattr(_reading, "only", False):      # a wrap-up act: nothing that changes anything
            for name in WRITING_TOOLS:
                self._handlers.pop(name, None)

    def schemas(self) -> list[dict[str, Any]]:
        """Tool definitions for the Messages API ``tools`` parameter (the tools this set offers)."""
        return [dict(s) for s in TOOL_SCHEMAS if s["name"] in self._handlers]

    def call(self, name: str, tool_input: object) -> ToolResult:
        """Run tool ``name`` with the model's ``tool_input``. Never raises; returns a result.
        The observer this thread installed (``observed``) hears of the call as it starts and ends."""
        observer = getattr(_observing, "observer", None)
        if observer is None:
            return self._call(name, tool_input)
        _tell(observer, describe_call(name, tool_input))
        try:
            return self._call(name, tool_input)
        finally:
            _tell(observer, None)

    def _call(self, name: str, tool_input: object) -> ToolResult:
        handler = self._handlers.get(name) if isinstance(name, str) else None
        if handler is None:
            return ToolResult(f"unknown tool {name!r}; available: {', '.join(self._handlers)}",
                              True, "unknown_tool")
        try:
            args = check_input(name, tool_input)
            return ToolResult(handler(**args))
        except _CommandFailed as failed:
            return ToolResult(str(failed), True, failed.code)
        except ToolError as exc:
            return ToolResult(f"error ({exc.code}): {exc}", True, exc.code)
        except OSError as exc:
            return ToolResult(f"error (os_error): {exc.strerror or exc}", True, "os_error")
        except Exception as exc:  # noqa: BLE001 — a tool bug or a coded refusal (no sandbox) must not end the act
            if not isinstance(exc, OrgError):
                return ToolResult(f"error (tool_failed): {type(exc).__name__}: {exc}", True, "tool_failed")
            return ToolResult(f"error ({exc.code}): {exc}", True, exc.code)

    # -- paths -----------------------------------------------------------------------------

    def resolve(self, rel: str) -> Path:
        """Absolute path of ``rel`` inside the workspace. Errors: ``ToolError`` with code
        ``path_absolute`` or ``path_escape`` (``..``, or a symlink leading outside)."""
        rel = rel.strip() or "."
        if "\x00" in rel:
            raise ToolError("bad_path", "path contains a NUL byte")
        pure = PurePosixPath(rel)
        if pure.is_absolute() or rel.startswith("~"):
            raise ToolError("path_absolute", f"{rel!r} is absolute; use a path relative to the workspace root")
        if ".." in pure.parts:
            raise ToolError("path_escape", f"{rel!r} uses '..'; paths must stay inside the workspace")
        resolved = (self.root / pure).resolve()
        if resolved != self.root and not resolved.is_relative_to(self.root):
            raise ToolError("path_escape", f"{rel!r} leads out of the workspace through a symlink")
        return resolved

    def _rel(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix() if path != self.root else "."

    def _text(self, path: Path) -> str:
        """The UTF-8 text of ``path`` (resolved inside the workspace), read as what a sandboxed
        command may have left: no link followed on the way, a regular file only, never a FIFO's
        wait, at most ``TEXT_MAX_BYTES`` (``hostile.read_regular``)."""
        if not path.is_file():
            raise ToolError("not_found", f"{self._rel(path)} is not a file")
        try:
            data = read_regular(path, limit=TEXT_MAX_BYTES, beneath=self.root, single_link=False)
        except HostileFile as exc:
            raise ToolError(exc.code, f"{self._rel(path)} was not read: {exc}") from None
        if b"\x00" in data[:_BINARY_PROBE]:
            raise ToolError("binary_file", f"{self._rel(path)} looks binary; the file tools handle text only")
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise ToolError("not_text", f"{self._rel(path)} is not UTF-8 text") from None

    # -- tools -----------------------------------------------------------------------------

    def _request(self, kind: str, command: str, reason: str) -> str:
        if kind not in GATE_KINDS:
            raise ToolError("bad_tool_input", f"kind must be one of {', '.join(GATE_KINDS)}")
        if not command.strip():
            raise ToolError("bad_tool_input", "command is empty")
        if len(command) > MAX_ACTION_COMMAND:
            # refused, never cut: a human approves the command they are shown, whole, and it is what runs
            raise ToolError("command_too_long", f"the command has {len(command)} characters; a command a human "
                            f"approves holds at most {MAX_ACTION_COMMAND}: put the steps in a script in the "
                            "workspace and ask to run that")
        self.requests.append({"kind": kind, "command": command, "reason": reason[:1000]})
        return ("Recorded for a human decision. Nothing ran. End your turn now; the decision (and the "
                "command's output if approved) comes back in the next iteration.")

    def _declare_impossible(self, reason: str) -> str:
        # recorded with the iteration's tool calls, where the eval-agent reads the claim
        if not reason.strip():
            raise ToolError("bad_tool_input", "reason is empty: say why the goal cannot be met")
        return ("Recorded: the eval-agent reviews your claim after this iteration. If its review agrees, a "
                "human decides whether the run ends; if not, you are told why and go on. End your turn now.")

    def _list(self, path: str = ".", recursive: bool = False) -> str:
        base = self.resolve(path)
        if not base.is_dir():
            raise ToolError("not_found", f"{path!r} is not a directory")
        cap = self.limits.list_max_entries
        entries: list[str] = []
        for entry in self._walk(base, recursive):
            if len(entries) == cap:
                entries.append(f"... (listing stops at {cap} entries; list a subdirectory)")
                break
            entries.append(entry)
        return "\n".join(entries) if entries else "(empty directory)"

    def _walk(self, base: Path, recursive: bool):
        for dirpath, dirnames, filenames in os.walk(base, followlinks=False):
            dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
            here = Path(dirpath)
            for d in dirnames:
                yield self._rel(here / d) + ("@" if (here / d).is_symlink() else "/")
            for f in sorted(filenames):
                p = here / f
                yield self._rel(p) + ("@" if p.is_symlink() else "")
            if not recursive:
                return

    def _read(self, path: str, offset: int = 1, limit: int | None = None) -> str:
        target = self.resolve(path)
        if offset < 1:
            raise ToolError("bad_tool_input", "offset is a 1-based line number")
        limit = min(limit or self.limits.read_max_lines, self.limits.read_max_lines)
        if limit < 1:
            raise ToolError("bad_tool_input", "limit must be at least 1")
        lines = self._text(target).splitlines()
        chosen = lines[offset - 1: offset - 1 + limit]
        out, size = [], 0
        for n, line in enumerate(chosen, start=offset):
            row = f"{n:>6}\t{line[:_MAX_LINE_CHARS]}"
            size += len(row) + 1
            if size > self.limits.read_max_bytes:
                break
            out.append(row)
        last = offset + len(out) - 1
        if not out:
            return f"(no lines at offset {offset}; the file has {len(lines)} lines)"
        tail = (f"\n(lines {offset}-{last} of {len(lines)}; read on with offset={last + 1})"
                if last < len(lines) else "")
        return "\n".join(out) + tail

    def writable(self, rel: str) -> Path:
        """``resolve(rel)`` for a write: never into a repository's own metadata (a ``.git`` folder
        or file at any depth), which is the user's — a hook or a config written there would run at
        the user's next git command, outside the sandbox. Errors: ``ToolError`` ``path_protected``."""
        target = self.resolve(rel)
        if ".git" in PurePosixPath(self._rel(target)).parts:
            raise ToolError("path_protected", f"{rel!r} is inside a repository's own metadata (.git), which "
                                              "is the user's; change the project's files instead")
        return target

    def _write(self, path: str, content: str) -> str:
        target = self.writable(path)
        data = content.encode("utf-8")
        if len(data) > self.limits.write_max_bytes:
            raise ToolError("too_large", f"content is {len(data)} bytes; the limit is {self.limits.write_max_bytes}")
        if target.is_dir():
            raise ToolError("is_directory", f"{path!r} is a directory")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        return f"wrote {len(data)} bytes to {self._rel(target)}"

    def _edit(self, path: str, old_string: str, new_string: str) -> str:
        target = self.writable(path)
        if not old_string:
            raise ToolError("bad_tool_input", "old_string must not be empty; use write_file to create a file")
        text = self._text(target)
        count = text.count(old_string)
        if count == 0:
            raise ToolError("edit_no_match", f"old_string does not occur in {path!r}; read the file and "
                            "copy the exact text (whitespace included)")
        if count > 1:
            raise ToolError("edit_not_unique", f"old_string occurs {count} times in {path!r}; include more "
                            "surrounding lines so it matches exactly once")
        target.write_text(text.replace(old_string, new_string, 1), encoding="utf-8")
        return f"edited {self._rel(target)}: replaced 1 occurrence"

    def _search(self, pattern: str, path: str = ".", regex: bool = False) -> str:
        base = self.resolve(path)
        if not pattern:
            raise ToolError("bad_tool_input", "pattern must not be empty")
        try:
            matcher = re.compile(pattern if regex else re.escape(pattern))
        except re.error as exc:
            raise ToolError("bad_regex", f"invalid regular expression: {exc}") from None
        cap, hits = self.limits.search_max_results, []
        files = [base] if base.is_file() else self._search_files(base)
        for file in files:
            for n, line in enumerate(self._searchable(file), start=1):
                if matcher.search(line):
                    if len(hits) == cap:
                        hits.append(f"... (results stop at {cap}; narrow the pattern or path)")
                        return "\n".join(hits)
                    hits.append(f"{self._rel(file)}:{n}: {line[:300]}")
        return "\n".join(hits) if hits else "(no matches)"

    def _search_files(self, base: Path):
        for dirpath, dirnames, filenames in os.walk(base, followlinks=False):
            dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
            for f in sorted(filenames):
                p = Path(dirpath) / f
                if not p.is_symlink():  # a symlink may point anywhere; search what is really here
                    yield p

    def _searchable(self, file: Path) -> list[str]:
        try:
            if file.stat().st_size > self.limits.search_max_file_bytes:
                return []
            return self._text(file).splitlines()
        except (ToolError, OSError):
            return []

    def _run(self, command: str, timeout_s: float | None = None) -> str:
        if not command.strip():
            raise ToolError("bad_tool_input", "command must not be empty")
        timeout = min(timeout_s or self.limits.command_timeout_s, self.limits.command_timeout_s)
        left = self.time_left()
        run_bound = left is not None and left < timeout
        if run_bound and left <= 0:
            raise ToolError("run_timeout", "the run's time limit is reached; the command was not started")
        if run_bound:
            timeout = left
        res = self.runner.run(command, self.root, timeout, self.limits.command_max_output_bytes)
        head = (f"timed out after {timeout:.3g}s (process killed"
                + ("; the run's time limit is reached)" if run_bound else ")") if res.timed_out
                else f"exit code {res.exit_code}")
        if res.truncated:
            head += f" (output truncated to {self.limits.command_max_output_bytes} bytes)"
        text = f"{head}\n{clean(res.output)}" if res.output else head      # no terminal control to the model
        if res.timed_out or res.exit_code != 0:
            raise _CommandFailed("command_timeout" if res.timed_out else "command_failed", text)
        return text


class _CommandFailed(ToolError):
    """A command that ran but failed: its output goes to the model as-is (no error prefix)."""


# The tools that change the workspace or the run's course (an action asked for, a claim made). A
# wrap-up act (the one act a run gets when a budget trips, to write its hand-off note) runs without
# them: the backend builds its WorkspaceTools in the engine's thread, so the engine says so for the
# thread (``read_only``).
WRITING_TOOLS = frozenset({"write_file", "edit_file", "run_command", "request_action", "declare_impossible"})
_reading = threading.local()


@contextmanager
def read_only() -> Iterator[None]:
    """Tools built in this thread meanwhile offer only the tools that read (list, read, search)."""
    before = getattr(_reading, "only", False)
    _reading.only = True
    try:
        yield
    finally:
        _reading.only = before


# The observer of the tool calls made in this thread: each act runs its tools in the thread that
# runs the engine, and the backend builds its WorkspaceTools itself, so the loop-agent process
# installs one per worker thread rather than threading it through every backend.
_observing = threading.local()
ToolObserver = Callable[["str | None"], None]


@contextmanager
def observed(observer: ToolObserver) -> Iterator[None]:
    """Tell ``observer(description)`` of every tool call this thread makes while inside, as it
    starts, and ``observer(None)`` as it ends. An observer that raises is ignored (a tool call
    never fails for being watched)."""
    before = getattr(_observing, "observer", None)
    _observing.observer = observer
    try:
        yield
    finally:
        _observing.observer = before


def _tell(observer: ToolObserver, description: str | None) -> None:
    try:
        observer(description)
    except Exception:  # noqa: BLE001 - watching must not change what the tool does
        pass


_SUBJECT = {"list_files": "path", "read_file": "path", "write_file": "path", "edit_file": "path",
            "search_files": "pattern", "run_command": "command", "request_action": "command"}


def describe_call(name: object, tool_input: object, *, cap: int = 120) -> str:
    """One short line naming a tool call: ``run_command pytest -q``, ``edit_file calc.py``."""
    field = _SUBJECT.get(name) if isinstance(name, str) else None
    subject = tool_input.get(field) if field and isinstance(tool_input, Mapping) else None
    text = f"{name} {' '.join(subject.split())}" if isinstance(subject, str) else str(name)
    return text if len(text) <= cap else text[:cap - 1] + "…"


def summarize_call(name: str, tool_input: object, result: ToolResult, *, cap: int = 200) -> dict:
    """A bounded record of one tool call for ``ActOutcome.tool_calls``."""
    if name == "declare_impossible":        # the claim is read back from this record: keep its reason whole
        cap = max(cap, 2000)
    return {"name": name, "input": _truncate(tool_input, cap), "ok": not result.is_error,
            "code": result.code, "result": result.content[:cap]}


def _truncate(value: object, cap: int) -> object:
    if isinstance(value, str):
        return value if len(value) <= cap else value[:cap] + f"…(+{len(value) - cap} chars)"
    if isinstance(value, Mapping):
        return {str(k): _truncate(v, cap) for k, v in list(value.items())[:20]}
    if isinstance(value, (list, tuple)):
        return [_truncate(v, cap) for v in value[:20]]
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return _truncate(repr(value), cap)
