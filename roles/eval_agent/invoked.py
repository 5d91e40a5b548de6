"""What a verify command *executes* of the workspace, as opposed to what it only names.

A file the verify command runs decides the check's outcome whatever the code under test does, so
the eval-agent holds it to the baseline (``held``: ``invoked_script``). A file it only names is a
data operand — ``test -f done.txt``, ``mypy app.py``, ``ruff check app.py`` — and is very often
the file the goal is about: holding it would revert the very change that is asked for.

So a word counts only where the shell or a known program executes it:

- the program of each simple command (``./run.sh``, ``ci/check``), after environment
  assignments and the wrappers that run their argument (``env``, ``exec``, ``nice``, ...);
- the script an interpreter runs (``python tools/check.py``, ``bash ci/t.sh``, ``node t.js``) and
  what it preloads (``node --require x.js``); ``-c``/``-e``/``-m`` run no file of the workspace
  by path (a module named by ``-m`` is code: the change scope rules decide about it);
- a file the shell sources (``. env.sh``, ``source env.sh``);
- what ``make`` runs: the Makefiles, and what their recipes execute (read from the baseline's
  Makefiles, which is what the check runs with);
- what the package manager's script runs (``npm test``, ``npm run X``, ``yarn X``, ``pnpm X``):
  the baseline's ``package.json`` script of that name and its ``pre``/``post`` scripts, read the
  same way.

Commands are split with the shell's own tokenizer rules (``shlex`` with its punctuation
characters): ``&&``, ``||``, ``;``, ``|`` and parentheses separate simple commands.
"""
from __future__ import annotations

import functools
import json
import re
import shlex
from typing import Callable, Iterable

# programs that execute the command they are given as their arguments: (name, options that take a value)
_WRAPPERS = {"env": frozenset({"-u", "--unset", "-C", "--chdir", "-S", "--split-string"}),
             "exec": frozenset({"-a"}), "command": frozenset(), "time": frozenset({"-f", "-o"}),
             "nice": frozenset({"-n", "--adjustment"}), "nohup": frozenset(), "stdbuf": frozenset({"-i", "-o", "-e"}),
             "timeout": frozenset({"-s", "--signal", "-k", "--kill-after"}), "xvfb-run": frozenset({"-a", "-s"}),
             "sudo": frozenset({"-u", "-g"}), "chronic": frozenset(), "unbuffer": frozenset()}
_DURATION = re.compile(r"^\d+(\.\d+)?[smhd]?$")        # timeout's first operand
_SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "fish"})
_PYTHON = re.compile(r"^(?:python|pypy)[\d.]*$")
_NODE = frozenset({"node", "nodejs", "bun", "deno", "tsx", "ts-node"})
_OTHER = frozenset({"ruby", "perl", "php", "Rscript", "lua", "julia"})
# options of each interpreter that take a value (the value is not the script), and those that
# name a file it executes before the script
_PY_VALUED = frozenset({"-W", "-X", "-Q"})
_NODE_VALUED = frozenset({"--env-file", "--conditions", "-C", "--input-type", "--test-reporter",
                          "--test-reporter-destination", "--test-name-pattern", "--stack-size"})
_NODE_PRELOAD = frozenset({"-r", "--require", "--import", "--loader", "--experimental-loader"})
_NODE_NO_FILE = frozenset({"-e", "--eval", "-p", "--print"})
_PACKAGE_MANAGERS = frozenset({"npm", "yarn", "pnpm", "bun"})
_MAKEFILES = ("GNUmakefile", "makefile", "Makefile")
_OPERATORS = frozenset({"&&", "||", ";", "|", "(", ")", "&", ";;", "|&", "\n"})
_ASSIGNMENT = re.compile(r"^[A-Za-z_]\w*=")


