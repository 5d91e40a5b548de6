from roles.loop_agent.history import *  # noqa: F401,F403  (moved here once stable)
from roles.loop_agent.history import WorkspaceHistory  # noqa: F401
