"""The sandbox every agent command runs in: real bubblewrap, real processes.

Tests that need bwrap are skipped (with the reason) only when it is not installed.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from roles.loop_agent.tools import WorkspaceTools
from roles.workbench.sandbox import (BwrapRunner, Limits, RefusingRunner, SandboxFailed, SandboxUnavailable, UnsandboxedRunner,
                           bubblewrap, default_hidden, default_visible, describe_mode, process_limit_kind,
                           run_sandboxed, runner_from_config)
from roles.workbench.sandbox import mode as sandbox_mode
from roles.workbench.sandbox.bwrap import mount_args
from roles.workbench.sandbox.toolchains import Exposure
from roles.workbench.sandbox.view import View
from state_db.kernel.config import Config, defaults
from tests.support.org import wait_for

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
needs_bwrap = pytest.mark.skipif(bubblewrap() is None,
                                 reason="bubblewrap (bwrap) is not installed: apt-get install -y bubblewrap")


@pytest.fixture(autouse=True, params=["program", "shell"])
def stages(request, monkeypatch):
    """Every test here runs with both forms of the processes around bubblewrap: the compiled
    ``sandbox-stage`` (where a C compiler built it) and the shell stages (``stage.py``)."""
    from roles.workbench.sandbox import stage
    if request.param == "shell":
        monkeypatch.setenv(stage.FORCE_SHELL, "shell")
    elif bubblewrap() is not None and stage.ensure() is None:
        pytest.skip("no C compiler here: the shell stages serve (tested with the 'shell' parameter)")
    return request.param


@pytest.fixture
def org(tmp_path):
    """A fake org home holding a state.db with a fake key, and a workspace inside it (like the demo's)."""
    home = tmp_path / "org"
    ws = home / "demo" / "ws"
    ws.mkdir(parents=True)
    (home / "state.db").write_text("ANTHROPIC_API_KEY=sk-ant-fake-key-in-the-org-home\n")
    (home / "run").mkdir(mode=0o700)
    return home, ws


def runner(org, **limits) -> BwrapRunner:
    home, ws = org
    return BwrapRunner(ws, hide=default_hidden(home), readonly_binds=default_visible(), limits=Limits(**limits))


def config(**sandbox) -> Config:
    data = defaults()
    data["sandbox"].update(sandbox)
    return Config(data)


def sh(r: BwrapRunner, line: str, timeout_s: float = 10.0, max_output: int = 20_000):
    return r.run(line, r.workspace, timeout_s, max_output)


def procs_with(token: str, argv0: str | None = None) -> list[int]:
    """Pids whose command line holds ``token`` (and starts with ``argv0`` when given)."""
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                argv = (d / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if token.encode() in argv and (argv0 is None or argv[0] == argv0.encode()):
                found.append(int(d.name))
    return found


def wait_until(predicate, timeout_s: float, what: str):
    return wait_for(predicate, timeout=timeout_s, what=what)


# -- identity and file system ---------------------------------------------------------------


@needs_bwrap
def test_commands_run_as_uid_65534_and_cannot_write_etc(org):
    r = runner(org)
    got = sh(r, "id -u; id -g; touch /etc/sandbox-probe && echo WROTE-ETC")
    assert got.output.splitlines()[:2] == ["65534", "65534"], got.output
    assert "WROTE-ETC" not in got.output and not Path("/etc/sandbox-probe").exists()


@needs_bwrap
def test_only_the_workspace_is_writable(org, tmp_path):
    r = runner(org)
    real_home = Path.home()
    name = f"escape-{uuid.uuid4().hex[:8]}"
    got = sh(r, f"touch {real_home}/{name}; touch {ROOT}/{name}; touch {tmp_path}/{name}; "
                f"echo inside > made.txt && cat made.txt")
    assert got.exit_code == 0 and got.output.strip().endswith("inside"), got.output
    assert (r.workspace / "made.txt").read_text() == "inside\n"
    for outside in (real_home / name, ROOT / name, tmp_path / name):
        assert not outside.exists(), f"{outside} was written from the sandbox"
    assert got.output.count("Read-only file system") >= 2, got.output


@pytest.mark.skipif(os.geteuid() != 0, reason="only root's own files are at stake: run as root")
def test_root_private_paths_are_found_by_their_mode_bits(tmp_path):
    from roles.workbench.sandbox.mode import root_private_paths
    top = tmp_path / "etc"
    (top / "ssl" / "private").mkdir(parents=True)
    (top / "ssl" / "private").chmod(0o700)
    (top / "ssl" / "certs").mkdir()
    (top / "ssl" / "certs" / "ca.pem").write_text("public")
    (top / "shadow").write_text("root:$6$secret")
    (top / "shadow").chmod(0o640)
    (top / "passwd").write_text("root:x:0:0")
    (top / "deep" / "a" / "b" / "c").mkdir(parents=True)
    (top / "deep" / "a" / "key").write_text("k")
    (top / "deep" / "a" / "key").chmod(0o600)
    (top / "deep" / "a" / "b" / "c" / "too-deep").write_text("k")
    (top / "deep" / "a" / "b" / "c" / "too-deep").chmod(0o600)
    (top / "link-to-shadow").symlink_to(top / "shadow")
    found = root_private_paths((str(top),), max_depth=3)
    assert found == tuple(sorted([top / "deep" / "a" / "key", top / "shadow", top / "ssl" / "private"]))


@needs_bwrap
def test_files_only_the_hosts_root_may_read_are_hidden(org, tmp_path):
    """As root, the sandbox's uid maps to the host's root: owner bits alone would let it read
    /etc/shadow. Hidden files read as empty, hidden folders as empty and read-only."""
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    (private / "key").write_text("PRIVATE-KEY-MATERIAL")
    secret = tmp_path / "secret.txt"
    secret.write_text("SECRET-FILE-CONTENT")
    secret.chmod(0o600)
    home, ws = org
    r = BwrapRunner(ws, hide=[*default_hidden(home), private, secret], readonly_binds=default_visible())
    shadow = Path("/etc/shadow")
    got = sh(r, f"cat {private}/key {secret}; ls -A {private}; cat /etc/shadow; echo done")
    assert "PRIVATE-KEY-MATERIAL" not in got.output and "SECRET-FILE-CONTENT" not in got.output, got.output
    assert got.output.rstrip().endswith("done")
    if shadow.exists() and os.geteuid() == 0 and not shadow.stat().st_mode & 0o004:
        first = shadow.read_text().split(":", 1)[0]
        assert f"{first}:" not in got.output, "the host's /etc/shadow was readable in the sandbox"


@needs_bwrap
def test_org_home_is_hidden_even_by_absolute_path_while_a_workspace_inside_it_stays_writable(org):
    home, ws = org
    r = runner(org)
    got = sh(r, f"cat {home}/state.db; ls -A {home}; ls -A {home}/run; touch {home}/planted; "
                f"echo ok > {ws}/inside.txt")
    assert "sk-ant-fake" not in got.output
    assert "No such file" in got.output and "Read-only file system" in got.output, got.output
    assert not (home / "planted").exists()
    assert (ws / "inside.txt").read_text() == "ok\n"


@needs_bwrap
def test_proc_shows_only_the_sandbox_processes(org):
    got = sh(runner(org), f"ls /proc | grep -c '^[0-9]'; cat /proc/{os.getpid()}/environ || echo NO-PARENT")
    assert int(got.output.split()[0]) < 10, got.output  # bwrap's init, the backstop, the shell and its pipeline
    assert "NO-PARENT" in got.output and "PATH=" not in got.output


def test_mounts_put_parents_before_children_whatever_the_argument_order(tmp_path):
    project = tmp_path / "project"
    home = project / ".org"
    ws = home / "demo" / "ws"
    ws.mkdir(parents=True)
    view = View(readonly=(Exposure(str(project), "test"),), hidden=(), path="/usr/bin")
    args = mount_args(view, ws, hide=[home])
    order = [args[i + 1] for i, a in enumerate(args) if a in ("--tmpfs", "--ro-bind", "--bind") and args[i + 1] != "/"]
    assert order == ["/tmp", str(project), str(home), str(ws)]
    assert args[-4:] == ["--remount-ro", str(home), "--remount-ro", "/"]


@needs_bwrap
def test_a_folder_inside_a_shown_folder_is_mounted_once_and_the_view_is_unchanged(tmp_path):
    """A toolchain's folders inside a shown home are not mounted again (bubblewrap pays a pass
    over the mount table per mount), but what a command sees does not change: a nested folder
    under a hidden one is still shown, and a nested path that is a link leading out of the shown
    folder still shows its target."""
    shown, outside = tmp_path / "home", tmp_path / "outside"
    (shown / "tool" / "bin").mkdir(parents=True)
    (shown / "tool" / "bin" / "t").write_text("tool\n")
    (shown / "secret" / "open").mkdir(parents=True)
    (shown / "secret" / "key").write_text("hidden\n")
    (shown / "secret" / "open" / "o").write_text("open\n")
    (outside / "lib").mkdir(parents=True)
    (outside / "lib" / "l").write_text("linked\n")
    (shown / "link").symlink_to(outside / "lib")
    ws = tmp_path / "ws"
    ws.mkdir()
    view = View(readonly=tuple(Exposure(str(p), "test") for p in (
        shown, shown / "tool" / "bin", shown / "secret" / "open", shown / "link")),
        hidden=(Exposure(str(shown / "secret"), "test"),), path="/usr/bin")
    args = mount_args(view, ws)
    binds = [args[i + 1] for i, a in enumerate(args) if a == "--ro-bind"]
    assert str(shown / "tool" / "bin") not in binds                  # inside a shown folder: once
    assert str(shown / "secret" / "open") in binds                   # under a hidden folder
    assert str(shown / "link") in binds                              # a link out of the shown folder
    r = BwrapRunner(ws, readonly_binds=[shown, shown / "tool" / "bin", shown / "secret" / "open", shown / "link"],
                    hide=[shown / "secret"])
    got = sh(r, f"cat {shown}/tool/bin/t {shown}/secret/open/o {shown}/link/l {outside}/lib/l; "
                f"cat {shown}/secret/key || echo NO-KEY")
    lines = got.output.splitlines()
    assert lines[:4] == ["tool", "open", "linked", "linked"] and lines[-1] == "NO-KEY", got.output
    assert "hidden" not in got.output, got.output


# -- network and environment ----------------------------------------------------------------


@needs_bwrap
def test_no_network_even_to_a_loopback_listener_outside(org):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    try:
        got = sh(runner(org), f"{PY} -c \"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2)\"")
        assert got.exit_code != 0 and "ConnectionRefusedError" in got.output, got.output
        listener.setblocking(False)
        with pytest.raises(BlockingIOError):
            listener.accept()
    finally:
        listener.close()


@needs_bwrap
def test_environment_carries_no_api_or_org_keys(org, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-not-for-the-sandbox")
    monkeypatch.setenv("ORG_HOME", str(org[0]))
    monkeypatch.setenv("ORG_ROLE_KEY", "role-secret")
    monkeypatch.setenv("GITHUB_TOKEN", "ghp-secret")
    got = sh(runner(org), "env")
    names = {line.split("=", 1)[0] for line in got.output.splitlines() if "=" in line}
    assert not {"ANTHROPIC_API_KEY", "ORG_HOME", "ORG_ROLE_KEY", "GITHUB_TOKEN"} & names, names
    assert "secret" not in got.output and "sk-ant" not in got.output
    home = dict(line.split("=", 1) for line in got.output.splitlines() if "=" in line)["HOME"]
    assert home != str(Path.home())


# -- limits ---------------------------------------------------------------------------------


@needs_bwrap
def test_cpu_limit_kills_a_busy_loop(org):
    got = runner(org, cpu_s=1).run([PY, "-c", "while True: pass"], org[1], 20.0, 4000)
    assert not got.timed_out
    assert got.exit_code in (128 + signal.SIGXCPU, 128 + signal.SIGKILL), got
    assert got.duration_s < 8


@needs_bwrap
def test_memory_limit_stops_a_big_allocation(org):
    got = runner(org, memory_mb=256).run([PY, "-c", "b = bytearray(1024 ** 3); print('ALLOCATED')"], org[1], 20.0, 4000)
    assert got.exit_code != 0 and "ALLOCATED" not in got.output
    assert "MemoryError" in got.output, got.output


@needs_bwrap
@pytest.mark.skipif(process_limit_kind() == "none",
                    reason="no process limit on this machine (root without a writable pids cgroup)")
def test_process_limit_stops_a_bounded_fork_loop(org):
    # bounded on purpose: 40 forks at most, each child sleeps then exits
    script = textwrap.dedent("""
        import os, time
        ok = failed = 0
        for _ in range(40):
            try:
                pid = os.fork()
            except OSError:
                failed += 1
                continue
            if pid == 0:
                time.sleep(1.5)
                os._exit(0)
            ok += 1
        print(f"ok={ok} failed={failed}", flush=True)
    """)
    got = runner(org, max_procs=8).run([PY, "-c", script], org[1], 20.0, 4000)
    counts = dict(kv.split("=") for kv in got.output.split() if "=" in kv)
    assert int(counts["ok"]) <= 8 and int(counts["failed"]) >= 30, got.output


@needs_bwrap
def test_output_cap_keeps_head_and_tail(org):
    got = runner(org).run([PY, "-c", "print('HEAD-MARK'); print('x' * 500000); print('TAIL-MARK')"], org[1], 20.0, 2000)
    assert got.truncated and len(got.output) < 2200
    assert got.output.startswith("HEAD-MARK") and got.output.rstrip().endswith("TAIL-MARK")


@needs_bwrap
def test_timeout_kills_the_whole_tree_including_a_detached_grandchild(org):
    token = f"tok-{uuid.uuid4().hex}"
    script = textwrap.dedent("""
        import os, time
        if os.fork() == 0:
            os.setsid()              # leaves the process group: only the namespace still holds it
            if os.fork() == 0:
                time.sleep(60)
            os._exit(0)
        time.sleep(60)
    """)
    t0 = time.monotonic()
    got = runner(org).run([PY, "-c", script, token], org[1], 1.0, 4000)
    assert got.timed_out and got.exit_code is None and time.monotonic() - t0 < 5
    wait_until(lambda: not procs_with(token), 3.0, f"processes carrying {token} to end")


def _sandboxed_sleeper_parent(ws: Path, half: str) -> subprocess.Popen:
    """A parent process running a sandboxed sleeper whose argv carries ``"tok-" + half``; the
    parent's own command line holds only the halves, never the token."""
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        from pathlib import Path
        from roles.workbench.sandbox import run_sandboxed
        run_sandboxed([{PY!r}, "-c", "import time; time.sleep(60)", "tok-" + {half!r}],
                      workspace=Path({str(ws)!r}), timeout_s=60)
    """)
    return subprocess.Popen([PY, "-c", code], start_new_session=True)


@needs_bwrap
@pytest.mark.parametrize("moment", ["running", "starting"])
def test_sandbox_dies_with_its_parent(tmp_path, moment):
    """Killed with the parent, whether the command already runs or bubblewrap is still starting."""
    ws = tmp_path / "ws"
    ws.mkdir()
    half = uuid.uuid4().hex
    token = f"tok-{half}"
    parent = _sandboxed_sleeper_parent(ws, half)
    try:
        # "running": the sleeper itself exists; "starting": anything carrying the token (the wrappers, bwrap)
        wait_until(lambda: procs_with(token, PY if moment == "running" else None), 10.0, f"the sandbox {moment}")
        parent.kill()  # SIGKILL: no cleanup code of ours runs
        parent.wait()
        wait_until(lambda: not procs_with(token), 5.0, f"processes carrying {token} to end")
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


# -- modes and errors -----------------------------------------------------------------------


@needs_bwrap
def test_a_missing_command_is_exit_127_not_a_sandbox_error(org):
    got = runner(org).run(["no-such-command-here"], org[1], 10.0, 4000)
    assert got.exit_code == 127 and "no-such-command-here" in got.output


@needs_bwrap
def test_workspace_tools_run_command_goes_through_the_sandbox(org):
    """One runner without a fixed workspace serves whatever workspace the tools run in."""
    shared = runner_from_config(config(), org[0])
    result = WorkspaceTools(org[1], shared).call("run_command", {"command": "id -u; echo x > mark.txt"})
    assert not result.is_error and "65534" in result.content, result
    assert (org[1] / "mark.txt").read_text() == "x\n"


def test_bwrap_that_cannot_start_is_a_coded_sandbox_failed(org, tmp_path):
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to creating new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    r = BwrapRunner(org[1], bwrap=str(fake))
    with pytest.raises(SandboxFailed) as caught:
        r.run("true", org[1], 5.0, 4000)
    assert caught.value.code == "sandbox_failed"
    assert "No permissions" in str(caught.value) and "user namespaces" in str(caught.value)


def test_without_bubblewrap_commands_are_refused_unless_unsandboxed_is_allowed(org, monkeypatch):
    monkeypatch.setattr(sandbox_mode, "bubblewrap", lambda: None)
    refused = runner_from_config(config(), org[0], org[1])
    assert isinstance(refused, RefusingRunner)
    with pytest.raises(SandboxUnavailable) as caught:
        refused.run("true", org[1], 5.0, 4000)
    assert caught.value.code == "sandbox_unavailable" and "bubblewrap" in str(caught.value)
    tools_result = WorkspaceTools(org[1], refused).call("run_command", {"command": "true"})
    assert tools_result.is_error
    assert describe_mode(config()) == "agent commands refused: bubblewrap missing (install the 'bubblewrap' package)"

    allowed = runner_from_config(config(mode="unsandboxed", allow_unsandboxed=True), org[0], org[1])
    assert isinstance(allowed, UnsandboxedRunner)
    got = allowed.run("echo plain", org[1], 5.0, 4000)
    assert got.exit_code == 0 and got.output == "plain\n"
    assert describe_mode(config(mode="unsandboxed", allow_unsandboxed=True)).startswith("unsandboxed (allowed by org.toml)")


@needs_bwrap
def test_describe_mode_names_bubblewrap_uid_and_network(org):
    line = describe_mode(config())
    assert line.startswith(f"sandbox: bubblewrap at {bubblewrap()} (uid 65534, no network")
    assert isinstance(runner_from_config(config(), org[0], org[1]), BwrapRunner)


@needs_bwrap
def test_run_sandboxed_takes_a_shell_line_and_extra_writable_paths(tmp_path):
    ws, extra = tmp_path / "ws", tmp_path / "extra"
    ws.mkdir()
    extra.mkdir()
    got = run_sandboxed(f"echo a > {extra}/a.txt && echo $GREETING", workspace=ws, writable=[extra],
                        env={"GREETING": "hello"}, timeout_s=10)
    assert got.exit_code == 0 and got.output == "hello\n"
    assert (extra / "a.txt").read_text() == "a\n"


@pytest.mark.timeout(30)
def test_an_unsandboxed_command_dies_with_the_process_that_runs_it(tmp_path):
    """A human-approved action runs unsandboxed; kill -9 of the loop-agent running it must not
    leave it (or its children) running beside the next attempt."""
    import signal
    import subprocess
    import sys
    import time
    pidfile = tmp_path / "child.pid"
    code = ("import sys; from pathlib import Path; from roles.workbench.sandbox.mode import UnsandboxedRunner; "
            f"UnsandboxedRunner(Path({str(tmp_path)!r})).run('sleep 30 & echo $! > {pidfile}; wait', "
            f"Path({str(tmp_path)!r}), 60, 1000)")
    parent = subprocess.Popen([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[1])
    deadline = time.monotonic() + 10
    while not (pidfile.exists() and pidfile.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.05)
    child = int(pidfile.read_text())
    assert Path(f"/proc/{child}").exists()
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while Path(f"/proc/{child}").exists() and time.monotonic() < deadline:
        state = Path(f"/proc/{child}/stat").read_text().split(")")[-1].split()[0] \
            if Path(f"/proc/{child}/stat").exists() else "X"
        if state in ("Z", "X"):
            break
        time.sleep(0.05)
    gone = not Path(f"/proc/{child}").exists() or \
        Path(f"/proc/{child}/stat").read_text().split(")")[-1].split()[0] in ("Z", "X")
    assert gone, "the unsandboxed command outlived the process that ran it"


def test_only_the_roots_a_shown_folder_reaches_are_walked_for_root_private_files(tmp_path, monkeypatch):
    """``root_private_in`` walks a root of ``root_private_paths`` only where a shown folder lies
    inside it or holds it: what the other roots hold is not shown, so their walk (/var: a third
    of the stat calls on a Debian host) is wasted."""
    from roles.workbench.sandbox import view
    walked = []
    real = sandbox_mode._root_private_under.__wrapped__
    monkeypatch.setattr(sandbox_mode, "_root_private_under",
                        lambda root, depth: walked.append(root) or real(root, depth))
    view.root_private_in(["/usr", "/etc", str(tmp_path)])
    assert sorted(walked) == ["/etc", "/usr/local"]
    walked.clear()
    view.root_private_in(["/var/lib/some-toolchain", "/opt"])
    assert sorted(walked) == ["/opt", "/var"]
    assert sandbox_mode.shown_private_roots(["/"]) == sandbox_mode._PRIVATE_ROOTS


@needs_bwrap
def test_after_the_warm_up_a_command_walks_no_root_and_builds_no_filter(tmp_path):
    """``warm`` (run by the role template after its heavy stage, and by an eval-agent before its
    first verification) leaves nothing for the first command to make: the shown roots are
    walked and the system-call filter compiled once, before anyone waits on them."""
    from roles.workbench.sandbox.seccomp import program
    sandbox_mode.warm()
    walks, filters = sandbox_mode._root_private_under.cache_info().misses, program.cache_info().misses
    got = BwrapRunner(tmp_path).execute("echo hello", timeout_s=30)
    assert got.exit_code == 0 and got.output.strip() == "hello", got.output
    assert sandbox_mode._root_private_under.cache_info().misses == walks
    assert program.cache_info().misses == filters


@needs_bwrap
def test_the_inner_stage_refuses_to_run_outside_a_sandbox(stages, tmp_path):
    """``sandbox-stage inner`` kills every process it may signal (kill(-1)) when its caller dies or
    its backstop passes: only ever the sandbox's, where its parent is the pid namespace's first
    process. Run anywhere else it refuses, before anything."""
    from roles.workbench.sandbox import stage
    if stages != "program":
        pytest.skip("the program's own guard")
    r, w = os.pipe()
    try:
        got = subprocess.run([stage.binary(), "inner", str(r), "1", "--", "true"], pass_fds=(r,),
                             capture_output=True, text=True, timeout=10)
    finally:
        os.close(r)
        os.close(w)
    assert got.returncode == 126 and "only as the command of a sandbox" in got.stderr


@needs_bwrap
def test_the_backstop_ends_the_whole_sandbox_while_its_caller_lives(stages, tmp_path):
    """The inner stage's second clock: past it every process of the sandbox is killed, a
    background one too, though the caller still holds the pipe open (``_backstop``'s job)."""
    from roles.workbench.sandbox import stage
    if stages != "program":
        pytest.skip("the program's own clock (the shell stages use timeout(1))")
    r, w = os.pipe()
    token = f"tok-{uuid.uuid4().hex}"
    try:
        t0 = time.monotonic()
        got = subprocess.run([bubblewrap(), "--unshare-pid", "--unshare-user", "--die-with-parent", "--ro-bind", "/",
                              "/", "--proc", "/proc", "--dev", "/dev", stage.binary(), "inner", str(r), "1", "--",
                              PY, "-c", "import os, time; os.fork(); time.sleep(30)", token],
                             pass_fds=(r,), capture_output=True, text=True, timeout=20)
        assert got.returncode == 137 and time.monotonic() - t0 < 10, got
    finally:
        os.close(r)
        os.close(w)
    assert not procs_with(token)


@needs_bwrap
def test_a_process_limit_that_cannot_be_set_up_refuses_the_command_rather_than_run_it_unbounded(org, monkeypatch):
    """Fail-closed, in both forms of the stages: a run's pids cgroup that cannot be joined ends the
    run before bubblewrap starts, as a sandbox that could not be built; the command never runs."""
    from roles.workbench.sandbox import limits as sandbox_limits
    gone = org[1].parent / "no-such-cgroup"
    monkeypatch.setattr(sandbox_limits.PidsCgroup, "create", classmethod(lambda cls, limits, own=0: cls(gone)))
    with pytest.raises(SandboxFailed):
        runner(org).run("echo ran > ran.txt", org[1], 10.0, 4000)
    assert not (org[1] / "ran.txt").exists()
