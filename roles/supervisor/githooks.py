"""What guards a served workspace history, whoever starts the ``receive-pack`` that takes a push.

The coordinator host's histories are served two ways: by ``git daemon`` over git://
(``roles.supervisor.gitserve``) and by sshd's forced command ``org git-shell`` over ssh://
(``roles.supervisor.gitshell``). Both run git with the same settings (``receive_config``) and the
same ``pre-receive`` hook (``write_hooks``), written once here. This module imports nothing but
the standard library: ``org git-shell`` runs once per ssh connection and must start fast.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

ALLOWED_REFS = ("refs/iterations/*", "refs/actions/*", "refs/discarded/*", "refs/heads/checkpoints")

PRE_RECEIVE = """#!/bin/sh
# What a worker host may push into a workspace history (written by roles/supervisor/githooks.py).
# stdin: one "<old> <new> <ref>" line per updated ref; any refusal refuses the whole push.
status=0
while read -r old new ref; do
    case "$new" in
        *[!0]*) ;;
        *) echo "loop-org: refusing to delete $ref: histories only grow" >&2; status=1; continue ;;
    esac
    case "$ref" in
        refs/loop-org/*)
            echo "loop-org: refusing $ref: the baseline belongs to the coordinator host" >&2; status=1 ;;
        %(allowed)s) ;;
        *)
            echo "loop-org: refusing $ref: a worker pushes only %(listed)s" >&2; status=1 ;;
    esac
done
exit $status
"""

# GIT_PROTOCOL is the one setting a client may send (ssh's SendEnv): it asks for protocol v2.
_GIT_PROTOCOL = re.compile(r"[A-Za-z0-9=:._-]{0,64}")


def hooks_dir_for(history_dir: Path) -> Path:
    """Where the server's hooks live: ``<home>/run/git-hooks`` beside ``<home>/history``."""
    return Path(history_dir).absolute().parent / "run" / "git-hooks"


def hook_text() -> str:
    """The ``pre-receive`` hook's text."""
    return PRE_RECEIVE % {"allowed": "|".join(ALLOWED_REFS), "listed": ", ".join(ALLOWED_REFS)}


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


def receive_config(hooks_dir: Path) -> list[str]:
    """The ``-c`` settings every git serving a history runs with: malformed objects refused, no
    deletion, the hooks of ``hooks_dir`` (never a repository's own ``hooks/``), no ``gc --auto``
    after a push (the client would wait for it)."""
    return ["-c", "receive.fsckObjects=true", "-c", "receive.denyDeletes=true",
            "-c", "receive.autogc=false", "-c", f"core.hooksPath={Path(hooks_dir).absolute()}"]


def serve_env(environ: dict[str, str] | None = None, *, keep_protocol: bool = False) -> dict[str, str]:
    """The environment of a git serving histories: no user or system git configuration, no
    inherited ``GIT_*`` setting (but a well-formed ``GIT_PROTOCOL`` with ``keep_protocol``: what
    an ssh client asked for), messages in English."""
    source = os.environ if environ is None else environ
    env = {k: v for k, v in source.items() if not k.startswith("GIT_")}
    protocol = source.get("GIT_PROTOCOL")
    if keep_protocol and protocol and _GIT_PROTOCOL.fullmatch(protocol):
        env["GIT_PROTOCOL"] = protocol
    env.update(GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull, LC_ALL="C")
    return env
