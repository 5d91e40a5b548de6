"""Grouping notes on one topic: deterministic average-link clustering over unit vectors.

1. **Online pass** — notes are taken in the given order (oldest first); each joins the group
   with the highest *average* cosine to its members (``v·Σm / k``) if that is ≥ the threshold,
   otherwise it starts a new group.
2. **Merge pass** — two groups whose average pairwise cosine (``Σa·Σb / (ka·kb)``) is ≥ the
   threshold become one, best pair first, until no pair qualifies.
3. **Reassignment** — each free note moves to the group whose average cosine to it (itself
   left out) is highest, if that is ≥ the threshold and better than where it is; at most two
   rounds.

*Seed* groups (curated notes that exist already) keep their members: their archived notes
never move and two seed groups never merge; free notes may join them, and a new group may merge
into one. The result lists the seed groups first, in their given order, then new groups.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from knowledge.similarity import Vec, add_into, dot

REASSIGN_ROUNDS = 2


@dataclass
class _Group:
    members: list[int]
    total: Vec = field(default_factory=dict)
    seed: int | None = None


class _Scorer:
    """Average cosine of a vector to every live group, through an inverted index of the sums."""

    def __init__(self):
        self.postings: dict[str, dict[int, float]] = {}

    def add(self, gid: int, vec: Vec, sign: float = 1.0) -> None:
        for g, w in vec.items():
            slot = self.postings.setdefault(g, {})
            slot[gid] = slot.get(gid, 0.0) + sign * w

    def drop(self, gid: int, total: Vec) -> None:
        for g in total:
            self.postings.get(g, {}).pop(gid, None)

    def dots(self, vec: Vec) -> dict[int, float]:
        acc: dict[int, float] = {}
        for g, w in vec.items():
            slot = self.postings.get(g)
            if slot:
                for gid, sw in slot.items():
                    acc[gid] = acc.get(gid, 0.0) + w * sw
        return acc


def group(vecs: Sequence[Vec], threshold: float, seeds: Sequence[Sequence[int]] = (),
          order: Sequence[int] | None = None) -> list[list[int]]:
    """Group the indices of ``vecs``.

    Args:
        vecs: unit vectors.
        threshold: average cosine needed to join or merge.
        seeds: fixed groups (indices that never move).
        order: the free indices in the order to place them (default: every index not in a
            seed, ascending).
    Returns: groups of indices — seed groups first (same order), then new ones.
    """
    groups: dict[int, _Group] = {}
    scorer = _Scorer()
    fixed = set()
    for s, members in enumerate(seeds):
        g = _Group(list(members), seed=s)
        for i in members:
            add_into(g.total, vecs[i])
            fixed.add(i)
        groups[s] = g
        scorer.add(s, g.total)
    free = list(order) if order is not None else [i for i in range(len(vecs)) if i not in fixed]
    where: dict[int, int] = {}
    next_id = len(seeds)

    # 1. online
    for i in free:
        best, best_score = None, threshold
        for gid, d in scorer.dots(vecs[i]).items():
            score = d / len(groups[gid].members)
            if score > best_score or (score == best_score and best is not None and gid < best):
                best, best_score = gid, score
        if best is None:
            best = next_id
            next_id += 1
            groups[best] = _Group([])
        groups[best].members.append(i)
        add_into(groups[best].total, vecs[i])
        scorer.add(best, vecs[i])
        where[i] = best

    # 2. merge
    def link(a: int, b: int) -> float:
        ga, gb = groups[a], groups[b]
        if ga.seed is not None and gb.seed is not None:
            return -1.0
        return dot(ga.total, gb.total) / (len(ga.members) * len(gb.members))

    pairs = {(a, b): link(a, b) for a in groups for b in groups if a < b}
    while True:
        cand = [(s, p) for p, s in pairs.items() if s >= threshold]
        if not cand:
            break
        _, (a, b) = max(cand, key=lambda x: (x[0], -x[1][0], -x[1][1]))
        if groups[b].seed is not None:         # keep the seed's id: merge the new group into it
            a, b = b, a
        gone = groups.pop(b)
        scorer.drop(b, gone.total)
        groups[a].members.extend(gone.members)
        add_into(groups[a].total, gone.total)
        scorer.add(a, gone.total)
        for i in gone.members:
            if i in where:
                where[i] = a
        pairs = {p: s for p, s in pairs.items() if b not in p and a not in p}
        for other in groups:
            if other != a:
                pairs[(min(a, other), max(a, other))] = link(a, other)

    # 3. reassign free notes
    for _ in range(REASSIGN_ROUNDS):
        moved = 0
        for i in free:
            if not vecs[i]:
                continue                       # no grams at all: it stays where it started
            cur = where[i]
            own = groups[cur]
            k_own = len(own.members) - 1
            d = scorer.dots(vecs[i])
            stay = (d.get(cur, 0.0) - 1.0) / k_own if k_own else -1.0
            best, best_score = cur, max(stay, threshold)
            for gid, dv in d.items():
                if gid == cur:
                    continue
                score = dv / len(groups[gid].members)
                if score > best_score:
                    best, best_score = gid, score
            if best == cur:
                continue
            own.members.remove(i)
            scorer.add(cur, vecs[i], -1.0)
            add_into(own.total, {g: -w for g, w in vecs[i].items()})
            if not own.members and own.seed is None:
                scorer.drop(cur, own.total)
                del groups[cur]
            groups[best].members.append(i)
            add_into(groups[best].total, vecs[i])
            scorer.add(best, vecs[i])
            where[i] = best
            moved += 1
        if not moved:
            break

    seeded = sorted((g for g in groups.values() if g.seed is not None), key=lambda g: g.seed)
    new = [g for gid, g in sorted(groups.items()) if g.seed is None and g.members]
    return [list(g.members) for g in seeded + new]
