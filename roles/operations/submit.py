"""Submitting a work item: validate, record the workspace baseline, write it, wake the coordinator."""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from roles.operations import Result, human_writer, signed
from roles.operations.wake import Waker
from roles.workbench.workspace import safegit
from roles.workbench.workspace.errors import RepositoryError
from state_db.kernel.config import Config
from state_db.kernel.errors import StateError
from state_db.kernel.home import OrgHome
from state_db.queries import work
from state_db.queries.processes import session as org_session
from state_db.queries.verdicts import Preflight, preflight as preflight_of
from roles.operations.caps import resolve as resolve_caps
from state_db.queries.work import FLAG, Caps, Ladder
from state_db.vocab import WorkStatus

BACKENDS = ("anthropic", "command")


class SubmitError(StateError):
    code = "bad_submit"


@dataclass
class SubmitRequest:
    goal: str
    workspace: str
    verify: list[str]
    protect: list[str] = field(default_factory=list)
    default_protect: bool = True          # --protect adds to the default test patterns unless False
    caps: Caps = field(default_factory=Caps)   # the caps given (a value) and removed (--no-timeout, ...)
    ladder: tuple[str, ...] | None = None  # models, weakest first (None: [loop] ladder in org.toml)
    backend: str | None = None
    worktree: bool = False
    review: str | None = None             # review criteria for passes (default: [review] criteria in org.toml)
    idempotency_key: str | None = None
    via: str | None = None                # the client it came through, e.g. mcp:claude-code
    toolchain: dict | None = None         # the submitter's, taken when a standing order was made (else ours)
    scope: list[str] = field(default_factory=list)   # globs that widen the change scope (roles/eval_agent/scope.py)
    no_review: bool = False               # --no-review: no model review of passes (it is on by default)
    verify_hidden: str | None = None      # held-out checks folder (default: [verify] hidden in org.toml)

    def encode(self) -> dict:
        """The request as stored (a standing order's): its fields, the caps in their JSON form."""
        return {**{f.name: getattr(self, f.name) for f in fields(self)}, "caps": self.caps.to_json()}

    @classmethod
    def decode(cls, data: dict) -> "SubmitRequest":
        """The request ``encode`` stored (one stored with the caps as flat fields and ``no_caps``
        too). Raises TypeError for a field this code does not know."""
        data = dict(data)
        flat = {k: data.pop(k) for k in Caps.names() if k in data}
        removed = data.pop("no_caps", ()) or ()
        caps = Caps.from_json(data.pop("caps")) if "caps" in data else Caps.given(flat, removed)
        return cls(**data, caps=caps)


def _arguments(req: SubmitRequest, workspace) -> dict:
    """What a submit's idempotency key is bound to: the request as given, with the workspace it
    names (not how it came, nor the submitter's toolchain, taken anew each time)."""
    args = {k: v for k, v in req.encode().items() if k not in ("idempotency_key", "via", "toolchain")}
    return {**args, "workspace": str(workspace)}


def new_work_id() -> str:
    return "w-" + time.strftime("%m%d") + "-" + uuid.uuid4().hex[:6]


def _caps(req: SubmitRequest, cfg: Config) -> tuple[Caps, bool]:
    """The run's caps (roles/operations/caps.py) and whether none came from a flag."""
    caps = resolve_caps(cfg, req.caps)
    return caps, all(source != FLAG for _, source in caps.sources)


def _ladder(req: SubmitRequest, cfg: Config) -> dict:
    """The run's model ladder (``Ladder``'s stored form; {} for none): ``--ladder``, else
    ``[loop] ladder``. Raises SubmitError ``bad_ladder`` (an empty rung, one twice, one unpriced)."""
    models = tuple(req.ladder) if req.ladder is not None else tuple(cfg.loop.ladder)
    if not models:
        return {}
    if any(not m.strip() for m in models) or len(set(models)) != len(models):
        raise SubmitError(f"--ladder {','.join(models)!r} has an empty or repeated rung", code="bad_ladder",
                          hint="name each model once, weakest first, e.g. --ladder claude-haiku-4-5,claude-sonnet-4-5")
    unpriced = [m for m in models if m not in cfg.prices]
    if unpriced:
        raise SubmitError(f"--ladder names {', '.join(unpriced)}, with no entry in [prices]", code="bad_ladder",
                          hint="add [prices.\"MODEL\"] to org.toml for each rung")
    return Ladder(models).encode()


