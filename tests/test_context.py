"""Bounded context assembly and the lessons fed to it."""
from __future__ import annotations

import hashlib
import json
import random

from hypothesis import given
from hypothesis import strategies as st

from roles.loop_agent.context import IterationDigest, assemble, clip_block, rolling_summary
from roles.loop_agent.lessons import Lesson, LessonBook, clip, derive_lesson, normalize

INSTRUCTIONS = ("You are a loop-agent of loop-org. Work only inside the workspace with the tools "
                "you are given. Make the smallest change that meets the goal; the eval-agent "
                "verifies every iteration and only its verdict ends the run.\n") * 6
SKILLS = [("fix-failing-test", "When a test fails, read the assertion and the code under test "
                               "before editing; change the code, never the test.\n" * 8),
          ("python-decimal", "Use decimal.Decimal(str(x)) for exact decimal arithmetic.\n" * 5)]
KNOWLEDGE = [("K-17", "Float sums such as 0.1 + 0.2 are inexact; tests comparing decimal text "
                      "need Decimal arithmetic end to end, including the parsing of inputs. " * 3),
             ("K-42", "Run the narrowest failing test first (pytest -x -q path::name); the "
                      "whole suite afterwards. " * 3)]
GOAL = ("Make calc.add accept decimal strings ('0.1', '2.50') as well as ints and floats, return "
        "exact Decimal results for decimal input and keep int + int an int. tests/test_calc.py "
        "describes the behaviour and must pass unchanged. Keep the public API of calc.py as it "
        "is, update the docstring of add, and add a line to CHANGELOG.md under 'Unreleased'. "
        "Do not add dependencies; the standard library is enough for this change. ") * 2

_SENTENCES = [
    "I read calc.py and the failing test to see how inputs reach add().",
    "The inputs were converted with float(), which loses precision for '0.1'.",
    "I switched the conversion to Decimal(str(x)) and kept ints untouched.",
    "Running pytest -x -q tests/test_calc.py still shows a rounding mismatch.",
    "The quantize call used the wrong exponent, so trailing zeros differed.",
    "I updated the docstring of add and the CHANGELOG entry.",
    "The remaining failure looks related to mixing float and Decimal operands.",
    "Next I would normalise mixed operands before adding them.",
]


def realistic_digest(rng: random.Random, n: int) -> IterationDigest:
    summary = " ".join(rng.sample(_SENTENCES, rng.randint(4, 7)))
    tools = [rng.choice(["read calc.py", "read tests/test_calc.py", "edit calc.py",
                         "run pytest -x -q tests/test_calc.py -> exit 1",
                         "search 'float(' in .", "write CHANGELOG.md"])
             for _ in range(rng.randint(4, 10))]
    return IterationDigest(
        iteration=n, summary=summary,
        outcome=f"fail: pytest (test_add_{rng.choice(['decimal', 'mixed', 'str'])}: "
                "AssertionError)",
        tool_calls=tuple(tools),
        changed_paths=tuple(rng.sample(["calc.py", "CHANGELOG.md", "docs/calc.md"],
                                       rng.randint(1, 2))))


def realistic_feedback(rng: random.Random, n: int) -> str:
    name = rng.choice(["decimal", "mixed", "str"])
    lines = [f"FAILED tests/test_calc.py::test_add_{name} - AssertionError", "",
             f"    def test_add_{name}():", "        for a, b, want in CASES:"]
    lines += [f">           assert add('{n}.{i}', '0.{i}') == Decimal('{n}.{2 * i}')"
              f"\nE           AssertionError: assert Decimal('{n}.{2 * i}0000000001') == "
              f"Decimal('{n}.{2 * i}')" for i in range(15)]
    lines += ["", f"tests/test_calc.py:{rng.randint(10, 90)}: AssertionError",
              "=========================== short test summary info ==========================",
              f"FAILED tests/test_calc.py::test_add_{name}",
              f"1 failed, {rng.randint(8, 14)} passed in 0.{rng.randint(10, 99)}s"]
    return "\n".join(lines)


