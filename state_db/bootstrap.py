"""Create or open an org home: folders, org.toml with defaults, migrated state.db."""
from __future__ import annotations

import os

from state_db.kernel import config as config_mod
from state_db.kernel.home import OrgHome, require_linux
from state_db.migrations import migrate


def _private_db(path) -> None:
    """state.db is owner-only (0600) from its first byte; SQLite gives its -wal and -shm files
    the same mode."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)


def init_home(home: OrgHome) -> tuple[config_mod.Config, dict]:
    """Make ``home`` ready to run an org. Idempotent.

    Returns (config, migration result). Raises ConfigError, SchemaTooNew, MigrationFailed.
    """
    require_linux()
    home.ensure()
    if not home.store_url:
        _private_db(home.db_path)
    config_mod.write_default(home.config_path)
    cfg = config_mod.load(home.config_path)
    result = migrate(home.db_path, backups_dir=home.backups_dir)
    return cfg, result
