"""The processes around bubblewrap as one small compiled program (``stage.c``), where a C compiler
is at hand; the shell stages of ``bwrap`` otherwise.

Each sandboxed command ran eight programs besides bubblewrap and the command: ``setpriv`` (the
parent-death signal), a shell and its forked watcher (the caller's death, the pids cgroup),
``prlimit`` (the rlimits), then inside a shell and its forked watcher (the caller's death again)
and ``timeout`` (the backstop). Each is an exec with its dynamic loading: ~5 ms of the machine's
CPU of a verification's ~20 (``bench/scale.py``: a fresh sandbox for every verification is most
of what the org spends per iteration). ``sandbox-stage outer`` and ``sandbox-stage inner`` do the
same jobs in one exec and one fork each, with the same exits (``stage.c`` says how).

The program is built from ``stage.c`` into the project's ``build/`` folder (shown read-only inside
every sandbox, as the project's code is: the inner stage runs there), its name carrying the
source's hash, so a changed source is built anew and never mixed with an old binary. ``ensure``
builds it (the role template's warm-up, ``mode.warm``; ``scripts/test``); ``binary`` says whether
it is there. Without a compiler nothing is built and the shell stages serve: slower, the same
guarantees (``ORG_SANDBOX_STAGES=shell`` chooses them anyway; the sandbox tests run both).
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import threading
import uuid
from pathlib import Path

import structlog

log = structlog.get_logger("sandbox.stage")

SOURCE = Path(__file__).with_name("stage.c")
FORCE_SHELL = "ORG_SANDBOX_STAGES"      # "shell": the shell stages even where the program is built
_LOCK = threading.Lock()
_found: str | None = None
_tried = False


def path() -> Path:
    """Where the program built from the current source lives."""
    from state_db.kernel.home import project_root
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    return project_root() / "build" / f"sandbox-stage-{digest}"


def binary() -> str | None:
    """The built program's path, or None (not built, or ``ORG_SANDBOX_STAGES=shell``: the shell
    stages serve). Kept once found, while it is still there."""
    global _found
    if os.environ.get(FORCE_SHELL) == "shell":
        return None
    if _found is not None and os.access(_found, os.X_OK):   # a stat: a build/ folder cleaned meanwhile
        return _found
    _found = None
    try:
        target = path()
    except OSError:
        return None
    if os.access(target, os.X_OK):
        _found = str(target)
    return _found


def ensure() -> str | None:
    """Build the program if it is not there yet and a C compiler is (``cc``, else ``gcc``): static
    where the C library allows it, else dynamic. Returns its path, or None. Tried once per
    process; the file appears whole or not at all (built beside it, renamed into place)."""
    global _tried
    with _LOCK:
        found = binary()
        if found is not None or _tried:
            return found
        _tried = True
        compiler = shutil.which("cc") or shutil.which("gcc")
        if compiler is None:
            log.info("sandbox_stage_not_built", why="no C compiler (cc, gcc)",
                     next="each sandbox starts its shell stages instead: install gcc to save ~5 ms of CPU each")
            return None
        try:
            target = path()
            target.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            log.info("sandbox_stage_not_built", why=str(exc), next="the shell stages serve")
            return None
        tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}")
        try:
            for static in (["-static"], []):
                got = subprocess.run([compiler, "-O2", *static, "-o", str(tmp), str(SOURCE)],
                                     capture_output=True, text=True, timeout=120)
                if got.returncode == 0:
                    os.chmod(tmp, 0o755)
                    os.replace(tmp, target)
                    return binary()
            log.warning("sandbox_stage_not_built", why=(got.stderr or got.stdout).strip()[-300:],
                        next="the shell stages serve")
        except (OSError, subprocess.SubprocessError) as exc:
            log.warning("sandbox_stage_not_built", why=str(exc), next="the shell stages serve")
        finally:
            try:
                tmp.unlink()
            except FileNotFoundError:
                pass
        return None
