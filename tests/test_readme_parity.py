"""README.md and README.ja.md describe the same sections, commands, flags and code.

The Japanese README marks each of its `##`/`###` headings with the English heading it
stands for, on the line right before it:

    <!-- section: How the eval-agent judges -->
    ## eval-agent はどう判定するか

so sections are matched by name and order, not by guessing from translated titles.
Everything that is code stays the same in both files: command lines in fenced blocks
(comments after `#` may be translated), `org <command>` names, `--flags`, inline code
spans (paths, config keys, stop reasons, quoted `org` output) and link targets.

A failure names what one README has and the other lacks; bring the other file in step.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EN_PATH = ROOT / "README.md"
JA_PATH = ROOT / "README.ja.md"
EN_LINK = "[README.ja.md](README.ja.md)"
JA_LINK = "[README.md](README.md)"

# A line in a fenced block is a command when it starts like one a reader would type.
COMMAND_PREFIXES = (
    "scripts/", "org ", ".venv/bin/", "export ", "python ", "python3 ", "pip ",
    "bench/", "claude ", "git ", "npm ", "uv ", "curl ",
)
FENCE = re.compile(r"^```.*?^```[ \t]*$", re.S | re.M)
HEADING = re.compile(r"^(#{2,3})[ \t]+(.+?)[ \t]*$", re.M)
MARK = re.compile(r"^<!--[ \t]*section:[ \t]*(.+?)[ \t]*-->[ \t]*$", re.M)
# `\w` would count kana and kanji as word characters, so name ASCII explicitly.
FLAG = re.compile(r"(?<![A-Za-z0-9_-])--[a-z][a-z0-9-]*")
ORG_COMMAND = re.compile(r"(?<![A-Za-z0-9_.-])org ([a-z][a-z-]+)")
SPAN = re.compile(r"`([^`]+)`")
LINK = re.compile(r"\]\(([^)\s]+)\)")
TRAILING_COMMENT = re.compile(r"\s+#\s.*$")


def _fenced_blocks(text: str) -> list[str]:
    return FENCE.findall(text)


def _prose(text: str) -> str:
    return FENCE.sub("", text)


def _squash(text: str) -> str:
    return " ".join(text.split())


def command_spans(text: str) -> list[tuple[str, int, int]]:
    """Logical command lines of the fenced blocks.

    Returns (command, start, end) with the command's comment dropped and its whitespace
    squashed; start/end are character offsets into `text` covering every physical line
    of the command (continuation lines ending in a backslash included).
    """
    found = []
    for block in FENCE.finditer(text):
        lines = block.group(0).splitlines(keepends=True)
        offset = block.start()
        i = 0
        while i < len(lines):
            start = offset
            parts = [lines[i]]
            offset += len(lines[i])
            while parts[-1].rstrip().endswith("\\") and i + 1 < len(lines):
                i += 1
                parts.append(lines[i])
                offset += len(lines[i])
            i += 1
            joined = " ".join(TRAILING_COMMENT.sub("", p.rstrip("\n")).rstrip().rstrip("\\")
                              for p in parts)
            command = _squash(joined)
            if command.startswith(COMMAND_PREFIXES):
                found.append((command, start, offset))
    return found


def commands(text: str) -> set[str]:
    return {command for command, _, _ in command_spans(text)}


def code_spans(text: str) -> set[str]:
    """Inline code of the prose (outside fenced blocks), whitespace squashed."""
    return {_squash(span) for span in SPAN.findall(_prose(text))}


def _code(text: str) -> str:
    """Fenced blocks without their (translatable) comments, then the inline code."""
    block_lines = [TRAILING_COMMENT.sub("", line)
                   for block in _fenced_blocks(text) for line in block.splitlines()]
    return "\n".join(block_lines + sorted(code_spans(text)))


def org_commands(text: str) -> set[str]:
    return {f"org {name}" for name in ORG_COMMAND.findall(_code(text))}


def flags(text: str) -> set[str]:
    return set(FLAG.findall(_code(text)))


def links(text: str) -> set[str]:
    return set(LINK.findall(_prose(text))) - {"README.md", "README.ja.md"}


def headings(text: str) -> list[tuple[int, str]]:
    return [(len(m.group(1)), m.group(2)) for m in HEADING.finditer(_prose(text))]


def section_marks(text: str) -> tuple[list[tuple[int, str]], list[str]]:
    """The marks of README.ja.md as (level of the heading below, English title).

    Returns the marks and a list of problems: a mark not followed by a heading, or a
    heading without a mark.
    """
    prose = _prose(text)
    lines = prose.splitlines()
    marks, problems = [], []
    for i, line in enumerate(lines):
        mark = MARK.match(line)
        if mark:
            below = HEADING.match(lines[i + 1]) if i + 1 < len(lines) else None
            if below is None:
                problems.append(f"README.ja.md: the mark for {mark.group(1)!r} is not "
                                "right above a ##/### heading")
            else:
                marks.append((len(below.group(1)), mark.group(1)))
        heading = HEADING.match(line)
        if heading and not (i > 0 and MARK.match(lines[i - 1])):
            problems.append(f"README.ja.md: heading {heading.group(2)!r} has no "
                            "<!-- section: ... --> mark naming its README.md heading")
    return marks, problems


def _one_way(kind: str, ours: set[str], theirs: set[str], missing_in: str) -> list[str]:
    return [f"{missing_in} lacks {kind} {item!r}" for item in sorted(ours - theirs)]


def parity_problems(en: str, ja: str) -> list[str]:
    """Every difference in sections, commands, flags, code and links; empty when in step."""
    problems = []
    if EN_LINK not in en:
        problems.append(f"README.md lacks the link {EN_LINK} at its top")
    if JA_LINK not in ja:
        problems.append(f"README.ja.md lacks the link {JA_LINK} at its top")

    en_sections = headings(en)
    ja_sections, mark_problems = section_marks(ja)
    problems += mark_problems
    en_titles = [title for _, title in en_sections]
    ja_titles = [title for _, title in ja_sections]
    for title in en_titles:
        if title not in ja_titles:
            problems.append(f"README.ja.md lacks section {title!r} (add its text under "
                            f"<!-- section: {title} -->)")
    for title in ja_titles:
        if title not in en_titles:
            problems.append(f"README.md lacks section {title!r} named by a mark in README.ja.md")
    shared = [s for s in en_sections if s[1] in ja_titles]
    if shared != [s for s in ja_sections if s[1] in en_titles]:
        problems.append(f"sections differ in order or level: README.md {shared} vs "
                        f"README.ja.md {ja_sections}")

    for kind, extract in (("command", commands), ("org command", org_commands),
                          ("flag", flags), ("link", links)):
        en_items, ja_items = extract(en), extract(ja)
        problems += _one_way(kind, en_items, ja_items, "README.ja.md")
        problems += _one_way(kind, ja_items, en_items, "README.md")
    problems += _one_way("inline code", code_spans(en), code_spans(ja), "README.ja.md")
    return problems


EN = EN_PATH.read_text(encoding="utf-8")
JA = JA_PATH.read_text(encoding="utf-8")


def test_readmes_match_in_sections_commands_and_code():
    """README.ja.md has every section, command, flag and code span of README.md, and back."""
    problems = parity_problems(EN, JA)
    assert not problems, "README.md and README.ja.md differ:\n" + "\n".join(problems)


def _without_section(ja: str, title: str) -> str:
    marks = list(MARK.finditer(ja))
    for i, mark in enumerate(marks):
        if mark.group(1) == title:
            end = marks[i + 1].start() if i + 1 < len(marks) else len(ja)
            return ja[:mark.start()] + ja[end:]
    raise AssertionError(f"README.ja.md has no mark for {title!r}")


@pytest.mark.parametrize("title", [title for _, title in section_marks(JA)[0]])
def test_a_section_missing_from_the_japanese_readme_fails(title):
    """Dropping any one section from README.ja.md is reported by its English heading."""
    problems = parity_problems(EN, _without_section(JA, title))
    assert f"README.ja.md lacks section {title!r}" in "\n".join(problems), problems


@pytest.mark.parametrize("command", sorted(commands(JA)))
def test_a_command_missing_from_the_japanese_readme_fails(command):
    """Dropping any one command line from README.ja.md's code blocks is reported."""
    ja = JA
    for text, start, end in reversed(command_spans(JA)):
        if text == command:
            ja = ja[:start] + ja[end:]
    problems = parity_problems(EN, ja)
    assert f"README.ja.md lacks command {command!r}" in problems, problems


