"""Dense vectors: stored in SQLite, searched exactly with numpy, fused with BM25.

Storage (``migrations/0003_vectors.sql``)
    One row per chunk in ``vectors``: the chunk's embedding as little-endian
    float32 bytes, L2-normalized when written, so a dot product is the cosine
    similarity. float32 rather than float16: exact scores (1 KiB per 256-d
    vector, 5 MB for SciFact's 5,183 chunks); float16 can be recorded instead
    (``Store.set_vector_model(..., dtype="float16")``) to halve the size.
    A trigger deletes a chunk's vector with the chunk, whoever deletes it.
    The model is recorded in ``settings`` under ``"embedding"`` as
    ``{"model": name, "dimensions": n, "dtype": "float32"}``: vectors from a
    different model are refused with :class:`~ragdb.errors.EmbeddingError`;
    :meth:`ragdb.Database.embed` with ``rebuild=True`` (``ragdb embed --rebuild``)
    replaces every vector with a new model's.

Pending chunks (what happens when the embedder fails)
    Text and vectors are written in separate transactions: the document's
    text lands first (lexical search finds it at once); its chunks are then
    *pending* - they have no row in ``vectors`` - until :meth:`ragdb.Database.embed`
    embeds them, in batches, each batch its own transaction. If the embedder
    fails, the document stays stored and searchable lexically, its chunks stay
    pending, ``embed`` raises ``EmbeddingError`` saying how many
    are pending, and the next ``ragdb embed`` (or embedding add) fills them.
    A document is therefore never half-written: its rows are all there, and
    each of its chunks either has its vector or is visibly pending
    (:attr:`ragdb.types.VectorInfo.pending`).

Reuse (unchanged text is never embedded again)
    Each vector records the SHA-256 of its chunk text (``vectors.text_hash``,
    migration 0005). Every stored vector is of the recorded model, so in the
    transaction that writes a document, each new chunk whose text hash is
    stored - an unchanged chunk of the version it replaces (read before that
    version is deleted), or any stored chunk - gets a copy of that vector,
    with or without an embedder: editing one paragraph of a 15-chunk document
    embeds one chunk. A copy, never a move: deleting the old version (or
    keeping it, ``keep_versions``) leaves the new one's vectors alone.
    :meth:`ragdb.Database.embed` looks pending chunks up the same way and
    embeds each distinct text of a batch once. A database without vectors
    hashes nothing. (A re-chunked document reuses only chunks whose text
    came out the same: with the default ``recursive`` chunker an edit that
    changes a chunk's length can move the boundaries of the chunks after it.)

Search
    :class:`VectorIndex` keeps the vectors of one database in a numpy matrix.
    Every change to ``vectors`` is logged (``vector_log``), by this process or
    any other; before each search the index reads the log entries it has not
    seen and applies only those, so its answers always equal a fresh load.
    Search is exhaustive and exact: a float32 pass over every row (numpy's
    single-threaded loop, ~0.6 ms for 5,183 x 256) picks every row that can
    be in the top k given float32's error bound, and those few are scored in
    float64 and rounded to float32 - so a vector's score does not depend on
    where it sits in the matrix (a float32 BLAS product's does), equal vectors
    score equal, and ties are broken by content (source, position) as in
    lexical search: a database answers exactly as a rebuilt one.

    ``Database.search(scorer="vector" | "hybrid")`` (:mod:`ragdb.engine.search`)
    takes the same restrictions as lexical search (``filter``, ``since``,
    ``until``, ``as_of``, ``principals``, ``versions``); they are applied to
    both sides before any cut. Hybrid search takes a candidate pool from each
    side (BM25 hits with a positive score; chunks with positive cosine) and
    fuses them with min-max weighted sum (default, vector weight
    ``alpha=0.3``) or reciprocal rank fusion (:mod:`ragdb.index.fusion`). A chunk
    in neither pool is never returned: no zero-relevance padding.

    The default fusion, ``adaptive``, is the weighted sum with a vector weight
    chosen per query (:func:`ragdb.index.fusion.adaptive_alpha`: fitted per model and
    query language, raised when BM25 covers little of the query); measured in
    BENCHMARKS.md (section hybrid) against each side, RRF and fixed weights.

Approximate search
    From :data:`ragdb.index.ann.ANN_MIN_VECTORS` vectors on (``ann="auto"``), or always
    (``"on"``), the index asks an HNSW graph (:mod:`ragdb.index.ann`, a cache file next
    to the database) for candidates and re-scores them exactly as above; the
    restrictions are applied before the cut, with an exact scan of the allowed
    rows when they are few or too few candidates qualify.

The SQL is in :mod:`ragdb.storage.vectors`; this module holds the in-memory
index and the fusion arithmetic, and no SQL.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ragdb.errors import EmbeddingError
from ragdb.index.fusion import empty_pool

if TYPE_CHECKING:
    from ragdb.index.ann import AnnGraph
    from ragdb.storage import Store

__all__ = ["VectorIndex"]

_BLOCK = 32_768          # rows scored per block (bounds the float64 temporary)


class VectorIndex:
    """The vectors of one database as a numpy matrix, kept equal to the table
    (each open database's :class:`ragdb.engine.state.Engine` holds one, as it holds
    its lexical :class:`ragdb.index.inverted.Index`).

    :meth:`sync` (inside a transaction) applies the changes logged since the
    last call, by any connection; a cut log or a rebuild means a full reload.
    Removed rows are marked dead (id -1) and compacted once they are a quarter
    of the matrix; additions are appended into spare capacity.
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        self.version: tuple[int, int] | None = None
        self.model: dict[str, Any] | None = None
        self.dims = 0
        self.ids = np.zeros(0, np.int64)
        self.matrix = np.zeros((0, 0), np.float32)
        self.n = 0          # rows in use (live and dead)
        self.dead = 0
        #: ``auto``/``on``/``off`` for the approximate graph (:mod:`ragdb.index.ann`); None: ``$RAGDB_ANN``, else auto.
        self.ann_mode: str | None = None
        self.graph: AnnGraph | None = None
        self._graph_checked = False
        self._row_of: np.ndarray | None = None   # chunk id -> row (-1: none), built when needed
        #: How the last search ran: ``exact``, ``ann``, ``exact-allowed`` (a selective
        #: restriction: its rows scanned) or ``ann-fallback`` (too few allowed candidates).
        self.last_strategy = "exact"

    def sync(self) -> None:
        st = self.store
        version = st.vector_version()
        if version == self.version:
            return
        model = st.vector_model()
        if self.version is None or version[0] != self.version[0] or model != self.model:
            ids, mat = st.all_vectors()
            self.model = model
            self.dims = int(model["dimensions"]) if model else 0
            self.ids, self.matrix = ids, mat.reshape(len(ids), self.dims)
            self.n, self.dead = len(ids), 0
            self.graph, self._graph_checked, self._row_of = None, False, None  # reloaded or rebuilt when next needed
        else:
            changed = st.vectors_changed_since(self.version[1])
            ids, mat = st.vectors_for(changed)
            if changed:
                self._remove(np.asarray(changed, np.int64))
            self._append(ids, mat)
            if self.graph is not None and self.graph.version == self.version:
                self.graph.remove(np.asarray(changed, np.int64))
                self.graph.add(ids, mat.reshape(len(ids), self.dims))
                self.graph.version = version
        self.version = version

    def _remove(self, chunk_ids: np.ndarray) -> None:
        live = self.ids[:self.n]
        gone = np.isin(live, chunk_ids) & (live >= 0)
        k = int(gone.sum())
        self._row_of = None
        if k:
            live[gone] = -1
            self.dead += k
        if self.dead and self.dead * 4 >= self.n:
            keep = np.flatnonzero(self.ids[:self.n] >= 0)
            self.ids = self.ids[keep]
            self.matrix = self.matrix[keep]
            self.n, self.dead = len(keep), 0

    def _append(self, ids: np.ndarray, mat: np.ndarray) -> None:
        m = len(ids)
        if not m:
            return
        self._row_of = None
        need = self.n + m
        if need > len(self.ids):
            cap = max(need, int(len(self.ids) * 1.5) + 1024)
            new_ids = np.full(cap, -1, np.int64)
            new_mat = np.zeros((cap, self.dims), np.float32)
            new_ids[:self.n] = self.ids[:self.n]
            new_mat[:self.n] = self.matrix[:self.n]
            self.ids, self.matrix = new_ids, new_mat
        self.ids[self.n:need] = ids
        self.matrix[self.n:need] = mat
        self.n = need

    def __len__(self) -> int:
        return self.n - self.dead

    def exact_scores(self, q64: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Cosines of the unit float64 query with the given rows: float64 dot
        products of the float32 values (each product exact), rounded to float32.
        The result does not depend on where a vector sits in the matrix (a
        float32 matrix-vector product's rounding does), so equal vectors score
        equal and a database's answers equal a rebuilt one's."""
        out = np.empty(len(rows), np.float64)
        for a in range(0, len(rows), _BLOCK):
            out[a:a + _BLOCK] = _matvec(self.matrix[rows[a:a + _BLOCK]].astype(np.float64), q64)
        return out.astype(np.float32).astype(np.float64)

    def search(self, qvec: np.ndarray, k: int, mask: np.ndarray | None = None, *,
               min_score: float | None = None, with_ties: bool = False) -> list[tuple[int, float]]:
        """The ``k`` most similar chunks as ``(chunk id, cosine)``, best first,
        equal scores by chunk id; see :meth:`search_arrays`."""
        ids, s = self.search_arrays(qvec, k, mask, min_score=min_score, with_ties=with_ties)
        return list(zip(ids.tolist(), s.tolist()))

    def search_arrays(self, qvec: np.ndarray, k: int, mask: np.ndarray | None = None, *,
                      min_score: float | None = None, with_ties: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """(chunk ids, cosines) of the ``k`` most similar chunks, best first,
        equal scores by chunk id. ``mask``: boolean array over chunk ids (ids past
        its end are not allowed). ``min_score``: keep only scores above it
        (strictly). ``with_ties``: also return chunks tied with the k-th.

        Two stages, exact: a float32 product over all rows (fast) finds
        every row that can be in the answer - those within twice the float32
        error bound of the k-th best - and only these are scored exactly
        (:meth:`exact_scores`)."""
        q = np.asarray(qvec, np.float64).reshape(-1)
        if self.n - self.dead == 0 or k < 1:
            return empty_pool()
        if q.shape != (self.dims,):
            raise EmbeddingError(f"query vector has {q.size} dimensions; the stored vectors have {self.dims}")
        norm = float(np.linalg.norm(q))
        if not np.isfinite(norm):
            raise EmbeddingError("query vector has NaN or infinite values")
        if norm == 0:
            return empty_pool()  # cosine 0 with everything
        q = q / norm
        if self._use_graph():
            found = self._graph_search(q, k, mask, min_score, with_ties)
            if found is not None:
                return found
        self.last_strategy = "exact"
        ids = self.ids[:self.n]
        if mask is None:
            ok = ids >= 0
        elif self.n and int(ids.max()) < len(mask):  # the usual case: one gather
            ok = mask[np.maximum(ids, 0)]
            if self.dead:
                ok &= ids >= 0
        else:
            ok = np.zeros(self.n, bool)
            inside = (ids >= 0) & (ids < len(mask))
            ok[inside] = mask[ids[inside]]
        approx = _matvec(self.matrix[:self.n], q.astype(np.float32))
        if min_score is not None:
            ok &= approx > min_score - self._eps
        rows = np.flatnonzero(ok)
        return self._top_of_rows(q, k, rows, approx[rows], min_score, with_ties)

    @property
    def _eps(self) -> float:
        # |float32 dot - exact dot| <= d * 2^-24 / (1 - d * 2^-24) for unit
        # vectors (Cauchy-Schwarz), plus 2^-24 from rounding the query; doubled.
        return 2.0 * (self.dims + 2) * 2.0 ** -24

    def _top_of_rows(self, q: np.ndarray, k: int, rows: np.ndarray, approx: np.ndarray | None,
                     min_score: float | None, with_ties: bool) -> tuple[np.ndarray, np.ndarray]:
        """The exact top ``k`` among ``rows`` (``approx``: their float32 scores, if computed)."""
        eps = self._eps
        if approx is None and len(rows) > k:
            approx = _matvec(self.matrix[rows], q.astype(np.float32))
        if len(rows) > k:
            assert approx is not None
            kth = float(np.partition(approx, len(approx) - k)[len(approx) - k])
            rows = rows[approx >= kth - 2.0 * eps]
        if len(rows) == 0:
            return empty_pool()
        ids = self.ids
        s = self.exact_scores(q, rows)
        cand_ids = ids[rows]
        if min_score is not None:
            keep = s > min_score
            s, cand_ids = s[keep], cand_ids[keep]
        order = np.lexsort((cand_ids, -s))
        if len(order) > k:
            if with_ties:
                kth = s[order[k - 1]]
                order = order[s[order] >= kth]
            else:
                order = order[:k]
        return cand_ids[order], s[order]

    # -- the approximate graph (ragdb.index.ann) ----------------------------------------------
    def _use_graph(self) -> bool:
        from ragdb.index.ann import ANN_MIN_VECTORS, ann_available, ann_mode

        mode = ann_mode(self.ann_mode)
        if mode == "off" or len(self) == 0 or (mode == "auto" and len(self) < ANN_MIN_VECTORS):
            return False
        return ann_available()

    def row_of(self, chunk_ids: np.ndarray) -> np.ndarray:
        """The matrix row of each chunk id (-1: no vector)."""
        if self._row_of is None:
            ids = self.ids[:self.n]
            top = int(ids.max()) + 1 if self.n else 0
            row_of = np.full(max(top, 1), -1, np.int64)
            live = ids >= 0
            row_of[ids[live]] = np.flatnonzero(live)
            self._row_of = row_of
        r = self._row_of
        chunk_ids = np.asarray(chunk_ids, np.int64)
        out = np.full(len(chunk_ids), -1, np.int64)
        inside = (chunk_ids >= 0) & (chunk_ids < len(r))
        out[inside] = r[chunk_ids[inside]]
        return out

    def ensure_graph(self) -> AnnGraph:
        """The graph of the current vectors: kept, loaded from the cache file and brought up
        to date through the vector log, or rebuilt (inside a read transaction, after ``sync``)."""
        from ragdb.index.ann import AnnGraph, cache_folder

        assert self.version is not None
        g = self.graph
        if g is not None and g.version == self.version:
            return g
        st = self.store
        # a read-only handle writes nothing, not even the cache file (it may still read one)
        folder = cache_folder(st.path)
        writable = not getattr(st, "readonly", False)
        changed = np.zeros(0, np.int64)  # the chunks the log says changed since the graph's file
        if g is None:
            g = AnnGraph.load(folder, st.collection_id, self.dims, *self.version)
            self._graph_checked = False
        if g is not None and g.version != self.version:
            if g.version[0] != self.version[0] or g.version[1] > self.version[1]:
                g = None
            else:  # apply what the log says changed since the graph was made
                changed = np.asarray(st.vectors_changed_since(g.version[1]), np.int64)
                g.remove(changed)
                rows = self.row_of(changed)
                g.add(changed[rows >= 0], self.matrix[rows[rows >= 0]])
                g.version = self.version
        if g is not None and not self._graph_checked and not self._graph_matches(g, changed):
            g = None
        if g is None:
            g = AnnGraph(self.dims)
            live = np.flatnonzero(self.ids[:self.n] >= 0)
            g.add(self.ids[live], self.matrix[live])
            g.version = self.version
            # not inside a write transaction: a rollback would leave a file named for a log
            # position that later writes reach again with other vectors at the same chunk ids
            # (it stays unsaved: Database.close writes it under the usual rule)
            if writable and not st.in_write():
                g.save(folder, st.collection_id, *self._fingerprints())
        g.fingerprint = None  # (checked: only the loaded file's)
        self.graph, self._graph_checked = g, True
        return g

    def _fingerprints(self) -> tuple[np.ndarray, np.ndarray]:
        """(live chunk ids, their vectors' fingerprints): what a graph's file is checked by."""
        from ragdb.index.ann import fingerprints

        live = np.flatnonzero(self.ids[:self.n] >= 0)
        return self.ids[live], fingerprints(self.matrix[:self.n])[live]  # (rows in place: no copy of the matrix)

    def _graph_matches(self, g: AnnGraph, changed: np.ndarray) -> bool:
        """A loaded graph holds exactly the live chunk ids, and each vector the log names no change
        of (``changed``: those it does) is the one its file was written with, by the file's
        fingerprints (a sample of 16 vectors, the check before fingerprints, let a file of
        another history through). A file without them (missing, damaged, or an older ragdb's)
        is not loaded at all (:meth:`ragdb.index.ann.AnnGraph.load`): they hold the checksum
        that keeps a damaged graph file, which crashes usearch, from being read."""
        from ragdb.index.ann import FINGERPRINT_TOLERANCE, fingerprints

        live = self.ids[:self.n][self.ids[:self.n] >= 0]
        if len(g) != len(live) or g.fingerprint is None:
            return False
        keys = np.sort(g.keys())
        if not np.array_equal(keys, np.sort(live)):
            return False
        saved_ids, saved = g.fingerprint
        kept = keys[~np.isin(keys, changed)]
        at = np.searchsorted(saved_ids, kept)
        if len(kept) and (int(at.max()) >= len(saved_ids) or not np.array_equal(saved_ids[at], kept)):
            return False  # a chunk the file did not hold, and no change of it logged since
        now = fingerprints(self.matrix[:self.n])[self.row_of(kept)]  # (rows in place: no copy of the matrix)
        return bool(np.all(np.abs(now - saved[at]) <= FINGERPRINT_TOLERANCE * (1.0 + np.abs(now))))

    def save_graph(self, force: bool = False) -> bool:
        """Write the graph's cache file if it has enough unsaved changes (``force``: any);
        True if written. A few changes are not worth rewriting a large file for: the next
        process applies them from the vector log, which is kept far longer
        (:data:`ragdb.storage.vectors.LOG_KEEP` entries) than :data:`ragdb.index.ann.SAVE_AFTER`."""
        g = self.graph
        if g is None or not g.unsaved or g.version != self.version or getattr(self.store, "readonly", False):
            return False
        # imported once there is a graph: closing a database without one (every close after a
        # lexical search) does not import the graph's module (tempfile, shutil, random)
        from ragdb.index.ann import SAVE_AFTER, SAVE_FRACTION, cache_folder

        if not force and g.unsaved < max(SAVE_AFTER, int(SAVE_FRACTION * len(g))):
            return False
        folder = cache_folder(self.store.path)
        if folder is None or not self.store.collection_exists():
            return False  # (dropped since, by another handle or process: its files were removed, not to come back)
        return g.save(folder, self.store.collection_id, *self._fingerprints())

    def _allowed_rows(self, mask: np.ndarray | None) -> np.ndarray:
        if mask is None:
            return np.flatnonzero(self.ids[:self.n] >= 0)
        rows = self.row_of(np.flatnonzero(mask))
        return np.sort(rows[rows >= 0])

    def _graph_search(self, q: np.ndarray, k: int, mask: np.ndarray | None, min_score: float | None,
                      with_ties: bool) -> tuple[np.ndarray, np.ndarray] | None:
        """Top ``k`` through the graph, restrictions applied before the cut (see :mod:`ragdb.index.ann`)."""
        from ragdb.index.ann import EXACT_ALLOWED, MIN_CANDIDATES, OVERSAMPLE, SELECTIVE_FRACTION, ann_mode

        live = len(self)
        allowed = live if mask is None else int(np.count_nonzero(mask))
        frac = min(1.0, allowed / live)
        small = allowed <= EXACT_ALLOWED and ann_mode(self.ann_mode) == "auto"  # "on" forces the graph
        if small or frac < SELECTIVE_FRACTION:
            self.last_strategy = "exact-allowed"
            return self._top_of_rows(q, k, self._allowed_rows(mask), None, min_score, with_ties)
        g = self.ensure_graph()
        # a restricted search asks for twice the candidates its allowed fraction implies: the
        # allowed chunks are not spread evenly over a query's neighbourhood (measured: recall@10
        # 0.94 at a 10% filter with 1x, 0.99 with 2x)
        count = int(max(k * OVERSAMPLE, MIN_CANDIDATES) / frac * (2 if frac < 1 else 1)) + 1
        q32 = q.astype(np.float32)
        while True:
            cand = g.search(q32, count)
            rows = self.row_of(cand)
            ok = rows >= 0
            if mask is not None:
                inside = (cand >= 0) & (cand < len(mask))
                ok &= inside
                ok[inside] &= mask[cand[inside]]
            rows = rows[ok]
            s = self.exact_scores(q, rows)
            enough = int(np.count_nonzero(s > min_score)) if min_score is not None else len(rows)
            if enough >= k:
                self.last_strategy = "ann"
                # only the candidates: their exact float32 scores order them as the exact scan would
                return self._top_of_rows(q, k, rows, None, min_score, with_ties)
            if count >= len(g):
                break
            count = min(len(g), count * 4)
        # fewer than k allowed candidates above the floor: the graph may have missed some
        self.last_strategy = "ann-fallback"
        return None if mask is None else self._top_of_rows(q, k, self._allowed_rows(mask), None, min_score,
                                                            with_ties)


def _matvec(mat: np.ndarray, q: np.ndarray) -> np.ndarray:
    """``mat @ q`` in float32 with numpy's own single-threaded loop (einsum),
    not BLAS: a multi-threaded BLAS call wakes its worker threads for every
    query, which on a busy machine cost 12x the product itself (measured on
    two loaded cores for SciFact's 5,183 x 256: 8.8 ms against 0.7 ms)."""
    return np.einsum("ij,j->i", mat, q)
