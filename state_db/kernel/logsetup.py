"""Structured JSON-lines logs per role instance in ``<home>/logs/``, rotated by size.

Every line names the role and instance, from every thread of the process (contextvars do not
reach worker threads, so the identity is added by a processor, not only bound). Lines logged
through the standard library (the HTTP client: httpx, httpcore, anthropic) go through the same
processors by structlog's ProcessorFormatter, so every line in a role's log is JSON. A redaction
processor removes secret values (the API keys in the environment, and anything shaped like an
Anthropic key) before a line is written.
"""
from __future__ import annotations

import logging
import logging.handlers
import os
from pathlib import Path

import structlog

from state_db.kernel.secrets import has_secret, redact_text, secret_values


def redact(_, __, event_dict: dict) -> dict:
    """structlog processor: scrub secrets from every value."""
    secrets = secret_values()
    for k, v in list(event_dict.items()):
        if isinstance(v, str):
            event_dict[k] = redact_text(v, secrets)
        elif not isinstance(v, (int, float, bool, type(None))) and has_secret(repr(v), secrets):
            event_dict[k] = redact_text(repr(v), secrets)
    return event_dict


def identity(role: str, instance: str):
    """structlog processor: name the process's role and instance on every line that does not
    name its own (an engine binds its instance; a worker thread's lines have no contextvars)."""
    def add(_, __, event_dict: dict) -> dict:
        event_dict.setdefault("role", role)
        event_dict.setdefault("instance", instance)
        return event_dict
    return add


class RotatingLog(logging.handlers.RotatingFileHandler):
    """The standard library's size-rotated file, rendering each line once.

    ``RotatingFileHandler`` formats a record to measure it against ``maxBytes`` and then again to
    write it: two JSON renders a line, most of what a log call costs. Here the text made for
    the measure is the one written (both happen under the handler's lock). It also stats the
    file only when a line would make it roll over, to keep the standard rule that a file that is
    not a regular one (``/dev/null``) is never rotated."""

    _last: tuple[logging.LogRecord, str] | None = None

    def format(self, record: logging.LogRecord) -> str:
        last = self._last
        if last is not None and last[0] is record:
            return last[1]
        text = super().format(record)
        self._last = (record, text)
        return text

    def emit(self, record: logging.LogRecord) -> None:
        try:
            super().emit(record)
        finally:
            self._last = None

    def shouldRollover(self, record: logging.LogRecord) -> bool:
        if self.stream is None:                 # delay=True: opened by the first line
            self.stream = self._open()
        if self.maxBytes <= 0:
            return False
        size = len("%s\n" % self.format(record))
        self.stream.seek(0, 2)
        if self.stream.tell() + size < self.maxBytes:
            return False
        return not (os.path.exists(self.baseFilename) and not os.path.isfile(self.baseFilename))


def configure(logs_dir: Path | None, role: str, instance: str, *, max_bytes: int = 10 * 2**20,
              backups: int = 3, stderr: bool = False) -> structlog.BoundLogger:
    """Send this process's structlog output to ``<logs_dir>/<instance>.log`` as JSON lines.

    Returns a logger bound to role and instance.
    """
    handlers: list[logging.Handler] = []
    if logs_dir is not None:
        logs_dir.mkdir(parents=True, exist_ok=True)
        handlers.append(RotatingLog(logs_dir / f"{instance}.log", maxBytes=max_bytes, backupCount=backups,
                                    encoding="utf-8"))
    if stderr or not handlers:
        handlers.append(logging.StreamHandler())
    who = identity(role, instance)
    stamp = structlog.processors.TimeStamper(fmt="iso", utc=True)
    formatter = structlog.stdlib.ProcessorFormatter(
        # lines from the standard library's loggers (the HTTP client) get what structlog's get below
        foreign_pre_chain=[structlog.contextvars.merge_contextvars, structlog.processors.add_log_level,
                           structlog.stdlib.add_logger_name, stamp, who],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, redact,
                    structlog.processors.format_exc_info, structlog.processors.JSONRenderer()])
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    for h in handlers:
        h.setFormatter(formatter)
        root.addHandler(h)
    root.setLevel(logging.INFO)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            stamp,
            who,
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False,
    )
    structlog.contextvars.bind_contextvars(role=role, instance=instance)
    return structlog.get_logger()
