"""Dense vectors: stored in SQLite, searched exactly with numpy, fused with BM25.

Storage (``migrations/0003_vectors.sql``)
    One row per chunk in ``vectors``: the chunk's embedding as little-endian
    float32 bytes, L2-normalized when written, so a dot product is the cosine
    similarity. float32 rather than float16: exact scores (1 KiB per 256-d
    vector, 5 MB for SciFact's 5,183 chunks); float16 can be recorded instead
    (``VectorStorage.set_model(..., dtype="float16")``) to halve the size.
    A trigger deletes a chunk's vector with the chunk, whoever deletes it.
    The model is recorded in ``settings`` under ``"embedding"`` as
    ``{"model": name, "dimensions": n, "dtype": "float32"}``: vectors from a
    different model are refused with :class:`~ragdb.errors.EmbeddingError`;
    :func:`embed_pending` with ``rebuild=True`` (``ragdb embed --rebuild``)
    replaces every vector with a new model's.

Pending chunks (what happens when the embedder fails)
    Text and vectors are written in separate transactions: the document's
    text lands first (lexical search finds it at once); its chunks are then
    *pending* - they have no row in ``vectors`` - until :func:`embed_pending`
    embeds them, in batches, each batch its own transaction. If the embedder
    fails, the document stays stored and searchable lexically, its chunks stay
    pending, :func:`embed_pending` raises ``EmbeddingError`` saying how many
    are pending, and the next ``ragdb embed`` (or embedding add) fills them.
    A document is therefore never half-written: its rows are all there, and
    each of its chunks either has its vector or is visibly pending
    (:meth:`VectorStorage.pending_count`).

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

    :func:`vector_search` and :func:`hybrid_search` take the same
    restrictions as :meth:`ragdb.Database.search` (``filter``, ``since``,
    ``until``, ``as_of``, ``principals``, ``versions``); they are applied to
    both sides before any cut. Hybrid search takes a candidate pool from each
    side (BM25 hits with a positive score; chunks with positive cosine) and
    fuses them with min-max weighted sum (default, vector weight
    ``alpha=0.3``) or reciprocal rank fusion (:mod:`ragdb.fusion`). A chunk
    in neither pool is never returned: no zero-relevance padding.

    SciFact (5,183 documents, 809 judged train queries, WordLlama 256-d),
    nDCG@10: BM25 0.702, vector 0.550, weighted alpha 0.2 / 0.3 / 0.4 / 0.5:
    0.713 / 0.718 / 0.714 / 0.699, RRF (k=60) 0.660; hence the defaults.

``VectorStorage`` is the only place here with SQL (bound parameters only;
identifiers are constants). It may move into :mod:`ragdb.storage` later.
"""

from __future__ import annotations

import sqlite3
import weakref
from typing import Any
from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np

from . import filters
from .embeddings import Embedder, embed_query, get_embedder
from .errors import EmbeddingError, InvalidInput, StorageError
from .fusion import rrf
from .storage import dumps, loads
from .types import Hit

__all__ = [
    "VectorStorage",
    "VectorIndex",
    "ensure_model",
    "embedder_for",
    "embed_pending",
    "vector_search",
    "hybrid_search",
    "vector_index",
    "check_vectors",
    "FUSIONS",
    "DEFAULT_FUSION",
    "DEFAULT_ALPHA",
    "DEFAULT_RRF_K",
    "DEFAULT_POOL",
]

FUSIONS = ("weighted", "rrf")
# Chosen from SciFact measurements (see BENCHMARKS.md): min-max weighted sum
# with vector weight 0.3 beats BM25; RRF does not.
DEFAULT_FUSION = "weighted"
DEFAULT_ALPHA = 0.3
DEFAULT_RRF_K = 60
DEFAULT_POOL = 100
DTYPES = {"float32": "<f4", "float16": "<f2"}
SETTINGS_KEY = "embedding"
LOG_KEEP = 50_000        # log entries kept before the log is cut (readers then reload everything)
_PARAM_CHUNK = 900       # bound parameters per statement (old SQLite builds allow 999)
_BLOCK = 32_768          # rows scored per block (bounds the float64 temporary)
_MAX_K = 10_000          # as ragdb.database.MAX_K


# ---------------------------------------------------------------------------
# Storage layer: every SQL statement about vectors
# ---------------------------------------------------------------------------