def _review(req: SubmitRequest, cfg: Config) -> dict:
    """The review criteria the eval-agent holds each pass to (roles/eval_agent/review.py): --review,
    else [review] criteria in org.toml; {} when neither asks for a review. Raises SubmitError."""
    if req.review is not None and not req.review.strip():
        raise SubmitError("--review is empty", code="bad_review",
                          hint='say what the reviewer must hold the change to, e.g. --review "no special cases"')
    if req.no_review:
        if req.review is not None:
            raise SubmitError("--review and --no-review together", code="bad_review",
                              hint="give review criteria, or turn the review off, not both")
        return {"off": True}
    criteria = (req.review if req.review is not None else cfg.review.criteria).strip()
    return {"criteria": criteria[:4000]} if criteria else {}


def check_script(spec: str | None) -> None:
    """A ``scripted:FILE`` backend's script, checked where the human's input arrives so a bad one
    is refused now, with its line, not mid-run (the loop-agent checks it again when it builds the
    backend, whoever submitted). Nothing to check for another backend, or a file that is not
    there (``check`` says so).

    Raises:
        ScriptError (an OrgError): the script cannot be read or parsed.
    """
    if spec and spec.startswith("scripted:"):
        from roles.workbench.scripted.script import load_script
        path = Path(spec.split(":", 1)[1]).expanduser()
        if path.is_file():
            load_script(path.resolve())


def _backend(req: SubmitRequest, cfg: Config, home: OrgHome, conn=None) -> str:
    backend = req.backend or cfg.model.backend
    if backend.startswith("scripted:"):
        script = Path(backend.split(":", 1)[1]).expanduser().resolve()
        if not script.is_file():
            raise SubmitError(f"script file {script} does not exist", hint="pass --backend scripted:PATH to a script")
        # its content is checked where the human's input arrives (``check_script``, the CLI and MCP)
        # and, whoever submitted it, by the loop-agent that builds the backend (a bad one ends the run)
        return f"scripted:{script}"
    if backend not in BACKENDS:
        raise SubmitError(f"unknown backend {backend!r}", hint="use anthropic, command or scripted:FILE")
    if backend == "anthropic":
        _require_key(home, cfg, conn)
    return backend


# The anthropic backend's rule (roles/loop_agent/backends/anthropic_backend.py), read here from the
# environment and the configuration: the loop-agent itself is no dependency of the operations.
_LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})


def _org_environ(home: OrgHome, conn=None) -> dict[str, str] | None:
    """The environment of the running supervisor, which its loop-agents inherit; None when the org
    is not running or its environment cannot be read. ``conn``: a connection to the store to read
    the session through (default: one of its own)."""
    if conn is None:
        from contextlib import closing

        from state_db.connection import connect
        with closing(connect(home.db_path, readonly=True)) as own:
            return _org_environ(home, own)
    row = org_session(conn)
    if row is None or row.status != "running" or not row.supervisor_pid:
        return None
    try:
        raw = Path(f"/proc/{int(row.supervisor_pid)}/environ").read_bytes()
    except OSError:
        return None
    return dict(kv.decode(errors="replace").split("=", 1) for kv in raw.split(b"\0") if b"=" in kv)


def _require_key(home: OrgHome, cfg: Config, conn=None) -> None:
    """The anthropic backend needs ANTHROPIC_API_KEY unless its server is on this machine; check it
    where the run will happen (the running org's environment, else this one) before anything waits.
    ``conn``: the store connection the org's session is read through (default: one of its own).

    Raises SubmitError ``no_api_key``."""
    import os
    from urllib.parse import urlparse

    if (urlparse(cfg.model.base_url).hostname or "") in _LOOPBACK:
        return                          # org.toml's server is on this machine, whatever the environment
    org_env = _org_environ(home, conn)
    env = os.environ if org_env is None else org_env
    if env.get("ANTHROPIC_API_KEY") or (urlparse(env.get("ANTHROPIC_BASE_URL") or "").hostname or "") in _LOOPBACK:
        return
    where = "the running org's environment" if org_env is not None else "the environment"
    hint = "export ANTHROPIC_API_KEY=… or set model.base_url"
    if org_env is not None:
        hint = "export ANTHROPIC_API_KEY=…, then 'org stop' and 'scripts/start-org' in that shell; or set model.base_url"
    raise SubmitError(f"the anthropic backend needs an API key, and {where} has no ANTHROPIC_API_KEY",
                      code="no_api_key", hint=hint)


