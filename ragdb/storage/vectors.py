"""The SQL of dense vectors (tables of ``migrations/0003_vectors.sql``).

A mixin of :class:`ragdb.storage.Store`: every method runs on the store's
connection inside its transactions (``store.read()`` / ``store.write()``)
and never opens one itself. Identifiers are constants; every value is a
bound parameter.

``vectors`` holds one row per chunk: the embedding as little-endian float32
(or float16) bytes, L2-normalized when written. ``vector_log`` records every
change, by any connection, so in-memory indexes apply only what changed;
``vector_stats`` holds an epoch (bumped when the log is cut or the model
changes: readers reload) and the ``embedded_upto`` watermark below which
every chunk has a vector. The model is the ``"embedding"`` setting.

Each vector also records ``text_hash`` (:func:`text_hash`, migration 0005),
the SHA-256 of the chunk text it was made from: every stored vector is of the
recorded model, so a chunk whose text hash is already stored takes that
vector over (:meth:`VectorSQL.vectors_by_hash`, :meth:`VectorSQL.copy_vectors`)
instead of being embedded again.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from ragdb.errors import EmbeddingError, InvalidInput, StorageError
from ragdb.storage.base import StoreBase
from ragdb.storage.codec import dumps, loads

DTYPES = {"float32": "<f4", "float16": "<f2"}
MODEL_KEY = "embedding"
LOG_KEEP = 50_000        # log entries kept before the log is cut (readers then reload everything)
_PARAM_CHUNK = 900       # bound parameters per statement (old SQLite builds allow 999)


def text_hash(text: str) -> bytes:
    """The key under which a vector of ``text`` is found again: SHA-256 of its UTF-8
    bytes (32 bytes; the digest ``documents.content_hash`` is the hex form of).
    SHA-256 rather than BLAKE2: OpenSSL's is the faster of hashlib's on the
    ~800-character chunks ragdb makes (0.8 against 1.4 us here). (hashlib imported here: a
    search without vectors never hashes, and it costs a command-line start ~7 ms.)"""
    import hashlib

    return hashlib.sha256(text.encode("utf-8")).digest()


def check_model_args(name: str, dimensions: int, dtype: str) -> None:
    if not isinstance(name, str) or not name:
        raise InvalidInput(f"embedding model name must be a non-empty string, got {name!r}")
    if not isinstance(dimensions, (int, np.integer)) or isinstance(dimensions, bool) or dimensions < 1:
        raise InvalidInput(f"embedding dimensions must be a positive integer, got {dimensions!r}")
    if dtype not in DTYPES:
        raise InvalidInput(f"vector dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")


def model_mismatch(current: Mapping[str, Any], name: str, dimensions: int) -> str:
    """The message of a database holding vectors of another model than the embedder's."""
    return (f"the database's vectors were made by {current['model']!r} ({current['dimensions']} dimensions); "
            f"the embedder is {name!r} ({dimensions} dimensions). Use the recorded model, or re-embed "
            f"everything with the new one: ragdb embed --model {name} --rebuild")