def realistic_prompt(iteration_no: int, seed: int = 7):
    """The prompt of ``iteration_no`` in a run whose every earlier iteration failed."""
    rng = random.Random(seed)
    digests, book, feedback = [], LessonBook(), ""
    for n in range(1, iteration_no):
        d = realistic_digest(rng, n)
        feedback = realistic_feedback(rng, n)
        digests.append(d)
        check = d.outcome.split("(")[1].split(":")[0]
        book = book.add(derive_lesson([("pytest", f"{check}: AssertionError")], feedback), n)
    return assemble(GOAL, INSTRUCTIONS, SKILLS, KNOWLEDGE, digests, book, feedback, iteration_no)


def test_variable_part_at_iteration_30_stays_within_1_3_times_iteration_3():
    ratios = []
    for seed in range(10):
        p3, p30 = realistic_prompt(3, seed), realistic_prompt(30, seed)
        ratios.append(p30.manifest["variable_bytes"] / p3.manifest["variable_bytes"])
        assert p30.manifest["recent_iterations"] == [29, 28, 27]
        assert p30.manifest["summarized_iterations"] + p30.manifest["omitted_iterations"] == 26
    print("variable_prompt_growth_ratio max/median:", round(max(ratios), 3),
          round(sorted(ratios)[5], 3), p3.manifest["section_bytes"], p30.manifest["section_bytes"])
    assert max(ratios) <= 1.3


def test_stable_prefix_is_byte_identical_across_iterations():
    prompts = [realistic_prompt(n) for n in (1, 2, 3, 10, 30)]
    assert len({p.system_prefix for p in prompts}) == 1
    prefix = prompts[0].system_prefix
    assert prefix.startswith(INSTRUCTIONS.strip()) and "## Skill: python-decimal" in prefix
    for p in prompts:
        assert "Iteration:" not in p.system_prefix and GOAL[:40] not in p.system_prefix


def test_variable_part_starts_with_the_exact_iteration_line():
    for n in (1, 4, 30):
        assert realistic_prompt(n).variable.split("\n", 1)[0] == f"Iteration: {n}"


def test_manifest_records_sizes_ids_and_a_hash_of_the_whole_prompt():
    p = realistic_prompt(8)
    m = p.manifest
    assert m["iteration"] == 8
    assert m["prefix_bytes"] == len(p.system_prefix.encode())
    assert m["variable_bytes"] == len(p.variable.encode())
    assert m["skills"] == ["fix-failing-test", "python-decimal"]
    assert m["knowledge"] == ["K-17", "K-42"]
    assert len(m["lessons"]) >= 2
    assert m["sha256"] == hashlib.sha256(
        p.system_prefix.encode() + b"\0" + p.variable.encode()).hexdigest()
    assert m["recent_iterations"] == [7, 6, 5] and m["summarized_iterations"] == 4
    assert sum(m["section_bytes"].values()) <= m["variable_bytes"]
    json.dumps(m)  # recorded as JSON with the iteration


def test_hash_changes_with_content_and_not_otherwise():
    args = dict(goal="g", instructions="i", skills=[("s", "t")], knowledge=[],
                iterations=[IterationDigest(1, "did x", "fail: t (E)")],
                lessons=["try y"], feedback="E: boom", iteration_no=2)
    base = assemble(**args).manifest["sha256"]
    assert assemble(**args).manifest["sha256"] == base
    for change in ({"feedback": "E: other"}, {"lessons": ["try z"]}, {"iteration_no": 3},
                   {"skills": [("s", "t2")]}, {"knowledge": [("k", "note")]}):
        assert assemble(**{**args, **change}).manifest["sha256"] != base, change


def test_lesson_ids_in_the_manifest_are_those_of_the_lessons_shown():
    book = LessonBook().add("first lesson", 1).add("second lesson", 2)
    p = assemble("g", "i", [], [], [], book, "", 3)
    assert p.manifest["lessons"] == [book.lessons[0].id, book.lessons[1].id]
    assert p.variable.index("second lesson") < p.variable.index("first lesson")


