"""Workspaces: the shadow history (baseline, checkpoints, snapshots) and protected paths.

Shared infrastructure below both the loop-agent (which checkpoints) and the eval-agent (which
verifies snapshots): neither judges through the other's code.
"""
