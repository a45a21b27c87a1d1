"""Scoring functions: each a few lines over numpy arrays, with its source.

All statistics come from the live collection: ``n`` is the number of chunks
that default searches see, ``df`` the number of those chunks containing the
term, ``avgdl`` their mean length in terms. Scores are computed in float64
and summed over query terms in query order, so the same collection gives
bit-identical scores however it was built.
"""

from __future__ import annotations

import math
from typing import overload

import numpy as np

BM25_K1 = 1.2
BM25_B = 0.6  # Lucene uses 0.75; 0.6 measured best on SciFact train and CMRC trial (BENCHMARKS.md)


def bm25_idf(n: int, df: int) -> float:
    """BM25 inverse document frequency as in Lucene (and bm25s' ``lucene`` method):
    ``ln(1 + (N - df + 0.5) / (df + 0.5))``; always positive, unlike Robertson's
    original ``ln((N - df + 0.5) / (df + 0.5))`` which goes negative for terms in
    more than half the documents. Kamphuis et al., "Which BM25 Do You Mean? A
    Large-Scale Reproducibility Study of Scoring Variants", ECIR 2020.
    """
    return math.log(1.0 + (n - df + 0.5) / (df + 0.5))


def bm25_length_norm(doc_len: np.ndarray, avgdl: float, k1: float = BM25_K1, b: float = BM25_B) -> np.ndarray:
    """The document-length part of BM25's denominator, ``k1 * (1 - b + b * dl / avgdl)``,
    for every document at once (it depends on the document, not the term).
    Robertson & Zaragoza, "The Probabilistic Relevance Framework: BM25 and Beyond", 2009.
    When every document is empty (``avgdl`` 0: chunks whose text has no index terms, a stopword
    or a field's only), each is of the average length: ``k1`` (0 / 0 made NaNs and a warning).
    """
    if avgdl <= 0:
        return np.full(np.shape(doc_len), k1, dtype=np.float64)
    return k1 * (1.0 - b + b * doc_len / avgdl)


def bm25_term_scores(tf: np.ndarray, length_norm: np.ndarray, idf: float) -> np.ndarray:
    """Per-document contribution of one term: ``idf * tf / (tf + k1 * (1 - b + b * dl / avgdl))``,
    with the length part from :func:`bm25_length_norm`.

    Lucene's BM25 (Lucene >= 8 drops the constant ``(k1 + 1)`` numerator factor,
    which does not change the ranking). Robertson & Zaragoza, "The Probabilistic
    Relevance Framework: BM25 and Beyond", 2009; Kamphuis et al., ECIR 2020.
    """
    tf = tf.astype(np.float64)
    den = tf + length_norm
    tf *= idf  # in place: the same arithmetic as ``idf * tf / den``, one temporary fewer
    tf /= den
    return tf


@overload
def tfidf_idf(n: int, df: np.ndarray) -> np.ndarray: ...


@overload
def tfidf_idf(n: int, df: int) -> float: ...


def tfidf_idf(n: int, df: np.ndarray | int) -> np.ndarray | float:
    """Smoothed IDF ``ln((1 + N) / (1 + df)) + 1`` (as scikit-learn's
    ``TfidfVectorizer(smooth_idf=True)``); never zero, so a term in every
    document still counts a little. Salton & Buckley, "Term-weighting
    approaches in automatic text retrieval", IP&M 1988.
    """
    return np.log((1.0 + n) / (1.0 + np.asarray(df, dtype=np.float64))) + 1.0


def tfidf_tf(tf: np.ndarray) -> np.ndarray:
    """Sublinear term frequency ``1 + ln(tf)`` (Manning, Raghavan & Schütze,
    *Introduction to Information Retrieval*, 2008, §6.4.1)."""
    return 1.0 + np.log(tf.astype(np.float64))


def cosine_norms(rows: np.ndarray, weights: np.ndarray, size: int) -> np.ndarray:
    """Euclidean norm of each row's weight vector: ``sqrt(sum_t w_t^2)``.

    ``rows`` gives the row of each weight; rows' entries must come in a fixed
    order (ragdb keeps a chunk's terms in the analyzer's order) so the floating
    point sum is the same in every database holding that chunk.
    """
    return np.sqrt(np.bincount(rows, weights=weights * weights, minlength=size))
