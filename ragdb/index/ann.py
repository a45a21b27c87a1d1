"""Approximate nearest-neighbour search for large collections: an HNSW graph (usearch) kept as a cache.

The SQLite ``vectors`` table stays the source of truth, and the in-memory matrix
of :class:`ragdb.index.vectors.VectorIndex` its exact copy; this module adds an HNSW
graph over the same vectors (`usearch <https://github.com/unum-cloud/usearch>`_,
``pip install 'ragdb[ann]'``: a maintained single-file HNSW library with
float16/int8 storage, fast multi-threaded inserts and removals, and
save/restore; hnswlib is unmaintained since 2023 and faiss-cpu is a 30 MB wheel
whose HNSW cannot remove vectors). The graph only *proposes* candidates: every
candidate is scored exactly from the matrix (the same float64 arithmetic as the
exact scan), checked against the search's restrictions, and ordered as exact
search orders, so an ANN answer differs from the exact one only by chunks the
graph failed to propose, never by a wrong score or a chunk outside the filter.

When it is used (:func:`ann_mode`): ``auto`` (default) once a collection holds
:data:`ANN_MIN_VECTORS` vectors (below that the exact numpy scan is fast enough;
the threshold is measured in BENCHMARKS.md, section ``ann``), ``on`` always,
``off`` never; ``RAGDB_ANN`` or :attr:`ragdb.Database.ann` choose. Without
usearch installed, search stays exact.

The cache file
    ``<database>.ann/c<collection id>-e<epoch>-s<seq>.usearch``, next to the
    database (none for ``:memory:`` or when the folder cannot be written): the
    graph as of vector-log position ``(epoch, seq)``, written to a temporary
    file and renamed, so a kill leaves either the old file or the new one.
    On first use a process loads the newest file of its collection's epoch
    whose ``seq`` is not ahead of the database, applies the logged changes
    since (removing and re-adding the chunks they name), and checks that the
    graph holds exactly the live chunk ids and that every chunk the log names
    no change of has the vector it had when the file was written: beside the
    graph, ``c<id>-e<epoch>-s<seq>.fp.npy`` holds a fingerprint of each vector
    (:func:`fingerprints`), so a file of another history of the same file name
    (a database deleted and built again at the same path, a backup restored and
    written since) is not taken for this one (a sample of 16 vectors let a few
    changed ones through: the graph missed them). The table's first row holds the size and
    CRC-32 of the graph file, checked before usearch reads it: usearch trusts its file (a few
    bytes changed crashed the process as it loaded), and a graph file of another database
    copied beside this one's table is not this one's. A file without its table (an older
    ragdb's has none) is rebuilt like one that is missing. Anything else (missing,
    corrupt, another epoch, a cut log, a different model) rebuilds it from the vectors. It is saved after a
    rebuild (not one inside a write transaction, which a rollback may undo), and on ``Database.close`` once its unsaved changes reach
    :data:`SAVE_AFTER` or :data:`SAVE_FRACTION` of its size (fewer are cheaper
    to replay from the log than a large file is to rewrite).

Restrictions (filters, principals, time, versions)
    are applied before the top-k cut, as for BM25: when the allowed set is
    small (fewer than :data:`EXACT_ALLOWED` chunks, or under
    :data:`SELECTIVE_FRACTION` of the collection) the allowed rows are
    scanned exactly; otherwise the graph is asked for enough candidates that
    ``k`` allowed ones are expected among them, and asked again for more when
    fewer came back; if ``k`` allowed candidates with a score above the floor
    still are not found, the search falls back to the exact scan of the allowed
    rows. So a search returns ``k`` hits whenever ``k`` qualify, and never one
    outside the restrictions.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from ragdb.errors import InvalidInput

__all__ = ["ANN_MIN_VECTORS", "ANN_MODES", "AnnGraph", "ann_available", "ann_mode", "cache_folder", "fingerprints"]

#: Collections with at least this many vectors use the graph in mode ``auto``.
#: Measured (BENCHMARKS.md, section ann): the exact scan of 384-d float32
#: vectors costs about 1 ms per 10,000 on this machine's cores, so it passes
#: the graph's ~2 ms somewhere near 20,000-50,000 vectors; below 50,000 the
#: scan is exact and fast enough that the graph's build and memory are not worth it.
ANN_MIN_VECTORS = 50_000
ANN_MODES = ("auto", "on", "off")
#: Allowed sets at most this large are scanned exactly instead of searched in the graph.
EXACT_ALLOWED = 20_000
#: Allowed sets under this fraction of the collection are scanned exactly too
#: (the graph would need ~k/fraction candidates to find k allowed ones).
SELECTIVE_FRACTION = 0.05
CONNECTIVITY = 16        # HNSW M
EXPANSION_ADD = 128      # efConstruction (64 built graphs whose recall@10 fell to 0.83 at 1M vectors)
EXPANSION_SEARCH = 256   # ef at query time (raised to the candidate count when larger)
STORAGE = "i8"           # vectors in the graph: int8 (a quarter of float32; inserts 5x faster than float16
                         # here, whose arithmetic has no hardware support); candidates are re-scored exactly
#: Candidates asked of the graph for k hits (before the allowed fraction): int8 distances
#: misorder near neighbours a little, and re-scoring 4k candidates exactly restores them
#: (measured: recall@10 0.90 with 10 candidates, 1.00 with 40, at 100k clustered vectors).
OVERSAMPLE = 4
MIN_CANDIDATES = 40
#: A graph whose unsaved changes reach max(SAVE_AFTER, SAVE_FRACTION of its size) is written
#: back when its database is closed; fewer are applied from the vector log by the next process.
SAVE_AFTER = 1_000
SAVE_FRACTION = 0.01
_NAME = re.compile(r"c(\d+)-e(\d+)-s(\d+)\.usearch")
_FINGERPRINTS = re.compile(r"c(\d+)-e(\d+)-s(\d+)\.fp\.npy")
#: Fingerprints of vectors equal within this are of the same vector (float64 sums of one
#: float32 vector's products may differ in their last bits with how the rows are blocked).
FINGERPRINT_TOLERANCE = 1e-9
_FINGERPRINT_BLOCK = 4_096  # rows converted to float64 at a time: 32,768 left the cache (0.70 -> 0.16 s a million)
_FINGERPRINT_DTYPE = np.dtype([("id", "<i8"), ("fp", "<f8")])
_probes: dict[int, np.ndarray] = {}


def fingerprints(mat: np.ndarray) -> np.ndarray:
    """A float64 fingerprint of each row of ``mat`` (vectors): its dot product with a fixed
    random vector of its dimensions, the same in every process. Two vectors that differ
    anywhere by more than rounding differ here too, but for a chance of ~1e-9 / spread."""
    dims = int(mat.shape[1]) if mat.ndim == 2 else 0
    probe = _probes.get(dims)
    if probe is None:
        probe = _probes[dims] = np.random.default_rng(0x7A6DB).standard_normal(dims)
    out = np.empty(len(mat), np.float64)
    for s in range(0, len(mat), _FINGERPRINT_BLOCK):
        out[s:s + _FINGERPRINT_BLOCK] = mat[s:s + _FINGERPRINT_BLOCK].astype(np.float64) @ probe
    return out


def ann_mode(value: str | None = None) -> str:
    """The mode in force: ``value`` if given, else ``$RAGDB_ANN``, else ``auto``."""
    mode = value if value is not None else (os.environ.get("RAGDB_ANN") or "auto")
    mode = mode.strip().lower() if isinstance(mode, str) else mode
    if mode not in ANN_MODES:
        raise InvalidInput(f"ann mode must be one of {', '.join(ANN_MODES)}, got {mode!r}"
                           + (" (from RAGDB_ANN)" if value is None else ""))
    return str(mode)


def ann_available() -> bool:
    try:
        import usearch.index  # noqa: F401
    except ImportError:
        return False
    return True


def cache_folder(db_path: str) -> Path | None:
    """Where the graphs of a database file are kept (None for an in-memory database, and for a
    PostgreSQL one: its URL or key/value string is no file path; its graph stays in memory)."""
    from ragdb.storage.backend import is_postgres

    if not db_path or db_path == ":memory:" or db_path.startswith("file:") or is_postgres(db_path):
        return None
    return Path(db_path + ".ann")


class AnnGraph:
    """An HNSW graph over chunk ids -> vectors, with the vector-log position it reflects."""

    def __init__(self, dims: int) -> None:
        from usearch.index import Index

        self.dims = dims
        self.index = Index(ndim=dims, metric="ip", dtype=STORAGE, connectivity=CONNECTIVITY,
                           expansion_add=EXPANSION_ADD, expansion_search=EXPANSION_SEARCH)
        self.version: tuple[int, int] = (-1, -1)
        self.unsaved = 0          # changes applied since the file was written
        #: (chunk ids, sorted; their vectors' :func:`fingerprints`) as the loaded file was
        #: written, None without them; dropped once checked
        self.fingerprint: tuple[np.ndarray, np.ndarray] | None = None

    def __len__(self) -> int:
        return int(len(self.index))

    @property
    def memory_bytes(self) -> int:
        return int(self.index.memory_usage)

    def add(self, ids: np.ndarray, mat: np.ndarray) -> None:
        if len(ids):
            # small batches in one thread: the same graph every time (concurrent inserts link
            # nodes in a varying order) at no cost worth having
            self.index.add(np.ascontiguousarray(ids, np.uint64), np.ascontiguousarray(mat, np.float32),
                           threads=_threads() if len(ids) >= 10_000 else 1)
            self.unsaved += len(ids)

    def remove(self, ids: np.ndarray) -> None:
        if len(ids):
            present = np.asarray(self.index.contains(np.ascontiguousarray(ids, np.uint64)), bool).reshape(-1)
            if present.any():
                self.index.remove(np.ascontiguousarray(ids[present], np.uint64))
            self.unsaved += int(present.sum())

    def search(self, q: np.ndarray, count: int) -> np.ndarray:
        """Chunk ids of (about) the ``count`` vectors nearest to ``q``."""
        count = max(1, min(count, len(self)))
        setattr(self.index, "expansion_search", max(EXPANSION_SEARCH, count))  # noqa: B010 - a setter the stubs omit
        found = self.index.search(np.ascontiguousarray(q, np.float32), count, threads=1)
        return np.asarray(found.keys, np.int64).reshape(-1)

    def keys(self) -> np.ndarray:
        return np.asarray(self.index.keys, np.int64)

    def vectors_of(self, ids: np.ndarray) -> np.ndarray:
        return np.asarray(self.index.get(np.ascontiguousarray(ids, np.uint64), dtype="f32"), np.float32)

    # -- the cache file ------------------------------------------------------------
    def save(self, folder: Path | None, collection_id: int, ids: np.ndarray, fps: np.ndarray) -> bool:
        """Write the graph as ``c<id>-e<epoch>-s<seq>.usearch`` and, first, the fingerprints
        ``fps`` of its chunks ``ids``' vectors beside it (each a temporary file, then renamed),
        and remove the collection's older files. False (nothing written) when the folder cannot be."""
        if folder is None or self.version[0] < 0:
            return False
        epoch, seq = self.version
        stem = f"c{collection_id}-e{epoch}-s{seq}"
        order = np.argsort(ids, kind="stable")
        table = np.empty(len(ids), _FINGERPRINT_DTYPE)
        table["id"], table["fp"] = np.asarray(ids, np.int64)[order], np.asarray(fps, np.float64)[order]
        final = folder / f"{stem}.usearch"
        try:
            folder.mkdir(exist_ok=True)
            # the graph first, into a temporary file; its checksum heads the fingerprint table,
            # which is renamed into place before the graph (a graph whose table is missing or
            # names another checksum is never loaded)
            graph_tmp = _temporary(folder, collection_id)
            try:
                self.index.save(graph_tmp)
                with open(graph_tmp, "rb") as fh:
                    header = _header(fh.read())
                _write(folder, collection_id, folder / f"{stem}.fp.npy",
                       lambda tmp: _save_table(tmp, np.concatenate([header, table])))
                _write(folder, collection_id, final, None, graph_tmp)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(graph_tmp)
                raise
        except OSError:
            return False
        for other in [*_files(folder, collection_id), *_files(folder, collection_id, _FINGERPRINTS)]:
            if other[2].name not in (final.name, f"{stem}.fp.npy"):
                with contextlib.suppress(OSError):
                    other[2].unlink()
        self.unsaved = 0
        return True

    @classmethod
    def load(cls, folder: Path | None, collection_id: int, dims: int, epoch: int, seq: int) -> AnnGraph | None:
        """The newest saved graph of this collection and epoch not ahead of ``seq``, or None
        (none, unreadable, without its fingerprint table, not the file the table's checksum
        names, or of other dimensions)."""
        if folder is None:
            return None
        files = [f for f in _files(folder, collection_id) if f[0] == epoch and f[1] <= seq]
        if not files:
            return None
        _e, s, path = max(files, key=lambda f: f[1])
        saved = _read_fingerprints(path.with_name(path.name[:-len(".usearch")] + ".fp.npy"))
        if saved is None:
            return None
        ids, fps, header = saved
        try:
            data = path.read_bytes()
        except OSError:
            return None
        # usearch trusts its file: a damaged one crashes the process as it loads (a few bytes
        # changed anywhere were enough), and a foreign one of the same chunk ids was taken for
        # this one. Only the bytes the fingerprint table's checksum names are loaded.
        if not np.array_equal(_header(data), header):
            return None
        try:
            graph = cls(dims)
            graph.index.load(data)
            if int(graph.index.ndim) != dims:
                return None
        except Exception:  # (its own files only: a usearch of another version, say)
            return None
        graph.version = (epoch, s)
        graph.unsaved = 0
        graph.fingerprint = ids, fps
        return graph


