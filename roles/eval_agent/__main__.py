import sys

from roles.eval_agent.process import EvalAgentProcess
from roles.base.runtime import main

sys.exit(main(EvalAgentProcess))
