"""The host side against a hostile doer: what a sandbox leaves behind, tried on every host reader.

Usage: ``bench/host_escapes.py --json`` (≈ 1 min; ``--quick`` tries one kind per reader).

The sandbox itself is ``bench/escapes.py``'s; here a real bubblewrap sandbox leaves each kind of
file a sandboxed process can make — a link to a host file, a link to a device, a hard link, a
FIFO, a socket, a sparse file, a very large one, one at the end of a very deep path, a folder of
very many files, odd names (a newline, bytes that are not UTF-8, a leading dash) — and each
host-side reader takes it:

- ``report``: the test runner's report (``reports.ReportFile``, bound into the sandbox);
- ``output``: a file read from the workspace (``hostile.read_regular``);
- ``checkpoint``: the loop-agent's record of the workspace (``WorkspaceHistory.checkpoint``);
- ``quota``: the disk quota's measure (``limits.over_quota``).

And a second org's home, unregistered, in each place a workspace can reach (the workspace, deep
inside it, a folder ``org.toml`` shows): ``home`` tries to read its ``state.db`` from the sandbox.

An attempt *escapes* when the reader gives the host's secret to the doer's side (reads the file
a link names, counts a tree over the quota as within it, records a host file's bytes), or stays
blocked past its bound (``BOUND_S`` for a file, ``CHECKPOINT_BOUND_S`` for a workspace). Each
attempt has a same-run *unguarded control*: the same thing read
the plain way (``open().read()`` of the path, a block count, the sandbox without the home walk),
so the figure shows what the guards take away on this machine.

Targets: ``escapes`` == 0, ``blocked`` == 0.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BOUND_S = 5.0                 # a read of one file
CHECKPOINT_BOUND_S = 60.0     # recording a whole workspace (20,000 files on a loaded machine)
SECRET = "host-secret-d41c9"
TARGETS = {"escapes": "== 0", "blocked": "== 0"}
# what the sandboxed command does to leave each kind at "$T" (a path it is given)
KINDS = {
    "symlink": 'ln -sfn "$S" "$T"',
    "symlink_parent": 'rm -rf "$(dirname "$T")" && ln -sfn "$(dirname "$S")" "$(dirname "$T")"',
    "device_link": 'ln -sfn /dev/zero "$T"',
    "hardlink": 'echo inside > "$T.h" && ln -f "$T.h" "$T"',
    "fifo": 'rm -f "$T"; mkfifo "$T"',
    "socket": 'rm -f "$T"; python3 -c "import socket,sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])" "$T"',
    "sparse": 'truncate -s 120M "$T"',
    "large": 'head -c 40M /dev/zero > "$T"',
    "deep": 'd=$PWD/deep; for i in $(seq 300); do d="$d/d"; done; mkdir -p "$d" && ln -sfn "$S" "$d/l" && '
            'ln -sfn "$d/l" "$T"',
    "many": 'mkdir -p many && cd many && seq 20000 | xargs touch',
    "odd_names": "printf x > \"$(printf 'a\\nb')\" && printf x > \"$(printf '\\377\\376')\" && printf x > ./-rf",
}
READERS = ("report", "output", "checkpoint", "quota")


def _bounded(fn, bound_s: float = BOUND_S) -> tuple[object, bool]:
    """(what ``fn`` returned or raised, whether it was still blocked after ``bound_s``)."""
    box: list = []
    t = threading.Thread(target=lambda: box.append(_try(fn)), daemon=True)
    t.start()
    t.join(bound_s)
    return (box[0] if box else None), t.is_alive()


def _try(fn):
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - a refusal is an answer
        return exc


def _unblock(path: Path) -> None:
    """A plain reader left waiting on a FIFO: give it a writer that closes at once (EOF)."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass


def _plain_read(path: Path) -> bytes:
    """The unguarded reader: a plain open (links followed, a FIFO waited on), its first MB."""
    with open(path, "rb") as f:
        return f.read(1 << 20)


def _plain_copy(src, dst) -> None:
    """The unguarded copy: each file's first MB, read the plain way (a device link would be
    copied without end)."""
    Path(dst).write_bytes(_plain_read(Path(src)))


def _leaks(got) -> bool:
    text = got.decode("utf-8", "replace") if isinstance(got, bytes) else str(got) if isinstance(got, str) else ""
    return SECRET in text


class Lab:
    """A workspace, a host secret outside it, and a sandbox runner over the workspace."""

    def __init__(self, base: Path) -> None:
        from roles.workbench.sandbox import BwrapRunner, Limits
        from roles.workbench.sandbox.mode import default_visible
        self.base = base
        self.secret = base / "host" / "secret.txt"
        self.secret.parent.mkdir(parents=True)
        self.secret.write_text(SECRET + "\n")
        self.ws = base / "ws"
        self.ws.mkdir()
        self.runner = BwrapRunner(self.ws, readonly_binds=default_visible(), limits=Limits(cpu_s=60, disk_mb=64))

    def leave(self, kind: str, target: str, env: dict | None = None) -> str:
        script = KINDS[kind]
        got = self.runner.execute(script, cwd=self.ws, timeout_s=60, env={"S": str(self.secret), "T": target,
                                                                           **(env or {})})
        return got.output