def remove_files(db_path: str, collection_id: int) -> None:
    """Remove the graph files of a dropped collection (collection ids are never reused, so they
    would only take disk space)."""
    folder = cache_folder(db_path)
    if folder is None:
        return
    for *_, path in [*_files(folder, collection_id), *_files(folder, collection_id, _FINGERPRINTS)]:
        with contextlib.suppress(OSError):
            path.unlink()


def _temporary(folder: Path, collection_id: int) -> str:
    fd, tmp = tempfile.mkstemp(prefix=f".c{collection_id}-", suffix=".tmp", dir=folder)
    os.close(fd)
    return tmp


def _header(data: bytes) -> np.ndarray:
    """The first row of a fingerprint table: the size (as ``-1 - size``: chunk ids are positive)
    and CRC-32 of the graph file ``data``."""
    row = np.empty(1, _FINGERPRINT_DTYPE)
    row["id"], row["fp"] = -1 - len(data), float(zlib.crc32(data))
    return row


def _write(folder: Path, collection_id: int, final: Path, write: Any, tmp: str | None = None) -> None:
    """``write(path)`` into a temporary file of ``folder`` (or ``tmp``, already written), synced,
    then renamed to ``final``."""
    if tmp is None:
        tmp = _temporary(folder, collection_id)
    try:
        if write is not None:
            write(tmp)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _save_table(path: str, table: np.ndarray) -> None:
    with open(path, "wb") as fh:  # (np.save of a name adds ".npy" to it)
        np.save(fh, table, allow_pickle=False)


