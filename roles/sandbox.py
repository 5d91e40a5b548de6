"""Which isolation agent commands get, as far as this version goes (bubblewrap comes next)."""
from __future__ import annotations

import shutil


def bubblewrap() -> str | None:
    return shutil.which("bwrap")


def describe_mode(cfg) -> str:
    found = bubblewrap()
    if found:
        return (f"bubblewrap found at {found}; this version does not yet run agent commands inside it — "
                "the demo's scripted model only reads and edits files through the workspace tools")
    return ("bubblewrap is not installed: the demo runs its known script unsandboxed (it only reads and "
            "edits files through the workspace tools; verify commands run as plain processes)")
