"""The installed loop-org version, for ``org --version``."""
from __future__ import annotations

import tomllib
from importlib import metadata
from pathlib import Path

DISTRIBUTION = "loop-org"


def version() -> str:
    """The version pip recorded for the installed package, else ``pyproject.toml``'s (a checkout
    run without installing), else ``unknown``."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        pass
    try:
        with open(Path(__file__).resolve().parents[2] / "pyproject.toml", "rb") as f:
            return str(tomllib.load(f)["project"]["version"])
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return "unknown"
