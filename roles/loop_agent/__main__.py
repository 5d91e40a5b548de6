import sys

from roles.loop_agent.process import LoopAgentProcess
from roles.base.runtime import main

sys.exit(main(LoopAgentProcess))
