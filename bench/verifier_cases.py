"""The shape of one case of ``bench/verifier.py``: a workspace, what the doer does, how it is checked.

A case is plain data: the baseline's files, the doer's acts (the scripted model's tool uses, the
last act repeating), the verify commands and the submitter's environment. ``{python}`` stands for
the interpreter the checks run under, ``{pytest}`` for pytest run by it, ``{site}`` for a virtual
environment's ``site-packages`` below the workspace and ``{tag}`` for the interpreter's compiled
file tag; a workspace setup step (``setup``, named in ``SETUPS``) runs after the baseline's files
are written and before the baseline is committed.

Hostile cases leave the code the user runs broken whatever the doer does: any pass the verifier
gives one is a false pass. Honest cases apply a correct fix that passes the same commands on the
host: any run of one that does not end ``goal_met`` is a false fail.
"""
from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

VERSION = f"{sys.version_info.major}.{sys.version_info.minor}"
SITE = f".venv/lib/python{VERSION}/site-packages"
TAG = sys.implementation.cache_tag
HOSTILE, HONEST = "hostile", "honest"
# this interpreter by its environment's real folder: the sandbox shows folders, not the links to them
# (a checkout whose .venv is a link to another's)
PYTHON = str(Path(sys.prefix).resolve() / "bin" / Path(sys.executable).name)
BIN = str(Path(PYTHON).parent)


def pytest_command(python: str) -> str:
    """pytest under ``python``; ``-p no:hypothesispytest`` leaves out a plugin no case uses."""
    return f"{python} -m pytest -q -p no:hypothesispytest"


def write(path: str, content: str) -> dict:
    return {"name": "write_file", "input": {"path": path, "content": content}}


def edit(path: str, old: str, new: str) -> dict:
    return {"name": "edit_file", "input": {"path": path, "old_string": old, "new_string": new}}


def run(command: str) -> dict:
    return {"name": "run_command", "input": {"command": command}}


@dataclass(frozen=True)
class Case:
    """One run of the benchmark. ``corpus``: hostile or honest; ``kind``: the attack's class, or
    the honest case's toolchain; ``place``: where the attack's file lies, or the honest case's
    project; ``env``: variables the submitter has (``{tools}`` and ``{ws}`` resolved at run time)."""

    name: str
    corpus: str
    kind: str
    place: str
    why: str
    acts: tuple[tuple[dict, ...], ...]
    verify: tuple[str, ...]
    files: Mapping[str, str] = field(default_factory=dict)
    setup: tuple = ()                 # names in SETUPS, or callables (workspace, context)
    env: Mapping[str, str] = field(default_factory=dict)
    quick: bool = False


@dataclass
class Context:
    """What every case's preparation shares: the interpreter, the cache of fetched projects and
    the tools made once per benchmark run (``tools``)."""

    python: str
    cache: Path
    tools: Path
    made: dict = field(default_factory=dict)

    def resolve(self, text: str, ws: Path | None = None) -> str:
        return (text.replace("{pytest}", pytest_command(self.python)).replace("{python}", self.python)
                .replace("{site}", SITE).replace("{tag}", TAG).replace("{tools}", str(self.tools))
                .replace("{ws}", str(ws or "")))


def git_commit(ws: Path) -> None:
    git = ["git", "-c", "user.name=bench", "-c", "user.email=bench@example.invalid", "-c", "init.defaultBranch=main",
           "-c", "core.autocrlf=false", "-C", str(ws)]
    if not (ws / ".git").exists():
        subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "baseline", "--allow-empty"], check=True)


def script_for(case: Case, ctx: Context, ws: Path) -> dict:
    """The scripted model's answers: each act makes its tool uses in one turn, then ends."""
    done = {"text": f"Done ({case.name})."}
    acts = [[{"tool_uses": list(uses)}, done] if uses else [done] for uses in case.acts]
    return json.loads(ctx.resolve(json.dumps({"version": 1, "acts": acts, "repeat_last": True}), ws))


def write_files(ws: Path, files: Mapping[str, str], ctx: Context) -> None:
    for rel, content in files.items():
        (ws / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws / rel).write_text(ctx.resolve(content, ws))


# -- workspace set-up steps --------------------------------------------------------------------

def inner_venv(ws: Path, ctx: Context) -> None:
    """A ``.venv`` in the workspace (ignored by git, as uv and poetry make it) that sees the
    benchmark's own packages, pytest among them, through a ``.pth`` line."""
    subprocess.run([PYTHON, "-m", "venv", "--without-pip", str(ws / ".venv")], check=True)
    outer = next(Path(sys.prefix).resolve().glob("lib/python*/site-packages"))
    (ws / SITE / "_outer.pth").write_text(f"{outer}\n")
    ignore = ws / ".gitignore"
    ignore.write_text((ignore.read_text() if ignore.exists() else "") + ".venv/\n")


SETUPS: dict[str, Callable[[Path, Context], None]] = {"inner_venv": inner_venv}


def prepare(case: Case, root: Path, ctx: Context) -> Path:
    """The case's workspace at ``root/<name>``: files written, set-up steps run, baseline committed."""
    ws = root / case.name
    ws.mkdir(parents=True)
    write_files(ws, case.files, ctx)
    for step in case.setup:
        (SETUPS[step] if isinstance(step, str) else step)(ws, ctx)
    git_commit(ws)
    return ws
