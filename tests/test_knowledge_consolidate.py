"""Consolidation: grouping (English and Japanese), merging into curated notes, contradictions,
raw notes archived and never edited."""
from __future__ import annotations

import itertools

import pytest

from knowledge import consolidate as K
from knowledge.errors import ConsolidationRaced
from knowledge.thresholds import Thresholds
from state_db.queries.knowledge import curated_notes, pending_notes as pending
from state_db.vocab import Actor
from tests.test_knowledge_helpers import note, put_notes, rows

# Labelled fixture: (topic label, fact, judgment) — 10 topics, 5 in English and 5 in Japanese,
# each note a different wording of its topic, as retros of different runs would put it.
LABELLED = [
    # A: missing module / import path
    ("import", "Check `pytest -q` failed in iterations 1 and 2 with ModuleNotFoundError: No module named 'yaml'.", "The environment lacks the yaml package; installing it is not possible in the sandbox, so vendor a tiny parser instead."),
    ("import", "pytest collection stopped: ModuleNotFoundError: No module named 'requests' in tests/test_client.py.", "Do not add network-dependent imports; the sandbox has no pip access, use urllib from the standard library."),
    ("import", "ImportError while importing test module tests/test_api.py: No module named 'app'.", "The package was not on sys.path; adding an empty __init__.py or running python -m pytest fixed the import."),
    ("import", "Verification failed three times with ModuleNotFoundError: No module named 'src.utils'.", "When pytest reports ModuleNotFoundError for a local module, check the package layout before changing code."),
    ("import", "ModuleNotFoundError: No module named 'dateutil' broke every check of the run.", "Third-party modules are missing in the verify environment; prefer the standard library."),
    ("import", "The test module could not be imported: ModuleNotFoundError for 'helpers'.", "Relative imports inside tests need a conftest.py or a package __init__.py; check the import path first."),
    ("import", "Check `python -m unittest` failed: ImportError: cannot import name 'parse' from 'config'.", "The import error came from a renamed function; keep old names importable when refactoring."),
    # B: network access blocked -> timeouts
    ("network", "Check `pytest -q` timed out after 300 s; the test tried to reach https://api.example.com.", "Tests that call the network hang in the sandbox because network access is blocked; mock the HTTP client."),
    ("network", "requests.exceptions.ConnectionError: Failed to establish a new connection in test_fetch.", "The sandbox blocks network access, so replace real HTTP calls with a fake server or a mock."),
    ("network", "socket.gaierror: Name or service not known while running the integration test.", "DNS resolution fails without network; network-dependent tests must be skipped or mocked."),
    ("network", "urllib.error.URLError: <urlopen error [Errno 101] Network is unreachable> in three iterations.", "Network is unreachable inside the sandbox; ask the human gate to lift the network block only when the goal needs it."),
    ("network", "The download step failed with a connection error because outbound network access was denied.", "Do not fetch data at test time; commit a small fixture file instead of downloading it."),
    ("network", "Integration tests hung on an HTTP request and the check timed out; no network in the sandbox.", "Mock HTTP requests in tests; real network access is unavailable and makes the check time out."),
    # C: editing protected tests
    ("protected", "Protected files were changed and restored for verification: tests/test_calc.py.", "Editing the tests to make them pass never counts; change the code under test instead."),
    ("protected", "The act modified tests/test_parser.py; the eval-agent restored the protected test file and the check still failed.", "Changing protected test files is useless because the verifier restores them from the baseline."),
    ("protected", "Iteration 2 rewrote the assertion in tests/test_math.py; the verdict reported the protected file as changed.", "Never weaken assertions in protected tests; fix the implementation so the original test passes."),
    ("protected", "Protected test file tests/test_io.py was deleted by the agent and restored for verification.", "Deleting or editing protected tests does not help: the baseline copy is used for verification."),
    ("protected", "The verdict listed tests/conftest.py among protected files changed during the act.", "Leave protected test files and fixtures alone; the eval-agent verifies against the baseline versions."),
    ("protected", "Check failed after the agent skipped the failing test with @pytest.mark.skip in a protected file.", "Skipping protected tests is reverted by the verifier; address the failing behaviour in the code."),
    # D: token budget exhausted by reading big files
    ("budget", "The run stopped with token_budget after reading the whole 40 MB log file into the prompt.", "Reading large files whole exhausts the token budget; read only the relevant lines with grep or head."),
    ("budget", "Token budget reached in iteration 3: each act printed the full test output of 5000 lines.", "Long command outputs burn tokens; run the failing test alone and cut the output."),
    ("budget", "Run ended with token_budget: 380000 of 400000 tokens used, mostly by repeated full-file reads.", "Avoid re-reading unchanged files every iteration; keep notes of what was already read."),
    ("budget", "cost_budget stopped the run after the agent dumped the entire database export into the context.", "Large dumps in the context exceed the budget; sample a few rows instead of the whole export."),
    ("budget", "Tokens ran out because the agent listed the full node_modules tree with find.", "Directory listings of vendored trees waste the token budget; exclude node_modules and similar folders."),
    ("budget", "The budget was exhausted early: each iteration re-read every source file of the project.", "Reading the whole project in every iteration exhausts the token budget; read only files the feedback names."),
    # E: flaky ordering / randomness
    ("flaky", "The test passed in iteration 2 and failed in iteration 3 without code changes: set ordering differs between runs.", "Tests that depend on set or dict ordering are flaky; sort the output before comparing."),
    ("flaky", "test_shuffle failed intermittently because random.shuffle was not seeded.", "Seed the random generator in tests so that results are reproducible."),
    ("flaky", "AssertionError: ['b', 'a'] != ['a', 'b'] appeared only in some verification runs.", "Comparing unordered collections as lists is flaky; compare sorted lists or sets."),
    ("flaky", "A flaky failure: the order of files returned by os.listdir changed between iterations.", "os.listdir order is arbitrary; sort directory listings before using them in assertions."),
    ("flaky", "Intermittent failure in test_sample caused by an unseeded random number generator.", "Random numbers in tests must come from a seeded generator or the check becomes flaky."),
    ("flaky", "The same commit failed once and passed once: hash randomization changed set iteration order.", "Do not rely on set iteration order; PYTHONHASHSEED differs between runs so sort first."),
    # F: JA encoding errors
    ("encoding", "検証コマンド `pytest -q` が UnicodeDecodeError: 'utf-8' codec can't decode byte 0x82 で失敗した。", "入力ファイルが Shift_JIS なので、open() に encoding を明示して読む必要がある。"),
    ("encoding", "CSV の読み込みで文字化けが発生し、テストが2回連続で失敗した。ファイルは Shift_JIS だった。", "文字コードを推測せず、encoding='cp932' を指定して読み込むべき。"),
    ("encoding", "UnicodeDecodeError によりイテレーション1と2の検証が失敗した。原因は BOM 付きの UTF-8 ファイル。", "BOM 付きファイルは encoding='utf-8-sig' で開くと文字コードの問題を避けられる。"),
    ("encoding", "日本語のファイル名を含むパスで文字コードのエラーが出て、チェックが失敗した。", "ファイル名やファイル内容の文字コードは UTF-8 に統一し、読み込み時に encoding を指定する。"),
    ("encoding", "テキストファイルの読み込みで 'utf-8' codec can't decode のエラーが繰り返し発生した。", "文字コードが UTF-8 でない入力には errors='replace' ではなく正しい encoding を指定すべき。"),
    ("encoding", "出力ファイルを Shift_JIS で書き出したため、比較テストで文字化けして失敗した。", "出力の文字コードはテストの期待値と同じ UTF-8 にそろえる必要がある。"),
    # G: JA infinite loop timeouts
    ("loop", "チェック `python -m unittest` が 300 秒でタイムアウトした。while ループの終了条件が誤っていた。", "無限ループを避けるため、ループの終了条件とカウンタの更新を必ず確認する。"),
    ("loop", "イテレーション3でテストが終わらず、検証がタイムアウトで打ち切られた。再帰の停止条件がなかった。", "再帰関数には必ず停止条件を書き、小さい入力で先に動作を確かめるべき。"),
    ("loop", "無限ループのためにテストがタイムアウトし、同じ失敗が2回続いて repeated_failure で停止した。", "タイムアウトが続いたら、同じ修正を繰り返さずループの終了条件を見直すべき。"),
    ("loop", "ループ内でインデックスを進め忘れ、テストがタイムアウトした。", "ループ変数の更新漏れは無限ループの典型的な原因なので、最初に確認する。"),
    ("loop", "検証でプロセスが終了せず、CPU 時間の上限に達してタイムアウトになった。原因は無限ループ。", "タイムアウトの原因はまず無限ループを疑い、ループの出口を確認する。"),
    ("loop", "テストがハングしてタイムアウトした。待ち合わせの while True ループに break がなかった。", "while True を使うときは break の条件を明示し、タイムアウト前に抜けるようにする。"),
    # H: JA dependency version mismatch
    ("version", "numpy のバージョンが 2.0 に上がり、np.float が使えずに AttributeError でテストが失敗した。", "依存パッケージのバージョン差異を考慮し、非推奨 API を使わないようにすべき。"),
    ("version", "pandas のバージョン違いで append メソッドが無くなっており、検証が失敗した。", "ライブラリのバージョンを確認し、削除された API の代わりに concat を使う。"),
    ("version", "ローカルと検証環境で依存パッケージのバージョンが異なり、テスト結果が一致しなかった。", "依存パッケージのバージョンを固定し、検証環境と同じバージョンで確認すべき。"),
    ("version", "requirements.txt にバージョン指定がなく、新しいバージョンの破壊的変更でテストが失敗した。", "依存パッケージはバージョンを固定して、破壊的変更の影響を避ける。"),
    ("version", "Python 3.11 で削除された API を古いライブラリが使っており、インポート時にエラーになった。", "Python とライブラリのバージョンの組み合わせを確認してから修正方針を決める。"),
    ("version", "pydantic のメジャーバージョンが 1 から 2 に変わり、バリデータの書き方の違いで失敗した。", "メジャーバージョンの違いによる API の変更を確認し、対応するバージョンの書き方に合わせる。"),
    # I: JA mypy type errors
    ("types", "型チェック `mypy src` が Incompatible types in assignment のエラーで失敗した。", "型ヒントと実際の値の型を一致させ、Optional の扱いを明示すべき。"),
    ("types", "mypy が None を返す可能性のある関数について型エラーを報告し、チェックが2回失敗した。", "Optional を返す関数は呼び出し側で None を確認してから使う必要がある。"),
    ("types", "型チェックで Argument 1 has incompatible type のエラーが出て検証に失敗した。", "引数の型ヒントを正しく書き、呼び出し側の型も合わせるべき。"),
    ("types", "mypy の strict モードで型注釈のない関数がエラーになり、チェックが失敗した。", "strict モードではすべての関数に型注釈を付ける必要がある。"),
    ("types", "型エラー: Item \"None\" of \"Optional[str]\" has no attribute \"strip\" により mypy が失敗した。", "Optional[str] の値は None でないことを確認してからメソッドを呼ぶ。"),
    ("types", "型チェックのエラーを # type: ignore で隠したが、レビューで差し戻された。", "型エラーは ignore で隠さず、型ヒントを直して解決すべき。"),
    # J: JA timezone handling
    ("timezone", "日付の比較テストが失敗した。datetime.now() がタイムゾーンなしで、UTC と JST の差で9時間ずれた。", "日時はタイムゾーン付きで扱い、UTC に統一して比較すべき。"),
    ("timezone", "検証環境のタイムゾーンが UTC で、ローカルの JST 前提の期待値と一致せずテストが失敗した。", "テストはタイムゾーンに依存しないように、タイムゾーンを明示して日時を作る。"),
    ("timezone", "naive な datetime と aware な datetime を比較して TypeError でテストが失敗した。", "datetime はすべてタイムゾーン付き (aware) にそろえてから比較する必要がある。"),
    ("timezone", "日付の境界で集計テストが失敗した。UTC と日本時間の日付が異なっていた。", "日付の集計はどのタイムゾーンで区切るかを明示して実装すべき。"),
    ("timezone", "time.localtime に依存したテストが CI のタイムゾーン設定で失敗した。", "ローカルタイムに依存せず、タイムゾーンを指定した datetime を使う。"),
    ("timezone", "夏時間のない JST 前提のコードで、タイムゾーン変換のテストが失敗した。", "タイムゾーン変換は zoneinfo を使い、UTC との変換を明示する。"),
]



