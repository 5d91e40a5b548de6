"""Secrets at rest in the org home: never on a command line, never in a file others can read.

- ``write_private(path, text)``: a file created owner-only (0600) from its first byte, written
  whole (temp, fsync, rename) — ``org.toml`` and every file that holds a secret is written so.
- The PostgreSQL store's password is kept out of ``org.toml`` and out of ``argv``: ``org join``
  takes it from a file, a prompt or ``$ORG_STATE_PASSWORD`` (``password_from``) and writes it into
  ``<home>/store.pgpass`` in libpq's password-file format; the URL in ``org.toml`` names that file
  with libpq's own ``passfile`` parameter, so every connection libpq opens finds it with no code of
  ours on the connecting side.
- ``exposed(home)``: the files of the home that hold a secret and that a group or others may read
  (``org doctor``'s "secret files" check).
"""
from __future__ import annotations

import os
import stat
from pathlib import Path
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit, urlunsplit

from state_db.kernel.errors import StateError

PASSFILE = "store.pgpass"
ENV_PASSWORD = "ORG_STATE_PASSWORD"


class CredentialError(StateError):
    code = "credential_refused"


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` as a file only its owner can read or write (0600), atomically.
    A file that was there before is replaced, whatever its mode was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)                     # whatever the umask said
        with os.fdopen(fd, "w", closefd=True) as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def password_in(url: str) -> str | None:
    """The password a ``postgresql://`` URL carries (``user:PASS@``, or ``?password=``), or None."""
    parts = urlsplit(url)
    if parts.password is not None:
        return unquote(parts.password)
    for k, v in parse_qsl(parts.query, keep_blank_values=True):
        if k == "password":
            return v
    return None


def without_password(url: str) -> str:
    """``url`` with its password (in the authority or the query) taken out."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if parts.password is not None:
        user = netloc.rpartition("@")[0].partition(":")[0]
        netloc = f"{user}@{netloc.rpartition('@')[2]}"
    query = urlencode([(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "password"])
    return urlunsplit(parts._replace(netloc=netloc, query=query))


def refuse_on_command_line(url: str, option: str) -> None:
    """Raises CredentialError(code="password_on_command_line") when ``url``, given as ``option``
    on a command line, carries a password: every local user reads it in the process list."""
    if password_in(url) is not None:
        raise CredentialError(f"{option} holds a password: every user of this machine can read a command line",
                              code="password_on_command_line",
                              hint=f"give the URL without it, and the password with --store-password-file FILE "
                                   f"(or '-' to type it), or ${ENV_PASSWORD}; then change that password")


def password_from(file: str | None, environ=os.environ, *, prompt=None) -> str | None:
    """The store's password: from ``file`` (its first line; ``-``: typed at a prompt, or the first
    line of stdin when it is not a terminal), else ``$ORG_STATE_PASSWORD``, else None.

    Raises: CredentialError(code="password_unreadable")."""
    import sys
    if file == "-":
        if sys.stdin.isatty():
            import getpass
            return (prompt or getpass.getpass)("password of the PostgreSQL store: ")
        return sys.stdin.readline().rstrip("\r\n")
    if file:
        try:
            return Path(file).read_text().splitlines()[0] if Path(file).stat().st_size else ""
        except (OSError, IndexError) as exc:
            raise CredentialError(f"cannot read the password file {file}: {getattr(exc, 'strerror', None) or exc}",
                                  code="password_unreadable", hint="give a readable file with the password on its "
                                                                   "first line") from None
    return environ.get(ENV_PASSWORD) or None


def _pgpass_field(text: str) -> str:
    return text.replace("\\", "\\\\").replace(":", "\\:")


def store_password(home_root: Path, url: str, password: str) -> str:
    """Keep ``password`` in ``<home_root>/store.pgpass`` (0600, libpq's format, matching any
    server) and return ``url`` without a password, naming that file (``passfile``)."""
    path = Path(home_root) / PASSFILE
    write_private(path, f"*:*:*:*:{_pgpass_field(password)}\n")
    parts = urlsplit(without_password(url))
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "passfile"]
    query.append(("passfile", str(path.absolute())))
    return urlunsplit(parts._replace(query=urlencode(query, quote_via=quote, safe="/")))


def secret_files(home) -> list[Path]:
    """The files of an org home that hold a secret (those present)."""
    root = Path(home.root)
    candidates = [home.config_path, root / PASSFILE]
    if not home.store_url:      # a PostgreSQL store is a URL, no file of the home's
        candidates += [Path(home.db_path), Path(f"{home.db_path}-wal"), Path(f"{home.db_path}-shm")]
    keys = Path(home.run_dir)
    if keys.is_dir():
        candidates += sorted(p for p in keys.rglob("*") if p.is_file() and "key" in p.name)
    return [p for p in candidates if p.is_file()]


def exposed(home) -> list[tuple[Path, int]]:
    """(path, mode) of each secret-holding file that its group or others may read or write."""
    out = []
    for path in secret_files(home):
        try:
            mode = stat.S_IMODE(path.lstat().st_mode)
        except OSError:
            continue
        if mode & 0o077:
            out.append((path, mode))
    return out