def test_older_iterations_become_one_line_each_and_the_oldest_go_first():
    digests = [IterationDigest(n, f"attempt {n} " + "x" * 200, f"fail: t{n} (E)")
               for n in range(1, 41)]
    p = assemble("g", "i", [], [], digests, [], "", 41, k_recent=3, summary_cap_chars=500)
    summary = p.variable.split("## Earlier iterations (one line each)\n")[1].split("\n\n")[0]
    assert len(summary) <= 500
    lines = summary.splitlines()
    assert lines[0].startswith("(... ") and lines[-1].startswith("#37 ")
    kept = [int(l.split()[0][1:]) for l in lines[1:]]
    assert kept == list(range(38 - len(kept), 38))
    assert p.manifest["omitted_iterations"] == 37 - len(kept)
    assert "### Iteration 40" in p.variable and "### Iteration 38" in p.variable
    assert "### Iteration 37" not in p.variable


def test_digests_of_the_current_or_later_iterations_are_ignored():
    digests = [IterationDigest(n, f"did {n}") for n in range(1, 6)]
    p = assemble("g", "i", [], [], digests, [], "", 3)
    assert p.manifest["recent_iterations"] == [2, 1] and "did 3" not in p.variable


def test_knowledge_beyond_its_cap_is_left_out_and_not_listed():
    notes = [(f"K{i}", "n" * 900) for i in range(10)]
    p = assemble("g", "i", [], notes, [], [], "", 1, knowledge_cap_chars=2000)
    assert p.manifest["knowledge"] == ["K0", "K1", "K2"]
    assert "[K3]" not in p.variable


def test_long_feedback_keeps_its_head_and_tail():
    fb = "FIRST FAILURE\n" + "noise line\n" * 2000 + "1 failed, 3 passed"
    text = clip_block(fb, 1000)
    assert len(text) <= 1000 and text.startswith("FIRST FAILURE")
    assert text.endswith("1 failed, 3 passed") and "characters cut" in text


def test_rolling_summary_with_nothing_to_drop_keeps_every_line():
    digests = [IterationDigest(n, "short") for n in range(1, 4)]
    text, dropped = rolling_summary(digests, 10_000)
    assert dropped == 0 and len(text.splitlines()) == 3


text_st = st.text(st.characters(blacklist_categories=["Cs"]), max_size=3000)
digest_st = st.builds(IterationDigest, iteration=st.integers(1, 200), summary=text_st,
                      outcome=st.text(max_size=300),
                      tool_calls=st.lists(st.text(max_size=200), max_size=30).map(tuple),
                      changed_paths=st.lists(st.text(max_size=100), max_size=20).map(tuple))


@given(goal=text_st, digests=st.lists(digest_st, max_size=40),
       lessons=st.lists(st.text(max_size=600), max_size=8), feedback=text_st,
       knowledge=st.lists(st.tuples(st.text(max_size=10), text_st), max_size=6),
       iteration_no=st.integers(1, 250))
def test_variable_part_is_bounded_for_any_digests(goal, digests, lessons, feedback, knowledge,
                                                  iteration_no):
    caps = dict(summary_cap_chars=1200, history_cap_chars=2500, detail_cap_chars=900,
                feedback_cap_chars=1500, knowledge_cap_chars=1000, lessons_cap_chars=600,
                goal_cap_chars=800)
    p = assemble(goal, "instructions", [], knowledge, digests, lessons, feedback, iteration_no,
                 **caps)
    headers = 300  # section titles, separators and the iteration line
    bound = (caps["goal_cap_chars"] + caps["knowledge_cap_chars"] + caps["history_cap_chars"]
             + caps["feedback_cap_chars"] + caps["lessons_cap_chars"] + headers)
    assert len(p.variable) <= bound
    assert p.variable.startswith(f"Iteration: {iteration_no}\n")
    assert set(p.manifest["recent_iterations"]) <= {d.iteration for d in digests}
    assert all(n < iteration_no for n in p.manifest["recent_iterations"])


# -- lessons ---------------------------------------------------------------------------------