def pairwise_f1(labels: list[str], groups: list[str]) -> tuple[float, float, float]:
    """Grouping F1 over pairs of notes: precision = pairs put in one group that share a label /
    pairs put in one group; recall = pairs that share a label put in one group / pairs that share
    a label; F1 = their harmonic mean."""
    tp = fp = fn = 0
    for i, j in itertools.combinations(range(len(labels)), 2):
        same_label, same_group = labels[i] == labels[j], groups[i] == groups[j]
        tp += same_label and same_group
        fp += same_group and not same_label
        fn += same_label and not same_group
    precision, recall = tp / (tp + fp), tp / (tp + fn)
    return 2 * precision * recall / (precision + recall), precision, recall


@pytest.fixture
def curator(writer_for):
    return writer_for(Actor.CURATOR)


def consolidate(curator, threshold=5, force=False):
    return K.consolidate(curator, Thresholds(raw_notes_to_consolidate=threshold), force=force)


def test_grouping_f1_on_a_labelled_english_and_japanese_fixture_is_at_least_0_8(writer_for, curator):
    assert len(LABELLED) >= 60
    for k, (label, fact, judgment) in enumerate(LABELLED):
        put_notes(writer_for, f"r{k:02d}", [note(fact, judgment)])
    result = consolidate(curator)
    assert result.archived == len(LABELLED)
    by_note = {r["run_id"]: r["curated_id"] for r in rows(curator, "SELECT run_id, curated_id FROM raw_notes")}
    labels = [label for label, _, _ in LABELLED]
    groups = [by_note[f"r{k:02d}"] for k in range(len(LABELLED))]
    f1, precision, recall = pairwise_f1(labels, groups)
    assert f1 >= 0.8, (f1, precision, recall)
    for script in ("english", "japanese"):          # each language on its own, too
        idx = [k for k, (_, fact, _) in enumerate(LABELLED)
               if any(ord(c) > 0x3000 for c in fact) == (script == "japanese")]
        assert pairwise_f1([labels[k] for k in idx], [groups[k] for k in idx])[0] >= 0.8, script


