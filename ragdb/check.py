"""``Database.check``: every invariant of the file, verified from the rows.

SQLite integrity; statistics equal to counts of the rows; no orphaned chunk;
each document frequency equal to the number of latest chunks holding the
term; packed postings listing exactly the (term, chunk, tf) triples of the
chunks' forward indexes; and for vectors: no orphans, the recorded size, no
holes below the watermark, the in-memory matrix equal to the table.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

import numpy as np

from .index import Index, unpack_ids, unpack_tfs
from .storage import DTYPES

if TYPE_CHECKING:
    from .engine import Engine


def check(engine: Engine) -> list[str]:
    """Verify every invariant; returns a list of problems (empty when healthy).

    Checks SQLite integrity, that statistics equal counts of the rows, that
    no chunk is orphaned, that each document frequency equals the number of
    latest chunks holding the term, and that the packed postings list
    exactly the (term, chunk, tf) triples of the chunks' forward indexes.
    """
    store = engine.store
    problems: list[str] = []
    with store.read():
        problems += store.integrity_problems()
        s = store.stats_row()
        docs, n, total = store.real_counts()
        if (docs, n, total) != (s["n_docs"], s["n_chunks"], s["total_length"]):
            problems.append(f"statistics say {s['n_docs']} documents, {s['n_chunks']} chunks, total length "
                            f"{s['total_length']}; rows say {docs}, {n}, {total}")
        if (o := store.orphan_chunks()):
            problems.append(f"{o} chunks belong to no document")
        if (m := store.latest_mismatch()):
            problems.append(f"{m} chunks disagree with their document about being the latest version")
        if (d := store.duplicate_latest_sources()):
            problems.append(f"{d} sources have more than one latest version")
        fwd = store.forward_all()
        table = {cid: latest for cid, _length, latest, _doc, _whole in store.chunk_table()}
        df_real: Counter[int] = Counter()
        triples = []
        for cid, t, f in fwd:
            terms = unpack_ids(t)
            if table.get(cid) == 1:
                df_real.update(terms.tolist())
            if cid <= s["flushed_upto"]:
                triples.append(np.stack([terms.astype(np.int64), np.full(len(terms), cid, np.int64),
                                         unpack_tfs(f).astype(np.int64)], axis=1))
        index = Index(store)  # a fresh view, independent of this connection's cache
        index.sync()
        bad_df = [(tid, df, df_real.get(tid, 0)) for tid, df in index.live_dfs().items()
                  if df != df_real.get(tid, 0)]
        if bad_df:
            tid, df, real = bad_df[0]
            problems.append(f"{len(bad_df)} terms have a wrong document frequency "
                            f"(e.g. term id {tid}: df {df}, real {real})")
        posted = []
        for tid, ids, tfs in store.all_postings():
            ids_a = unpack_ids(ids).astype(np.int64)
            live = np.array([c in table for c in ids_a.tolist()], dtype=bool)
            posted.append(np.stack([np.full(int(live.sum()), tid, np.int64), ids_a[live],
                                    unpack_tfs(tfs).astype(np.int64)[live]], axis=1))
        a = _sorted_rows(triples)
        b_ = _sorted_rows(posted)
        if a.shape != b_.shape or not np.array_equal(a, b_):
            problems.append(f"postings disagree with the chunks' forward indexes "
                            f"({len(b_)} live postings, {len(a)} expected)")
    return problems + check_vectors(engine)


def check_vectors(engine: Engine) -> list[str]:
    """Vector problems (empty when healthy): orphans, wrong sizes, holes below the
    watermark, and the in-memory matrix disagreeing with the table."""
    problems: list[str] = []
    st = engine.store
    with st.read():
        if (o := st.orphan_vectors()):
            problems.append(f"{o} vectors belong to no chunk")
        info = st.vector_model()
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
        vi = engine.vectors
        vi.sync()
        ids, mat = st.all_vectors()
        live = np.flatnonzero(vi.ids[:vi.n] >= 0)
        order = live[np.argsort(vi.ids[live])]
        if not (np.array_equal(vi.ids[order], ids) and np.array_equal(vi.matrix[order], mat)):
            problems.append("the in-memory vector index disagrees with the stored vectors")
    return problems


def _sorted_rows(parts: list[np.ndarray]) -> np.ndarray:
    if not parts:
        return np.zeros((0, 3), np.int64)
    a = np.concatenate(parts)
    if len(a) == 0:
        return np.zeros((0, 3), np.int64)
    return a[np.lexsort((a[:, 1], a[:, 0]))]
