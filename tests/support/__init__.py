"""Helpers the tests share."""
from __future__ import annotations

import subprocess
from pathlib import Path


def install_current(root: Path, extras: str = "") -> bool:
    """Whether the checkout's .venv holds a current install (``scripts/_bootstrap.sh``'s own
    answer), so running ``scripts/org`` or ``scripts/start-org`` starts no pip."""
    out = subprocess.run(["bash", "-c", 'source "$1/scripts/_bootstrap.sh" && install_current "$2"', "_",
                          str(root), extras], capture_output=True, timeout=30)
    return out.returncode == 0