def test_four_pending_notes_do_not_consolidate_and_five_do(writer_for, curator):
    for k in range(4):
        put_notes(writer_for, f"r{k}", [note(f"Check `pytest -q` failed with ModuleNotFoundError in run r{k}.",
                                             "Installing packages is impossible; vendor the module.")])
    assert consolidate(curator) is None
    assert len(pending(curator.conn)) == 4
    put_notes(writer_for, "r4", [note("Check `pytest -q` failed with ModuleNotFoundError again.",
                                      "Vendor the module instead of installing it.")])
    result = consolidate(curator)
    assert result.archived == 5 and len(result.created) == 1
    assert pending(curator.conn) == []
    (cn,) = curated_notes(curator.conn)
    assert len(cn.source_notes) == 5 and "Seen in 5 run(s), 5 note(s)" in cn.body


def test_raw_notes_are_archived_never_edited_or_deleted(writer_for, curator):
    for k in range(5):
        put_notes(writer_for, f"r{k}", [note(f"Fact {k} about flaky ordering of sets.", "Sort before comparing.",
                                             kind="failure")])
    parts = "id, run_id, fact, judgment, rationale, applicability, evidence, created_at"
    before = rows(curator, f"SELECT {parts} FROM raw_notes ORDER BY id")
    consolidate(curator)
    assert rows(curator, f"SELECT {parts} FROM raw_notes ORDER BY id") == before
    after = rows(curator, "SELECT status, curated_id FROM raw_notes")
    assert {r["status"] for r in after} == {"archived"} and all(r["curated_id"] for r in after)
    archived = rows(curator, "SELECT actor, data FROM events WHERE kind = 'raw_notes.archived'")
    assert len(archived) == 5 and {a["actor"] for a in archived} == {"curator"}
    assert rows(curator, "SELECT * FROM events WHERE kind = 'raw_notes.deleted'") == []