def test_a_flag_and_org_command_missing_from_the_japanese_readme_fail():
    """Dropping the only line that shows `org export --patch` reports the command, its name and flag."""
    ja = "\n".join(line for line in JA.splitlines() if "org export" not in line)
    problems = parity_problems(EN, ja)
    assert "README.ja.md lacks org command 'org export'" in problems, problems
    assert "README.ja.md lacks flag '--patch'" in problems, problems


def test_a_command_only_in_the_japanese_readme_fails():
    """The check runs both ways: a command README.md does not show is reported too."""
    ja = JA.replace("scripts/org cancel ID\n", "scripts/org cancel ID\nscripts/org frobnicate --hard\n")
    problems = parity_problems(EN, ja)
    assert "README.md lacks command 'scripts/org frobnicate --hard'" in problems, problems
    assert "README.md lacks org command 'org frobnicate'" in problems, problems
    assert "README.md lacks flag '--hard'" in problems, problems


def test_inline_code_dropped_from_the_japanese_readme_fails():
    """A stop reason, path or config key written as code in README.md must stay in README.ja.md."""
    ja = JA.replace("`sandbox.disk_mb`", "ディスク上限")
    problems = parity_problems(EN, ja)
    assert "README.ja.md lacks inline code 'sandbox.disk_mb'" in problems, problems


def test_a_heading_without_its_mark_fails():
    """A Japanese heading must say which README.md heading it stands for."""
    ja = JA.replace("<!-- section: Dashboard -->\n", "")
    problems = "\n".join(parity_problems(EN, ja))
    assert "has no <!-- section: ... --> mark" in problems
    assert "README.ja.md lacks section 'Dashboard'" in problems
