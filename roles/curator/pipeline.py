"""One pass of the curator over state.db: retros → consolidation → patterns → candidates →
batches → skill files → use counts and retirement proposals.

Every step reads what is due from state.db and does nothing otherwise, so a pass is cheap when
nothing happened and a restarted curator simply carries on. Passes are single-flight: a pass
asked for while one runs is skipped (the running one, or the next tick, picks the work up).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import structlog

from knowledge import consolidate as K
from knowledge import findings
from knowledge import notes as N
from knowledge import record
from knowledge.errors import ConsolidationRaced, RetroExists, RunNotEnded
from knowledge.patterns import score_patterns
from knowledge.retro import RetroAuthor, derive
from knowledge.signals import RECOMMENDED
from knowledge.thresholds import Thresholds
from skills import batches, candidates, registry, select
from skills.drafting import draft
from state_db.queries import replays as replays_q
from state_db.writer import StateWriter


@dataclass
class PassReport:
    """What one pass did (for logs and tests)."""

    retros: list[str] = field(default_factory=list)
    archived: int = 0
    curated: list[str] = field(default_factory=list)
    scored: dict[str, int] = field(default_factory=dict)
    proposed: list[tuple[str, str]] = field(default_factory=list)
    batch: str | None = None
    closed: list[str] = field(default_factory=list)
    rendered: list[str] = field(default_factory=list)
    uses: dict[str, int] = field(default_factory=dict)
    retirement_proposed: list[str] = field(default_factory=list)
    skipped: bool = False

    def busy(self) -> bool:
        return bool(self.retros or self.archived or self.proposed or self.batch or self.closed or self.rendered
                    or self.retirement_proposed)


RETRO_MARGIN_S = 600.0


class Pipeline:
    """The curator's work, pure over state.db and the skills folder.

    Args:
        writer: a StateWriter as the curator.
        thresholds: ``[knowledge]`` thresholds.
        skills_dir: ``<org home>/skills``.
        author: writes a retro from a run record (default: derived, no model).
        log: structlog logger.
        wait_for_replays: replays are on ([learning]): a candidate joins a batch once its
            replays have ended (or none could be planned), so the human sees it measured.
    """

    def __init__(self, writer: StateWriter, thresholds: Thresholds, skills_dir: Path, *,
                 author: RetroAuthor = derive, log=None, clock: Callable[[], float] = time.time,
                 wait_for_replays: bool = False):
        self.w = writer
        self.t = thresholds
        self.skills_dir = Path(skills_dir)
        self.author = author
        self.log = log or structlog.get_logger("curator")
        self.clock = clock
        self._flight = threading.Lock()
        self.wait_for_replays = wait_for_replays   # a batch offers only candidates whose replays ended
        self._retros_since: float | None = None    # every run that ended before it has its retro

    def run(self, *, slow: bool = False) -> PassReport:
        """One pass; ``slow`` adds the periodic work (use recount, retirement proposals)."""
        if not self._flight.acquire(blocking=False):
            return PassReport(skipped=True)
        try:
            report = PassReport()
            report.retros = self.retros()
            self.consolidate(report)
            with self.w.transaction() as tx:
                report.batch = batches.open_if_due(tx, self.t.candidates_per_batch,
                                                   wait_for_replays=self.wait_for_replays)
                report.closed = batches.close_finished(tx)
            report.rendered = registry.ensure_rendered(self.w.conn, self.skills_dir)
            if slow:
                report.uses = select.record_use(self.w)
                with self.w.transaction() as tx:
                    report.retirement_proposed = registry.propose_retirements(tx, self.t.skill_unused_days)
            if report.busy():
                self.log.info("curated", retros=report.retros, archived=report.archived, curated=report.curated,
                              proposed=report.proposed, batch=report.batch, rendered=report.rendered,
                              retire=report.retirement_proposed, next="wait for the next ended run or tick")
            return report
        finally:
            self._flight.release()

    def retros(self, limit: int = 50) -> list[str]:
        """Write the retro of every ended run that has none (exactly once per run). A run that
        failed only because of its environment is recorded as skipped instead, whoever the
        author: no note, so no knowledge and no skill, comes of it."""
        started = self.clock()
        runs = N.runs_without_retro(self.w.conn, limit, since=self._retros_since)
        done = []
        for run_id in runs:
            try:
                if replays_q.is_replay(self.w.conn, run_id):
                    with self.w.transaction() as tx:   # it measured a skill; its lessons are the item's own
                        N.skip_retro(tx, run_id, "a replay measures a skill; it teaches nothing of its own")
                    continue
                rec = record.load(self.w.conn, run_id)
                why = findings.taught_nothing(rec)
                drafts = [] if why else self.author(rec)
                with self.w.transaction() as tx:
                    if not drafts:
                        N.skip_retro(tx, run_id, why or "the retro found nothing to say")
                        continue
                    N.write_retro(tx, run_id, drafts, author="model" if getattr(self.author, "model", False)
                                  else "derived")
                done.append(run_id)
            except (RetroExists, RunNotEnded):
                continue                        # another writer was first; nothing to do
        if len(runs) < limit:
            # every run then waiting was just seen to: the next pass looks only at what ended
            # since (less a margin for a writer that stamped its ending before it committed, or
            # on another host's clock), not through the whole history again. A run continued and
            # ended again has a new ending time; a process that starts again looks at all once.
            self._retros_since = started - RETRO_MARGIN_S
        return done

    def consolidate(self, report: PassReport) -> None:
        try:
            result = K.consolidate(self.w, self.t)
        except ConsolidationRaced as exc:
            self.log.warning("consolidation_raced", error=str(exc), next="retry on the next pass")
            return
        if result is None:
            return
        report.archived = result.archived
        report.curated = list(result.touched)
        for p in score_patterns(self.w, list(result.touched), self.t):
            report.scored[p.curated["id"]] = p.score.score
            if p.score.tier != RECOMMENDED:
                continue
            d = draft(self.w.conn, p)
            with self.w.transaction() as tx:
                cid, what = candidates.propose(tx, d, self.t.notes_per_pattern)
            report.proposed.append((d.name, what))