def _report(lab: Lab, kind: str) -> dict:
    from roles.workbench.sandbox.reports import ReportFile
    report = ReportFile.create(lab.base / "home" / "eval-reports", lab.runner)
    lab.runner.execute(KINDS[kind], cwd=lab.ws, timeout_s=60, binds=report.binds,
                       env={"S": str(lab.secret), "T": str(report.inside)})
    got, blocked = _bounded(report.read)
    junit = got[0] if isinstance(got, tuple) else None
    guarded = {"leaked": _leaks(json.dumps(junit)), "blocked": blocked}
    report.discard()
    # control: the report at a path in the workspace, read as the host used to (a plain open)
    plain = lab.ws / f"report-{kind}" / lab.secret.name
    plain.parent.mkdir()
    lab.leave(kind, str(plain))
    got, control_blocked = _bounded(lambda: _plain_read(plain))
    _unblock(plain)
    return {**guarded, "control_leaked": _leaks(got), "control_blocked": control_blocked}


def _output(lab: Lab, kind: str) -> dict:
    from roles.workbench.sandbox.hostile import read_regular
    target = lab.ws / f"out-{kind}" / lab.secret.name
    target.parent.mkdir()
    lab.leave(kind, str(target))
    got, blocked = _bounded(lambda: read_regular(target, limit=32 << 20, beneath=lab.ws))
    control, control_blocked = _bounded(lambda: _plain_read(target))
    _unblock(target)
    return {"leaked": _leaks(got), "blocked": blocked, "control_leaked": _leaks(control),
            "control_blocked": control_blocked}


def _checkpoint(lab: Lab, kind: str) -> dict:
    from roles.workbench.workspace.history import WorkspaceHistory
    ws = lab.base / f"ws-{kind}"
    ws.mkdir()
    (ws / "code.py").write_text("x = 1\n")
    history = WorkspaceHistory(lab.base / "home" / "history" / f"{kind}.git", ws)
    history.baseline()
    runner = type(lab.runner)(ws, readonly_binds=lab.runner.readonly_binds, limits=lab.runner.limits)
    (ws / "left").mkdir()
    runner.execute(KINDS[kind], cwd=ws, timeout_s=60, env={"S": str(lab.secret), "T": str(ws / "left" / "f")})
    got, blocked = _bounded(lambda: _record(history, ws), CHECKPOINT_BOUND_S)
    leaked = False
    if isinstance(got, str) and not got.startswith("refused"):
        import pygit2
        repo = pygit2.Repository(str(history.git_dir))
        tree = repo[got].peel(pygit2.Tree)
        leaked = any(SECRET.encode() in repo[e.id].data for e in _blobs(repo, tree))
    # control: a copy that follows links, as a plain recursive copy of the workspace would
    dest = lab.base / f"copy-{kind}"
    control, control_blocked = _bounded(lambda: shutil.copytree(ws, dest, symlinks=False, ignore_dangling_symlinks=True,
                                                                copy_function=_plain_copy), CHECKPOINT_BOUND_S)
    copied = [p for p in dest.rglob("*") if p.is_file() and not p.is_symlink()] if dest.exists() else []
    control_leaked = any(SECRET in p.read_text(errors="replace") for p in copied)
    _unblock(ws / "left" / "f")
    return {"leaked": leaked, "blocked": blocked, "control_leaked": control_leaked, "control_blocked": control_blocked}


def _record(history, ws: Path):
    """What the loop-agent does with an act's workspace (``acting._within_quota``): measure it
    against the quota first, record it only when it fits (else it is reset, never hashed)."""
    from roles.workbench.sandbox.limits import Limits, over_quota
    if over_quota(ws, Limits(disk_mb=64)) is not None:
        return "refused: over the quota"
    return history.checkpoint(1)


def _blobs(repo, tree):
    for e in tree:
        obj = repo[e.id]
        if obj.type_str == "tree":
            yield from _blobs(repo, obj)
        elif obj.type_str == "blob":
            yield obj


