"""state.db: the single source of truth (schema, migrations, StateWriter, queries, config, home)."""
import sys as _sys

if "structlog" not in _sys.modules:
    # structlog's console renderer imports rich when it is installed, for tracebacks drawn on a
    # terminal: about 60 ms of CPU in every org process (the CLI, the supervisor, the role
    # template). The org logs JSON to files, and ``org watch`` imports rich itself when it runs,
    # so structlog is imported here, first in every process, without it.
    _rich = _sys.modules.get("rich", False)
    _sys.modules["rich"] = None  # type: ignore[assignment]  # ``import rich`` fails for the moment
    try:
        import structlog  # noqa: F401
    finally:
        if _rich is False:
            del _sys.modules["rich"]
        else:
            _sys.modules["rich"] = _rich
