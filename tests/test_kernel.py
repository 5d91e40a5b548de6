"""The kernel (state_db/kernel/) stands under the truth layer: it imports nothing else of state_db."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
KERNEL = sorted(p.stem for p in (ROOT / "state_db" / "kernel").glob("*.py") if p.stem != "__init__")

pytestmark = pytest.mark.timeout(60)


def test_the_kernel_loads_nothing_of_the_truth_layer():
    code = ("import sys\n"
            + "".join(f"import state_db.kernel.{m}\n" for m in KERNEL)
            + "print('\\n'.join(sorted(n for n in sys.modules if n.startswith(('state_db', 'roles', 'transport',"
              " 'knowledge', 'skills', 'scripts')))))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr
    loaded = set(out.stdout.split())
    assert {f"state_db.kernel.{m}" for m in KERNEL} <= loaded
    assert loaded - {f"state_db.kernel.{m}" for m in KERNEL} == {"state_db", "state_db.kernel"}


def test_the_kernel_names_the_proposal_kinds_the_vocabulary_holds():
    from state_db.kernel.config import PROPOSAL_KINDS
    from state_db.vocab import ProposalKind

    assert PROPOSAL_KINDS == tuple(k.value for k in ProposalKind)