@functools.lru_cache(maxsize=256)
def simple_commands(command: str) -> tuple[tuple[str, ...], ...]:
    """``command`` split into its simple commands' words (comments dropped)."""
    lex = shlex.shlex(command.replace("\n", " ; "), posix=True, punctuation_chars=";&|()<>")
    lex.whitespace_split = True
    lex.commenters = "#"
    out, current = [], []
    try:
        words = list(lex)
    except ValueError:
        words = command.split()
    redirect = False
    for w in words:
        if w in _OPERATORS:
            if current:
                out.append(tuple(current))
            current, redirect = [], False
        elif set(w) <= set("<>&") and w:
            redirect = True                     # the next word is a redirection's target, not an argument
        elif redirect:
            redirect = False
        else:
            current.append(w)
    if current:
        out.append(tuple(current))
    return tuple(out)


def _name(word: str) -> str:
    return word.rsplit("/", 1)[-1]


def _rel(word: str) -> str:
    while word.startswith("./"):
        word = word[2:]
    return word


def _skip_wrappers(words: tuple[str, ...]) -> tuple[str, ...]:
    """The words of the command a simple command finally runs (assignments and wrappers skipped)."""
    i = 0
    while i < len(words):
        w = words[i]
        if _ASSIGNMENT.match(w):
            i += 1
            continue
        valued = _WRAPPERS.get(_name(w))
        if valued is None:
            return words[i:]
        i += 1
        while i < len(words) and words[i].startswith("-") and words[i] != "-":
            i += 2 if words[i] in valued else 1
        if _name(w) == "timeout" and i < len(words) and _DURATION.match(words[i]):
            i += 1
    return ()


def _script_of(program: str, args: tuple[str, ...]) -> list[str]:
    """The files an interpreter ``program`` executes from ``args``: its script and preloads."""
    name = _name(program)
    found: list[str] = []
    i = 0
    if _PYTHON.match(name):
        while i < len(args):
            a = args[i]
            if a in ("-c", "-m") or (a.startswith("-") and not a.startswith("--") and a[-1] in "cm"
                                     and len(a) > 2 and set(a[1:-1]) <= set("BbdEhiIOqsSuvx")):
                return found                    # a command string or a module: no file by path
            if a in _PY_VALUED:
                i += 2
                continue
            if a.startswith("-") and a != "-":
                i += 1
                continue
            return found + [a]
        return found
    if name in _NODE:
        while i < len(args):
            a = args[i]
            if a in _NODE_NO_FILE:
                return found
            if a in _NODE_PRELOAD and i + 1 < len(args):
                found.append(args[i + 1])
                i += 2
                continue
            if "=" in a and a.split("=", 1)[0] in _NODE_PRELOAD:
                found.append(a.split("=", 1)[1])
                i += 1
                continue
            if a in ("run", "test") and name in ("bun", "deno"):
                i += 1
                continue
            if a in _NODE_VALUED:
                i += 2
                continue
            if a.startswith("-"):
                i += 1
                continue
            return found + [a]
        return found
    if name in _SHELLS or name in _OTHER:
        while i < len(args):
            a = args[i]
            if name in _SHELLS and a.startswith("-") and not a.startswith("--") and "c" in a[1:]:
                return found                    # sh -c STRING
            if name in _OTHER and a in ("-e", "-E", "-r"):
                return found                    # ruby -e, perl -e, php -r: a program string
            if a in ("-o", "-O", "+o", "+O", "-I"):
                i += 2
                continue
            if a.startswith(("-", "+")):
                i += 1
                continue
            return found + [a]
    return found


def executed(command: str, paths: Iterable[str], read: Callable[[str], bytes | None] = lambda p: None,
             *, _depth: int = 0) -> set[str]:
    """The workspace files (of ``paths``) that ``command`` executes. ``read`` gives a file's
    content (the baseline's) for Makefiles and ``package.json``."""
    paths = paths if isinstance(paths, (set, frozenset)) else set(paths)
    found: set[str] = set()
    for words in simple_commands(command):
        words = _skip_wrappers(words)
        if not words:
            continue
        program, args = words[0], words[1:]
        name = _name(program)
        if program in (".", "source"):
            found.update(_rel(a) for a in args[:1])
            continue
        if "/" in program:
            found.add(_rel(program))            # a bare name is looked up on PATH, never in the workspace
        found.update(_rel(a) for a in _script_of(program, args))
        if _depth >= 3:
            continue                            # a script that runs a script that runs a script: enough
        if name in ("make", "gmake"):
            found.update(_make(args, paths, read, _depth))
        elif name in _PACKAGE_MANAGERS:
            found.update(_package_script(args, paths, read, _depth))
    return found & paths


