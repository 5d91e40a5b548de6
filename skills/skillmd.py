"""SKILL.md in the Agent Skills format: YAML front matter (``name``, ``description``, optional
``metadata`` map of strings) followed by a Markdown body.

Front matter is read and written with PyYAML (``safe_load`` semantics, through the node tree so
that a problem is reported with its line). The writer emits ``name`` plain and ``description`` and
metadata values double-quoted, so any text round-trips and ordinary text reads as it did when the
writer used JSON strings. The reader takes whatever YAML a person writes by hand (plain, quoted,
folded ``>`` or literal ``|`` scalars, comments); round-trip editing (ruamel.yaml) is not needed,
since the files are rendered from state.db rather than patched. Malformed front matter is a
``BadSkillText`` with the line of the text (1 = the opening ``---``) that YAML points at. The body
of a skill has four sections: when to use, steps, criteria and thresholds, pitfalls (``SECTIONS``).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path

import yaml

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


class _Quoted(str):
    """Text the writer double-quotes: it may hold anything (': ', '#', a leading quote, newlines)."""


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(_Quoted, lambda d, v: d.represent_scalar("tag:yaml.org,2002:str", str(v), style='"'))


def render(text: SkillText) -> str:
    """The SKILL.md text of ``text`` (validated first)."""
    text.validate()
    front: dict[str, object] = {"name": text.name, "description": _Quoted(text.description)}
    if text.metadata:
        front["metadata"] = {str(k): _Quoted(str(v)) for k, v in text.metadata.items()}
    head = yaml.dump(front, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=1 << 30)
    return f"---\n{head}---\n\n{text.body.strip()}\n"


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


FRONT_LINE = 2        # the text's line of the front matter's first line (after the opening ---)


def _front_matter(lines: list[str], end: int) -> yaml.MappingNode:
    """The front matter's YAML node tree. Raises BadSkillText (with the line) if YAML cannot read it."""
    try:
        node = yaml.compose("\n".join(lines[1:end]), Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        if exc.context_mark is not None and "end of stream" in (exc.problem or ""):
            mark = exc.context_mark     # an unclosed quote or bracket: where it opened, not the end
        line = None if mark is None else mark.line + FRONT_LINE
        what = "; ".join(x for x in (exc.context, exc.problem) if x)
        raise BadSkillText(f"has front matter YAML cannot read ({what})", line) from None
    except yaml.YAMLError as exc:
        raise BadSkillText(f"has front matter YAML cannot read: {exc}") from None
    if node is None:
        raise BadSkillText("has empty front matter", FRONT_LINE)
    if not isinstance(node, yaml.MappingNode):
        raise BadSkillText("has front matter that is not a map of 'key: value' lines",
                           node.start_mark.line + FRONT_LINE)
    return node


def _fields(node: yaml.MappingNode) -> dict[str, tuple[object, int]]:
    """Front matter keys → (value, line of the key); a key given twice is refused."""
    loader = yaml.SafeLoader("")
    out: dict[str, tuple[object, int]] = {}
    for key_node, value_node in node.value:
        key, line = loader.construct_object(key_node, deep=True), key_node.start_mark.line + FRONT_LINE
        if str(key) in out:
            raise BadSkillText(f"gives {key!r} twice in its front matter", line)
        try:
            out[str(key)] = (loader.construct_object(value_node, deep=True), line)
        except yaml.constructor.ConstructorError as exc:
            mark = exc.problem_mark or value_node.start_mark
            raise BadSkillText(f"has a value YAML cannot read: {exc.problem}", mark.line + FRONT_LINE) from None
    return out


def parse(text: str) -> SkillText:
    """Parse a SKILL.md text.

    Raises:
        BadSkillText: no front matter, front matter YAML cannot read (with the line YAML points
            at), no name or description, a name or description that is not text, a key given twice.
        BadSkillName: the name breaks the naming rule.
    """
    lines = text.lstrip("\ufeff").splitlines()
    if not lines or lines[0].strip() != "---":
        raise BadSkillText("does not start with a '---' front matter line", 1)
    try:
        end = next(i for i in range(1, len(lines)) if lines[i].strip() == "---")
    except StopIteration:
        raise BadSkillText("has no closing '---' after the front matter") from None
    front = _fields(_front_matter(lines, end))
    name, name_line = front.get("name", (None, end + 1))
    description, description_line = front.get("description", (None, end + 1))
    if name is None or name == "":
        raise BadSkillText("has no name in its front matter", name_line)
    if not isinstance(name, str):
        raise BadSkillText(f"has a name that is not text: {name!r}", name_line)
    if description is None:
        raise BadSkillText("has no description in its front matter", description_line)
    if not isinstance(description, str):
        raise BadSkillText(f"has a description that is not text ({type(description).__name__}); quote it",
                           description_line)
    metadata, metadata_line = front.get("metadata", ({}, None))
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict):
        raise BadSkillText("has metadata that is not a map of 'key: value' lines", metadata_line)
    body = "\n".join(lines[end + 1:]).strip() + "\n"
    return SkillText(name, description.strip(), body, {str(k): "" if v is None else str(v)
                                                       for k, v in metadata.items()}).validate()