def _worktree(home: OrgHome, ws: Path, work_id: str) -> tuple[Path, str]:
    """A new branch ``loop-org/<work_id>`` and a worktree of it under the org home.

    The doer may have written the workspace's repository (hooks, fsmonitor, filter drivers,
    includes), so libgit2 makes both and the git executable never runs on it (``safegit``).
    Raises SubmitError with the repository's code (``not_a_repository``, ``no_commit``, ...).
    """
    branch = f"loop-org/{work_id}"
    dest = home.root / "worktrees" / work_id
    dest.parent.mkdir(exist_ok=True)
    try:
        safegit.add_worktree(ws, dest, branch)
    except RepositoryError as exc:
        hint = "drop --worktree, or run 'git init' there" if exc.code == "not_a_repository" else exc.hint
        raise SubmitError(f"--worktree: {exc.message}", code=exc.code, hint=hint) from None
    return dest, branch


def _toolchain(req: SubmitRequest, ws: Path) -> dict:
    """The submitter's PATH, HOME and the paths their verify commands name: the sandbox shows
    these tools to the work item's commands (roles/workbench/sandbox/toolchains.py)."""
    import os

    from roles.workbench.sandbox.toolchains import at_submit
    if req.toolchain is not None:
        return req.toolchain
    return at_submit(os.environ, req.verify, ws).encode()


@dataclass(frozen=True)
class Submitted(Result):
    """What ``org submit`` did: the item, its status (``queued``, or ``waiting`` for
    ``waiting_for``), its caps (with where each came from: ``caps_from`` in its data;
    ``defaults_applied``: none from a flag), the workspace (and the
    branch of ``--worktree``), the wake, ``replayed`` (this idempotency key had submitted it
    already), the key, the org session's status (``never started`` before the first start:
    nothing runs unless it is ``running``) and the ``preflight`` when it was waited for (the
    eval-agent's record: ``outcome`` such as ``ready``, ``already_passes``, ``unrunnable``, what it
    said, and ``ended``: the stop reason of the run by then, if it ended)."""

    id: str
    status: str
    caps: Caps
    defaults_applied: bool
    workspace: str
    branch: str | None
    waiting_for: str | None
    wake: str
    replayed: bool
    idempotency_key: str
    org_status: str
    preflight: Preflight | None = None

    def as_dict(self) -> dict:
        return {**super().as_dict(), "caps_from": dict(self.caps.sources)}


def wait_for_preflight(home: OrgHome, work_id: str, *, timeout_s: float, poll_s: float = 0.1) -> Preflight | None:
    """Wait until the eval-agent has run the verify commands on the baseline (the preflight) of
    ``work_id``; None on timeout or when the org is not running (nobody would run it). Its
    ``ended`` is the run's stop reason when the run has ended by then."""
    from state_db.connection import connect
    conn = connect(home.db_path, readonly=True)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            session = org_session(conn)
            if session is None or session.status != "running":
                return None
            done = preflight_of(conn, work_id)
            if done is not None:
                return replace(done, ended=work.item(conn, work_id).stop_reason)
            if time.monotonic() >= deadline:
                return None
            time.sleep(poll_s)
    finally:
        conn.close()


@dataclass(frozen=True)
class Checked:
    """A request that passed every check of ``submit``, with what the checks resolved."""

    workspace: Path
    caps: Caps
    defaults_applied: bool
    toolchain: dict
    backend: str
    verify_hidden: str = ""


def _no_home_within(ws: Path) -> None:
    """Refuse a workspace holding an org home, this org's or any other's (found by its marker,
    registered or not): its history would record that org's state.db and keys, and its doer
    could read and write them. A workspace past the walk's bound (``homes.MAX_ENTRIES``) is
    searched that far; every sandbox still hides the registered homes in it. Raises SubmitError
    ``workspace_contains_org_home``."""
    from roles.workbench.sandbox.homes import homes_within
    found = homes_within(ws)
    if found.homes:
        first = found.homes[0]
        more = f" (and {len(found.homes) - 1} more)" if len(found.homes) > 1 else ""
        raise SubmitError(f"the workspace {ws} contains an org home at {first}{more}; the agent must not reach "
                          "another org's files", code="workspace_contains_org_home",
                          hint="move that org home out of the workspace (or submit a folder beside it)")


