"""The user's toolchains: which folders a command needs to run what the submitting user runs.

Given the ``PATH`` recorded when the work item was submitted (and the submitter's ``HOME``),
``discover`` returns every folder on it and what the tools there need behind them:

- a symbolic link's real target and the prefix it lives in (``~/.local/bin/poetry`` → the
  virtual environment under ``~/.local/share/pypoetry``), a script's ``#!`` interpreter and its
  prefix, a virtual environment's base interpreter (``pyvenv.cfg``'s ``home``);
- known layouts: a virtual environment whose ``bin`` is on PATH (pipx's, a tool's own, an
  activated one: its libraries, not only its scripts), pyenv (the root behind ``shims``:
  ``versions``, ``libexec``), nvm (the node
  versions), cargo and rustup, a Go root, conda, uv's managed interpreters under
  ``~/.local/share/uv/python``;
- and the variables those tools read to find their root, since ``HOME`` inside the sandbox is
  a private folder (``PYENV_ROOT``, ``NVM_DIR``, ``CARGO_HOME``, ``RUSTUP_HOME``,
  ``UV_PYTHON_INSTALL_DIR``).

A home folder itself, ``~/.local`` and ``/`` are never exposed whole: a tool in ``~/bin``
exposes ``~/bin``, not the home. The deny-list and the org homes are applied by ``view``.
"""
from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt", "/nix/store")
_BIN_NAMES = ("bin", "sbin", "Scripts", "shims", "condabin")
_SCAN_ENTRIES = 400          # executables read per PATH folder (links and #! lines)
_HEADER = 256


@dataclass(frozen=True)
class Exposure:
    """One folder (or file) shown read-only, and why."""

    path: str
    reason: str


@dataclass(frozen=True)
class Toolchain:
    """What the submitting user ran with: ``path`` (their PATH), ``home`` (their HOME) and
    ``named`` (absolute paths the work item names outside the workspace: ``VIRTUAL_ENV``, a verify
    command's executable). Recorded with the work item (``encode``), so verification sees
    what the submitter saw."""

    path: str
    home: str
    named: tuple[str, ...] = ()

    def encode(self) -> dict:
        return {"path": self.path, "home": self.home, "named": list(self.named)}

    @classmethod
    def decode(cls, data: Mapping | None) -> Toolchain | None:
        if not data or not isinstance(data.get("path"), str):
            return None
        return cls(data["path"], str(data.get("home") or ""), tuple(str(p) for p in data.get("named") or ()))


def at_submit(environ: Mapping[str, str], verify: Iterable[str], workspace: Path) -> Toolchain:
    """The toolchain of a submitting user: their PATH and HOME, their active virtual environment
    and every absolute executable a verify command names outside ``workspace``."""
    named = []
    venv = environ.get("VIRTUAL_ENV", "")
    if venv.startswith("/"):
        named.append(venv)
    for command in verify:
        try:
            words = shlex.split(command)
        except ValueError:
            continue
        for word in words:
            if word.startswith("/") and not Path(word).is_relative_to(workspace) and os.access(word, os.X_OK) \
                    and os.path.isfile(word):
                named.append(word)
    return Toolchain(environ.get("PATH", ""), environ.get("HOME", ""), tuple(dict.fromkeys(named)))


def is_system(path: str) -> bool:
    return any(path == s or path.startswith(s + "/") for s in SYSTEM)


def discover(toolchain: Toolchain, homes: Iterable[str]) -> tuple[list[Exposure], dict[str, str]]:
    """Folders to show for ``toolchain`` and the variables pointing tools at them.

    ``homes``: folders never exposed whole (every user's home). Returns (exposures, env)."""
    found = _Found(set(homes) | {toolchain.home} - {""})
    for entry in toolchain.path.split(os.pathsep):
        if entry.startswith("/") and os.path.isdir(entry):
            found.path_dir(entry)
    for named in toolchain.named:
        found.behind(named, f"named by the work item ({named})")
    home = toolchain.home
    if home:
        uv = Path(home, ".local/share/uv/python")
        if uv.is_dir() and any(Path(home, ".local/bin", t).exists() for t in ("uv", "uvx")):
            found.add(str(uv), "uv's managed interpreters")
            found.env["UV_PYTHON_INSTALL_DIR"] = str(uv)
    return found.exposures(), found.env


