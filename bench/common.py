"""What every benchmark's command line shares: quiet logs, and the closing figures."""
from __future__ import annotations

import json


def quiet_logs() -> None:
    """Library logs go nowhere below warnings: the figures are the output."""
    import logging

    from state_db.logsetup import configure
    configure(None, "bench", "bench")
    logging.getLogger().setLevel(logging.WARNING)


def at_most(figures: dict, targets: dict) -> dict[str, bool]:
    """Each target an upper bound; a figure that was not measured fails."""
    return {k: figures.get(k) is not None and figures[k] <= v for k, v in targets.items()}


def finish(figures: dict, targets: dict, passes: dict[str, bool], *, as_json: bool) -> int:
    """Print the figures with their targets and results; the exit code says whether all held."""
    figures["targets"] = targets
    figures["pass"] = passes
    print(json.dumps(figures, ensure_ascii=False, indent=None if as_json else 2))
    return 0 if all(passes.values()) else 1
