"""Skill names: the Agent Skills rule (1-64 of ``a-z``, ``0-9`` and single inner hyphens; the
directory is named the same) and how a pattern gets its name, deterministically."""
from __future__ import annotations

import hashlib
import re
import unicodedata

from skills.errors import BadSkillName

MAX_NAME = 64
NAME_RE = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
_WORD = re.compile(r"[a-z][a-z0-9]*")
_ERROR = re.compile(r"\b([A-Za-z]\w*(?:Error|Exception))\b")
STOP = frozenset("""a an and are as at be by c for from in into is it of on or q m the this that to was were
with when whose run runs fails failed shows output check work items verified bin usr env
python python3 sh bash node npx uv poetry
""".split())
PREFIX = {"failure": "handle", "fix": "fix", "context": "use", "outcome": "runs"}


def validate_name(name: str) -> str:
    """Return ``name`` if it is a valid skill name; raise BadSkillName otherwise."""
    if not isinstance(name, str) or not name:
        raise BadSkillName(str(name), "is empty")
    if len(name) > MAX_NAME:
        raise BadSkillName(name, f"is longer than {MAX_NAME} characters")
    if not NAME_RE.match(name):
        raise BadSkillName(name, "has characters other than a-z, 0-9 and single inner hyphens")
    return name


def words(text: str, limit: int) -> list[str]:
    """Distinct meaningful ASCII words of ``text`` in order (stop words and 1-letter words out)."""
    flat = unicodedata.normalize("NFKC", text).casefold()
    out: list[str] = []
    for w in _WORD.findall(flat):
        if len(w) > 1 and w not in STOP and w not in out:
            out.append(w)
        if len(out) >= limit:
            break
    return out


def join(parts: list[str]) -> str:
    name = "-".join(parts)[:MAX_NAME].strip("-")
    return re.sub(r"-+", "-", name)


def name_for(kind: str, topic: str, trigger: str | None = None) -> str:
    """A stable name for a pattern: ``<verb>-<error class>-<what is checked>`` when the notes
    carry a check trigger (``check|why``), else the topic's first meaningful words; a topic
    with no ASCII word (Japanese, say) becomes ``pattern-<hash>``."""
    prefix = PREFIX.get(kind, "pattern")
    if trigger and "|" in trigger:
        check, why = trigger.split("|", 1)
        head_word, _, rest = check.strip().partition(" ")
        check = head_word.rsplit("/", 1)[-1] + " " + rest       # the program, not where it lives
        err = _ERROR.search(why)
        head = [err.group(1).casefold()] if err else words(why, 2)
        parts = [prefix] + head + [w for w in words(check, 4) if w not in head][:3]
    else:
        parts = [prefix] + words(topic, 5)
    if len(parts) == 1:
        digest = hashlib.sha256(unicodedata.normalize("NFKC", topic).encode()).hexdigest()[:8]
        parts = [prefix, digest]
    return validate_name(join(parts))
