"""The search stage: restrictions, lexical / vector / hybrid scoring, rerank.

:class:`Searcher` answers :class:`~ragdb.options.SearchOptions` on an
:class:`~ragdb.engine.Engine`. Restrictions become one boolean mask over
chunk ids (:meth:`ragdb.index.Index.allowed`) applied before any top-k cut,
so ``k`` hits come back whenever ``k`` matching chunks exist. Lexical scores
come from the inverted index (:mod:`ragdb.index`), dense ones from the
vector index (:mod:`ragdb.vectors`); hits are built and ordered by
:mod:`ragdb.hits` for every scorer alike.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from . import confidence, scoring
from .errors import EmbeddingError, InvalidInput
from .hits import Pool, content_order, cut_with_ties, hit_order, hits_from_scored, make_hits
from .options import SearchOptions
from .storage import model_mismatch
from .types import Hit
from .vectors import dimensions_of, empty_pool, minmax_weighted_pools, rrf_pools

if TYPE_CHECKING:
    from .embeddings import Embedder
    from .engine import Engine


def _clean_query(query: object) -> str:
    if not isinstance(query, str):
        raise InvalidInput(f"query must be a string, got {type(query).__name__}")
    # a query never fails on encoding: lone surrogates become U+FFFD
    return query.encode("utf-8", "replace").decode("utf-8") if not query.isascii() else query


class QueryTerms(NamedTuple):
    """A query's terms as scoring sees them: ``counts`` (every analyzed term),
    ``known`` (term -> (id, live df) for those in the vocabulary), ``order`` (the
    terms scored, in query order) and ``bound``, the highest BM25 score a chunk
    could reach for the query (:func:`ragdb.confidence.query_bound`)."""

    counts: Counter[str]
    known: dict[str, tuple[int, int]]
    order: list[str]
    bound: float


class Searcher:
    """Runs searches on one engine."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def search(self, query: str, opts: SearchOptions) -> list[Hit]:
        query = _clean_query(query)
        if opts.reranker is not None:
            first = self._first_stage(query, opts, opts.first_stage_k)
            return list(opts.reranker.rerank(query, first, top_n=opts.k))[:opts.k]
        return self._first_stage(query, opts, opts.k)

    def _first_stage(self, query: str, opts: SearchOptions, k: int) -> list[Hit]:
        if opts.scorer == "vector":
            return self._vector(query, opts, k)
        if opts.scorer == "hybrid":
            return self._hybrid(query, opts, k)
        return self._lexical_hits(query, opts, k)

    # -- lexical --------------------------------------------------------------------
    def _lexical_hits(self, query: str, opts: SearchOptions, k: int) -> list[Hit]:
        eng = self.engine
        with eng.store.read():
            eng.sync()  # first: the restrictions read the access setting, which another connection may change
            index = eng.index
            cand, sc, contributions, terms = self.lexical(query, k, opts,
                                                          index.allowed(eng.restrictions(opts.restrictions)))
            if len(cand) == 0:
                return []
            cids, scores = cand.tolist(), sc.tolist()
            if opts.lexical == "bm25":  # the score over the query's maximum: no extra work
                conf = confidence.from_scores(scores, terms.bound)
            else:
                conf = self._confidences(terms, cand, opts)
            protos = index.hit_protos(cids)
        hits = make_hits(protos, cids, scores, contributions if opts.explain else None, conf)
        if len(sc) > 1 and bool(np.any(sc[1:] == sc[:-1])):
            # equal scores: order by source and position, which do not depend on history
            hits.sort(key=hit_order)
        return hits[:k]

    def _bm25_params(self, opts: SearchOptions) -> tuple[float, float]:
        """(k1, b) of a search: its options, else the database's settings, else the defaults."""
        settings = self.engine.settings
        k1 = float(settings.get("bm25_k1", scoring.BM25_K1) if opts.k1 is None else opts.k1)
        b = float(settings.get("bm25_b", scoring.BM25_B) if opts.b is None else opts.b)
        return k1, b

    def query_terms(self, query: str, opts: SearchOptions) -> QueryTerms:
        """The query's analyzed terms as scoring sees them (inside a read transaction, after ``sync``)."""
        eng = self.engine
        counts = Counter(eng.analyzer.terms(query))
        if not counts:
            return QueryTerms(counts, {}, [], 0.0)
        index = eng.index
        known = index.lookup_terms(list(counts))
        # Terms found only in kept older versions (df 0) cannot match a latest
        # chunk; leaving them out keeps the TF-IDF query vector equal to a
        # fresh database's. Searches of history keep them, unless no stored
        # chunk holds them any more (deleted documents' terms wait for
        # ``optimize`` in the vocabulary; a fresh database has none of them).
        order = [t for t in counts if t in known and known[t][1] > 0]
        if opts.restrictions.history:
            rare = [known[t][0] for t in counts if t in known and known[t][1] == 0]
            stored = index.stored_terms(rare) if rare else set()
            order = [t for t in counts if t in known and (known[t][1] > 0 or known[t][0] in stored)]
        # every distinct query term counts in the maximum, one no chunk holds with df 0
        bound = confidence.query_bound(index.n_chunks, [known[t][1] if t in known else 0 for t in counts])
        return QueryTerms(counts, known, order, bound)

    def _confidences(self, terms: QueryTerms, chunk_ids: np.ndarray, opts: SearchOptions) -> list[float]:
        """:attr:`Hit.confidence` of these chunks for a query (BM25 of just them over the
        query's maximum; see :mod:`ragdb.confidence`)."""
        if not terms.order or terms.bound <= 0:
            return [0.0] * len(chunk_ids)
        k1, b = self._bm25_params(opts)
        scores = confidence.chunk_bm25(self.engine.index, [terms.known[t] for t in terms.order], chunk_ids, k1, b)
        return confidence.from_scores(scores.tolist(), terms.bound)

    def lexical(self, query: str, k: int, opts: SearchOptions, mask: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, dict[int, dict[str, float]], QueryTerms]:
        """Lexical scoring without building hits (inside a read transaction, after ``sync``).

        Returns the ids and scores of the ``k`` best chunks that ``mask`` allows
        (plus any tied with the k-th), best first, equal scores by chunk id,
        per-term contributions when ``opts.explain``, and the query's terms (with
        the maximum score for confidences). Shared by lexical and hybrid search.
        """
        k1, b = self._bm25_params(opts)
        terms = self.query_terms(query, opts)
        none: tuple[np.ndarray, np.ndarray, dict[int, dict[str, float]], QueryTerms] = (
            np.zeros(0, np.int64), np.zeros(0), {}, terms)
        counts, known, order = terms.counts, terms.known, terms.order
        if not order:
            return none
        index = self.engine.index
        explain = opts.explain
        if opts.lexical == "bm25":
            scores, per_term = index.bm25([known[t] for t in order], k1, b, explain)
        else:
            scores, per_term = index.tfidf([(*known[t], counts[t]) for t in order], explain)
        n = min(len(mask), len(scores))
        cand = np.flatnonzero(mask[:n] & (scores[:n] > 0))
        if opts.min_score is not None and opts.scorer != "hybrid":  # hybrid thresholds the fused score
            cand = cand[scores[cand] >= opts.min_score]
        if len(cand) > k:
            top = np.argpartition(-scores[cand], k - 1)[:k]
            kth = scores[cand[top]].min()
            cand = cand[scores[cand] >= kth]  # keep ties at the cut for the stable order
        sc = scores[cand]
        by_score = np.lexsort((cand, -sc))
        cand, sc = cand[by_score], sc[by_score]
        contributions: dict[int, dict[str, float]] = {}
        if explain:
            for cid in cand.tolist():
                contributions[cid] = {t: float(c[cid]) for t, c in zip(order, per_term)
                                      if len(c) and c[cid] != 0.0}
        return cand, sc, contributions, terms

    # -- dense -----------------------------------------------------------------------
    def _vector_pool(self, qvec: np.ndarray, embedder: Embedder, k: int, mask: np.ndarray) -> Pool:
        """(chunk ids, cosines) of the ``k`` chunks (plus ties) with the highest
        positive cosine among those ``mask`` allows, best first, equal cosines by
        chunk id (inside a read transaction)."""
        eng = self.engine
        vi = eng.vectors
        vi.sync()
        info = vi.model  # the recorded model, re-read whenever the vectors changed
        name, dims = embedder.name, dimensions_of(embedder)
        if info is None:
            if eng.store.has_chunks():
                raise EmbeddingError("the database has no vectors: embed it first (ragdb embed --model wordllama)")
            return empty_pool()
        if (info["model"], int(info["dimensions"])) != (name, dims):
            raise EmbeddingError(model_mismatch(info, name, dims))
        return vi.search_arrays(qvec, k, mask, min_score=0.0, with_ties=True)

    def _vector(self, query: str, opts: SearchOptions, k: int) -> list[Hit]:
        """The ``k`` chunks most similar to ``query`` (exact cosine), best first;
        only chunks with positive similarity (never padding)."""
        from .embeddings import embed_query

        eng = self.engine
        eng.restrictions(opts.restrictions)  # refuse bad restrictions before embedding the query
        emb = eng.query_embedder(opts.embedder)
        if not query.strip():
            return []
        qvec = embed_query(emb, query)  # outside the transaction: an endpoint may be slow
        with eng.store.read():
            eng.sync()
            ids, sims = self._vector_pool(qvec, emb, k, eng.index.allowed(eng.restrictions(opts.restrictions)))
            if opts.min_score is not None:
                keep = sims >= opts.min_score
                ids, sims = ids[keep], sims[keep]
            pool = list(zip(ids.tolist(), sims.tolist()))
            # a vector hit's confidence is the lexical support of its chunk (ragdb.confidence)
            conf = dict(zip(ids.tolist(), self._confidences(self.query_terms(query, opts), ids, opts)))
            protos = eng.index.hit_protos([c for c, _ in pool])
        return hits_from_scored(protos, ((c, s, {"vector:cosine": s} if opts.explain else {})
                                         for c, s in pool), conf)[:k]

    def _adaptive_alpha(self, query: str, opts: SearchOptions, emb: Embedder, lex: Pool, terms: QueryTerms) -> float:
        """The vector weight of fusion ``adaptive`` for this query (:func:`ragdb.fusion.adaptive_alpha`):
        the base weight (``alpha``, else the one fitted for the model and the query's language),
        raised when the best lexical hit covers little of the query."""
        from .fusion import adaptive_alpha, base_alpha

        base = opts.alpha if opts.alpha is not None else base_alpha(emb.name, query)
        if len(lex[0]) == 0:
            return adaptive_alpha(float(base), 0.0)
        top = int(np.argmax(lex[1]))
        if opts.lexical == "bm25":  # the lexical scores are BM25: the confidence is the score over the bound
            coverage = confidence.from_scores([float(lex[1][top])], terms.bound)[0]
        else:
            coverage = self._confidences(terms, lex[0][top:top + 1], opts)[0]
        return adaptive_alpha(float(base), float(coverage))

    def _hybrid_confidences(self, terms: QueryTerms, ids: np.ndarray, lex: Pool, opts: SearchOptions
                            ) -> dict[int, float]:
        """Confidences of the fused hits: from the BM25 scores already computed for those in
        the lexical pool, from their postings for the others (vector-only candidates)."""
        if opts.lexical != "bm25" or not len(lex[0]):
            return dict(zip(ids.tolist(), self._confidences(terms, ids, opts)))
        known = dict(zip(lex[0].tolist(), confidence.from_scores(lex[1].tolist(), terms.bound)))
        rest = np.array([c for c in ids.tolist() if c not in known], np.int64)
        if len(rest):
            known.update(zip(rest.tolist(), self._confidences(terms, rest, opts)))
        return {c: known[c] for c in ids.tolist()}

    def _hybrid(self, query: str, opts: SearchOptions, k: int) -> list[Hit]:
        """Lexical and vector candidates fused into one ranking, best first.

        Candidate pools, both under the same restrictions (applied before the
        cut) and read from one snapshot: the ``max(pool, k)`` best BM25 chunks
        (positive scores only) and the ``max(pool, k)`` chunks with the highest
        positive cosine (ties at either cut are kept). ``fusion="weighted"``:
        ``alpha * minmax(cosine) + (1 - alpha) * minmax(lexical)``, each min-max
        over its own pool, a side where a chunk is absent counting 0;
        ``fusion="adaptive"`` (default): the same with ``alpha`` chosen per query
        (:meth:`_adaptive_alpha`);
        ``fusion="rrf"``: reciprocal rank fusion with constant ``rrf_k``.
        ``min_score`` drops fused scores below it. Chunks in neither pool are
        never returned."""
        from .embeddings import embed_query

        eng = self.engine
        size = max(opts.pool_size, k)
        eng.restrictions(opts.restrictions)  # refuse bad restrictions before embedding the query
        emb = eng.query_embedder(opts.embedder)
        qvec = embed_query(emb, query) if query.strip() else None  # outside the transaction
        store = eng.store
        with store.read():  # one snapshot for both sides
            eng.sync()
            index = eng.index
            mask = index.allowed(eng.restrictions(opts.restrictions))
            cand, scores, contrib, terms = self.lexical(query, size, opts, mask)
            lex: Pool = (cand.astype(np.int64), scores)
            dense = self._vector_pool(qvec, emb, size, mask) if qvec is not None else empty_pool()
            lex, dense = content_order(lex, store.chunk_sort_keys), content_order(dense, store.chunk_sort_keys)
            alpha: float | None = None
            if opts.fusion_method == "rrf":
                ids, fused = rrf_pools(lex, dense, opts.fusion_rrf_k)
            else:
                alpha = opts.fusion_alpha if opts.fusion_method == "weighted" else \
                    self._adaptive_alpha(query, opts, emb, lex, terms)
                ids, fused = minmax_weighted_pools(lex, dense, alpha)
            if opts.min_score is not None:
                keep = fused >= opts.min_score
                ids, fused = ids[keep], fused[keep]
            ids, fused = cut_with_ties(ids, fused, k)
            conf = self._hybrid_confidences(terms, ids, lex, opts)
            protos = index.hit_protos(ids.tolist())
        lex_scores = dict(zip(lex[0].tolist(), lex[1].tolist())) if opts.explain else {}
        dense_scores = dict(zip(dense[0].tolist(), dense[1].tolist())) if opts.explain else {}
        scored = []
        for cid, score in zip(ids.tolist(), fused.tolist()):
            ex: dict[str, float] = {}
            if opts.explain:
                ex.update(contrib.get(cid, {}))
                if cid in lex_scores:
                    ex[f"lexical:{opts.lexical}"] = lex_scores[cid]
                if cid in dense_scores:
                    ex["vector:cosine"] = dense_scores[cid]
                if alpha is not None:
                    ex["fusion:alpha"] = alpha
            scored.append((cid, score, ex))
        return hits_from_scored(protos, scored, conf)[:k]