def test_derived_lesson_is_deterministic_short_and_names_the_failure():
    failing = [("pytest", "test_add: AssertionError"), ("ruff", "E501")]
    feedback = "\n\n  FAILED tests/test_calc.py::test_add - AssertionError\nmore"
    lesson = derive_lesson(failing, feedback)
    assert lesson == derive_lesson(failing, feedback) and len(lesson) <= 300
    assert "pytest (test_add: AssertionError)" in lesson and "ruff (E501)" in lesson
    assert "FAILED tests/test_calc.py::test_add" in lesson and "\n" not in lesson
    long = derive_lesson([(f"check{i}", "sig" * 40) for i in range(9)], "x" * 5000, max_chars=120)
    assert len(long) <= 120 and "do not repeat" in long
    assert derive_lesson([], "")


def test_lesson_book_keeps_the_most_recent_capped_and_deduplicated():
    book = LessonBook()
    for n in range(1, 8):
        book = book.add(f"Lesson number {n}: check the rounding.", n)
    assert len(book) == 5 and book.lessons[0].iteration == 7 and book.lessons[-1].iteration == 3
    again = book.add("lesson NUMBER 4 -- check the rounding", 8)
    assert len(again) == 5 and again.lessons[0].iteration == 8
    assert sum(normalize(t) == normalize("Lesson number 4: check the rounding.")
               for t in again.texts()) == 1
    assert book.lessons[0].iteration == 7  # the original book is unchanged
    assert book.add("   ", 9) is book
    assert len(LessonBook().add("y" * 1000, 1).lessons[0].text) == 300
    assert "lesson number 7: check the rounding" in book


def test_lesson_book_round_trips_through_json():
    book = LessonBook(max_lessons=3, max_chars=80).add("a", 1).add("b", 2, source="model")
    again = LessonBook.decode(book.encode())
    assert again == book and again.lessons[0] == Lesson("b", 2, "model")
    assert again.ids() == book.ids() and len(set(book.ids())) == 2


@given(st.lists(st.tuples(st.text(max_size=500), st.integers(0, 100)), max_size=30),
       st.integers(1, 6), st.integers(20, 400))
def test_lesson_book_caps_hold_for_any_sequence_of_adds(adds, max_lessons, max_chars):
    book = LessonBook(max_lessons=max_lessons, max_chars=max_chars)
    for text, n in adds:
        book = book.add(text, n)
    assert len(book) <= max_lessons
    assert all(len(t) <= max_chars for t in book.texts())
    keys = [normalize(t) for t in book.texts()]
    assert len(keys) == len(set(keys)) and all(keys)
    # the last add is first unless it is blank once clipped to max_chars (then it adds nothing)
    if adds and normalize(clip(adds[-1][0], max_chars)):
        assert book.lessons[0].iteration == adds[-1][1]


def test_default_caps_bound_the_variable_part_whatever_the_input():
    huge = "y" * 50_000
    digests = [IterationDigest(n, huge, huge, (huge,), (huge,)) for n in range(1, 500)]
    p = assemble(huge, "i", [], [(f"K{i}", huge) for i in range(50)], digests,
                 [huge] * 50, huge, 500)
    goal, knowledge, history, feedback, lessons, headers = 8000, 4000, 2000, 4000, 600, 300
    assert len(p.variable) <= goal + knowledge + history + feedback + lessons + headers
    assert p.manifest["recent_iterations"] and p.manifest["summarized_iterations"] >= 1


_LESSON_TEXTS = st.sampled_from(["Failed: verify (x). Fix it.", "failed verify x fix it", "Failed: lint (E501).",
                                 "Failed: test_a.", "", "  ", "Failed: test_b; Fix this cause directly." * 12])


@given(st.lists(_LESSON_TEXTS, max_size=25), st.integers(min_value=1, max_value=6))
def test_a_book_built_from_the_newest_end_equals_one_added_to_lesson_by_lesson(texts, max_lessons):
    entries = [(t, i + 1) for i, t in enumerate(texts)]
    added = LessonBook(max_lessons=max_lessons)
    for text, n in entries:
        added = added.add(text, n)
    latest = LessonBook.latest(entries, max_lessons)
    assert [(x.text, x.iteration) for x in latest.lessons] == [(x.text, x.iteration) for x in added.lessons]
    assert latest.encode() == added.encode()
