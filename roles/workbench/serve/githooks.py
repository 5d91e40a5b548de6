"""What guards a served workspace history, whoever starts the ``receive-pack`` that takes a push.

The coordinator host's histories are served two ways: by ``git daemon`` over git://
(``roles.workbench.serve.gitserve``) and by sshd's forced command ``org git-shell`` over ssh://
(``roles.workbench.serve.gitshell``). Both run git with the same settings (``receive_config``) and the
same ``pre-receive`` hook (``write_hooks``), written once here. This module imports nothing but
the standard library: ``org git-shell`` runs once per ssh connection and must start fast.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

ALLOWED_REFS = ("refs/iterations/*", "refs/actions/*", "refs/discarded/*", "refs/heads/checkpoints")
MAX_PUSH_BYTES = 256 * 1024 * 1024     # git's receive.maxInputSize: a bigger pack is refused whole

# what the git serving a push was told of the pusher (set by org git-shell and the daemon, never
# by a client: serve_env drops every LOOP_ORG_* a client or a parent could pass)
SCOPE_ENV = "LOOP_ORG_SCOPE"           # "host:<name>" (org git-shell --host), "all" or "daemon"
NEXT_ENV = "LOOP_ORG_NEXT"             # with a host: the one iteration it may push now

# The pre-receive hook, in Python (the standard library only, started with -IS: isolated, fast).
# stdin: one "<old> <new> <ref>" line per updated ref; any refusal refuses the whole push.
PRE_RECEIVE = """#!%(python)s -IS
# What a worker host may push into a workspace history (written by roles/workbench/serve/githooks.py).
import os, subprocess, sys

scope, nxt = os.environ.get("%(scope_env)s", ""), os.environ.get("%(next_env)s", "")
lines = [ln.split() for ln in sys.stdin.read().splitlines() if ln.strip()]
discarding = {tuple(ref.split("/")[2:4]) for old, new, ref in lines if ref.startswith("refs/discarded/")}
refused = []

def zero(oid):
    return set(oid) == {"0"}

def ancestor(old, new):
    return subprocess.run(["git", "merge-base", "--is-ancestor", old, new], stdin=subprocess.DEVNULL,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0

def refuse(ref, why):
    refused.append("loop-org: refusing %%s: %%s" %% (ref, why))

if not scope:
    refuse("this push", "the server does not know who pushes (serve histories with org git-shell)")
for old, new, ref in lines:
    parts = ref.split("/")
    if zero(new):
        refuse(ref, "histories only grow (no deletion)")
    elif ref.startswith("refs/loop-org/"):
        refuse(ref, "the baseline belongs to the coordinator host")
    elif len(parts) == 3 and parts[:2] == ["refs", "iterations"] and parts[2].isdigit():
        if nxt and parts[2] != nxt:
            refuse(ref, "this host may push only the iteration it is about to commit (%%s)" %% nxt)
        elif not zero(old) and not ancestor(old, new) and (parts[2], old) not in discarding:
            refuse(ref, "a rewrite keeps the replaced commit in refs/discarded/%%s/<old> in the same push" %% parts[2])
    elif len(parts) == 4 and parts[:2] == ["refs", "discarded"] and parts[2].isdigit():
        if nxt and parts[2] != nxt:
            refuse(ref, "this host may discard only the iteration it is about to commit (%%s)" %% nxt)
        elif not zero(old):
            refuse(ref, "the discard area is written once")
    elif (len(parts) == 3 and parts[:2] == ["refs", "actions"]) or ref == "refs/heads/checkpoints":
        if not zero(old) and not ancestor(old, new):
            refuse(ref, "a non-fast-forward update (only the discard area takes a replaced commit)")
    else:
        refuse(ref, "a worker pushes only %(listed)s")
for line in refused:
    print(line, file=sys.stderr)
sys.exit(1 if refused else 0)
"""

# GIT_PROTOCOL is the one setting a client may send (ssh's SendEnv): it asks for protocol v2.
_GIT_PROTOCOL = re.compile(r"[A-Za-z0-9=:._-]{0,64}")


def hooks_dir_for(history_dir: Path) -> Path:
    """Where the server's hooks live: ``<home>/run/git-hooks`` beside ``<home>/history``."""
    return Path(history_dir).absolute().parent / "run" / "git-hooks"


def hook_text() -> str:
    """The ``pre-receive`` hook's text (run by this interpreter)."""
    import sys
    return PRE_RECEIVE % {"python": sys.executable, "scope_env": SCOPE_ENV, "next_env": NEXT_ENV,
                          "listed": ", ".join(ALLOWED_REFS)}


def write_hooks(hooks_dir: Path) -> Path:
    """Write the ``pre-receive`` hook (atomically, executable) and return its path."""
    hooks_dir.parent.mkdir(mode=0o700, parents=True, exist_ok=True)   # run/ is owner-only
    hooks_dir.mkdir(exist_ok=True)
    hook = hooks_dir / "pre-receive"
    tmp = hook.with_name(f".{hook.name}.{os.getpid()}.tmp")
    tmp.write_text(hook_text())
    os.chmod(tmp, 0o755)
    os.replace(tmp, hook)
    return hook


def hooks_current(hooks_dir: Path) -> bool:
    """Whether ``hooks_dir`` holds this version's ``pre-receive`` hook, executable."""
    hook = hooks_dir / "pre-receive"
    try:
        return os.access(hook, os.X_OK) and hook.read_text() == hook_text()
    except OSError:
        return False


def receive_config(hooks_dir: Path, max_push_bytes: int | None = None) -> list[str]:
    """The ``-c`` settings every git serving a history runs with: malformed objects refused, no
    deletion, the hooks of ``hooks_dir`` (never a repository's own ``hooks/``), no ``gc --auto``
    after a push (the client would wait for it), a pack larger than ``MAX_PUSH_BYTES`` refused."""
    return ["-c", "receive.fsckObjects=true", "-c", "receive.denyDeletes=true",
            "-c", "receive.autogc=false", "-c", f"receive.maxInputSize={max_push_bytes or MAX_PUSH_BYTES}",
            "-c", f"core.hooksPath={Path(hooks_dir).absolute()}"]


def serve_env(environ: dict[str, str] | None = None, *, keep_protocol: bool = False) -> dict[str, str]:
    """The environment of a git serving histories: no user or system git configuration, no
    inherited ``GIT_*`` setting (but a well-formed ``GIT_PROTOCOL`` with ``keep_protocol``: what
    an ssh client asked for), messages in English."""
    source = os.environ if environ is None else environ
    env = {k: v for k, v in source.items() if not k.startswith(("GIT_", "LOOP_ORG_"))}
    protocol = source.get("GIT_PROTOCOL")
    if keep_protocol and protocol and _GIT_PROTOCOL.fullmatch(protocol):
        env["GIT_PROTOCOL"] = protocol
    env.update(GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull, LC_ALL="C")
    return env
