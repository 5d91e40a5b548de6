"""A batch of submits (``submit_many``): each item its own row, baseline and wake, through one
store connection and one connection to the coordinator, whose counters are written once when
the batch ends. A real org on ipc://."""
from __future__ import annotations

import subprocess

import pytest

from roles.operations import submit as submit_mod
from roles.operations.submit import SubmitError, SubmitRequest, submit_many
from state_db import connection
from state_db import writer as writer_mod
from state_db.kernel.config import load_config
from state_db.queries.work import Caps
from tests.support.org import query, running_org, wait_for

pytestmark = pytest.mark.timeout(120)

CONFIG = """
[org]
loop_agents = 1
[model]
name = "scripted"
"""
# the model's server named by the environment the org runs in (not org.toml): each submit reads
# the running org's environment to check it, through the batch's connection
LOCAL_MODEL = "http://127.0.0.1:9"


def _workspace(path):
    path.mkdir(parents=True)
    (path / "answer.txt").write_text("wrong\n")
    subprocess.run(["git", "init", "-q"], cwd=path, check=True)
    return path


def _request(ws, **extra):
    return SubmitRequest(goal="make answer.txt say right", workspace=str(ws), verify=["grep -q right answer.txt"],
                         caps=Caps(max_iterations=1), backend="anthropic", **extra)


def test_a_batch_submits_each_item_with_its_wake_through_one_connection(tmp_path, monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", LOCAL_MODEL)
    opened = []
    real = connection.connect

    def counted(*a, **k):
        opened.append(a[0])
        return real(*a, **k)
    monkeypatch.setattr(connection, "connect", counted)
    monkeypatch.setattr(writer_mod, "connect", counted)
    with running_org(CONFIG) as home:
        cfg = load_config(home)
        pushed_before, received_before = _pushed(home), _received(home)
        reqs = [_request(_workspace(tmp_path / f"ws{k}")) for k in range(6)]
        opened.clear()
        done = submit_many(home, cfg, reqs)
        assert [d.wake for d in done] == ["push"] * 6
        assert [d.workspace for d in done] == [r.workspace for r in reqs]
        rows = {r["id"]: r for r in query(home, "SELECT id, workspace, status FROM work_items")}
        assert set(rows) == {d.id for d in done}
        # one store connection for the rows, one for the sender's records and one for its
        # counters at the end — whatever the number of items (a lone submit opens them all each time)
        store = [p for p in opened if str(p) == str(home.db_path)]
        assert len(store) <= 3, store
        # the six wakes went out and were counted once the batch closed its connection
        assert _pushed(home) == pushed_before + 6
        # and the coordinator received each of them, once
        wait_for(lambda: _received(home) == received_before + 6, timeout=30, what="the coordinator to get six wakes")


def test_a_batch_stops_at_the_first_bad_request_keeping_the_ones_before(tmp_path, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_BASE_URL", LOCAL_MODEL)
    with running_org(CONFIG) as home:
        cfg = load_config(home)
        good = _workspace(tmp_path / "good")
        reqs = [_request(good, idempotency_key="k-good"), _request(tmp_path / "missing"),
                _request(_workspace(tmp_path / "after"))]
        with pytest.raises(SubmitError):
            submit_many(home, cfg, reqs)
        assert [r["workspace"] for r in query(home, "SELECT workspace FROM work_items")] == [str(good)]
        # the same batch again, its first request now known by its key: nothing written twice
        with pytest.raises(SubmitError):
            submit_many(home, cfg, reqs)
        assert len(query(home, "SELECT id FROM work_items")) == 1


def test_an_empty_batch_opens_nothing(monkeypatch, org_home):
    monkeypatch.setattr(submit_mod, "Waker", lambda *a, **k: pytest.fail("no wake for an empty batch"))
    assert submit_many(org_home, load_config(org_home), []) == []


def _pushed(home) -> int:
    rows = query(home, "SELECT value FROM transport_counters WHERE instance = 'human' AND name = 'pushed'")
    return rows[0]["value"] if rows else 0


def _received(home) -> int:
    return query(home, "SELECT COUNT(*) AS n FROM delivery_ledger WHERE sender = 'human' "
                       "AND recipient = 'coordinator' AND kind = 'wake'")[0]["n"]
