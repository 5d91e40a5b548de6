"""``org git-shell``: sshd's forced command serving the coordinator host's workspace histories.

Over ssh:// a worker's ``git fetch`` and ``git push`` run ``git upload-pack`` and ``git
receive-pack`` on the coordinator host through sshd, which by itself would run them with none of
the settings ``git daemon`` is given: the baseline would not be guarded and a repository's own
``hooks/`` would run. A worker's key is therefore allowed one command only, in the coordinator
user's ``~/.ssh/authorized_keys``::

    command="<checkout>/scripts/org git-shell --home <home>",restrict ssh-ed25519 AAAA... worker-1

(``org hosts ssh-line KEYFILE`` prints that line.) sshd runs it whatever the client asked for and
puts the client's request in ``SSH_ORIGINAL_COMMAND``. Accepted: ``git-upload-pack '<path>'`` and
``git-receive-pack '<path>'`` (or ``git upload-pack`` / ``git receive-pack``), where ``<path>`` is
``/<id>.git``, ``<id>.git`` or ``<home>/history/<id>.git`` and names a repository that exists
directly below ``<home>/history``, symbolic links resolved (a worker never creates one). Anything
else is refused with one line ``error[code]: what — what to do`` on stderr and a non-zero exit: an
interactive login, another command, a quoting error, extra words, ``..``, a path or a link
leading outside. An accepted request writes the ``pre-receive`` hook when it is missing or stale,
then becomes (``exec``) ``git <receive_config> upload-pack|receive-pack <repository>``: the same
``-c`` settings and hook as the daemon (``roles.workbench.serve.githooks``).

Imports are the standard library's and the state layer's errors only: this runs once per
connection.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
from pathlib import Path
from typing import Mapping, NoReturn, Sequence

from roles.workbench.serve.githooks import hooks_current, hooks_dir_for, receive_config, serve_env, write_hooks
from state_db.kernel.errors import OrgError

SERVICES = {"git-upload-pack": "upload-pack", "git-receive-pack": "receive-pack"}
# a work item's history: one path component, <id>.git (never "." or "..": the first character
# is a letter, digit or underscore)
REPO_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}\.git")
_SHOWN = 80   # at most this much of what a client sent is repeated in an error


class GitShellError(OrgError):
    """A request ``org git-shell`` refuses; ``code`` says why."""

    code = "git_shell_refused"


def _shown(text: str) -> str:
    return repr(text if len(text) <= _SHOWN else text[:_SHOWN] + "…")


def parse(command: str | None) -> tuple[str, str]:
    """The git service (``upload-pack`` or ``receive-pack``) and the repository path a client
    asked for in ``SSH_ORIGINAL_COMMAND``.

    Raises:
        GitShellError(code="git_shell_interactive"): no command (an interactive login).
        GitShellError(code="git_shell_command"): anything but one of the two git services with
            exactly one argument, quoted as a shell would.
    """
    if command is None or not command.strip():
        raise GitShellError("an interactive login is refused: this key serves workspace histories only",
                            code="git_shell_interactive",
                            hint="fetch and push with git over ssh://; log in with another key")
    try:
        words = shlex.split(command)
    except ValueError as exc:
        raise GitShellError(f"cannot read the command {_shown(command)}: {exc}", code="git_shell_command",
                            hint="only git-upload-pack and git-receive-pack with one quoted path are served") from None
    if len(words) >= 2 and words[0] == "git" and f"git-{words[1]}" in SERVICES:
        words = [f"git-{words[1]}", *words[2:]]
    if not words or words[0] not in SERVICES:
        raise GitShellError(f"the command {_shown(words[0] if words else command)} is refused",
                            code="git_shell_command",
                            hint="this key only fetches and pushes workspace histories (git-upload-pack, "
                                 "git-receive-pack)")
    if len(words) != 2:
        raise GitShellError(f"{words[0]} takes one repository path, not {len(words) - 1} arguments",
                            code="git_shell_command", hint="fetch or push ssh://HOST/<work_id>.git with git")
    return SERVICES[words[0]], words[1]


def resolve(path: str, history_dir: Path) -> Path:
    """The repository ``path`` names: ``/<id>.git``, ``<id>.git`` or ``<history_dir>/<id>.git``,
    an existing repository directly below ``history_dir`` once every link is resolved.

    Raises:
        GitShellError(code="git_shell_path"): any other path, or one leading outside.
        GitShellError(code="git_no_such_repository"): no repository there.
    """
    history = os.path.abspath(history_dir)
    real_history = os.path.realpath(history)
    head, name = os.path.split(path)
    if head not in ("", "/", history, real_history) or not REPO_NAME.fullmatch(name):
        raise GitShellError(f"the path {_shown(path)} is refused: only /<work_id>.git is served",
                            code="git_shell_path", hint="fetch or push ssh://HOST/<work_id>.git")
    real = os.path.realpath(os.path.join(real_history, name))
    if os.path.dirname(real) != real_history:
        raise GitShellError(f"the path {_shown(path)} is refused: it leads outside {history}",
                            code="git_shell_path", hint="only the histories of the org's work items are served")
    if not (os.path.isfile(os.path.join(real, "HEAD")) and os.path.isdir(os.path.join(real, "objects"))):
        raise GitShellError(f"no such repository: {name} in {history}", code="git_no_such_repository",
                            hint="the coordinator makes a work item's history with its baseline; try again later")
    return Path(real)


def command(service: str, repository: Path, hooks_dir: Path, max_push_bytes: int | None = None) -> list[str]:
    """The git command line serving ``service`` on ``repository`` (what ``serve`` becomes)."""
    return ["git", *receive_config(hooks_dir, max_push_bytes), service, str(repository)]


def scope_env(home_root: Path, host: str | None, service: str, repository: Path) -> tuple[dict[str, str], int]:
    """What the ``pre-receive`` hook is told of the pusher, and the largest push taken. With
    ``host`` (the key's forced command names it): the store is asked what that host holds
    (``gitscope``); a request for a history it may not reach raises ScopeError; the bound is
    ``[hosts] git_max_push_mb``. Without: ``all`` (an operator's own key), the default bound."""
    from roles.workbench.serve.githooks import MAX_PUSH_BYTES, NEXT_ENV, SCOPE_ENV
    if host is None:
        return {SCOPE_ENV: "all"}, MAX_PUSH_BYTES
    from roles.workbench.serve.gitscope import scope_of
    from state_db.kernel.config import load_config
    from state_db.connection import connect
    from state_db.kernel.home import OrgHome
    home = OrgHome(Path(home_root))
    cfg = load_config(home)
    conn = connect(home.db_path, readonly=True)
    try:
        scope = scope_of(conn, host, repository.name[:-len(".git")],
                         heartbeat_timeout_s=cfg.supervisor.heartbeat_timeout_s)
    finally:
        conn.close()
    scope.require(service)
    return {SCOPE_ENV: f"host:{host}", NEXT_ENV: str(scope.next_iteration)}, cfg.hosts.git_max_push_mb * 1024 * 1024


def prepare(home_root: Path, original: str | None, host: str | None = None) -> list[str]:
    """Check a client's request against ``<home_root>/history`` and return the git command line
    that serves it; the ``pre-receive`` hook is written first when missing or stale. ``host``:
    the joined host the key belongs to (``scope_env`` checks what it may reach).

    Raises: GitShellError (see ``parse``, ``resolve``; ``git_shell_hooks``: the hook cannot be
    written), ScopeError (``git_shell_not_yours``).
    """
    argv, _ = prepare_scoped(home_root, original, host)
    return argv


def prepare_scoped(home_root: Path, original: str | None, host: str | None = None) -> tuple[list[str], dict]:
    """``prepare``, with the environment the served git and its hook get (``scope_env``)."""
    service, path = parse(original)
    history = Path(home_root) / "history"
    repository = resolve(path, history)
    scoped, limit = scope_env(home_root, host, service, repository)
    hooks = hooks_dir_for(history)
    if not hooks_current(hooks):
        try:
            write_hooks(hooks)
        except OSError as exc:
            raise GitShellError(f"cannot write the hooks in {hooks}: {exc.strerror}", code="git_shell_hooks",
                                hint="give the ssh user write access to the org home") from None
    return command(service, repository, hooks, limit), scoped


def serve(home_root: Path, environ: Mapping[str, str] | None = None, host: str | None = None) -> NoReturn:
    """Serve the request in ``SSH_ORIGINAL_COMMAND``: become the git that answers it, scoped to
    ``host`` when the key's forced command names one.

    Raises: GitShellError (see ``prepare``; ``git_missing``: no git executable on PATH), ScopeError.
    """
    env = dict(os.environ if environ is None else environ)
    argv, scoped = prepare_scoped(home_root, env.get("SSH_ORIGINAL_COMMAND"), host)
    git = shutil.which("git", path=env.get("PATH") or os.defpath)
    if git is None:
        raise GitShellError("git is not installed on this host", code="git_missing",
                            hint="install git on the coordinator host")
    env = serve_env(env, keep_protocol=True)
    env.pop("SSH_ORIGINAL_COMMAND", None)
    env.update(scoped)
    os.execve(git, argv, env)


# -- the authorized_keys line ------------------------------------------------------------------

_HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
_KEY = re.compile(r"(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(256|384|521)|sk-ssh-ed25519@openssh\.com|"
                  r"sk-ecdsa-sha2-nistp256@openssh\.com) [A-Za-z0-9+/]+={0,3}( [^\r\n]*)?")


def authorized_keys_line(org_command: Sequence[str | os.PathLike], home_root: Path, public_key: str,
                         host: str | None = None) -> str:
    """The line of ``~/.ssh/authorized_keys`` that lets ``public_key`` (a worker host's, as in its
    ``.pub`` file) fetch and push the histories of ``home_root`` and do nothing else: with
    ``host``, only those of the work items that host holds or held (``gitscope``); without, all
    of them (an operator's own key). ``org_command`` runs the org CLI (``[<checkout>/scripts/org]``).

    Raises: GitShellError(code="git_shell_key"): not one public key; a path sshd cannot quote.
    """
    lines = [ln.strip() for ln in public_key.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    if len(lines) != 1 or not _KEY.fullmatch(lines[0]):
        raise GitShellError("not one ssh public key (a line 'ssh-ed25519 AAAA... comment')", code="git_shell_key",
                            hint="give the worker host's ~/.ssh/id_ed25519.pub or the like, one key")
    words = [os.fspath(w) for w in org_command] + ["git-shell", "--home", os.fspath(home_root)]
    if host is not None:
        if not _HOST.fullmatch(host):
            raise GitShellError(f"{host!r} is not a host name", code="git_shell_key",
                                hint="give the joined host's name as 'org hosts' lists it")
        words += ["--host", host]
    for word in words:
        if any(c in word for c in '"\\\n\r'):
            raise GitShellError(f"{word!r} holds a quote, a backslash or a line break", code="git_shell_key",
                                hint="put the checkout and the org home at plain paths")
    forced = " ".join(shlex.quote(w) for w in words)
    return f'command="{forced}",restrict {lines[0]}'
