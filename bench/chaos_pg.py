"""The chaos run (``bench/chaos.py``) with the org's state in PostgreSQL: a throwaway server from
Debian's ``postgresql`` package on a Unix socket, named by org.toml's ``[state] url``; integrity
is PostgreSQL's own constraints, each in force. Usage: ``bench/chaos_pg.py --json`` plus any of
``bench/chaos.py``'s options (the claim: ``--items 120 --kills 14 --seconds 70``)."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.chaos import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["--store", "postgresql", *(sys.argv[1:] or ["--json"])]))
