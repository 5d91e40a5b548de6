"""state.db: the single source of truth (schema, migrations, StateWriter, queries, config, home)."""
