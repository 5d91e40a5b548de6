"""SKILL.md in the Agent Skills format: YAML front matter (``name``, ``description``, optional
``metadata`` map of strings) followed by a Markdown body.

The writer emits ``description`` and metadata values as double-quoted scalars (JSON strings are
valid YAML), so any text round-trips. The reader accepts the subset people write by hand in an
editor: plain, single- or double-quoted scalars, ``>`` / ``|`` block scalars, and one level of
nested map. The body of a skill has four sections: when to use, steps, criteria and thresholds,
pitfalls (``SECTIONS``).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from skills.errors import BadSkillText
from skills.names import validate_name
from state_db.snapshot import write_atomic

MAX_DESCRIPTION = 1024
SECTIONS = ("When to use", "Steps", "Criteria and thresholds", "Pitfalls")


@dataclass(frozen=True)
class SkillText:
    """A parsed SKILL.md: front matter fields and the body."""

    name: str
    description: str
    body: str
    metadata: dict[str, str] = field(default_factory=dict)

    def validate(self) -> "SkillText":
        validate_name(self.name)
        if not self.description.strip():
            raise BadSkillText("has an empty description")
        if len(self.description) > MAX_DESCRIPTION:
            raise BadSkillText(f"has a description longer than {MAX_DESCRIPTION} characters")
        return self


def _q(value: str) -> str:
    return json.dumps(value, ensure_ascii=False)


def render(text: SkillText) -> str:
    """The SKILL.md text of ``text`` (validated first)."""
    text.validate()
    lines = ["---", f"name: {text.name}", f"description: {_q(text.description)}"]
    if text.metadata:
        lines.append("metadata:")
        lines += [f"  {k}: {_q(str(v))}" for k, v in text.metadata.items()]
    lines += ["---", "", text.body.strip(), ""]
    return "\n".join(lines)


def renamed(text: SkillText, new_name: str) -> SkillText:
    """``text`` under ``new_name``, consistently: the old name is replaced wherever it stands as a
    whole word (the ``# name`` heading, the description, the steps), so nothing still says the old one."""
    if new_name == text.name:
        return text
    whole = re.compile(rf"(?<![\w-]){re.escape(text.name)}(?![\w-])")
    return replace(text, name=new_name, description=whole.sub(new_name, text.description),
                   body=whole.sub(new_name, text.body))


def write_folder(text: SkillText, parent: Path) -> Path:
    """Write ``parent/<name>/SKILL.md`` in the Agent Skills layout (the folder is named as the
    skill, which Claude Code and other clients require) and return its path; what else the
    folder holds is kept."""
    target = Path(parent) / text.name / "SKILL.md"
    write_atomic(target, render(text))
    return target


def _scalar(raw: str) -> str:
    raw = raw.strip()
    if raw.startswith('"'):
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            raise BadSkillText(f"has a badly quoted value: {raw[:40]}") from None
    if raw.startswith("'") and raw.endswith("'") and len(raw) >= 2:
        return raw[1:-1].replace("''", "'")
    return raw


def parse(text: str) -> SkillText:
    """Parse a SKILL.md text.

    Raises:
        BadSkillText: no front matter, no name or description, or an unreadable value.
        BadSkillName: the name breaks the naming rule.
    """
    lines = text.lstrip("\ufeff").splitlines()
    if not lines or lines[0].strip() != "---":
        raise BadSkillText("does not start with a '---' front matter line")
    try:
        end = next(i for i in range(1, len(lines)) if lines[i].strip() == "---")
    except StopIteration:
        raise BadSkillText("has no closing '---' after the front matter") from None
    front: dict[str, object] = {}
    i = 1
    while i < end:
        line = lines[i]
        i += 1
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if line[0] in " \t" or ":" not in line:
            raise BadSkillText(f"has a front matter line it cannot read: {line.strip()[:40]!r}")
        key, raw = line.split(":", 1)
        key, raw = key.strip(), raw.strip()
        block = []
        while i < end and (not lines[i].strip() or lines[i][0] in " \t"):
            block.append(lines[i])
            i += 1
        if raw in (">", ">-", "|", "|-"):
            parts = [b.strip() for b in block]
            front[key] = (" " if raw.startswith(">") else "\n").join(p for p in parts if p or raw.startswith("|"))
        elif raw == "" and block:
            nested = {}
            for b in block:
                if b.strip():
                    if ":" not in b:
                        raise BadSkillText(f"has a metadata line it cannot read: {b.strip()[:40]!r}")
                    k, v = b.split(":", 1)
                    nested[k.strip()] = _scalar(v)
            front[key] = nested
        else:
            front[key] = _scalar(raw + "".join(" " + b.strip() for b in block if b.strip()))
    name, description = front.get("name"), front.get("description")
    if not isinstance(name, str) or not name:
        raise BadSkillText("has no name in its front matter")
    if not isinstance(description, str):
        raise BadSkillText("has no description in its front matter")
    metadata = front.get("metadata") if isinstance(front.get("metadata"), dict) else {}
    body = "\n".join(lines[end + 1:]).strip() + "\n"
    return SkillText(name, description.strip(), body, {str(k): str(v) for k, v in metadata.items()}).validate()