def test_contradicting_notes_are_kept_side_by_side_and_marked(writer_for, curator):
    helped = "Skill `fix-calc` helped: it was used and the run reached goal_met."
    not_helped = "Skill `fix-calc` did not help: it was used but the run ended max_iterations."
    for k, judgment in enumerate([helped, helped, not_helped, helped, not_helped]):
        put_notes(writer_for, f"r{k}", [note(f"Skill `fix-calc` was in the prompts of iterations 1, 2 of run r{k}.",
                                             judgment, kind="context", subject="skills:fix-calc")])
    consolidate(curator)
    (cn,) = curated_notes(curator.conn)
    (c,) = cn.contradicts
    assert c["subject"] == "skills:fix-calc"
    assert c["positive"] == ["rn-r0-0", "rn-r1-0", "rn-r3-0"] and c["negative"] == ["rn-r2-0", "rn-r4-0"]
    side_by_side = cn.body.split("Contradicting judgments, kept side by side:")[1]
    assert "+ Skill `fix-calc` helped" in side_by_side and "− Skill `fix-calc` did not help" in side_by_side


def test_opposite_judgments_about_different_subjects_are_not_a_contradiction(writer_for, curator):
    for k, (skill, verdict) in enumerate([("a", "helped"), ("a", "helped"), ("b", "did not help"),
                                          ("b", "did not help"), ("a", "helped")]):
        put_notes(writer_for, f"r{k}", [note(f"Skill `fix-{skill}` was carried in run r{k}.",
                                             f"Skill `fix-{skill}` {verdict}: see the run.", kind="context",
                                             subject=f"skills:fix-{skill}")])
    consolidate(curator)
    assert all(c.contradicts == () for c in curated_notes(curator.conn))


