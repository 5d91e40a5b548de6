"""What a human can do to the org (submit, cancel, decide), shared by the CLI and ``org chat``.

Each operation is one durable StateWriter write as actor ``human`` under an idempotency key,
followed by a wake to the coordinator: a lost wake delays, never loses.
"""
