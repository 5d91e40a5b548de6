"""The pipeline's thresholds: ``[knowledge]`` in org.toml, with the documented defaults."""
from __future__ import annotations

from dataclasses import asdict, dataclass

#: Cosine (TF-IDF over character n-grams) at or above which two notes are on one topic. Chosen
#: on the labelled English/Japanese fixture in tests/test_knowledge_consolidate.py: grouping F1
#: is 1.0 at 0.20 and stays ≥ 0.84 from 0.18 to 0.24.
SIMILARITY = 0.20


@dataclass(frozen=True)
class Thresholds:
    """Args:
        raw_notes_to_consolidate: pending raw notes that trigger a consolidation.
        notes_per_pattern: independent notes (distinct runs) that make a pattern worth scoring.
        candidates_per_batch: pending, unbatched candidates that open a review batch.
        skill_unused_days: days without use after which a skill is proposed for retirement.
        similarity: grouping threshold (see ``SIMILARITY``).
    """

    raw_notes_to_consolidate: int = 5
    notes_per_pattern: int = 3
    candidates_per_batch: int = 5
    skill_unused_days: int = 90
    similarity: float = SIMILARITY

    @classmethod
    def from_config(cls, cfg) -> "Thresholds":
        """Read ``knowledge.*`` from a ``state_db.kernel.config.Config`` (validated there)."""
        return cls(raw_notes_to_consolidate=cfg.knowledge.raw_notes_to_consolidate,
                   notes_per_pattern=cfg.knowledge.notes_per_pattern,
                   candidates_per_batch=cfg.knowledge.candidates_per_batch,
                   skill_unused_days=cfg.knowledge.skill_unused_days)

    def encode(self) -> dict:
        return asdict(self)
