"""What every layer needs and that knows nothing of state: the org home, the org.toml schema,
logging, the price table, process identity, secrets, credentials and the error root.

Nothing here imports the rest of ``state_db`` (the truth layer stands on the kernel).
"""
