"""The offline demo shown by ``scripts/start-org --demo``."""
from __future__ import annotations


def run_demo(home, cfg) -> int:
    print("demo: the org is running with every role as its own process (coordinator, "
          f"{cfg['org.loop_agents']} loop-agents, eval-agent, curator) under a supervisor, talking over "
          "ZeroMQ with an outbox fallback, all state in state.db.")
    print("demo: NOT YET — submitting work, the loop, verification by the eval-agent and the "
          "scripted model arrive with later issues; this demo only starts the org and pings every role.")
    from roles.supervisor.ping import ping_all
    for row in ping_all(home, cfg, timeout_s=5.0):
        print(f"  ping {row['instance']:<14} {row['result']}")
    print("next: 'scripts/org status', 'scripts/org logs -f', 'scripts/org stop'")
    return 0
