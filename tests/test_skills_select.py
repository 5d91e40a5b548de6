"""Choosing skills and knowledge for a loop's context, and counting use once per run."""
from __future__ import annotations

import pytest

from knowledge import consolidate as K
from knowledge.thresholds import Thresholds
from roles.loop_agent.engine import LoopSettings
from skills import candidates as C, registry, select
from skills.drafting import CandidateDraft
from state_db.vocab import Actor
from tests.support.loop import CHECK
from tests.test_knowledge_helpers import BAD, BAD2, GOOD, note, put_notes, rows, run_loop

SKILLS = {
    "fix-calc-add": ("Use for work items verified by `python -c 'import calc; assert calc.add(2, 3) == 5'` whose "
                     "output shows AssertionError.", "Check calc.add and its operator."),
    "mock-network": ("Use when tests call the network (requests, urllib, ConnectionError) in the sandbox.",
                     "Mock the HTTP client; never fetch at test time."),
    "timezone-aware": ("日付やタイムゾーン (UTC, JST) を扱うテストが失敗するときに使う。", "datetime はタイムゾーン付きにそろえる。"),
}


def approve(writer_for, name, description, steps, run_prefix=None):
    curator, human = writer_for(Actor.CURATOR), writer_for(Actor.HUMAN)
    runs = [f"{run_prefix or name}-{k}" for k in range(3)]
    for run in runs:
        put_notes(writer_for, run, [note(f"{name} in {run}.", "When it fails twice, act.")])
    body = f"## When to use\n- {description}\n\n## Steps\n1. {steps}\n\n## Criteria and thresholds\n- twice\n\n## Pitfalls\n- none\n"
    d = CandidateDraft(name, description, body, 4, {}, tuple((f"rn-{r}-0", r) for r in runs), "cn-x")
    with curator.transaction() as tx:
        cid, _ = C.propose(tx, d, 3)
    with human.transaction() as tx:
        C.decide(tx, cid, "approve", "tester")


@pytest.fixture
def skills(writer_for):
    for name, (description, steps) in SKILLS.items():
        approve(writer_for, name, description, steps)
    return writer_for(Actor.CURATOR)


def chosen(conn, context, **kw):
    return [name for name, _ in select.choose_skills(conn, context, **kw)]


def test_the_skill_whose_trigger_matches_the_work_item_is_chosen_and_unrelated_ones_are_not(skills):
    work = {"goal": "make add() add", "verify": [CHECK]}
    assert chosen(skills.conn, select.context_of(work)) == ["fix-calc-add"]
    assert chosen(skills.conn, "Our tests fail with ConnectionError when requests reach the network") == \
        ["mock-network"]
    assert chosen(skills.conn, "JST と UTC のタイムゾーンの違いで日付のテストが失敗する") == ["timezone-aware"]
    assert chosen(skills.conn, "write a README for the project\nmarkdownlint README.md") == []


def test_choice_is_top_k_best_first_within_a_size_cap(skills):
    context = "tests fail: calc.add AssertionError, requests ConnectionError to the network, UTC/JST タイムゾーン"
    everything = chosen(skills.conn, context, k=3, threshold=0.0)
    assert len(everything) == 3 and chosen(skills.conn, context, k=1, threshold=0.0) == everything[:1]
    texts = select.choose_skills(skills.conn, context, k=3, threshold=0.0)
    one = len(texts[0][1])
    capped = select.choose_skills(skills.conn, context, k=3, threshold=0.0, cap_chars=one + 10)
    assert [n for n, _ in capped] == [texts[0][0]]
    name, text = texts[0]
    assert text.startswith(SKILLS[name][0]) and "## Steps" in text


