"""Confidence: a score in [0, 1] that means the same for every query and corpus, and the refusal floor.

A raw BM25 score cannot be a refusal threshold: it grows with the number of
query terms and with their IDFs, which depend on the corpus, so no one number
separates weak from strong evidence ("What is the capital of Mongolia?"
against CMake docs matched three chunks on the stem ``capit``, from "capital
letter", with scores a real question could have). :attr:`ragdb.types.Hit.confidence`
is the hit's BM25 score divided by the highest BM25 score *any* chunk could
reach for that query::

    confidence(q, c) = sum_{t in q} idf(t) * tf(t, c) / (tf(t, c) + k1 * (1 - b + b * |c| / avgdl))
                       -------------------------------------------------------------------------
                                              sum_{t in q} idf(t)

The numerator is ragdb's (Lucene's) BM25 (:mod:`ragdb.index.scoring`). Its
term-frequency part is below 1 and tends to 1 as ``tf`` grows, BM25's
saturation (Robertson & Zaragoza, "The Probabilistic Relevance Framework:
BM25 and Beyond", FnTIR 2009, section 3.4), so a term adds at most its IDF and
the denominator is the score of a chunk holding every query term without
limit. Query terms (distinct, after analysis) that no chunk holds count in the
denominator with ``df = 0``, the largest IDF: a question about something the
knowledge base never mentions (``mongolia``) keeps a low confidence however
well its other words match. This is a fixed-range score normalisation in the
sense of Montague & Aslam ("Relevance Score Normalization for Metasearch",
CIKM 2001), with the query's theoretical maximum in place of the best score
observed, so the best hit of a bad query is not stretched to 1.

Measured while designing it, against the plain share of the query's IDF
mass a chunk matches (the same formula with the tf part 1 for any match): on
the SciFact train and CMRC 2018 trial queries against the off-topic
questions of benchmarks/data/ (best hit of the top 8), the normalised BM25
separated them better (ROC AUC 0.907 and 0.991, against 0.889 and 0.979),
and a weighted sum of the two was no better than it alone. The benchmark's
refusal section reports the AUC of this score on every run.

Every scorer's hits get the same score, computed from the query's terms and
the chunk's term frequencies, whatever ranked the chunk: for a BM25 search it
is the hit's score divided by the query's maximum (no extra work); for
TF-IDF, vector and hybrid searches :func:`chunk_bm25` computes the BM25 of the
returned chunks only, from the postings of the query's terms (which the
lexical side reads anyway, and caches). So a vector hit's confidence is the
lexical support of that chunk: a chunk that paraphrases the question without
sharing its words has confidence 0 and is refused under the default floor; a
knowledge base searched by meaning rather than words can turn the floor off
(``min_confidence=0``, ``ragdb config min_confidence 0``) and use
``min_score`` on the cosine instead. BM25 parameters are the search's
(``k1``/``b`` options, else the database's settings).

Everything here reads only the inverted index data the search already has:
the query's term ids and document frequencies, chunk lengths, and the
postings of the query's terms; nothing scans the chunks.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ragdb.index import scoring
from ragdb.errors import InvalidInput, StorageError
from ragdb.options import check_number

if TYPE_CHECKING:
    from ragdb.index.inverted import Index
    from ragdb.types import Hit

__all__ = ["DEFAULT_MIN_CONFIDENCE", "SETTING", "query_bound", "from_scores", "chunk_bm25",
           "check_min_confidence", "stored_min_confidence", "effective_min_confidence", "best_confidence"]

#: The confidence below which ``prompt``/``ask`` drop a hit (and refuse when none is left),
#: unless the caller or the database (setting :data:`SETTING`) says otherwise.
#:
#: Chosen with :func:`ragdb.answers.prompt.choose_threshold` (the best F1 of "answer"
#: decisions) on the best hit confidence (top 8, as ``ragdb prompt``) of every
#: judged query of the SciFact train split (809, English) and of the CMRC 2018
#: trial set (1,002, Chinese), which should be answered, and of the 60 English
#: and 60 Chinese off-topic questions of benchmarks/data/offtopic-{en,zh}.jsonl
#: asked of the corpus of their language, which should be refused (default
#: analyzer, BM25 k1=1.2 b=0.6, one chunk per document). Pooled it picked 0.190
#: (F1 0.981), rounded to 0.2. At 0.2, SciFact refuses 2.8% of its judged
#: queries (23) and 46.7% of the off-topic ones, CMRC 1.7% (17) and 88.3%;
#: held out (2-fold), 1.7% / 36.7% and 1.2% / 83.3%. Collections much smaller
#: than these (tens of chunks) have coarser IDFs and refuse more real questions
#: (9% of SciFact's at 200 documents): ``ragdb eval --calibrate`` fits one's own.
#: ``benchmarks/run.py --sections refusal --merge`` measures it again (BENCHMARKS.md).
DEFAULT_MIN_CONFIDENCE = 0.2

#: The database setting holding a calibrated floor (``ragdb eval --calibrate``,
#: ``Database.set_min_confidence``, ``ragdb config min_confidence X``); JSON null: the default.
SETTING = "min_confidence"


def query_bound(n: int, dfs: Iterable[int]) -> float:
    """The highest BM25 score any chunk can reach for a query whose distinct
    terms have document frequencies ``dfs`` among ``n`` chunks (0 for a term no
    chunk holds): the sum of their IDFs (:func:`ragdb.index.scoring.bm25_idf`)."""
    return float(sum(scoring.bm25_idf(n, df) for df in dfs))


def from_scores(scores: Sequence[float] | np.ndarray, bound: float) -> list[float]:
    """Confidences of BM25 ``scores`` of one query whose :func:`query_bound` is ``bound``,
    clipped to [0, 1]. Plain Python for a few hits, where numpy's per-call overhead cost
    more than the arithmetic; numpy from 16 (100 hits: 21 -> 4 µs), the same divisions."""
    if bound <= 0:
        return [0.0] * len(scores)
    if len(scores) >= 16:
        with np.errstate(over="ignore"):  # a score over a tiny bound: inf, clipped to 1 as in Python
            return np.clip(np.asarray(scores, dtype=np.float64) / bound, 0.0, 1.0).tolist()
    plain = scores.tolist() if isinstance(scores, np.ndarray) else scores  # Python floats out
    return [min(1.0, max(0.0, s / bound)) for s in plain]


def chunk_bm25(index: Index, terms: Sequence[tuple[int, int]], chunk_ids: Sequence[int] | np.ndarray,
               k1: float, b: float) -> np.ndarray:
    """BM25 scores of just ``chunk_ids`` for ``terms`` = [(term id, live df)], from
    the postings of those terms (inside a read transaction, after ``sync``).

    The arithmetic of :meth:`ragdb.index.inverted.Index.bm25` (:func:`ragdb.index.scoring.bm25_term_scores`),
    for a few chunks: the chunks' term frequencies are picked out of the terms'
    postings at once (one gather through a slot table over chunk ids) into a
    chunks x terms matrix, rather than scoring every chunk that holds a term;
    a constant number of numpy calls whatever the number of terms."""
    cids = np.asarray(chunk_ids, dtype=np.intp)
    n = index.n_chunks
    if not len(cids) or not terms or n == 0:
        return np.zeros(len(cids))
    postings = index.term_postings([t for t, _ in terms])
    found = [(j, postings[t]) for j, (t, _) in enumerate(terms) if t in postings]
    if not found:
        return np.zeros(len(cids))
    slot = index.scratch("confidence_slot", len(index.lengths), np.int32)
    slot.fill(-1)
    slot[cids] = np.arange(len(cids), dtype=np.int32)
    ids = np.concatenate([p[0] for _, p in found])
    tfs = np.concatenate([p[1] for _, p in found])
    col = np.repeat(np.fromiter((j for j, _ in found), np.intp, len(found)),
                    np.fromiter((len(p[0]) for _, p in found), np.intp, len(found)))
    row = slot[ids]
    hit = row >= 0
    tf = np.zeros((len(cids), len(terms)))
    tf[row[hit], col[hit]] = tfs[hit]
    idf = np.fromiter((scoring.bm25_idf(n, df) for _, df in terms), np.float64, len(terms))
    norm = scoring.bm25_length_norm(index.lengths[cids], index.total_length / n, k1, b)
    return (idf * tf / (tf + norm[:, None])).sum(axis=1)


def check_min_confidence(value: Any, name: str = "min_confidence") -> float | None:
    """None, or a number in [0, 1] (0 turns the floor off); the check of
    :func:`ragdb.options.check_number`, the one check of numbers."""
    return None if value is None else check_number(value, name, low=0.0, high=1.0)


def stored_min_confidence(settings: Any, path: str = "the database") -> float | None:
    """The floor stored in a database's ``settings`` (None: not set, the default applies).
    A stored value that is not a number in [0, 1] is a :class:`StorageError`."""
    value = settings.get(SETTING) if hasattr(settings, "get") else None
    if value is None:
        return None
    try:
        return check_min_confidence(value, SETTING)
    except InvalidInput:
        raise StorageError(f"{path}: the database is damaged: setting {SETTING!r} is {value!r}, not a number "
                           f"between 0 and 1; set it again with 'ragdb config {SETTING} X'") from None


def effective_min_confidence(min_confidence: float | None, *, min_score: float | None = None,
                             stored: float | None = None) -> float:
    """The confidence floor a prompt applies (0.0: none).

    ``min_confidence`` given (a number in [0, 1]; 0 turns refusal by confidence
    off) wins. Otherwise a ``min_score`` given is the caller's explicit rule (a
    raw score floor) and no confidence floor is added. Otherwise the database's
    stored floor ``stored`` (``ragdb eval --calibrate``), else
    :data:`DEFAULT_MIN_CONFIDENCE`."""
    given = check_min_confidence(min_confidence)
    if given is not None:
        return given
    if min_score is not None:
        return 0.0
    stored = check_min_confidence(stored, SETTING)
    return DEFAULT_MIN_CONFIDENCE if stored is None else stored


def best_confidence(hits: Iterable[Hit]) -> float | None:
    """The highest confidence among ``hits`` (None when none carries one)."""
    values = [h.confidence for h in hits if h.confidence is not None and not math.isnan(h.confidence)]
    return max(values) if values else None
