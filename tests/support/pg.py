"""A throwaway PostgreSQL server for tests, on a Unix socket only (no TCP port is opened).

``PgServer.start(base)`` runs Debian's ``initdb`` and ``pg_ctl`` (``/usr/lib/postgresql/<v>/bin``)
on a data folder under ``base``, listening on a socket in that folder; ``stop`` shuts it down
(``pg_ctl stop -m immediate``) and removes the folder. PostgreSQL refuses to run as root: as root,
the server runs as the unprivileged user ``nobody`` (``runuser``), and its folder is made under
``/tmp`` (pytest's own temporary root is owner-only, so ``nobody`` could not enter it) and owned by
that user. ``fresh_url()`` gives each test its own schema in the one database (a new store in
milliseconds, where CREATE DATABASE costs a file copy).

``pg_server`` (session) and ``pg_url`` (a fresh, empty store per test) are the fixtures; both skip
with the reason when the server binaries are absent (``scripts/test`` installs Debian's
``postgresql`` package when it can).
"""
from __future__ import annotations

import glob
import itertools
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import pytest

RUN_AS = "nobody"


def binaries() -> Path | None:
    """The newest installed PostgreSQL server's bin folder, or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"),
                   key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0)
    return Path(found[-1]).parent if found else None


@dataclass
class PgServer:
    bin: Path
    root: Path          # data folder, socket and log live here
    _names = itertools.count(1)

    @property
    def socket_dir(self) -> Path:
        return self.root

    @property
    def log(self) -> Path:
        return self.root / "server.log"

    def url(self, dbname: str = "postgres", schema: str | None = None) -> str:
        """A ``postgresql://`` URL on the socket (libpq's ``host=`` query form)."""
        query = f"host={quote(str(self.socket_dir), safe='')}&user=postgres"
        if schema:
            query += "&options=" + quote(f"-csearch_path={schema}", safe="")
        return f"postgresql:///{dbname}?{query}"

    def fresh_url(self) -> str:
        """A new, empty schema as its own store."""
        import psycopg
        name = f"t{os.getpid()}_{next(self._names)}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {name}")
        return self.url(schema=name)

    def _as_owner(self, argv: list[str]) -> list[str]:
        return ["runuser", "-u", RUN_AS, "--", *argv] if os.geteuid() == 0 else argv

    @classmethod
    def start(cls, base: Path) -> "PgServer":
        bin_dir = binaries()
        if bin_dir is None:
            raise FileNotFoundError("no PostgreSQL server binaries under /usr/lib/postgresql")
        if os.geteuid() == 0:
            root = Path(tempfile.mkdtemp(prefix="loop-org-pg-", dir="/tmp"))
            shutil.chown(root, RUN_AS)
        else:
            base.mkdir(parents=True, exist_ok=True)
            root = Path(tempfile.mkdtemp(prefix="pg-", dir=base))
        server = cls(bin_dir, root)
        data = root / "data"
        env = {**os.environ, "LC_ALL": "C", "TZ": "UTC"}
        try:
            subprocess.run(server._as_owner([str(bin_dir / "initdb"), "-D", str(data), "-U", "postgres",
                                             "--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync",
                                             "--no-instructions"]),
                           check=True, capture_output=True, timeout=120, env=env, cwd=root)
            opts = f"-k {root} -h '' -F -c max_connections=60 -c shared_buffers=16MB -c fsync=off"
            subprocess.run(server._as_owner([str(bin_dir / "pg_ctl"), "-D", str(data), "-o", opts,
                                             "-l", str(server.log), "-w", "-t", "60", "start"]),
                           check=True, capture_output=True, timeout=90, env=env, cwd=root)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
            detail = (getattr(exc, "stderr", b"") or b"").decode(errors="replace")
            log = server.log.read_text(errors="replace") if server.log.exists() else ""
            server.stop()
            raise RuntimeError(f"PostgreSQL did not start: {detail}\n{log}") from exc
        return server

    def stop(self) -> None:
        data = self.root / "data"
        if (data / "postmaster.pid").exists():
            subprocess.run(self._as_owner([str(self.bin / "pg_ctl"), "-D", str(data), "-m", "immediate",
                                           "-w", "-t", "30", "stop"]), capture_output=True, timeout=60, cwd="/")
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture(scope="session")
def pg_server(tmp_path_factory):
    """One PostgreSQL server for the session (skipped when not installed)."""
    if binaries() is None:
        pytest.skip("PostgreSQL server binaries are not installed (/usr/lib/postgresql/*/bin); "
                    "scripts/test installs Debian's postgresql package")
    try:
        import psycopg  # noqa: F401
    except ImportError:
        pytest.skip("psycopg is not installed (.venv/bin/pip install 'psycopg[binary]')")
    server = PgServer.start(tmp_path_factory.mktemp("pg"))
    yield server
    server.stop()


@pytest.fixture
def pg_url(pg_server):
    """The URL of a fresh, empty PostgreSQL store (its own schema)."""
    return pg_server.fresh_url()
