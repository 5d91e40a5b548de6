"""The workbench every role works on: histories (workspace/), the sandbox, the model relay and
its meter (relay/), serving histories to other hosts (serve/), and the scripted model.

It never imports a role.
"""
