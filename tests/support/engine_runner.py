"""Run one engine in its own process (so tests can kill -9 it): HOME WORK_ID ACTS_JSON."""
import json
import sys
from pathlib import Path

from state_db.kernel.home import OrgHome
from tests.support.loop import ScriptedActs, engine

home, work_id, acts = OrgHome(Path(sys.argv[1])), sys.argv[2], json.loads(sys.argv[3])
decision = engine(home, work_id, ScriptedActs(acts)).run()
print(json.dumps(decision.encode() if decision else None))