def test_a_newly_approved_skill_is_chosen_at_once_and_a_retired_one_no_longer(writer_for, skills):
    assert chosen(skills.conn, "the parquet reader fails with ArrowInvalid on empty files") == []
    approve(writer_for, "parquet-empty", "Use when reading parquet files fails with ArrowInvalid.",
            "Check for empty files first.")
    assert chosen(skills.conn, "the parquet reader fails with ArrowInvalid on empty files") == ["parquet-empty"]
    with writer_for(Actor.HUMAN).transaction() as tx:
        registry.retire(tx, "parquet-empty")
    assert chosen(skills.conn, "the parquet reader fails with ArrowInvalid on empty files") == []


def test_use_is_counted_once_per_run_whatever_the_number_of_iterations(org_home, tmp_path, writer_for, skills):
    conn = skills.conn
    carried = select.choose_skills(conn, select.context_of({"goal": "make add() add", "verify": [CHECK]}))
    settings = LoopSettings(skills=carried)
    assert run_loop(org_home, tmp_path, "w1", [[BAD], [BAD2], [GOOD]], settings=settings).reason == "goal_met"
    loop_agent = writer_for(Actor.LOOP_AGENT, "loop-agent-1")
    assert select.record_use(loop_agent, "w1") == {"fix-calc-add": 1}
    assert select.record_use(loop_agent, "w1") == {"fix-calc-add": 1}        # again: still once
    run_loop(org_home, tmp_path, "w2", [[GOOD]], settings=settings)
    assert select.record_use(loop_agent, "w2") == {"fix-calc-add": 2}
    row = registry.skill(conn, "fix-calc-add")
    last = rows(skills, "SELECT MAX(committed_at) AS t FROM iterations")[0]["t"]
    assert (row["use_count"], row["last_used_at"]) == (2, last)
    assert registry.skill(conn, "mock-network")["use_count"] == 0
    assert select.record_use(skills)["fix-calc-add"] == 2                     # the curator's full recount agrees


def test_curated_knowledge_relevant_to_the_item_is_offered(writer_for):
    curator = writer_for(Actor.CURATOR)
    facts = ["Tests hung on an HTTP request: the sandbox has no network.",
             "requests ConnectionError in test_fetch: no network in the sandbox.",
             "CSV を Shift_JIS で読み込み UnicodeDecodeError になった。",
             "UnicodeDecodeError: 文字コードが UTF-8 でないファイルで失敗した。"]
    for k, fact in enumerate(facts):
        put_notes(writer_for, f"r{k}", [note(fact, "Mock the HTTP client." if k < 2 else "encoding を指定する。")])
    K.consolidate(curator, Thresholds(raw_notes_to_consolidate=4))
    offered = select.choose_knowledge(curator.conn, "tests fail with ConnectionError: no network access")
    assert len(offered) >= 1
    cid, body = offered[0]
    assert "HTTP" in body and cid == rows(curator, "SELECT curated_id FROM raw_notes WHERE run_id = 'r0'")[0]["curated_id"]
    ja = select.choose_knowledge(curator.conn, "UnicodeDecodeError で CSV の読み込みが失敗する")
    assert ja and "UnicodeDecodeError" in ja[0][1]


def test_a_resumed_run_keeps_the_skills_its_prompts_carried_even_if_a_better_match_appears(
        org_home, tmp_path, writer_for, skills):
    work = {"id": "w1", "goal": "make add() add", "verify": [CHECK]}
    fresh, _ = select.for_run(skills.conn, work)
    assert [n for n, _ in fresh] == ["fix-calc-add"]
    run_loop(org_home, tmp_path, "w1", [[BAD], [GOOD]], settings=LoopSettings(skills=fresh))
    approve(writer_for, "calc-add-operator", "Use for work items verified by `python -c 'import calc; assert "
            "calc.add(2, 3) == 5'`: make add() add with the + operator.", "Fix calc.add.")
    again, _ = select.for_run(skills.conn, work)
    assert again == fresh                                   # byte-identical prefix on resume
    assert "calc-add-operator" in [n for n, _ in select.for_run(skills.conn, {**work, "id": "new"})[0]]
