"""Deterministic text similarity that works for English and Japanese alike.

Text is normalised (NFKC, case-folded, digit runs → ``0``, punctuation → space) and cut into
character n-grams: **3-grams** of Latin-script words (with a space at each end, so word
boundaries count) and **1- and 2-grams** of CJK runs (kanji and kana carry meaning one or two
characters at a time; Japanese has no spaces between words). Grams are weighted TF-IDF
(sublinear tf, smoothed idf over the corpus at hand) and compared by cosine. No model, no
dictionary: the same input gives the same groups on every machine.

Polarity (for contradictions) reads the *head clause* of a judgment — up to the first ``:``,
``;``, ``.``, ``。`` or ``、`` — for negation and approval markers (see ``NEGATIVE`` and
``POSITIVE``): negative if a negation marker is present, positive if only an approval marker
is, neutral otherwise.
"""
from __future__ import annotations

import math
import re
import unicodedata
from collections import Counter
from typing import Iterable, Sequence

Vec = dict[str, float]

_DIGITS = re.compile(r"\d+")
_NONWORD = re.compile(r"[\W_]+")
_CJK_CHARS = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff66-\uff9f"
_RUNS = re.compile(f"[{_CJK_CHARS}]+|[^{_CJK_CHARS}]+")
_IS_CJK = re.compile(f"[{_CJK_CHARS}]")


def normalize(text: str, drop: Iterable[str] = ()) -> str:
    """Comparable form of ``text``; substrings in ``drop`` (e.g. the run id) are removed first."""
    for part in drop:
        if part:
            text = text.replace(part, " ")
    text = unicodedata.normalize("NFKC", text).casefold()
    text = _DIGITS.sub("0", text)
    return " ".join(_NONWORD.sub(" ", text).split())


def grams(text: str, drop: Iterable[str] = ()) -> Counter:
    """Character n-grams of ``text`` (see the module docstring) with their counts."""
    out: Counter = Counter()
    for word in normalize(text, drop).split():
        for run in _RUNS.findall(word):
            if _IS_CJK.match(run):
                out.update(run)
                out.update(run[i:i + 2] for i in range(len(run) - 1))
            else:
                padded = f" {run} "
                out.update(padded[i:i + 3] for i in range(len(padded) - 2))
    return out


def idf_table(docs: Sequence[Counter]) -> dict[str, float]:
    n = len(docs)
    df: Counter = Counter()
    for d in docs:
        df.update(d.keys())
    return {g: math.log((n + 1) / (c + 1)) + 1.0 for g, c in df.items()}


def weigh(doc: Counter, idf: dict[str, float], default_idf: float = 1.0) -> Vec:
    """Unit TF-IDF vector of one document."""
    vec = {g: (1.0 + math.log(tf)) * idf.get(g, default_idf) for g, tf in doc.items()}
    norm = math.sqrt(sum(w * w for w in vec.values()))
    return {g: w / norm for g, w in vec.items()} if norm else {}


def vectorize(texts: Sequence[str], drops: Sequence[Iterable[str]] | None = None) -> list[Vec]:
    """Unit TF-IDF vectors of ``texts``, the idf taken over ``texts`` themselves."""
    docs = [grams(t, drops[i] if drops else ()) for i, t in enumerate(texts)]
    idf = idf_table(docs)
    return [weigh(d, idf) for d in docs]


def dot(a: Vec, b: Vec) -> float:
    if len(a) > len(b):
        a, b = b, a
    get = b.get
    return sum([w * get(g, 0.0) for g, w in a.items()])


def add_into(total: Vec, vec: Vec) -> None:
    for g, w in vec.items():
        total[g] = total.get(g, 0.0) + w


class Index:
    """An inverted index over documents for fast top-k cosine queries (skill selection).

    Args:
        texts: the documents; their idf is the index's idf.
    """

    def __init__(self, texts: Sequence[str]):
        docs = [grams(t) for t in texts]
        self.idf = idf_table(docs)
        self.default_idf = math.log(len(docs) + 1) + 1.0   # a gram no document has
        self.postings: dict[str, list[tuple[int, float]]] = {}
        for i, d in enumerate(docs):
            for g, w in weigh(d, self.idf).items():
                self.postings.setdefault(g, []).append((i, w))
        self.size = len(docs)

    def query(self, text: str, *, k: int, threshold: float) -> list[tuple[int, float]]:
        """Documents with cosine ≥ ``threshold`` to ``text``, best first (ties by index), at most k."""
        vec = weigh(grams(text), self.idf, self.default_idf)
        scores: dict[int, float] = {}
        for g, w in vec.items():
            for i, dw in self.postings.get(g, ()):
                scores[i] = scores.get(i, 0.0) + w * dw
        ranked = sorted(((i, s) for i, s in scores.items() if s >= threshold), key=lambda x: (-x[1], x[0]))
        return ranked[:k]


# -- polarity ----------------------------------------------------------------------------------
NEGATIVE = re.compile(
    r"\b(not|no|never|didn t|doesn t|don t|isn t|wasn t|cannot|can t|avoid|useless|unhelpful|harmful|"
    r"failed to|without effect)\b|ない|なかった|ません|避け|無効|逆効果|役立たず|効果なし")
POSITIVE = re.compile(
    r"\b(helped|helps|worked|works|fits|fit|resolved|fixed|effective|useful|recommended|heeded)\b|"
    r"有効|役立った|役に立った|解決した|効果があった|適切|うまくいった")
_HEAD = re.compile(r"[:;.。、:;]")


def polarity(judgment: str) -> int:
    """-1, 0 or +1 for the judgment's head clause (see the module docstring)."""
    head = _HEAD.split(unicodedata.normalize("NFKC", judgment).casefold(), maxsplit=1)[0]
    head = head.replace("'", " ").replace("’", " ")
    if NEGATIVE.search(head):
        return -1
    return 1 if POSITIVE.search(head) else 0