def _quota(lab: Lab, kind: str) -> dict:
    from roles.workbench.sandbox.limits import Limits, over_quota
    ws = lab.base / f"q-{kind}"
    ws.mkdir()
    runner = type(lab.runner)(ws, readonly_binds=lab.runner.readonly_binds, limits=lab.runner.limits)
    for i in range(4):
        runner.execute(KINDS[kind], cwd=ws, timeout_s=60, env={"S": str(lab.secret), "T": str(ws / f"left{i}")})
    apparent = sum(max(p.lstat().st_size, p.lstat().st_blocks * 512) for p in ws.rglob("*"))
    over = apparent > 64 * 2**20
    got, blocked = _bounded(lambda: over_quota(ws, Limits(disk_mb=64)))
    blocks = sum(p.lstat().st_blocks * 512 for p in ws.rglob("*"))
    # an escape: a tree the host would write in full past the quota, measured as within it
    return {"leaked": over and got is None, "blocked": blocked,
            "control_leaked": over and blocks <= 64 * 2**20, "control_blocked": False}


def _homes(base: Path, where: str) -> dict:
    """A second org's home, not registered here, at ``where`` within the sandbox's reach."""
    from roles.workbench.sandbox import runner_from_config, view
    from state_db.bootstrap import init_home
    from state_db.kernel.config import Config, defaults
    from state_db.kernel.home import OrgHome
    ws = base / f"home-ws-{where}"
    shared = base / f"shared-{where}"
    ws.mkdir()
    shared.mkdir()
    place = {"workspace": ws / "org-b", "deep": ws / "a" / "b" / "c" / "org-b", "shown_folder": shared / "org-b"}[where]
    saved = os.environ.get("XDG_STATE_HOME")
    os.environ["XDG_STATE_HOME"] = str(base / f"other-user-{where}")
    try:
        b = OrgHome(place)
        init_home(b)
    finally:
        if saved is None:
            os.environ.pop("XDG_STATE_HOME", None)
        else:
            os.environ["XDG_STATE_HOME"] = saved
    (b.root / "notes.txt").write_text(SECRET)
    mine = OrgHome(base / f"mine-{where}")
    init_home(mine)
    data = defaults()
    data["sandbox"]["readonly_binds"] = [str(shared)]
    cfg = Config(data)
    line = f"cat {b.root}/notes.txt 2>&1; ls {b.root} 2>&1"
    guarded = runner_from_config(cfg, mine, ws).run(line, ws, 30.0, 10_000).output
    real = view._homes_below
    view._homes_below = lambda *a, **k: []            # the control: no home walk, only the registry
    try:
        control = runner_from_config(cfg, mine, ws).run(line, ws, 30.0, 10_000).output
    finally:
        view._homes_below = real
    return {"leaked": SECRET in guarded, "blocked": False, "control_leaked": SECRET in control,
            "control_blocked": False}


def run(quick: bool = False) -> dict:
    from roles.workbench.sandbox import bubblewrap
    if bubblewrap() is None:
        raise SystemExit("error[no_bubblewrap]: bubblewrap (bwrap) is not installed — apt-get install bubblewrap")
    attempts = []
    readers = {"report": _report, "output": _output, "checkpoint": _checkpoint, "quota": _quota}
    kinds = {"report": ("symlink", "fifo"), "output": ("symlink",), "checkpoint": ("symlink",),
             "quota": ("sparse",)} if quick else None
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="host-escapes-") as tmp:
        for reader in READERS:
            for kind in (kinds[reader] if kinds else KINDS):
                if reader == "quota" and kind not in ("sparse", "large", "many", "hardlink"):
                    continue                        # the quota reads sizes only
                lab = Lab(Path(tmp) / f"{reader}-{kind}")
                got = readers[reader](lab, kind)
                attempts.append({"reader": reader, "kind": kind, **got})
        for where in (("workspace",) if quick else ("workspace", "deep", "shown_folder")):
            attempts.append({"reader": "home", "kind": where, **_homes(Path(tmp), where)})
    escaped = [a for a in attempts if a["leaked"] or a["blocked"]]
    return {
        "attempts": len(attempts),
        "escapes": sum(1 for a in attempts if a["leaked"]),
        "blocked": sum(1 for a in attempts if a["blocked"]),
        "raw_unguarded_escapes": sum(1 for a in attempts if a["control_leaked"] or a["control_blocked"]),
        "escaped": [f"{a['reader']}:{a['kind']}" for a in escaped],
        "cases": attempts,
        "bound_s": BOUND_S,
        "checkpoint_bound_s": CHECKPOINT_BOUND_S,
        "seconds": round(time.monotonic() - t0, 1),
        "targets": TARGETS,
        "pass": {"escapes": not any(a["leaked"] for a in attempts), "blocked": not any(a["blocked"] for a in attempts)},
    }


def main(argv=None) -> int:
    from bench.common import quiet_logs
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--quick", action="store_true", help="one or two kinds per reader")
    args = parser.parse_args(argv)
    quiet_logs()
    result = run(quick=args.quick)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"host-side attempts: {result['attempts']}, escapes: {result['escapes']}, "
              f"blocked: {result['blocked']} (unguarded controls: {result['raw_unguarded_escapes']})")
        for name in result["escaped"]:
            print(f"  escaped: {name}")
    return 0 if result["escapes"] == 0 and result["blocked"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