class VectorStorage:
    """SQL for vectors on one connection (a ``ragdb.storage.Store``'s).

    Methods must run inside the store's transactions (``store.read()`` /
    ``store.write()``); they never open their own. Identifiers below are
    constants; every value is a bound parameter.
    """

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    # -- model -------------------------------------------------------------
    def model(self) -> dict[str, Any] | None:
        """The recorded ``{"model", "dimensions", "dtype"}``, or None."""
        row = self.conn.execute("SELECT value FROM settings WHERE key = ?", [SETTINGS_KEY]).fetchone()
        return loads(row[0]) if row else None

    def set_model(self, name: str, dimensions: int, dtype: str = "float32") -> dict[str, Any]:
        """Record the model (in a write transaction). Recording the same model is
        a no-op; a different one is an error while vectors of the recorded one exist."""
        _check_model_args(name, dimensions, dtype)
        current = self.model()
        if current is not None:
            if current["model"] == name and int(current["dimensions"]) == dimensions:
                return current
            if self.has_vectors():
                raise EmbeddingError(_mismatch(current, name, dimensions))
        info = {"model": name, "dimensions": int(dimensions), "dtype": dtype}
        self._write_model(info)
        self._bump_epoch()  # in-memory indexes re-read the model
        return info

    def reset_model(self, name: str, dimensions: int, dtype: str = "float32") -> dict[str, Any]:
        """Delete every vector and record a new model (``ragdb embed --rebuild``)."""
        _check_model_args(name, dimensions, dtype)
        self.conn.execute("DELETE FROM vectors")
        self.conn.execute("DELETE FROM vector_log")
        self.conn.execute("UPDATE vector_stats SET embedded_upto = 0 WHERE id = 1")
        self._bump_epoch()
        info = {"model": name, "dimensions": int(dimensions), "dtype": dtype}
        self._write_model(info)
        return info

    def _write_model(self, info: Mapping[str, Any]) -> None:
        self.conn.execute("INSERT INTO settings (key, value) VALUES (?, ?) "
                          "ON CONFLICT (key) DO UPDATE SET value = excluded.value", [SETTINGS_KEY, dumps(info)])

    def _bump_epoch(self) -> None:
        self.conn.execute("UPDATE vector_stats SET epoch = epoch + 1 WHERE id = 1")

    # -- vectors -------------------------------------------------------------
    def put(self, rows: Sequence[tuple[int, np.ndarray]]) -> int:
        """Store ``(chunk id, vector)`` rows (L2-normalized here) under the recorded
        model; rows of chunks that no longer exist are skipped. Returns rows written."""
        info = self.model()
        if info is None:
            raise EmbeddingError("no embedding model is recorded; call set_model first")
        dims, dtype = int(info["dimensions"]), DTYPES[info["dtype"]]
        if not rows:
            return 0
        ids = [int(cid) for cid, _ in rows]
        mat = np.empty((len(rows), dims), np.float32)
        for i, (cid, vec) in enumerate(rows):
            v = np.asarray(vec, dtype=np.float32).reshape(-1)
            if v.shape != (dims,):
                raise EmbeddingError(f"vector for chunk {cid} has {v.size} dimensions; "
                                     f"the database's model {info['model']!r} has {dims}")
            mat[i] = v
        if not np.all(np.isfinite(mat)):
            raise EmbeddingError("vectors contain NaN or infinite values")
        norms = np.linalg.norm(mat.astype(np.float64), axis=1, keepdims=True)
        mat = np.divide(mat, norms, out=np.zeros_like(mat), where=norms > 0).astype(dtype)
        written = 0
        for part in range(0, len(ids), _PARAM_CHUNK):
            chunk_ids = ids[part:part + _PARAM_CHUNK]
            alive = self._existing_chunks(chunk_ids)
            todo = [(cid, mat[part + j].tobytes()) for j, cid in enumerate(chunk_ids) if cid in alive]
            self.conn.executemany("INSERT INTO vectors (chunk_id, vector) VALUES (?, ?) "
                                  "ON CONFLICT (chunk_id) DO UPDATE SET vector = excluded.vector", todo)
            self.conn.executemany("INSERT INTO vector_log (chunk_id) VALUES (?)", [(c,) for c, _ in todo])
            written += len(todo)
        self._maybe_cut_log()
        return written

    def _existing_chunks(self, chunk_ids: Sequence[int]) -> set[int]:
        q = ",".join("?" * len(chunk_ids))
        return {r[0] for r in self.conn.execute(f"SELECT id FROM chunks WHERE id IN ({q})", list(chunk_ids))}

    def _maybe_cut_log(self) -> None:
        lo, hi = self.conn.execute("SELECT coalesce(min(seq), 0), coalesce(max(seq), 0) FROM vector_log").fetchone()
        if hi - lo >= LOG_KEEP:
            self.conn.execute("DELETE FROM vector_log")
            self._bump_epoch()

    def has_vectors(self) -> bool:
        return self.conn.execute("SELECT EXISTS (SELECT 1 FROM vectors)").fetchone()[0] == 1

    def count(self) -> int:
        """Number of stored vectors (reads the whole table; not for hot paths)."""
        return int(self.conn.execute("SELECT count(*) FROM vectors").fetchone()[0])

    def has_chunks(self) -> bool:
        return self.conn.execute("SELECT EXISTS (SELECT 1 FROM chunks)").fetchone()[0] == 1

    def version(self) -> tuple[int, int]:
        """(epoch, last log sequence number): changes whenever ``vectors`` changes."""
        epoch, seq = self.conn.execute("SELECT (SELECT epoch FROM vector_stats WHERE id = 1), "
                                       "(SELECT coalesce(max(seq), 0) FROM vector_log)").fetchone()
        return int(epoch), int(seq)

    def changed_since(self, seq: int) -> list[int]:
        """Chunk ids whose vector was written or deleted after log entry ``seq``."""
        return [r[0] for r in self.conn.execute(
            "SELECT DISTINCT chunk_id FROM vector_log WHERE seq > ?", [seq])]

    def vectors_for(self, chunk_ids: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """(ids, matrix) of the stored vectors among ``chunk_ids``."""
        rows: list[tuple[int, bytes]] = []
        for part in range(0, len(chunk_ids), _PARAM_CHUNK):
            ids = list(chunk_ids[part:part + _PARAM_CHUNK])
            q = ",".join("?" * len(ids))
            rows.extend(self.conn.execute(f"SELECT chunk_id, vector FROM vectors WHERE chunk_id IN ({q})", ids))
        return self._decode(rows)

    def all_vectors(self) -> tuple[np.ndarray, np.ndarray]:
        """(chunk ids as int64, float32 matrix with one row per id), by chunk id."""
        return self._decode(self.conn.execute("SELECT chunk_id, vector FROM vectors ORDER BY chunk_id"))

    def _decode(self, rows: Iterable[tuple[int, bytes]]) -> tuple[np.ndarray, np.ndarray]:
        info = self.model()
        rows = list(rows)
        if info is None:
            if rows:
                raise StorageError("the database has vectors but no recorded embedding model")
            return np.zeros(0, np.int64), np.zeros((0, 0), np.float32)
        dims, dtype = int(info["dimensions"]), DTYPES[info["dtype"]]
        width = dims * np.dtype(dtype).itemsize
        ids = np.fromiter((r[0] for r in rows), np.int64, len(rows))
        bad = [r[0] for r in rows if len(r[1]) != width]
        if bad:
            raise StorageError(f"{len(bad)} stored vectors (e.g. chunk {bad[0]}) are not {dims} {info['dtype']} "
                               f"values; run `ragdb embed --rebuild`")
        buf = b"".join(r[1] for r in rows)
        mat = np.frombuffer(buf, dtype=dtype).reshape(len(rows), dims).astype(np.float32)
        return ids, mat

    # -- pending chunks -------------------------------------------------------------
    def embedded_upto(self) -> int:
        return int(self.conn.execute("SELECT embedded_upto FROM vector_stats WHERE id = 1").fetchone()[0])

    def advance_embedded_upto(self, upto: int, seen_from: int) -> None:
        """Raise the watermark to ``upto`` unless it was lowered below ``seen_from``
        meanwhile (a rebuild by another process)."""
        self.conn.execute("UPDATE vector_stats SET embedded_upto = max(embedded_upto, ?) "
                          "WHERE id = 1 AND embedded_upto >= ?", [upto, seen_from])

    def missing_chunks(self, limit: int | None = None, after: int | None = None) -> list[tuple[int, str]]:
        """(chunk id, text) of chunks without a vector (pending), by id, with
        id > ``after`` (default: the ``embedded_upto`` watermark)."""
        if after is None:
            after = self.embedded_upto()
        return self.conn.execute(
            "SELECT c.id, coalesce(c.text, d.text) FROM chunks c JOIN documents d ON d.id = c.doc_id "
            "WHERE c.id > ? AND NOT EXISTS (SELECT 1 FROM vectors v WHERE v.chunk_id = c.id) "
            "ORDER BY c.id LIMIT ?", [after, -1 if limit is None else int(limit)]).fetchall()

    def pending_count(self) -> int:
        """Chunks without a vector."""
        return int(self.conn.execute(
            "SELECT count(*) FROM chunks c WHERE c.id > ? "
            "AND NOT EXISTS (SELECT 1 FROM vectors v WHERE v.chunk_id = c.id)", [self.embedded_upto()]).fetchone()[0])

    def max_chunk_id(self) -> int:
        return int(self.conn.execute("SELECT coalesce(max(id), 0) FROM chunks").fetchone()[0])

    # -- checks -----------------------------------------------------------------------
    def orphan_vectors(self) -> int:
        return int(self.conn.execute(
            "SELECT count(*) FROM vectors v WHERE NOT EXISTS (SELECT 1 FROM chunks c WHERE c.id = v.chunk_id)"
        ).fetchone()[0])

    def wrong_length_vectors(self, width: int) -> int:
        return int(self.conn.execute("SELECT count(*) FROM vectors WHERE length(vector) != ?", [width]).fetchone()[0])

    def unembedded_below_watermark(self) -> int:
        return int(self.conn.execute(
            "SELECT count(*) FROM chunks c WHERE c.id <= ? "
            "AND NOT EXISTS (SELECT 1 FROM vectors v WHERE v.chunk_id = c.id)", [self.embedded_upto()]).fetchone()[0])


def _check_model_args(name: str, dimensions: int, dtype: str) -> None:
    if not isinstance(name, str) or not name:
        raise InvalidInput(f"embedding model name must be a non-empty string, got {name!r}")
    if not isinstance(dimensions, (int, np.integer)) or isinstance(dimensions, bool) or dimensions < 1:
        raise InvalidInput(f"embedding dimensions must be a positive integer, got {dimensions!r}")
    if dtype not in DTYPES:
        raise InvalidInput(f"vector dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")


def _mismatch(current: Mapping[str, Any], name: str, dimensions: int) -> str:
    return (f"the database's vectors were made by {current['model']!r} ({current['dimensions']} dimensions); "
            f"the embedder is {name!r} ({dimensions} dimensions). Use the recorded model, or re-embed "
            f"everything with the new one: ragdb embed --model {name} --rebuild")


# ---------------------------------------------------------------------------
# In-memory exact search
# ---------------------------------------------------------------------------


class VectorIndex:
    """The vectors of one database as a numpy matrix, kept equal to the table.

    :meth:`sync` (inside a transaction) applies the changes logged since the
    last call, by any connection; a cut log or a rebuild means a full reload.
    Removed rows are marked dead (id -1) and compacted once they are a quarter
    of the matrix; additions are appended into spare capacity.
    """

    def __init__(self, storage: VectorStorage) -> None:
        self.storage = storage
        self.version: tuple[int, int] | None = None
        self.model: dict[str, Any] | None = None
        self.dims = 0
        self.ids = np.zeros(0, np.int64)
        self.matrix = np.zeros((0, 0), np.float32)
        self.n = 0          # rows in use (live and dead)
        self.dead = 0

    def sync(self) -> None:
        st = self.storage
        version = st.version()
        if version == self.version:
            return
        model = st.model()
        if self.version is None or version[0] != self.version[0] or model != self.model:
            ids, mat = st.all_vectors()
            self.model = model
            self.dims = int(model["dimensions"]) if model else 0
            self.ids, self.matrix = ids, mat.reshape(len(ids), self.dims)
            self.n, self.dead = len(ids), 0
        else:
            changed = st.changed_since(self.version[1])
            ids, mat = st.vectors_for(changed)
            if changed:
                self._remove(np.asarray(changed, np.int64))
            self._append(ids, mat)
        self.version = version

    def _remove(self, chunk_ids: np.ndarray) -> None:
        live = self.ids[:self.n]
        gone = np.isin(live, chunk_ids) & (live >= 0)
        k = int(gone.sum())
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
            return _empty()
        if q.shape != (self.dims,):
            raise EmbeddingError(f"query vector has {q.size} dimensions; the stored vectors have {self.dims}")
        norm = float(np.linalg.norm(q))
        if not np.isfinite(norm):
            raise EmbeddingError("query vector has NaN or infinite values")
        if norm == 0:
            return _empty()  # cosine 0 with everything
        q = q / norm
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
        # |float32 dot - exact dot| <= d * 2^-24 / (1 - d * 2^-24) for unit
        # vectors (Cauchy-Schwarz), plus 2^-24 from rounding the query; doubled.
        eps = 2.0 * (self.dims + 2) * 2.0 ** -24
        approx = _matvec(self.matrix[:self.n], q.astype(np.float32))
        if min_score is not None:
            ok &= approx > min_score - eps
        rows = np.flatnonzero(ok)
        if len(rows) > k:
            a = approx[rows]
            kth = float(np.partition(a, len(a) - k)[len(a) - k])
            rows = rows[a >= kth - 2.0 * eps]
        if len(rows) == 0:
            return _empty()
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


def _empty() -> tuple[np.ndarray, np.ndarray]:
    return np.zeros(0, np.int64), np.zeros(0, np.float64)


def _matvec(mat: np.ndarray, q: np.ndarray) -> np.ndarray:
    """``mat @ q`` in float32 with numpy's own single-threaded loop (einsum),
    not BLAS: a multi-threaded BLAS call wakes its worker threads for every
    query, which on a busy machine cost 12x the product itself (measured on
    two loaded cores for SciFact's 5,183 x 256: 8.8 ms against 0.7 ms)."""
    return np.einsum("ij,j->i", mat, q)


# ---------------------------------------------------------------------------
# Database-level functions (wired into Database.search / add / ragdb embed)
# ---------------------------------------------------------------------------

# One VectorIndex and one embedder (from the recorded model) per open Database.
# Kept outside Database so this module needs no change there; a Database that
# grows its own ``_vectors`` attribute is used as is.
_INDEXES: "weakref.WeakKeyDictionary[Any, VectorIndex]" = weakref.WeakKeyDictionary()
_EMBEDDERS: "weakref.WeakKeyDictionary[Any, tuple[str, Embedder]]" = weakref.WeakKeyDictionary()


def vector_index(db: Any) -> VectorIndex:
    """The database's :class:`VectorIndex` (created on first use)."""
    own = getattr(db, "_vectors", None)
    if isinstance(own, VectorIndex):
        return own
    vi = _INDEXES.get(db)
    if vi is None or vi.storage.conn is not db._store.conn:
        vi = VectorIndex(VectorStorage(db._store.conn))
        _INDEXES[db] = vi
    return vi


def _storage(db: Any) -> VectorStorage:
    return vector_index(db).storage


def _dims(embedder: Embedder) -> int:
    try:
        d = int(embedder.dimensions)
    except EmbeddingError:
        raise
    except Exception as e:  # a custom embedder's property failing
        raise EmbeddingError(f"embedder {getattr(embedder, 'name', embedder)!r}: cannot read dimensions ({e})") from e
    return d


def ensure_model(db: Any, embedder: Embedder) -> None:
    """Raise :class:`EmbeddingError` if the database holds vectors of another
    model than ``embedder``'s (read only; call before writing anything)."""
    name, dims = embedder.name, _dims(embedder)
    with db._store.read():
        st = _storage(db)
        current = st.model()
        if current is not None and (current["model"], int(current["dimensions"])) != (name, dims) \
                and st.has_vectors():
            raise EmbeddingError(_mismatch(current, name, dims))


def embedder_for(db: Any) -> Embedder | None:
    """An embedder for the model recorded in the database (None if none is),
    made with :func:`ragdb.embeddings.get_embedder` and kept for reuse."""
    with db._store.read():
        info = _storage(db).model()
    if info is None:
        return None
    cached = _EMBEDDERS.get(db)
    if cached is not None and cached[0] == info["model"]:
        return cached[1]
    emb = get_embedder(info["model"])
    _EMBEDDERS[db] = (info["model"], emb)
    return emb


def embed_pending(db: Any, embedder: Embedder, batch_size: int = 64, *, rebuild: bool = False,
                  full_scan: bool = False, progress: Callable[[int, int], None] | None = None) -> int:
    """Embed every pending chunk (one without a vector; kept older versions
    included, as ``versions="all"`` searches see them); returns how many were stored.

    Used by ``ragdb embed`` and after adds when an embedder is configured.
    Texts are embedded ``batch_size`` at a time, outside any transaction (an
    embedding endpoint may be slow); each batch's vectors are then written in
    their own write transaction. ``rebuild=True`` first deletes every vector and
    records ``embedder``'s model (``ragdb embed --rebuild``); otherwise a
    different recorded model raises :class:`EmbeddingError`. ``full_scan``
    looks for pending chunks below the watermark too (repairs hand-made holes).
    ``progress(done, pending_total)`` is called after each batch.

    If the embedder fails, vectors written by earlier batches stay, the rest
    stay pending, and ``EmbeddingError`` says how many are pending.
    """
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise InvalidInput(f"batch_size must be a positive integer, got {batch_size!r}")
    name, dims = embedder.name, _dims(embedder)
    store = db._store
    # db._store.write()/read() are the engine's transaction helpers (private to
    # ragdb): vectors must be written under the same lock and BEGIN IMMEDIATE
    # discipline as the rest of the database.
    with store.write():
        st = _storage(db)
        if rebuild:
            st.reset_model(name, dims)
        else:
            st.set_model(name, dims)
        start = 0 if full_scan else st.embedded_upto()
        total = st.pending_count() if progress is not None else 0
    done = 0
    after = start
    while True:
        with store.read():
            batch = st.missing_chunks(limit=batch_size, after=after)
        if not batch:
            break
        try:
            vecs = np.asarray(embedder.embed([text for _, text in batch]))
            if vecs.shape != (len(batch), dims):
                raise EmbeddingError(f"embedder {name!r} returned shape {vecs.shape} for {len(batch)} texts, "
                                     f"expected ({len(batch)}, {dims})")
            if not np.all(np.isfinite(vecs)):
                raise EmbeddingError(f"embedder {name!r} returned NaN or infinite values")
        except Exception as e:
            with store.read():
                left = st.pending_count()
            msg = (f"embedding with {name!r} failed ({e}); {left} chunks are pending (stored without vectors: "
                   f"lexical search finds them, vector search does not). Run `ragdb embed` to retry")
            raise EmbeddingError(msg) from e
        last = batch[-1][0]
        with store.write():
            current = st.model()
            if current is None or (current["model"], int(current["dimensions"])) != (name, dims):
                raise EmbeddingError(_mismatch(current or {"model": None, "dimensions": 0}, name, dims)
                                     + " (the model was changed by another process while embedding)")
            done += st.put([(cid, vecs[i]) for i, (cid, _t) in enumerate(batch)])
            # Every chunk in (start, last] has a vector now (or was deleted):
            # later searches for pending chunks start after it.
            st.advance_embedded_upto(last, start)
            vector_index(db).sync()
        after = last
        if progress is not None:
            progress(done, total)
    return done


def _search_restrictions(db: Any, filter: Mapping[str, Any] | None = None, since: Any = None, until: Any = None,
                         as_of: Any = None, principals: Sequence[str] | None = None,
                         versions: str = "latest") -> filters.Query:
    """The same restriction object ``Database.search`` builds."""
    return db._restrictions(filter, since, until, as_of, principals, versions)


def _check_query(query: Any, k: Any, min_score: Any) -> None:
    if not isinstance(query, str):
        raise InvalidInput(f"query must be a string, got {type(query).__name__}")
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= _MAX_K:
        raise InvalidInput(f"k must be an integer between 1 and {_MAX_K}, got {k!r}")
    if min_score is not None and (isinstance(min_score, bool) or not isinstance(min_score, (int, float))):
        raise InvalidInput(f"min_score must be a number, got {min_score!r}")


def _resolve_embedder(db: Any, embedder: Embedder | str | None) -> Embedder:
    if isinstance(embedder, str):
        return get_embedder(embedder)
    if embedder is not None:
        return embedder
    emb = embedder_for(db)
    if emb is None:
        raise EmbeddingError("the database has no vectors: embed it first (ragdb embed --model wordllama)")
    return emb


_NO_POOL = _empty()


def _vector_pool(db: Any, qvec: np.ndarray, embedder: Embedder, k: int, mask: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]:
    """(chunk ids, cosines) of the ``k`` chunks (plus ties) with the highest
    positive cosine among those ``mask`` allows, best first, equal cosines by
    chunk id (inside a read transaction)."""
    vi = vector_index(db)
    vi.sync()
    info = vi.model  # the recorded model, re-read whenever the vectors changed
    name, dims = embedder.name, _dims(embedder)
    if info is None:
        if vi.storage.has_chunks():
            raise EmbeddingError("the database has no vectors: embed it first (ragdb embed --model wordllama)")
        return _NO_POOL
    if (info["model"], int(info["dimensions"])) != (name, dims):
        raise EmbeddingError(_mismatch(info, name, dims))
    return vi.search_arrays(qvec, k, mask, min_score=0.0, with_ties=True)


def _hit_rows(db: Any, chunk_ids: list[int]) -> Mapping[int, tuple[dict[str, Any], dict[str, Any]]]:
    """Hit fields through the index's cache (see ``Index.hit_protos``)."""
    return db._index.hit_protos(chunk_ids)


def _lexical_pool(db: Any, query: str, scorer: str, k: int, mask: np.ndarray, *, versions_all: bool,
                  k1: float | None, b: float | None, explain: bool
                  ) -> tuple[tuple[np.ndarray, np.ndarray], dict[int, dict[str, float]]]:
    """(chunk ids, scores) of the ``k`` chunks (plus ties) with the highest
    positive lexical score among those ``mask`` allows, best first, equal
    scores by chunk id, without reading their texts (inside a read transaction,
    after ``db._index.sync()``); and the per-term contributions when ``explain``.
    The scoring is ``Database.search``'s own (``Database._lexical``)."""
    cand, scores, contrib = db._lexical(query, k, scorer, mask, versions_all=versions_all, explain=explain,
                                        k1=k1, b=b)
    return (cand.astype(np.int64), scores), contrib


def _content_order(store: Any, pool: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Order equal scores by (source, start) as ``Database.search`` does, so
    ranks do not depend on chunk ids (insertion history); reads only tied chunks."""
    ids, scores = pool
    if len(ids) < 2:
        return pool
    eq = scores[1:] == scores[:-1]
    if not eq.any():
        return pool
    pos = np.flatnonzero(eq)
    tied = sorted(set(ids[np.concatenate([pos, pos + 1])].tolist()))
    keys = store.chunk_sort_keys(tied)
    ranked = sorted(zip(ids.tolist(), scores.tolist()),
                    key=lambda cs: (-cs[1], *keys.get(cs[0], ("", 0)), cs[0]))
    return (np.fromiter((c for c, _ in ranked), np.int64, len(ranked)),
            np.fromiter((v for _, v in ranked), np.float64, len(ranked)))


def _minmax(v: np.ndarray) -> np.ndarray:
    if not len(v):
        return v
    lo, hi = float(v.min()), float(v.max())
    if hi == lo:
        return np.ones(len(v))
    return (v - lo) / (hi - lo)


def _minmax_weighted(lexical: tuple[np.ndarray, np.ndarray], dense: tuple[np.ndarray, np.ndarray], alpha: float
                     ) -> tuple[np.ndarray, np.ndarray]:
    """:func:`ragdb.fusion.minmax_weighted` on pools: the same arithmetic in
    the same order, so the same floats and the same order (the tests check it
    against the reference, which validates every value through
    ``numbers.Real`` and cost a third of a hybrid query's time)."""
    keys = lexical[0].tolist()
    lex = _minmax(lexical[1]).tolist()
    den = [0.0] * len(keys)
    pos = dict(zip(keys, range(len(keys))))
    for cid, v in zip(dense[0].tolist(), _minmax(dense[1]).tolist()):
        i = pos.get(cid)
        if i is None:
            keys.append(cid)
            lex.append(0.0)
            den.append(v)
        else:
            den[i] = v
    fused = alpha * np.array(den) + (1.0 - alpha) * np.array(lex)
    order = np.argsort(-fused, kind="stable")  # equal scores keep first-appearance order
    return np.array(keys, np.int64)[order], fused[order]


def _rrf(lexical: tuple[np.ndarray, np.ndarray], dense: tuple[np.ndarray, np.ndarray], k: float
         ) -> tuple[np.ndarray, np.ndarray]:
    fused = rrf([lexical[0].tolist(), dense[0].tolist()], k=k)
    return (np.fromiter((c for c, _ in fused), np.int64, len(fused)),
            np.fromiter((v for _, v in fused), np.float64, len(fused)))


def _make_hits(rows: Mapping[int, tuple[dict[str, Any], dict[str, Any]]],
               scored: Iterable[tuple[int, float, Mapping[str, float]]]) -> list[Hit]:
    """Hits from ``Index.hit_protos`` entries, built as ``Database.search`` builds them,
    ordered as it orders them: score, then source and position."""
    from .database import make_hits

    scored = [s for s in scored if s[0] in rows]  # rows are read in the same snapshot
    hits = make_hits(rows, [c for c, _, _ in scored], [float(v) for _, v, _ in scored],
                     {c: e for c, _, e in scored})
    hits.sort(key=lambda h: (-h.score, h.source, h.start, h.chunk_id))
    return hits


def _cut_with_ties(ids: np.ndarray, scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The first ``k`` of a best-first pool plus any tied with the k-th."""
    if len(ids) <= k:
        return ids, scores
    keep = scores >= scores[k - 1]
    return ids[keep], scores[keep]


def vector_search(db: Any, query: str, k: int = 10, embedder: Embedder | str | None = None, *,
                  min_score: float | None = None, explain: bool = False,
                  filter: Mapping[str, Any] | None = None, since: Any = None, until: Any = None,
                  as_of: Any = None, principals: Sequence[str] | None = None,
                  versions: str = "latest") -> list[Hit]:
    """The ``k`` chunks most similar to ``query`` (exact cosine), best first.

    Only chunks with positive similarity are returned (never padding);
    restrictions as in :meth:`ragdb.Database.search`, applied before the cut;
    equal scores ordered by source, then position. ``embedder`` defaults to
    the database's recorded model; a different model raises
    :class:`EmbeddingError`. Pending chunks (no vector yet) are not seen.
    ``explain=True`` sets ``Hit.explain`` to ``{"vector:cosine": score}``.
    """
    _check_query(query, k, min_score)
    restrict = _search_restrictions(db, filter, since, until, as_of, principals, versions)
    emb = _resolve_embedder(db, embedder)
    if not query.strip():
        return []
    qvec = embed_query(emb, query)  # outside the transaction: an endpoint may be slow
    with db._store.read():
        db._index.sync()
        ids, sims = _vector_pool(db, qvec, emb, k, db._index.allowed(restrict))
        if min_score is not None:
            keep = sims >= min_score
            ids, sims = ids[keep], sims[keep]
        pool = list(zip(ids.tolist(), sims.tolist()))
        rows = _hit_rows(db, [c for c, _ in pool])
    return _make_hits(rows, ((c, s, {"vector:cosine": s} if explain else {}) for c, s in pool))[:k]


def hybrid_search(db: Any, query: str, k: int = 10, embedder: Embedder | str | None = None, *,
                  fusion: str = DEFAULT_FUSION, alpha: float = DEFAULT_ALPHA, rrf_k: float = DEFAULT_RRF_K,
                  pool: int = DEFAULT_POOL, lexical: str = "bm25", min_score: float | None = None,
                  explain: bool = False, filter: Mapping[str, Any] | None = None, since: Any = None,
                  until: Any = None, as_of: Any = None, principals: Sequence[str] | None = None,
                  versions: str = "latest", k1: float | None = None, b: float | None = None) -> list[Hit]:
    """Lexical and vector candidates fused into one ranking, best first.

    Candidate pools, both under the same restrictions (applied before the
    cut) and read from one snapshot: the ``max(pool, k)`` best lexical chunks
    (``lexical``: ``"bm25"`` or ``"tfidf"``; positive scores only) and the
    ``max(pool, k)`` chunks with the highest positive cosine (ties at either
    cut are kept). ``fusion="weighted"``: ``alpha * minmax(cosine) +
    (1 - alpha) * minmax(lexical)``, each min-max over its own pool, a side
    where a chunk is absent counting 0 (:func:`ragdb.fusion.minmax_weighted`);
    ``fusion="rrf"``: reciprocal rank fusion with constant ``rrf_k``
    (:func:`ragdb.fusion.rrf`). ``Hit.score`` is the fused score (with
    weighted fusion the weakest lexical-only candidate scores 0.0 - it still
    matched lexically); ``min_score`` drops fused scores below it. Chunks in
    neither pool are never returned, so fewer than ``k`` hits may come back.
    ``explain=True`` fills ``Hit.explain`` with the lexical per-term
    contributions plus the raw ``"lexical:<scorer>"`` and ``"vector:cosine"``.
    """
    _check_query(query, k, min_score)
    if fusion not in FUSIONS:
        raise InvalidInput(f"fusion {fusion!r} is unknown; choose one of {', '.join(FUSIONS)}")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0.0 <= alpha <= 1.0:
        raise InvalidInput(f"alpha must be a number in [0, 1], got {alpha!r}")
    if isinstance(rrf_k, bool) or not isinstance(rrf_k, (int, float)) or not np.isfinite(rrf_k) or rrf_k < 0:
        raise InvalidInput(f"rrf_k must be a finite number >= 0, got {rrf_k!r}")
    if lexical not in ("bm25", "tfidf"):
        raise InvalidInput(f"lexical scorer {lexical!r} is unknown; choose bm25 or tfidf")
    if not isinstance(pool, int) or isinstance(pool, bool) or pool < 1:
        raise InvalidInput(f"pool must be a positive integer, got {pool!r}")
    size = min(max(pool, k), _MAX_K)
    restrict = _search_restrictions(db, filter, since, until, as_of, principals, versions)
    versions_all = versions == "all" or as_of is not None
    emb = _resolve_embedder(db, embedder)
    qvec = embed_query(emb, query) if query.strip() else None  # outside the transaction
    store, index = db._store, db._index
    with store.read():  # one snapshot for both sides
        index.sync()
        mask = index.allowed(restrict)
        lex, contrib = _lexical_pool(db, query, lexical, size, mask, versions_all=versions_all, k1=k1, b=b,
                                     explain=explain)
        dense = _vector_pool(db, qvec, emb, size, mask) if qvec is not None else _NO_POOL
        lex, dense = _content_order(store, lex), _content_order(store, dense)
        if fusion == "weighted":
            ids, fused = _minmax_weighted(lex, dense, float(alpha))
        else:
            ids, fused = _rrf(lex, dense, rrf_k)
        if min_score is not None:
            keep = fused >= min_score
            ids, fused = ids[keep], fused[keep]
        ids, fused = _cut_with_ties(ids, fused, k)
        rows = _hit_rows(db, ids.tolist())
    scored = []
    if explain:
        lex_scores = dict(zip(lex[0].tolist(), lex[1].tolist()))
        dense_scores = dict(zip(dense[0].tolist(), dense[1].tolist()))
    for cid, score in zip(ids.tolist(), fused.tolist()):
        ex: dict[str, float] = {}
        if explain:
            ex.update(contrib.get(cid, {}))
            if cid in lex_scores:
                ex[f"lexical:{lexical}"] = lex_scores[cid]
            if cid in dense_scores:
                ex["vector:cosine"] = dense_scores[cid]
        scored.append((cid, score, ex))
    return _make_hits(rows, scored)[:k]


def check_vectors(db: Any) -> list[str]:
    """Vector problems (empty when healthy): orphans, wrong sizes, holes below the
    watermark, and the in-memory matrix disagreeing with the table."""
    problems: list[str] = []
    with db._store.read():
        st = _storage(db)
        if (o := st.orphan_vectors()):
            problems.append(f"{o} vectors belong to no chunk")
        info = st.model()
        if info is None:
            if st.has_vectors():
                problems.append("vectors are stored but no embedding model is recorded")
            return problems
        width = int(info["dimensions"]) * np.dtype(DTYPES[info["dtype"]]).itemsize
        if (w := st.wrong_length_vectors(width)):
            problems.append(f"{w} vectors are not {info['dimensions']} {info['dtype']} values")
            return problems
        if (h := st.unembedded_below_watermark()):
            problems.append(f"{h} chunks below the embedded watermark have no vector")
        vi = vector_index(db)
        vi.sync()
        ids, mat = st.all_vectors()
        live = np.flatnonzero(vi.ids[:vi.n] >= 0)
        order = live[np.argsort(vi.ids[live])]
        if not (np.array_equal(vi.ids[order], ids) and np.array_equal(vi.matrix[order], mat)):
            problems.append("the in-memory vector index disagrees with the stored vectors")
    return problems
