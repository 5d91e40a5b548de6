"""What a human can do to the org (submit, cancel, decide), shared by the CLI and ``org chat``.

Each operation is one durable StateWriter write as actor ``human`` under an idempotency key,
followed by a wake to the coordinator: a lost wake delays, never loses.
"""


def human_writer(db_path, via: str | None = None):
    """A StateWriter as actor ``human``. ``via`` names the client the write came through
    (``mcp:claude-code``): it becomes the journal events' instance and follows the OS user in the
    rows that say who did it (``signed``)."""
    from state_db.vocab import Actor
    from state_db.writer import StateWriter
    return StateWriter(db_path, Actor.HUMAN, via)


def signed(writer) -> str:
    """Who made a human write: the OS user, plus ``via <client>`` when it came through one."""
    return writer.os_user if writer.instance == writer.actor else f"{writer.os_user} via {writer.instance}"
