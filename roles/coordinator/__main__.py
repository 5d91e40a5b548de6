import sys

from roles.coordinator.process import CoordinatorProcess
from roles.runtime import main

sys.exit(main(CoordinatorProcess))