class _Found:
    def __init__(self, homes: set[str]) -> None:
        self.homes = {os.path.realpath(h) for h in homes}
        self.seen: dict[str, str] = {}
        self.env: dict[str, str] = {}

    def exposures(self) -> list[Exposure]:
        return [Exposure(p, r) for p, r in self.seen.items()]

    def _too_broad(self, real: str) -> bool:
        return real == "/" or any(real == h or h.startswith(real.rstrip("/") + "/") or real == h + "/.local"
                                  for h in self.homes)

    def add(self, path: str, reason: str) -> bool:
        real = os.path.realpath(path)
        if is_system(real) or self._too_broad(real) or not os.path.exists(real):
            return False
        if real not in self.seen:
            self.seen[real] = reason
        return True

    def path_dir(self, entry: str) -> None:
        real = os.path.realpath(entry)
        if is_system(real):
            return
        if not self.add(real, f"on the submitter's PATH ({entry})"):
            return
        self._layout(Path(real))
        try:
            names = sorted(os.listdir(real))[:_SCAN_ENTRIES]
        except OSError:
            return
        for name in names:
            self.behind(os.path.join(real, name), f"needed by {name} on PATH ({entry})", depth=1)

    def behind(self, path: str, reason: str, depth: int = 0) -> None:
        """What executable ``path`` needs: its real file's prefix and, for a script, its
        interpreter's (one level of indirection each)."""
        if depth > 2 or not os.path.lexists(path):
            return
        real = os.path.realpath(path)
        if is_system(real):
            return
        if os.path.isdir(real):         # a named prefix (VIRTUAL_ENV)
            self.add(real, reason)
            self._venv_base(Path(real), reason)
            return
        if depth == 0:                  # the named file's own prefix (a venv's bin/python is a link)
            own = _prefix(Path(os.path.realpath(os.path.dirname(path))) / "x")
            if self.add(str(own), reason):
                self._venv_base(own, reason)
        if os.path.islink(path) or depth == 0:
            prefix = _prefix(Path(real))
            if self.add(str(prefix), reason):
                self._venv_base(prefix, reason)
                self._layout(prefix / "bin")
        interpreter = _shebang(real)
        if interpreter:
            self.behind(interpreter, reason, depth + 1)

    def _venv_base(self, prefix: Path, reason: str) -> None:
        cfg = prefix / "pyvenv.cfg"
        try:
            text = cfg.read_text(errors="replace")
        except OSError:
            return
        for line in text.splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "home" and value.strip().startswith("/"):
                base = _prefix(Path(value.strip()) / "python")
                if not is_system(os.path.realpath(base)):
                    self.add(str(base), f"base interpreter of {prefix} ({reason})")

    def _layout(self, folder: Path) -> None:
        """Roots of known toolchains that a folder on PATH belongs to."""
        for root in (folder, *folder.parents):
            if str(root) in ("/", *self.homes):
                break
            if (root / "pyvenv.cfg").is_file():    # a virtual environment's bin/ on PATH: its libraries too
                if self.add(str(root), f"virtual environment behind {folder}"):
                    self._venv_base(root, f"virtual environment behind {folder}")
                return
            if (root / "libexec" / "pyenv").exists() and (root / "versions").is_dir():
                if self.add(str(root), "pyenv root (versions behind its shims)"):
                    self.env.setdefault("PYENV_ROOT", str(root))
                return
            if root.name == ".nvm" and (root / "versions").is_dir():
                if self.add(str(root), "nvm (its node versions)"):
                    self.env.setdefault("NVM_DIR", str(root))
                return
            if root.name == ".cargo":
                if self.add(str(root), "cargo"):
                    self.env.setdefault("CARGO_HOME", str(root))
                rustup = root.parent / ".rustup"
                if self.add(str(rustup), "rustup's toolchains (behind cargo's proxies)"):
                    self.env.setdefault("RUSTUP_HOME", str(rustup))
                return
            if (root / "conda-meta").is_dir() or ((root / "bin" / "go").exists() and (root / "VERSION").exists()):
                self.add(str(root), "toolchain root (conda or Go)")
                return


def _prefix(real_file: Path) -> Path:
    """The installation prefix of an executable: the parent of its ``bin`` folder, else its folder."""
    folder = real_file.parent
    return folder.parent if folder.name in _BIN_NAMES else folder


def _shebang(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            head = f.read(_HEADER)
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    words = head[2:].split(b"\n", 1)[0].split()
    if not words or not words[0].startswith(b"/"):
        return None
    if words[0].endswith(b"/env") and len(words) > 1:    # #!/usr/bin/env python: found on PATH
        return None
    return words[0].decode("utf-8", "replace")