def _make(args: tuple[str, ...], paths: set[str], read, depth: int) -> set[str]:
    """The Makefiles ``make`` reads and what their recipes execute."""
    folder = ""
    named = []
    i = 0
    while i < len(args):
        a = args[i]
        if a in ("-C", "--directory") and i + 1 < len(args):
            folder = _rel(args[i + 1]).rstrip("/") + "/"
            i += 2
            continue
        if a in ("-f", "--file", "--makefile") and i + 1 < len(args):
            named.append(_rel(args[i + 1]))
            i += 2
            continue
        i += 1
    files = [folder + f for f in named] if named else [folder + m for m in _MAKEFILES if folder + m in paths]
    files += [p for p in paths if p.endswith(".mk")]     # included makefiles, wherever they are
    found = set(files)
    for makefile in files:
        text = (read(makefile) or b"").decode("utf-8", "replace")
        for line in text.splitlines():
            if line.startswith("\t"):
                recipe = line.lstrip("\t").lstrip("@-+ ")
                found |= {folder + p if folder and not p.startswith(folder) else p
                          for p in executed(recipe, _under(paths, folder), _reader(read, folder), _depth=depth + 1)}
    return found


def _package_script(args: tuple[str, ...], paths: set[str], read, depth: int) -> set[str]:
    """``package.json`` and what the scripts ``npm test`` / ``npm run X`` / ``yarn X`` run execute."""
    words = [a for a in args if not a.startswith("-")]
    if not words:
        return set()
    if words[0] in ("test", "t", "tst"):
        script = "test"
    elif words[0] in ("run", "run-script") and len(words) > 1:
        script = words[1]
    elif words[0] in ("exec", "dlx", "x", "install", "ci", "add"):
        return set()
    else:
        script = words[0]                       # yarn X, pnpm X
    found = {"package.json"}
    try:
        data = json.loads((read("package.json") or b"{}").decode("utf-8", "replace"))
    except ValueError:
        return found
    scripts = data.get("scripts") if isinstance(data, dict) else None
    if not isinstance(scripts, dict):
        return found
    for name in (f"pre{script}", script, f"post{script}"):
        body = scripts.get(name)
        if isinstance(body, str):
            found |= executed(body, paths, read, _depth=depth + 1)
    return found


def _under(paths: set[str], folder: str) -> set[str]:
    if not folder:
        return paths
    return {p[len(folder):] for p in paths if p.startswith(folder)}


def _reader(read, folder: str):
    return read if not folder else (lambda p: read(folder + p))


_WORD = re.compile(r"[\w.+@%,=/-]+")


def named_files(commands: Iterable[str], paths: Iterable[str]) -> list[str]:
    """Every workspace file whose path the verify commands spell out anywhere — an operand, a
    redirection, inside a command substitution or a quoted script: files the user's own check is
    about (``test -f done.txt``, ``mypy app.py``, ``[ "$(cat answer.txt)" = right ]``)."""
    paths = paths if isinstance(paths, (set, frozenset)) else set(paths)
    found = set()
    for command in commands:
        for word in _WORD.findall(command):
            for candidate in (word, word.split("=", 1)[-1]):
                rel = _rel(candidate)
                if rel in paths:
                    found.add(rel)
    return sorted(found)


def executed_files(commands: Iterable[str], paths: Iterable[str],
                   read: Callable[[str], bytes | None] = lambda p: None) -> list[str]:
    """Every workspace file any of ``commands`` executes, sorted."""
    paths = set(paths)
    found: set[str] = set()
    for command in commands:
        found |= executed(command, paths, read)
    return sorted(found)
