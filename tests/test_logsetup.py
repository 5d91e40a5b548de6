"""The role logs: one JSON render a line, rotation by size kept, /dev/null never rotated."""
from __future__ import annotations

import json
import logging

import pytest

from state_db.kernel import logsetup


@pytest.fixture
def renders(monkeypatch):
    """How many times structlog's formatter rendered a record."""
    import structlog

    count = {"n": 0}
    real = structlog.stdlib.ProcessorFormatter.format

    def counting(self, record):
        count["n"] += 1
        return real(self, record)
    monkeypatch.setattr(structlog.stdlib.ProcessorFormatter, "format", counting)
    yield count
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
        h.close()


def test_each_line_is_rendered_once_and_written_whole(tmp_path, renders):
    log = logsetup.configure(tmp_path, "loop-agent", "loop-agent-1", max_bytes=10 * 2**20)
    for i in range(5):
        log.info("model turn", turn=i, request_id=f"r{i}")
    logging.getLogger("httpx").warning("a line from the standard library")
    assert renders["n"] == 6
    lines = [json.loads(x) for x in (tmp_path / "loop-agent-1.log").read_text().splitlines()]
    assert [x.get("turn") for x in lines[:5]] == [0, 1, 2, 3, 4]
    assert lines[5]["event"] == "a line from the standard library" and lines[5]["instance"] == "loop-agent-1"


def test_the_log_still_rotates_at_its_size(tmp_path, renders):
    log = logsetup.configure(tmp_path, "eval-agent", "eval-agent", max_bytes=2000, backups=2)
    for i in range(60):
        log.info("verdict", work_id="w1", iteration=i, outcome="fail")
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["eval-agent.log", "eval-agent.log.1", "eval-agent.log.2"], files
    assert all(p.stat().st_size <= 2000 for p in tmp_path.iterdir())
    last = json.loads((tmp_path / "eval-agent.log").read_text().splitlines()[-1])
    assert last["iteration"] == 59                      # nothing lost from the newest file


def test_a_log_that_is_not_a_regular_file_is_never_rotated(tmp_path):
    handler = logsetup.RotatingLog("/dev/null", maxBytes=10, backupCount=1)
    try:
        record = logging.LogRecord("x", logging.INFO, __file__, 1, "a line longer than ten bytes", (), None)
        assert handler.shouldRollover(record) is False
        handler.emit(record)
    finally:
        handler.close()
