import sys

from roles.curator.process import CuratorProcess
from roles.runtime import main

sys.exit(main(CuratorProcess))