def test_japanese_notes_on_one_topic_merge_into_one_curated_note_apart_from_another_topic(writer_for, curator):
    jst = ["タイムゾーンなしの datetime で UTC と JST が9時間ずれてテストが失敗した。",
           "検証環境のタイムゾーンが UTC で、JST 前提の日時の期待値と一致しなかった。",
           "naive な datetime と aware な datetime の比較でテストが失敗した。タイムゾーンの問題。"]
    enc = ["CSV の読み込みで UnicodeDecodeError が出た。ファイルは Shift_JIS の文字コードだった。",
           "文字コードが UTF-8 でない入力ファイルで UnicodeDecodeError により検証が失敗した。",
           "Shift_JIS のファイルを UTF-8 として読んで文字化けし、テストが失敗した。"]
    for k, fact in enumerate(jst + enc):
        put_notes(writer_for, f"j{k}", [note(fact, "タイムゾーンを明示すべき。" if k < 3 else "encoding を指定すべき。")])
    consolidate(curator)
    groups = {r["run_id"]: r["curated_id"] for r in rows(curator, "SELECT run_id, curated_id FROM raw_notes")}
    assert len({groups[f"j{k}"] for k in range(3)}) == 1 and len({groups[f"j{k}"] for k in range(3, 6)}) == 1
    assert groups["j0"] != groups["j3"]


def test_a_later_note_on_a_known_topic_joins_its_curated_note(writer_for, curator):
    for k in range(5):
        put_notes(writer_for, f"r{k}", [note(f"Tests hung on an HTTP request in run r{k}; the sandbox has no network.",
                                             "Mock HTTP requests; real network access is blocked.")])
    first = consolidate(curator)
    put_notes(writer_for, "r9", [note("An HTTP request hung the tests: no network in the sandbox.",
                                      "Mock the HTTP client in tests.")])
    later = consolidate(curator, threshold=1)
    assert later.created == () and later.updated == first.created
    (cn,) = curated_notes(curator.conn)
    assert "rn-r9-0" in cn.source_notes and len(cn.source_notes) == 6


def test_a_note_archived_by_another_curator_meanwhile_aborts_the_whole_consolidation(writer_for, monkeypatch):
    for k in range(5):
        put_notes(writer_for, f"r{k}", [note(f"Fact {k}: a budget ran out reading big files.", "Read less.")])
    mine, theirs = writer_for(Actor.CURATOR, "curator"), writer_for(Actor.CURATOR, "curator")
    real_plan = K.plan
    raced = []

    def racing_plan(*a, **kw):
        planned = real_plan(*a, **kw)
        if not raced:
            raced.append(True)
            assert K.consolidate(theirs, Thresholds()) is not None     # the other one commits first
        return planned

    monkeypatch.setattr(K, "plan", racing_plan)
    with pytest.raises(ConsolidationRaced):
        K.consolidate(mine, Thresholds())
    assert len(curated_notes(mine.conn)) == 1
    assert len(rows(mine, "SELECT * FROM events WHERE kind = 'raw_notes.archived'")) == 5
