import sys

from roles.curator.process import CuratorProcess
from roles.base.runtime import main

sys.exit(main(CuratorProcess))