def _read_fingerprints(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The (sorted chunk ids, fingerprints, the graph file's checksum row) saved beside a graph;
    None when there are none (a file of an older ragdb, which has no checksum: rebuilt) or they
    cannot be read."""
    try:
        table = np.load(path, allow_pickle=False)
    except Exception:  # missing, truncated or foreign
        return None
    if table.dtype != _FINGERPRINT_DTYPE or table.ndim != 1 or len(table) < 1 or int(table["id"][0]) >= 0:
        return None
    ids = np.ascontiguousarray(table["id"][1:])
    if len(ids) and (int(ids[0]) < 0 or not bool(np.all(ids[1:] > ids[:-1]))):
        return None
    return ids, np.ascontiguousarray(table["fp"][1:]), table[:1].copy()


def _files(folder: Path, collection_id: int, pattern: re.Pattern[str] = _NAME) -> list[tuple[int, int, Path]]:
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    out = []
    for name in names:
        m = pattern.fullmatch(name)
        if m and int(m.group(1)) == collection_id:
            out.append((int(m.group(2)), int(m.group(3)), folder / name))
    return out


def _threads() -> int:
    return max(1, min(4, os.cpu_count() or 1))


def describe(graph: Any) -> dict[str, Any]:
    """Size and memory of a graph, for stats and the benchmark."""
    return {"vectors": len(graph), "memory_bytes": graph.memory_bytes, "storage": STORAGE,
            "connectivity": CONNECTIVITY, "expansion_search": EXPANSION_SEARCH}