def check(home: OrgHome, cfg: Config, req: SubmitRequest, conn=None) -> Checked:
    """Every check ``submit`` makes before it writes (a standing order makes them when it is
    made, so a bad one is refused then, not at its first tick); ``conn``: a store connection to
    read through (default: one of its own where needed). Raises SubmitError."""
    if not req.goal.strip():
        raise SubmitError("the goal is empty", hint='say what "done" means, e.g. org submit "make tests pass" ...')
    if not req.verify:
        raise SubmitError("no --verify command: nobody could tell whether the goal is met",
                          hint="add --verify \"CMD\" (it must exit 0 when the goal is met)")
    if any(not v.strip() for v in req.verify):
        raise SubmitError("a --verify command is empty: an empty command runs nothing and would pass",
                          code="empty_verify", hint="give each --verify a command that exits 0 when the goal is met")
    if any(not p.strip() for p in req.protect):
        raise SubmitError("a --protect pattern is empty", code="bad_protect",
                          hint="give a glob such as 'src/**/test_*.py', or drop the flag")
    if any(not p.strip() for p in req.scope):
        raise SubmitError("a --scope glob is empty", code="bad_scope",
                          hint="give a glob such as 'docs/**' or 'pyproject.toml', or drop the flag")
    ws = Path(req.workspace).expanduser().resolve()
    if not ws.is_dir():
        raise SubmitError(f"workspace {ws} is not a directory", code="workspace_missing",
                          hint="create it or pass an existing --workspace")
    org_root = home.root.resolve()
    if ws.is_relative_to(org_root) and not any(ws.is_relative_to(org_root / d) for d in ("demo", "worktrees", "replays")):
        raise SubmitError(f"the workspace {ws} is inside the org home; the agent must not reach the org's files",
                          code="workspace_in_org_home", hint="use a folder outside the org home")
    if org_root.is_relative_to(ws):
        raise SubmitError(f"the org home {home.root} is inside the workspace {ws}; the agent must not reach it",
                          code="workspace_contains_org_home", hint="set ORG_HOME to a folder outside the workspace")
    _no_home_within(ws)
    caps, defaults_applied = _caps(req, cfg)
    _review(req, cfg)
    _ladder(req, cfg)
    toolchain = _toolchain(req, ws)
    return Checked(ws, caps, defaults_applied, toolchain, _backend(req, cfg, home, conn),
                   _verify_hidden(req, cfg, home, ws, toolchain))


def _verify_hidden(req: SubmitRequest, cfg: Config, home: OrgHome, ws: Path, toolchain: dict) -> str:
    """The held-out checks folder (--verify-hidden, else [verify] hidden), checked to be out of
    the doer's sight (roles/workbench/sandbox/held_out.py); '' for none. Raises SubmitError."""
    folder = req.verify_hidden if req.verify_hidden is not None else cfg.verify.hidden
    if not folder:
        return ""
    from roles.workbench.sandbox.held_out import HiddenError, check_folder
    from roles.workbench.sandbox.toolchains import Exposure, Toolchain
    from roles.workbench.sandbox.view import build
    view = build(Toolchain.decode(toolchain), own_home=home.root,
                 readonly=[Exposure(p, "org.toml sandbox.readonly_binds") for p in cfg.sandbox.readonly_binds])
    shown = [(e.path, False) for e in view.readonly] + [(e.path, True) for e in view.hidden]
    try:
        return check_folder(folder, ws, shown)
    except HiddenError as exc:
        raise SubmitError(f"--verify-hidden: {exc.message}", code=exc.code, hint=exc.hint) from None


