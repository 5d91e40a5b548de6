"""Create or open an org home: folders, org.toml with defaults, migrated state.db."""
from __future__ import annotations

from state_db import config as config_mod
from state_db.home import OrgHome, require_linux
from state_db.migrations import migrate


def init_home(home: OrgHome) -> tuple[config_mod.Config, dict]:
    """Make ``home`` ready to run an org. Idempotent.

    Returns (config, migration result). Raises ConfigError, SchemaTooNew, MigrationFailed.
    """
    require_linux()
    home.ensure()
    config_mod.write_default(home.config_path)
    cfg = config_mod.load(home.config_path)
    result = migrate(home.db_path, backups_dir=home.backups_dir)
    return cfg, result
