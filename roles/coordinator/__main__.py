import sys

from roles.coordinator.process import CoordinatorProcess
from roles.base.runtime import main

sys.exit(main(CoordinatorProcess))
