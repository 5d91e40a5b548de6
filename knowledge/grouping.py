"""Grouping notes on one topic: deterministic average-link clustering over unit vectors.

1. **Online pass** — notes are taken in the given order (oldest first); each joins the group
   with the highest *average* cosine to its members (``v·Σm / k``) if that is ≥ the threshold,
   otherwise it starts a new group.
2. **Merge pass** — two groups whose average pairwise cosine (``Σa·Σb / (ka·kb)``) is ≥ the
   threshold become one, best pair first, until no pair qualifies.
3. **Reassignment** — each free note moves to the group whose average cosine to it (itself
   left out) is highest, if that is ≥ the threshold and better than where it is; at most two
   rounds.

Only groups that share one of a note's ``TOP_GRAMS`` heaviest grams are scored (exactly) —
a group sharing none of them cannot reach the threshold in practice, and skipping it keeps
1,000 notes well under a second.

*Keys* (optional, one per note: a derived note's ``evidence.subject``, e.g. ``check:<command>``)
are a cannot-link: a note never joins, and two groups never merge into, a group holding a note
with another key. Derived retro notes share long templates, so two notes about different checks
can reach the threshold on the template alone; notes without a key are grouped by text only.

*Seed* groups (curated notes that exist already) keep their members: their archived notes never
move and two seed groups never merge; free notes may join them, and a new group may merge into
one. The result lists the seed groups first, in their given order, then the new groups.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from knowledge.similarity import Vec, add_into, dot

REASSIGN_ROUNDS = 2
TOP_GRAMS = 24
COMMON_SLOT = 24


@dataclass
class _Group:
    members: list[int]
    total: Vec = field(default_factory=dict)
    seed: int | None = None
    keys: dict[str, int] = field(default_factory=dict)


def top_grams(vec: Vec, k: int = TOP_GRAMS) -> list[str]:
    """The ``k`` heaviest grams of ``vec`` (ties broken by the gram, for determinism)."""
    return [g for g, _ in sorted(vec.items(), key=lambda x: (-x[1], x[0]))[:k]]


class _Grouping:
    def __init__(self, vecs: Sequence[Vec], threshold: float, keys: Sequence[str | None] | None = None):
        self.vecs = vecs
        self.keys = list(keys) if keys is not None else [None] * len(vecs)
        self.threshold = threshold
        self.tops = [top_grams(v) for v in vecs]
        self.groups: dict[int, _Group] = {}
        self.index: dict[str, dict[int, int]] = {}     # gram -> group id -> members with it on top
        self.where: dict[int, int] = {}
        self.next_id = 0

    # -- bookkeeping -------------------------------------------------------------------------
    def new_group(self, seed: int | None = None) -> int:
        gid = self.next_id
        self.next_id += 1
        self.groups[gid] = _Group([], seed=seed)
        return gid

    def put(self, i: int, gid: int) -> None:
        g = self.groups[gid]
        g.members.append(i)
        add_into(g.total, self.vecs[i])
        if self.keys[i]:
            g.keys[self.keys[i]] = g.keys.get(self.keys[i], 0) + 1
        for gram in self.tops[i]:
            slot = self.index.setdefault(gram, {})
            slot[gid] = slot.get(gid, 0) + 1
        self.where[i] = gid

    def take(self, i: int) -> None:
        gid = self.where.pop(i)
        g = self.groups[gid]
        g.members.remove(i)
        add_into(g.total, {k: -w for k, w in self.vecs[i].items()})
        key = self.keys[i]
        if key:
            g.keys[key] -= 1
            if not g.keys[key]:
                del g.keys[key]
        for gram in self.tops[i]:
            slot = self.index[gram]
            slot[gid] -= 1
            if not slot[gid]:
                del slot[gid]
        if not g.members and g.seed is None:
            del self.groups[gid]

    def near(self, grams: Sequence[str]) -> set[int]:
        out: set[int] = set()
        for gram in grams:
            slot = self.index.get(gram, ())
            if len(slot) <= COMMON_SLOT:           # a gram in that many groups tells nothing
                out.update(slot)
        return out

    def avg(self, i: int, gid: int) -> float:
        """Average cosine of note i to the members of gid, i itself left out."""
        g = self.groups[gid]
        key = self.keys[i]
        if key and any(k != key for k in g.keys):
            return -1.0                          # cannot-link: another subject
        own = self.where.get(i) == gid
        k = len(g.members) - own
        if k <= 0:
            return -1.0
        return (dot(self.vecs[i], g.total) - (dot(self.vecs[i], self.vecs[i]) if own else 0.0)) / k

    def best(self, i: int) -> tuple[int | None, float]:
        best, best_score = None, self.threshold
        for gid in sorted(self.near(self.tops[i])):
            score = self.avg(i, gid)
            if score > best_score:
                best, best_score = gid, score
        return best, best_score

    def link(self, a: int, b: int) -> float:
        ga, gb = self.groups[a], self.groups[b]
        if ga.seed is not None and gb.seed is not None:
            return -1.0
        if ga.keys and gb.keys and set(ga.keys) != set(gb.keys):
            return -1.0
        return dot(ga.total, gb.total) / (len(ga.members) * len(gb.members))

    # -- passes ------------------------------------------------------------------------------
    def online(self, free: Sequence[int]) -> None:
        for i in free:
            gid, _ = self.best(i)
            self.put(i, gid if gid is not None else self.new_group())

    def merge(self) -> None:
        pairs: dict[tuple[int, int], float] = {}
        for slot in self.index.values():
            if len(slot) > COMMON_SLOT:
                continue
            ids = sorted(slot)
            for x, a in enumerate(ids):
                for b in ids[x + 1:]:
                    if (a, b) not in pairs:
                        pairs[(a, b)] = self.link(a, b)
        while True:
            cands = [(s, p) for p, s in pairs.items() if s >= self.threshold]
            if not cands:
                return
            _, (a, b) = max(cands, key=lambda x: (x[0], -x[1][0], -x[1][1]))
            if self.groups[b].seed is not None:       # the seed keeps its id: merge into it
                a, b = b, a
            moved = list(self.groups[b].members)
            for i in moved:
                self.take(i)
                self.put(i, a)
            pairs = {p: s for p, s in pairs.items() if a not in p and b not in p}
            for other in sorted(self.near([g for i in self.groups[a].members for g in self.tops[i]])):
                if other != a:
                    pairs[(min(a, other), max(a, other))] = self.link(a, other)

    def reassign(self, free: Sequence[int]) -> None:
        for _ in range(REASSIGN_ROUNDS):
            moved = 0
            for i in free:
                if not self.vecs[i]:
                    continue                    # no grams at all: it stays where it started
                cur = self.where[i]
                stay = self.avg(i, cur)
                gid, score = self.best(i)
                if gid is None or gid == cur or score <= stay:
                    continue
                self.take(i)
                self.put(i, gid)
                moved += 1
            if not moved:
                return


def group(vecs: Sequence[Vec], threshold: float, seeds: Sequence[Sequence[int]] = (),
          order: Sequence[int] | None = None, keys: Sequence[str | None] | None = None) -> list[list[int]]:
    """Group the indices of ``vecs``.

    Args:
        vecs: unit vectors.
        threshold: average cosine needed to join or merge.
        seeds: fixed groups (indices that never move).
        order: the free indices in the order to place them (default: every index not in a
            seed, ascending).
        keys: one cannot-link key (or None) per index; see the module docstring.
    Returns: groups of indices — seed groups first (same order), then new ones.
    """
    run = _Grouping(vecs, threshold, keys)
    fixed: set[int] = set()
    for s, members in enumerate(seeds):
        gid = run.new_group(seed=s)
        for i in members:
            run.put(i, gid)
            fixed.add(i)
    free = list(order) if order is not None else [i for i in range(len(vecs)) if i not in fixed]
    run.online(free)
    run.merge()
    run.reassign(free)
    seeded = sorted((g for g in run.groups.values() if g.seed is not None), key=lambda g: g.seed)
    new = [g for gid, g in sorted(run.groups.items()) if g.seed is None and g.members]
    return [list(g.members) for g in seeded + new]
