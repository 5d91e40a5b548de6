"""Serving histories to other hosts: the git service, its shell and hooks, and each host's scope.
"""