def submit(home: OrgHome, cfg: Config, req: SubmitRequest, *, writer=None, origin: dict | None = None,
           guard=None, after=None, wake: bool = True, wait_s: float = 0.0, waker: Waker | None = None) -> Submitted:
    """Create a work item (or return the one this idempotency key created).

    ``writer`` writes it (default: a new one as the human, closed after); ``origin`` adds columns
    saying what started it (``origin``, ``origin_id``, ``created_by``); ``guard(tx, work_id)`` runs
    first in the write transaction and may raise to write nothing (a standing order's
    single-flight, re-checked under the lock); ``after(tx, work_id)`` runs in the same transaction
    once the row is written (a row that refers to it, e.g. a replay's); ``wake=False`` sends no wake (the coordinator
    submitting dispatches itself); ``waker`` sends it (default: a new one, closed after: see
    ``submit_many``); ``wait_s`` > 0 waits that long for the preflight of a new item
    (``wait_for_preflight``).

    Raises SubmitError (bad goal, workspace, caps, backend) or StateError.
    """
    checked = check(home, cfg, req, writer.conn if writer is not None else None)
    ws, caps, defaults_applied = checked.workspace, checked.caps, checked.defaults_applied
    toolchain, backend = checked.toolchain, checked.backend
    key = req.idempotency_key or uuid.uuid4().hex
    waker = (waker or Waker(home, cfg)) if wake else None
    own_writer = writer is None
    writer = human_writer(home.db_path, req.via) if own_writer else writer
    try:
        done = work.command_result(writer.conn, key, "submit")
        work_id = new_work_id()
        workspace, branch = ws, None
        if done is None:
            # slow work (git) happens before the write transaction, never while holding the lock
            if req.worktree:
                workspace, branch = _worktree(home, ws, work_id)
            from roles.workbench.workspace.history import WorkspaceHistory  # baseline at submit, outside the workspace
            WorkspaceHistory(home.history_dir / f"{work_id}.git", workspace).baseline()

        def do(tx):
            if guard is not None:
                guard(tx, work_id)
            busy = work.lock_holder(tx.conn, str(workspace))
            status = WorkStatus.WAITING if busy else WorkStatus.QUEUED
            tx.insert("work_items", {
                "id": work_id, "goal": req.goal, "workspace": str(workspace), "verify": req.verify,
                "protect": req.protect, "default_protect": int(req.default_protect), "caps": caps.to_json(),
                "backend": backend, "status": status,
                "stop_detail": f"workspace busy with {busy}" if busy else None,
                "worktree": int(req.worktree), "branch": branch, "created_by": signed(writer),
                "toolchain": toolchain, "review": _review(req, cfg), "scope": list(req.scope),
                "verify_hidden": checked.verify_hidden,
                "ladder": _ladder(req, cfg),
                "created_at": tx.now, "updated_at": tx.now, **(origin or {})})
            if not busy:
                tx.insert("workspace_locks", {"workspace": str(workspace), "work_id": work_id, "acquired_at": tx.now})
            if after is not None:
                after(tx, work_id)
            return {"id": work_id, "status": str(status), "caps": caps.to_json(),
                    "defaults_applied": defaults_applied,
                    "workspace": str(workspace), "branch": branch, "waiting_for": busy}

        result, replayed = writer.run_once(key, "submit", do, args=_arguments(req, ws))
        session = org_session(writer.conn)
    finally:
        if own_writer:
            writer.close()
    result = dict(result)
    came = result.pop("caps_from", None)         # a result recorded before the caps carried their sources
    result["caps"] = Caps.from_json({**result["caps"], **({"from": came} if came else {})})
    done = Submitted(**result, wake=waker.wake({"work_id": result["id"]}) if waker is not None else "not sent: not asked",
                     replayed=replayed, idempotency_key=key, org_status=session.status if session else "never started")
    if wait_s > 0 and not replayed:
        done = replace(done, preflight=wait_for_preflight(home, done.id, timeout_s=wait_s))
    return done


def submit_many(home: OrgHome, cfg: Config, reqs: list[SubmitRequest]) -> list[Submitted]:
    """Submit ``reqs`` in order through one store connection and one open connection to the
    coordinator: what a program submitting a batch (a hundred items at once) costs per item is
    the item's own checks, baseline and row, not a connection and a keyring read each (about
    half of a lone ``submit``'s CPU). Each item is its own transaction and gets its own wake, as
    with ``submit``. Raises at the first request that fails (SubmitError, StateError): the ones
    before it stay submitted, and their idempotency keys make a second call safe."""
    writers: dict = {}                  # by ``via``: each request is signed as it says it came
    waker = Waker(home, cfg, keep=True) if reqs else None
    done = []
    try:
        for req in reqs:
            if req.via not in writers:
                writers[req.via] = human_writer(home.db_path, req.via)
            done.append(submit(home, cfg, req, writer=writers[req.via], waker=waker))
        return done
    finally:
        if waker is not None:
            waker.close()
        for writer in writers.values():
            writer.close()
