import sys

from roles.eval_agent.process import EvalAgentProcess
from roles.runtime import main

sys.exit(main(EvalAgentProcess))