class VectorSQL(StoreBase):
    """Vector statements of :class:`ragdb.storage.Store` (see the module docstring)."""

    conn: sqlite3.Connection
    # a chunk's text as UTF-8 bytes, never decoded to str (check: invalid UTF-8 must not raise), a
    # compressed one decompressed (ragdb.storage.textcodec.register_functions; PgStore: its SQL)
    _CHUNK_TEXT_BYTES = ("ragdb_text_bytes(typeof(coalesce(c.text, d.text)), "
                         "CAST(coalesce(c.text, d.text) AS BLOB))")

    # -- model -------------------------------------------------------------
    def vector_model(self) -> dict[str, Any] | None:
        """The recorded ``{"model", "dimensions", "dtype"}``, or None."""
        row = self.conn.execute("SELECT value FROM settings WHERE key = ?", [MODEL_KEY]).fetchone()
        return loads(row[0]) if row else None

    def set_vector_model(self, name: str, dimensions: int, dtype: str = "float32") -> dict[str, Any]:
        """Record the model (in a write transaction). Recording the same model is
        a no-op; a different one is an error while vectors of the recorded one exist."""
        check_model_args(name, dimensions, dtype)
        current = self.vector_model()
        if current is not None:
            if current["model"] == name and int(current["dimensions"]) == dimensions:
                return current
            if self.has_vectors():
                raise EmbeddingError(model_mismatch(current, name, dimensions))
        info = {"model": name, "dimensions": int(dimensions), "dtype": dtype}
        self._write_vector_model(info)
        self._bump_vector_epoch()  # in-memory indexes re-read the model
        return info

    def reset_vector_model(self, name: str, dimensions: int, dtype: str = "float32") -> dict[str, Any]:
        """Delete every vector and record a new model (``ragdb embed --rebuild``)."""
        check_model_args(name, dimensions, dtype)
        self.conn.execute("DELETE FROM vectors")
        self.conn.execute("DELETE FROM vector_log")
        self.conn.execute("UPDATE vector_stats SET embedded_upto = 0 WHERE id = 1")
        self._bump_vector_epoch()
        info = {"model": name, "dimensions": int(dimensions), "dtype": dtype}
        self._write_vector_model(info)
        return info

    def _write_vector_model(self, info: Mapping[str, Any]) -> None:
        self.conn.execute("INSERT INTO settings (key, value) VALUES (?, ?) "
                          "ON CONFLICT (key) DO UPDATE SET value = excluded.value", [MODEL_KEY, dumps(info)])

    def _bump_vector_epoch(self) -> None:
        self.conn.execute("UPDATE vector_stats SET epoch = epoch + 1 WHERE id = 1")

    # -- vectors -------------------------------------------------------------
    def put_vectors(self, rows: Sequence[tuple[int, np.ndarray]], hashes: Sequence[bytes] | None = None) -> int:
        """Store ``(chunk id, vector)`` rows (L2-normalized here) under the recorded
        model; rows of chunks that no longer exist are skipped. Returns rows written.
        ``hashes``: the :func:`text_hash` of each row's chunk text, when the caller
        has them; otherwise they are computed from the stored texts."""
        info = self.vector_model()
        if info is None:
            raise EmbeddingError("no embedding model is recorded; call set_vector_model first")
        dims, dtype = int(info["dimensions"]), DTYPES[info["dtype"]]
        if not rows:
            return 0
        if hashes is not None and len(hashes) != len(rows):
            raise InvalidInput(f"put_vectors: {len(hashes)} hashes for {len(rows)} vectors")
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
            if hashes is None:
                alive = {cid: text_hash(text) for cid, text in self.chunk_texts_of(chunk_ids)}
            else:
                exist = self._existing_chunks(chunk_ids)
                alive = {cid: hashes[part + j] for j, cid in enumerate(chunk_ids) if cid in exist}
            written += self._insert_vectors([(cid, mat[part + j].tobytes(), alive[cid])
                                             for j, cid in enumerate(chunk_ids) if cid in alive])
        self._maybe_cut_vector_log()
        return written

    def _insert_vectors(self, rows: Sequence[tuple[int, bytes, bytes | None]]) -> int:
        """Write ``(chunk id, vector bytes, text hash)`` rows and log them."""
        self.conn.executemany("INSERT INTO vectors (chunk_id, vector, text_hash) VALUES (?, ?, ?) "
                              "ON CONFLICT (chunk_id) DO UPDATE SET vector = excluded.vector, "
                              "text_hash = excluded.text_hash", rows)
        self.conn.executemany("INSERT INTO vector_log (chunk_id) VALUES (?)", [(r[0],) for r in rows])
        return len(rows)

    # -- reuse by text hash -----------------------------------------------------
    def copy_vectors(self, rows: Sequence[tuple[int, bytes, bytes]], *, existing_only: bool = False) -> int:
        """Give chunks a stored vector: ``(chunk id, vector bytes as stored, text hash)``
        rows, the bytes read by :meth:`vectors_by_hash` or :meth:`doc_vectors` of this
        database under the model still recorded (so normalized, in its dtype).
        ``existing_only``: skip chunks deleted since they were read (the write
        that inserts the chunks need not look). Returns rows written."""
        written = 0
        for part in range(0, len(rows), _PARAM_CHUNK):
            todo = rows[part:part + _PARAM_CHUNK]
            if existing_only:
                alive = self._existing_chunks([r[0] for r in todo])
                todo = [r for r in todo if r[0] in alive]
            written += self._insert_vectors(todo)
        if written:
            self._maybe_cut_vector_log()
        return written

    def vectors_by_hash(self, hashes: Iterable[bytes]) -> dict[bytes, bytes]:
        """text hash -> stored vector bytes, for the ``hashes`` some vector has
        (one per hash; vectors of equal text are equal)."""
        out: dict[bytes, bytes] = {}
        wanted = list(dict.fromkeys(hashes))
        for part in range(0, len(wanted), _PARAM_CHUNK):
            keys = wanted[part:part + _PARAM_CHUNK]
            q = ",".join("?" * len(keys))
            for h, vec in self.conn.execute(
                    f"SELECT text_hash, vector FROM vectors WHERE text_hash IN ({q})", keys):
                out.setdefault(h, vec)
        return out

    def doc_vectors(self, doc_id: int) -> list[tuple[bytes, bytes]]:
        """(text hash, vector bytes) of a document's chunks that have a vector; the
        hash of a vector stored before migration 0005 (NULL) is computed from the text."""
        rows = self.conn.execute(
            "SELECT v.text_hash, v.vector, CASE WHEN v.text_hash IS NULL THEN "
            "coalesce(c.text, (SELECT d.text FROM documents d WHERE d.id = c.doc_id)) END "
            "FROM chunks c JOIN vectors v ON v.chunk_id = c.id WHERE c.doc_id = ?", [doc_id]).fetchall()
        return [(h if h is not None else text_hash(self._text(t)), vec) for h, vec, t in rows]

    def chunk_texts_of(self, chunk_ids: Sequence[int]) -> list[tuple[int, str]]:
        """(chunk id, text) of those of ``chunk_ids`` that exist."""
        out: list[tuple[int, str]] = []
        for part in range(0, len(chunk_ids), _PARAM_CHUNK):
            ids = list(chunk_ids[part:part + _PARAM_CHUNK])
            q = ",".join("?" * len(ids))
            out.extend((cid, self._text(t)) for cid, t in self.conn.execute(
                f"SELECT c.id, coalesce(c.text, d.text) FROM chunks c JOIN documents d ON d.id = c.doc_id "
                f"WHERE c.id IN ({q})", ids))
        return out

    def hashed_vector_texts(self, size: int = 2048) -> Iterator[list[tuple[int, bytes, bytes | None]]]:
        """(chunk id, text hash, chunk text as bytes) of every vector with a text hash, in
        blocks of ``size`` by chunk id (for ``check``)."""
        after = 0
        while True:
            rows = self.conn.execute(
                f"SELECT v.chunk_id, v.text_hash, {self._CHUNK_TEXT_BYTES} FROM vectors v "
                "JOIN chunks c ON c.id = v.chunk_id JOIN documents d ON d.id = c.doc_id "
                "WHERE v.chunk_id > ? AND v.text_hash IS NOT NULL ORDER BY v.chunk_id LIMIT ?",
                [after, size]).fetchall()
            if not rows:
                return
            yield rows
            after = rows[-1][0]

    def unhashed_vectors(self, limit: int) -> list[tuple[int, str]]:
        """(chunk id, text) of up to ``limit`` vectors without a text hash (stored before
        migration 0005)."""
        return [(cid, self._text(t)) for cid, t in self.conn.execute(
            "SELECT v.chunk_id, coalesce(c.text, d.text) FROM vectors v JOIN chunks c ON c.id = v.chunk_id "
            "JOIN documents d ON d.id = c.doc_id WHERE v.text_hash IS NULL LIMIT ?", [int(limit)])]

    def set_text_hashes(self, rows: Iterable[tuple[bytes, int]]) -> None:
        """Record ``(text hash, chunk id)`` on existing vectors (the vectors do not change)."""
        self.conn.executemany("UPDATE vectors SET text_hash = ? WHERE chunk_id = ?", rows)

    def _existing_chunks(self, chunk_ids: Sequence[int]) -> set[int]:
        q = ",".join("?" * len(chunk_ids))
        return {r[0] for r in self.conn.execute(f"SELECT id FROM chunks WHERE id IN ({q})", list(chunk_ids))}

    def _maybe_cut_vector_log(self) -> None:
        lo, hi = self.conn.execute("SELECT coalesce(min(seq), 0), coalesce(max(seq), 0) FROM vector_log").fetchone()
        if hi - lo >= LOG_KEEP:
            self.conn.execute("DELETE FROM vector_log")
            self._bump_vector_epoch()

    def has_vectors(self) -> bool:
        return bool(self.conn.execute("SELECT EXISTS (SELECT 1 FROM vectors)").fetchone()[0] == 1)

    def vector_count(self) -> int:
        """Number of stored vectors (reads the whole table; not for hot paths)."""
        return int(self.conn.execute("SELECT count(*) FROM vectors").fetchone()[0])

    def has_chunks(self) -> bool:
        return bool(self.conn.execute("SELECT EXISTS (SELECT 1 FROM chunks)").fetchone()[0] == 1)

    def vector_version(self) -> tuple[int, int]:
        """(epoch, last log sequence number): changes whenever ``vectors`` changes."""
        epoch, seq = self.conn.execute("SELECT (SELECT epoch FROM vector_stats WHERE id = 1), "
                                       "(SELECT coalesce(max(seq), 0) FROM vector_log)").fetchone()
        return int(epoch), int(seq)

    def vectors_changed_since(self, seq: int) -> list[int]:
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
        return self._decode_vectors(rows)

    def all_vectors(self) -> tuple[np.ndarray, np.ndarray]:
        """(chunk ids as int64, float32 matrix with one row per id), by chunk id."""
        return self._decode_vectors(self.conn.execute("SELECT chunk_id, vector FROM vectors ORDER BY chunk_id"))

    def _decode_vectors(self, rows: Iterable[tuple[int, bytes]]) -> tuple[np.ndarray, np.ndarray]:
        info = self.vector_model()
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

    def unembedded_chunks(self, limit: int | None = None, after: int | None = None) -> list[tuple[int, str]]:
        """(chunk id, text) of chunks without a vector (pending), by id, with
        id > ``after`` (default: the ``embedded_upto`` watermark)."""
        if after is None:
            after = self.embedded_upto()
        return [(cid, self._text(t)) for cid, t in self.conn.execute(
            "SELECT c.id, coalesce(c.text, d.text) FROM chunks c JOIN documents d ON d.id = c.doc_id "
            "WHERE c.id > ? AND NOT EXISTS (SELECT 1 FROM vectors v WHERE v.chunk_id = c.id) "
            "ORDER BY c.id LIMIT ?", [after, -1 if limit is None else int(limit)])]

    def chunk_text_sample(self, limit: int = 400) -> list[str]:
        """The texts of up to ``limit`` chunks spread evenly over the chunk ids (to tell
        which languages a collection holds)."""
        top = int(self.conn.execute("SELECT coalesce(max(id), 0) FROM chunks").fetchone()[0])
        step = max(1, top // max(1, int(limit)))
        return [self._text(r[0]) for r in self.conn.execute(
            "SELECT coalesce(c.text, d.text) FROM chunks c JOIN documents d ON d.id = c.doc_id "
            "WHERE c.id % ? = 0 ORDER BY c.id LIMIT ?", [step, int(limit)])]

    def unembedded_count(self) -> int:
        """Chunks without a vector."""
        return int(self.conn.execute(
            "SELECT count(*) FROM chunks c WHERE c.id > ? "
            "AND NOT EXISTS (SELECT 1 FROM vectors v WHERE v.chunk_id = c.id)", [self.embedded_upto()]).fetchone()[0])

    # -- checks -----------------------------------------------------------------------
    def orphan_vectors(self) -> int:
        return int(self.conn.execute(
            "SELECT count(*) FROM vectors v WHERE NOT EXISTS (SELECT 1 FROM chunks c WHERE c.id = v.chunk_id)"
        ).fetchone()[0])

    def unembedded_below_watermark(self) -> int:
        return int(self.conn.execute(
            "SELECT count(*) FROM chunks c WHERE c.id <= ? "
            "AND NOT EXISTS (SELECT 1 FROM vectors v WHERE v.chunk_id = c.id)", [self.embedded_upto()]).fetchone()[0])

    def malformed_vectors(self, width: int) -> tuple[int, int | None, str | None, int | None]:
        """(number, and of the one with the smallest chunk id: chunk id, typeof, length in bytes)
        of the vectors that are not a blob of ``width`` bytes."""
        n, cid = self.conn.execute(
            "SELECT count(*), min(chunk_id) FROM vectors WHERE typeof(vector) != 'blob' OR length(vector) != ?",
            [width]).fetchone()
        if not n:
            return 0, None, None, None
        kind, size = self.conn.execute(
            "SELECT typeof(vector), length(CAST(vector AS BLOB)) FROM vectors WHERE chunk_id = ?", [cid]).fetchone()
        return int(n), int(cid), kind, size
