"""Keeping secrets out of everything the org writes.

API keys come from the environment only. Whatever text reaches state.db, logs or snapshots is
passed through ``redact_text`` so a key pasted into a goal or echoed in an error is never stored.
"""
from __future__ import annotations

import os
import re

SECRET_ENV = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN")
_KEY_SHAPE = re.compile(r"sk-ant-[A-Za-z0-9_\-]{6,}")
REDACTED = "[redacted]"


def secret_values(env=os.environ) -> list[str]:
    return [env[name] for name in SECRET_ENV if len(env.get(name, "")) >= 8]


def redact_text(text: str, secrets: list[str] | None = None) -> str:
    """Replace every known secret value, and anything shaped like an Anthropic key."""
    for secret in secrets if secrets is not None else secret_values():
        if secret in text:
            text = text.replace(secret, REDACTED)
    if "sk-ant-" in text:
        text = _KEY_SHAPE.sub(REDACTED, text)
    return text


def has_secret(text: str, secrets: list[str] | None = None) -> bool:
    return redact_text(text, secrets) != text
