"""The roles' common base: the process runtime, the transport link, instances, telemetry.

It never imports a role.
"""
