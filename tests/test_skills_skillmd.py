"""SKILL.md front matter through PyYAML: what the writer emits reads back the same, what a person
writes by hand in an editor is understood, and malformed front matter is a coded error with the
line of the text it is on."""
from __future__ import annotations

import sys

import pytest
import yaml

from skills.errors import BadSkillName, BadSkillText
from skills.skillmd import SkillText, parse, render
from state_db.kernel.errors import OrgError
from tests.test_skills_cli import org, proposed  # noqa: F401 - fixtures

BODY = "# fix-imports\n\n## When to use\n- imports break\n\n## Steps\n1. vendor it\n"

TRICKY = [
    "Use when a check says: ModuleNotFoundError.",
    'He wrote "quoted" and \'single\' text',
    "# not a comment, - not a list, [not a list], {not a map}, & * ! | > % @ `",
    "'starts with a quote",
    "two\nlines",
    "trailing colon:",
    "yes",
    "123",
    "null",
    "Japanese: テストが失敗したときに使う。",
]


@pytest.mark.parametrize("description", TRICKY)
def test_render_then_parse_gives_back_the_same_fields(description):
    text = SkillText("fix-imports", description, BODY, {"origin-runs": "w1, w2", "approved-by": "alice: admin"})
    back = parse(render(text))
    assert back == text
    assert render(back) == render(text)


def test_the_written_front_matter_is_yaml_with_name_plain_and_description_quoted():
    out = render(SkillText("fix-imports", "Use when: imports break.", BODY))
    assert out.startswith('---\nname: fix-imports\ndescription: "Use when: imports break."\n---\n\n# fix-imports\n')
    front = yaml.safe_load(out.split("---\n")[1])
    assert front == {"name": "fix-imports", "description": "Use when: imports break."}


def test_hand_edited_multi_line_descriptions_comments_and_metadata_are_read():
    folded = ("---\n"
              "# edited by hand\n"
              "name: fix-imports\n"
              "description: >\n"
              "  Use when an import fails\n"
              "  in the sandbox.\n"
              "metadata:\n"
              "  approved-by: alice   # a comment\n"
              "  origin-runs: w1, w2\n"
              "  score: 4\n"
              "---\n" + BODY)
    got = parse(folded)
    assert got.description == "Use when an import fails in the sandbox."
    assert got.metadata == {"approved-by": "alice", "origin-runs": "w1, w2", "score": "4"}
    assert got.body == BODY
    literal = "---\nname: fix-imports\ndescription: |\n  First line.\n  Second line.\n---\n" + BODY
    assert parse(literal).description == "First line.\nSecond line."
    plain = "---\nname: fix-imports\ndescription: Use when an import\n  fails in the sandbox.\n---\n" + BODY
    assert parse(plain).description == "Use when an import fails in the sandbox."
    single = "---\nname: 'fix-imports'\ndescription: 'it''s: quoted'\n---\n" + BODY
    assert parse(single).description == "it's: quoted"


@pytest.mark.parametrize("front, line, says", [
    ('name: fix-imports\ndescription: "never closed\nmetadata:\n  a: b\n', 3, "cannot read"),
    ("name: fix-imports\ndescription: a: b\n", 3, "cannot read"),
    ("name: fix-imports\n  description: indented wrongly\n", 3, "cannot read"),
    ("name: fix-imports\ndescription: one\ndescription: two\n", 4, "twice"),
    ("name: fix-imports\ndescription: 42\n", 3, "not text"),
    ("name: [fix, imports]\ndescription: d\n", 2, "not text"),
    ("name: fix-imports\n", 3, "no description"),
    ("description: d\n", 3, "no name"),
    ("name: fix-imports\ndescription: d\nmetadata: just text\n", 4, "metadata"),
    ("- name\n- description\n", 2, "not a map"),
])
def test_malformed_front_matter_is_a_coded_error_with_its_line(front, line, says):
    with pytest.raises(BadSkillText) as caught:
        parse("---\n" + front + "---\n" + BODY)
    err = caught.value
    assert isinstance(err, OrgError) and err.code == "bad_skill_text"
    assert err.lineno == line and f"line {line}," in str(err) and says in str(err), str(err)


def test_missing_fences_and_a_bad_name_are_refused():
    with pytest.raises(BadSkillText) as caught:
        parse("name: fix-imports\n")
    assert caught.value.lineno == 1
    with pytest.raises(BadSkillText, match="no closing"):
        parse("---\nname: fix-imports\ndescription: d\n")
    with pytest.raises(BadSkillName):
        parse("---\nname: Fix Imports\ndescription: d\n---\n")


def test_an_editor_that_breaks_the_front_matter_gets_one_error_line_and_changes_nothing(
        capsys, proposed, tmp_path, monkeypatch):  # noqa: F811 - fixture
    editor = tmp_path / "editor.py"
    editor.write_text("import sys\np = sys.argv[1]\nt = open(p).read()\n"
                      "open(p, 'w').write(t.replace('description: \"', 'description: \"unclosed ', 1)"
                      ".replace('is needed.\"', 'is needed.'))\n")
    monkeypatch.setenv("EDITOR", f"{sys.executable} {editor}")
    monkeypatch.delenv("VISUAL", raising=False)
    code, out, err = org(capsys, "candidates", "edit", proposed[0])
    assert code != 0 and "Traceback" not in err
    assert err.startswith("error[bad_skill_text]: SKILL.md text, line ") and len(err.strip().splitlines()) == 1
    code, out, _ = org(capsys, "candidates", "show", proposed[0], "--json")
    assert code == 0 and '"Use when fix-imports is needed."' in out
