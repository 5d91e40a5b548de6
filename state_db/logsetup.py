"""Structured JSON-lines logs per role instance in ``<home>/logs/``, rotated by size.

Every line names the role and instance. A redaction processor removes secret values (the API
keys in the environment, and anything shaped like an Anthropic key) before a line is written.
"""
from __future__ import annotations

import logging
import logging.handlers
from pathlib import Path

import structlog

from state_db.secrets import has_secret, redact_text, secret_values


def redact(_, __, event_dict: dict) -> dict:
    """structlog processor: scrub secrets from every value."""
    secrets = secret_values()
    for k, v in list(event_dict.items()):
        if isinstance(v, str):
            event_dict[k] = redact_text(v, secrets)
        elif not isinstance(v, (int, float, bool, type(None))) and has_secret(repr(v), secrets):
            event_dict[k] = redact_text(repr(v), secrets)
    return event_dict


def configure(logs_dir: Path | None, role: str, instance: str, *, max_bytes: int = 10 * 2**20,
              backups: int = 3, stderr: bool = False) -> structlog.BoundLogger:
    """Send this process's structlog output to ``<logs_dir>/<instance>.log`` as JSON lines.

    Returns a logger bound to role and instance.
    """
    handlers: list[logging.Handler] = []
    if logs_dir is not None:
        logs_dir.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.handlers.RotatingFileHandler(
            logs_dir / f"{instance}.log", maxBytes=max_bytes, backupCount=backups, encoding="utf-8"))
    if stderr or not handlers:
        handlers.append(logging.StreamHandler())
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    for h in handlers:
        h.setFormatter(logging.Formatter("%(message)s"))
        root.addHandler(h)
    root.setLevel(logging.INFO)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            redact,
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False,
    )
    structlog.contextvars.bind_contextvars(role=role, instance=instance)
    return structlog.get_logger()
