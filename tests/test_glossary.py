"""README.ja.md renders each glossary term one way: the README's "Glossary" table (the same in
both READMEs) gives each English term its one Japanese rendering and the words not to use; the
Japanese prose (code, comments and link targets aside) uses the rendering, never those words,
and never the English term itself unless the rendering is the English term."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CODE = re.compile(r"^```.*?^```[ \t]*$|`[^`]*`|<!--.*?-->|\]\([^)]*\)", re.S | re.M)
ROW = re.compile(r"^\|\s*([^|]+?)\s*\|\s*([^|]+?)\s*\|\s*([^|]*?)\s*\|\s*$", re.M)

pytestmark = pytest.mark.timeout(30)


def split(text: str, heading: str) -> tuple[str, str]:
    """(the text without the glossary section, the glossary section)."""
    at = text.index(heading)
    title = at if heading.startswith("## ") else text.index("\n## ", at) + 1    # past a section mark
    end = text.find("\n## ", title + 1)
    end = len(text) if end < 0 else end
    return text[:at] + text[end:], text[at:end]


def table(section: str) -> list[tuple[str, str, list[str]]]:
    rows = [m.groups() for m in ROW.finditer(section)]
    assert rows[0] == ("term", "訳語", "not") and set(rows[1][0]) <= {"-"}, rows[:2]
    return [(term, chosen, [w.strip() for w in avoid.split(",") if w.strip()]) for term, chosen, avoid in rows[2:]]


def occurs(word: str, prose: str, *, plural: bool = False) -> bool:
    """Whether ``word`` is in ``prose``: an English word as whole words, any case (``plural``:
    its plural counts too)."""
    if re.fullmatch(r"[A-Za-z][A-Za-z -]*", word):
        ending = "(?:s|es)?" if plural else ""
        return re.search(rf"(?<![A-Za-z-]){re.escape(word)}{ending}(?![A-Za-z-])", prose, re.I) is not None
    return word in prose


def test_the_japanese_readme_renders_each_glossary_term_one_way():
    en_rest, en_glossary = split((ROOT / "README.md").read_text(), "## Glossary")
    ja_rest, ja_glossary = split((ROOT / "README.ja.md").read_text(), "<!-- section: Glossary -->")
    terms = table(ja_glossary)
    assert terms == table(en_glossary), "the two READMEs' glossaries differ"
    assert len(terms) >= 10
    en_prose, ja_prose = CODE.sub(" ", en_rest), CODE.sub(" ", ja_rest)
    wrong = []
    for term, chosen, avoid in terms:
        assert occurs(term, en_prose, plural=True), f"{term!r} is not a term README.md uses"
        if not occurs(chosen, ja_prose):
            wrong.append(f"{term}: {chosen!r} never used")
        for word in avoid + ([term] if chosen != term else []):
            if occurs(word, ja_prose):
                wrong.append(f"{term}: {word!r} used instead of {chosen!r}")
    assert not wrong, wrong


def test_an_unlisted_english_term_left_in_japanese_prose_is_found():
    """The check reads prose, not code: the same word inside a code span passes."""
    assert occurs("work item", "実行中の work item が")
    assert not occurs("work item", CODE.sub(" ", "実行中の `work item` が"))
    assert not occurs("iteration", "work、iterations、verdicts")
