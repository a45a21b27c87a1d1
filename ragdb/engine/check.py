"""``Database.check``: every invariant of the file, verified from the rows.

SQLite integrity; statistics equal to counts of the rows; no orphaned chunk;
every packed column well-formed (postings, forward indexes, the change log,
vectors); each document frequency equal to the number of latest chunks
holding the term; packed postings listing exactly the (term, chunk, tf)
triples of the chunks' forward indexes; the filter index (doc_meta, doc_acl)
holding exactly the rows of the documents' metadata and labels; unless ``quick``, every document's
text equal to its content hash and valid UTF-8, and every chunk's own text
equal to its slice of the document; and for vectors: no orphans, the
recorded size, no holes below the watermark, the in-memory matrix equal to
the table.

Nothing here raises on damage: each kind of problem is reported once, with a
count and an example, and a row found malformed is left out of the checks
that would need to decode it.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import numpy as np

from ragdb.errors import TextDamaged
from ragdb.index.forward import unpack_forward_many
from ragdb.index import snapshot
from ragdb.index.inverted import Index, postings_problem
from ragdb.storage import DTYPES
from ragdb.engine.write import stored_filter_rows
from ragdb.storage.textcodec import ZSTD_MAGIC

if TYPE_CHECKING:
    from collections.abc import Iterable

    from ragdb.engine.state import Engine
    from ragdb.storage import Store

_PLURAL = {"entry": "entries"}
_FIRST_ID, _LAST_ID = -(1 << 63), (1 << 63) - 1  # the range of SQLite integers


def _schema_problems(store: Store) -> list[str]:
    """A collection other than the default must have exactly the default's tables,
    indexes and triggers (by their plain names); the default's check also looks at
    every other collection's."""
    problems = []
    default = store.view(0, "default").collection_objects()
    views = [store] if store.collection_id else [store.view(cid, name) for cid, name, _at in store.collection_rows()
                                                 if cid != 0]
    for view in views:
        objects = view.collection_objects()
        if objects != default:
            missing = sorted(set(default) - set(objects))
            extra = sorted(set(objects) - set(default))
            problems.append(f"collection {view.collection!r}: its schema differs from the default collection's "
                            f"(missing {[m[1] for m in missing]}, extra {[e[1] for e in extra]})")
    return problems


def check(engine: Engine, quick: bool = False) -> list[str]:
    """Verify every invariant; returns a list of problems (empty when healthy).

    Checks SQLite integrity, that statistics equal counts of the rows, that
    no chunk is orphaned, that every packed column (postings.chunk_ids, .tfs
    and .n, chunks.terms and .tfs, chunk_log.terms, vectors.vector) is a blob
    of whole values whose lengths agree (segment ids strictly increasing),
    that each document frequency equals the number of latest chunks holding
    the term, that the packed postings list exactly the (term, chunk, tf)
    triples of the chunks' forward indexes, and that the filter index (doc_meta,
    doc_acl) holds exactly the rows the documents' metadata and labels give.
    Unless ``quick``, it also reads
    every text: each document's must be valid UTF-8 equal to its
    ``content_hash``, each chunk's own copy valid UTF-8 equal to its
    ``[start:end]`` slice of the (verified) document text. Malformed rows are
    reported and left out of the later checks; the document-frequency check
    is skipped when a forward index it needs cannot be read.
    """
    store = engine.store
    problems: list[str] = []
    with store.read():
        problems += store.integrity_problems()
        problems += _schema_problems(store)
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
        problems += _filter_index_problems(store)
        table = {cid: latest for cid, _length, latest, _doc, _whole in store.chunk_table()}
        # Every chunk id ever handed out is below stats.next_chunk_id, and an open database's
        # view of the index is sized by it: an id at or past it (in a chunk, a posting or the
        # change log) is out of that view's bounds, and search and optimize would fail on it.
        next_id = s["next_chunk_id"]
        beyond = [cid for cid in table if cid >= next_id or cid < 1]
        if beyond or s["flushed_upto"] >= next_id:
            problems.append(f"{_count(len(beyond), 'chunk')} with an id outside 1..{next_id - 1}, flushed up to "
                            f"{s['flushed_upto']} (stats.next_chunk_id {next_id}): search and optimize fail on "
                            f"such ids; run `ragdb reindex`")
        new_terms, in_both = store.new_term_counts()
        if in_both:
            problems.append(f"{_count(in_both, 'term')} of new_terms also in vocabulary (by id or by term); "
                            f"run `ragdb reindex`")
        if new_terms and s["flushed_upto"] >= next_id - 1:
            # (a flush moves them all; lookups skip new_terms when no chunk came after it)
            problems.append(f"new_terms holds {_count(new_terms, 'term')} but no chunk was added since the last "
                            f"flush, so searches do not see them; run `ragdb reindex`")
        bulk, elsewhere, twice = store.bulk_term_counts()
        if elsewhere:
            problems.append(f"{_count(elsewhere, 'term')} of bulk_terms also in vocabulary or new_terms (by id or by "
                            f"term); run `ragdb reindex`")
        if twice:
            problems.append(f"{_count(twice, 'term')} of bulk_terms stored twice (under two ids); run `ragdb reindex`")
        if bulk and s["flushed_upto"] >= next_id - 1:
            problems.append(f"bulk_terms holds {_count(bulk, 'term')} but no chunk was added since the last "
                            f"flush, so searches do not see them; run `ragdb reindex`")
        tally = _Tally()
        flushed = s["flushed_upto"]
        bad_chunks: set[int] = set()
        df_known = True  # False when a forward index the live df depends on is unreadable
        df_real: Counter[int] = Counter()
        triples = []
        for block in _blocks(store.packed_forward_rows()):
            for cid, fwd in _forward_block(tally, block):
                if fwd is None:
                    bad_chunks.add(cid)
                    if table.get(cid) == 1 or cid > flushed:
                        df_known = False
                    continue
                terms, tfs = fwd
                if table.get(cid) == 1:
                    df_real.update(terms.tolist())
                if cid <= flushed:
                    triples.append(np.stack([terms.astype(np.int64), np.full(len(terms), cid, np.int64),
                                             tfs.astype(np.int64)], axis=1))
        for seq, cid, kind, blob in store.packed_log_rows():
            if cid >= next_id:
                tally.add(f"chunk_log names a chunk id past stats.next_chunk_id {next_id}; run `ragdb reindex`",
                          "entry", f"seq {seq}, chunk {cid}")
            if not _log_terms_ok(tally, seq, cid, kind, blob):
                df_known = False
        posted = []
        bad_terms: set[int] = set()
        for tid, seg, count, ikind, ids, fkind, tfs_b in store.packed_postings_rows():
            segment = _segment(tally, tid, seg, count, ikind, ids, fkind, tfs_b)
            if segment is None:
                bad_terms.add(tid)
                continue
            ids_a, tfs_a = segment
            if len(ids_a) and (int(ids_a[-1]) >= next_id or int(ids_a[0]) < 1):  # ids strictly increase
                tally.add(f"postings.chunk_ids holds a chunk id outside 1..{next_id - 1} (stats.next_chunk_id "
                          f"{next_id}): search and optimize fail on it; run `ragdb reindex`", "segment",
                          f"term id {tid}, segment {seg}: ids {int(ids_a[0])}..{int(ids_a[-1])}")
            live = np.array([c in table and c not in bad_chunks for c in ids_a.tolist()], dtype=bool)
            posted.append(np.stack([np.full(int(live.sum()), tid, np.int64), ids_a[live], tfs_a[live]], axis=1))
        problems += tally.problems()
        problems += _snapshot_readable(store, s)
        if df_known:
            index = Index(store)  # a fresh view, independent of this connection's cache
            index.sync()
            problems += _snapshot_agrees(store, index)
            bad_df = [(tid, df, df_real.get(tid, 0)) for tid, df in index.live_dfs().items()
                      if df != df_real.get(tid, 0)]
            if bad_df:
                tid, df, real = bad_df[0]
                problems.append(f"{len(bad_df)} terms have a wrong document frequency "
                                f"(e.g. term id {tid}: df {df}, real {real})")
        a = _sorted_rows(triples, bad_terms)
        b_ = _sorted_rows(posted, bad_terms)
        if a.shape != b_.shape or not np.array_equal(a, b_):
            problems.append(f"postings disagree with the chunks' forward indexes "
                            f"({len(b_)} live postings, {len(a)} expected)")
        if not quick:
            text = _text_problems(store)
            # damaged text would also fail its vectors' hashes: that is reported once, above
            problems += text or _vector_hash_problems(store)
    return problems + check_vectors(engine)


def _snapshot_readable(store: Store, stats: dict[str, int]) -> list[str]:
    """A chunk-state snapshot tagged with the last flush that cannot be read (opening scans
    the chunk rows instead: slower, not wrong)."""
    got = store.chunk_state_snapshot()
    if got is None or (got[0], got[1]) != (stats["flush_count"], stats["flushed_upto"]):
        return []  # none, or another flush's: not used
    try:
        n = len(snapshot.decode(got[2]).lengths)
    except ValueError as e:
        return [f"chunk_state: the snapshot of the last flush cannot be read ({e}); handles scan every chunk "
                f"row instead; `ragdb reindex` writes it again"]
    if n != got[1] + 1:
        return [f"chunk_state: the snapshot of the last flush holds {n} chunk ids, not {got[1] + 1}; handles "
                f"scan every chunk row instead; `ragdb reindex` writes it again"]
    return []


def _snapshot_agrees(store: Store, index: Index) -> list[str]:
    """Whether a view opened through the chunk-state snapshot (``index``) holds what a scan of
    every chunk row gives (the same arrays, the same tail)."""
    scanned = Index(store, use_snapshot=False)
    scanned.sync()
    n = max(len(index.lengths), len(scanned.lengths))
    differ: set[int] = set()
    for name in ("lengths", "state", "chunk_doc", "whole"):
        a, b = getattr(index, name), getattr(scanned, name)
        a = np.concatenate([a, np.zeros(n - len(a), a.dtype)])
        b = np.concatenate([b, np.zeros(n - len(b), b.dtype)])
        differ.update(np.flatnonzero(a != b).tolist())
    tail = index.tail_chunk_ids() != scanned.tail_chunk_ids()
    if not differ and not tail:
        return []
    where = f"e.g. chunk id {min(differ)}" if differ else "the unflushed chunks"
    return [f"chunk_state: the snapshot of the last flush and the change log disagree with the chunk rows "
            f"({_count(len(differ), 'chunk id')}; {where}); `ragdb reindex` writes it again"]


def check_vectors(engine: Engine) -> list[str]:
    """Vector problems (empty when healthy): orphans, a malformed model record, vectors
    that are not a blob of the recorded size, holes below the watermark, and the
    in-memory matrix disagreeing with the table."""
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
        try:
            dims, dtype = int(info["dimensions"]), str(info["dtype"])
            itemsize = np.dtype(DTYPES[dtype]).itemsize
        except (KeyError, TypeError, ValueError):
            problems.append(f"the recorded embedding model is malformed: {info!r}")
            return problems
        n, cid, kind, size = st.malformed_vectors(dims * itemsize)
        if n:
            problems.append(f"vectors.vector is not {dims} {dtype} values in {_count(n, 'vector')} "
                            f"(e.g. chunk {cid}: {kind} of {_count(size, 'byte')})")
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


class _Tally:
    """Problems by kind: how many rows have each, and the first one's description."""

    def __init__(self) -> None:
        self.kinds: dict[tuple[str, str], list[Any]] = {}

    def add(self, what: str, noun: str, example: str) -> None:
        entry = self.kinds.setdefault((what, noun), [0, example])
        entry[0] += 1

    def problems(self) -> list[str]:
        return [f"{what} in {_count(n, noun)} (e.g. {example})" for (what, noun), (n, example) in self.kinds.items()]


def _count(n: Any, noun: str) -> str:
    return f"{n} {noun if n == 1 else _PLURAL.get(noun, noun + 's')}"


def _blocks(rows: Iterable[Any], size: int = 4096) -> Iterator[list[Any]]:
    block: list[Any] = []
    for row in rows:
        block.append(row)
        if len(block) >= size:
            yield block
            block = []
    if block:
        yield block


def _forward_block(tally: _Tally, block: Sequence[tuple[int, str, bytes | None, str, bytes | None]]
                   ) -> Iterator[tuple[int, tuple[np.ndarray, np.ndarray] | None]]:
    """Each chunk's (id, (term ids, tfs)), or (id, None) (reported) when malformed: raw or packed
    (:func:`ragdb.index.forward.unpack_forward_many` with ``check``, in blocks of rows)."""
    blobs: list[tuple[int, bytes, bytes]] = []
    for cid, tkind, t, fkind, f in block:
        where = f"chunk {cid}"
        if tkind != "blob" or t is None:
            tally.add("chunks.terms is not a blob", "chunk", f"{where}: {tkind}")
        elif fkind != "blob" or f is None:
            tally.add("chunks.tfs is not a blob", "chunk", f"{where}: {fkind}")
        else:
            blobs.append((cid, t, f))
            continue
        yield cid, None
    if not blobs:
        return
    batch = unpack_forward_many([t for _, t, _ in blobs], [f for _, _, f in blobs], check=True)
    for (cid, _t, _f), problem, fwd in zip(blobs, batch.problems, batch.rows()):
        if problem is not None:
            tally.add(problem[0], "chunk", f"chunk {cid}: {problem[1]}")
            yield cid, None
        else:
            yield cid, fwd


def _log_terms_ok(tally: _Tally, seq: int, cid: int, kind: str, blob: bytes | None) -> bool:
    """Whether a chunk_log entry's terms are a forward index's term ids, raw or packed (else reported)."""
    where = f"seq {seq}, chunk {cid}"
    if kind != "blob" or blob is None:
        tally.add("chunk_log.terms is not a blob", "entry", f"{where}: {kind}")
        return False
    problem = unpack_forward_many([blob], check=True, column="chunk_log.terms").problems[0]
    if problem is not None:
        tally.add(problem[0], "entry", f"{where}: {problem[1]}")
        return False
    return True


def _segment(tally: _Tally, tid: int, seg: int, n: Any, ikind: str, ids: bytes | None, fkind: str,
             tfs: bytes | None) -> tuple[np.ndarray, np.ndarray] | None:
    """A postings segment's (chunk ids, tfs) as int64, or None (reported) when malformed
    (raw or packed: :func:`ragdb.index.inverted.postings_problem`)."""
    where = f"term id {tid}, segment {seg}"
    for column, kind, blob in (("postings.chunk_ids", ikind, ids), ("postings.tfs", fkind, tfs)):
        if kind != "blob" or blob is None:
            tally.add(f"{column} is not a blob", "segment", f"{where}: {kind}")
            return None
    assert ids is not None and tfs is not None
    if not (type(n) is int and n >= 0):
        tally.add("postings.n is not a count", "segment", f"{where}: n {n!r}")
        return None
    problem, detail, ids_64, tfs_64 = postings_problem(ids, tfs, n)
    if problem:
        tally.add(problem, "segment", f"{where}: {detail}" if detail else where)
        return None
    return ids_64, tfs_64


def _text_problems(store: Store) -> list[str]:
    """Text problems: every document's text read as bytes, in blocks, with its chunks' own texts."""
    tally = _Tally()
    after = _FIRST_ID
    for block in store.document_text_blocks():
        verified: dict[int, str] = {}  # document id -> text, when it matches its content hash
        for doc_id, digest, kind, raw in block:
            text = _decode(store, tally, "documents.text", "document", f"document {doc_id}", kind, raw)
            if text is None:
                continue
            if hashlib.sha256(text.encode("utf-8")).hexdigest().encode() != digest:
                tally.add("documents.text does not match its content_hash", "document", f"document {doc_id}")
                continue
            verified[doc_id] = text
        upto = block[-1][0]
        _chunk_text_problems(store, tally, store.chunk_texts(after, upto), verified)
        after = upto
    _chunk_text_problems(store, tally, store.chunk_texts(after, _LAST_ID), {})  # chunks of no document
    return tally.problems()


def _filter_index_problems(store: Store) -> list[str]:
    """The filter index must hold exactly the rows each document's metadata and labels
    give, as every write derives them (:func:`ragdb.engine.write.stored_filter_rows`). A missing doc_acl row hides a document from principals holding the label, an
    extra one shows it to principals the document does not name; a missing or extra
    doc_meta row makes a filter miss a document or match one it should not."""
    tally = _Tally()
    missing: dict[str, list[Any]] = {"doc_meta": [0, None], "doc_acl": [0, None]}
    extra: dict[str, list[Any]] = {"doc_meta": [0, None], "doc_acl": [0, None]}
    after = _FIRST_ID
    for block in store.document_filter_blocks():
        upto = block[-1][0]
        _compare_filter_rows(tally, block, *store.filter_index_rows(after, upto), missing, extra)
        after = upto
    _compare_filter_rows(tally, [], *store.filter_index_rows(after, _LAST_ID), missing, extra)  # of no document
    problems = tally.problems()
    for found, table, wording, effect in (
            (missing, "doc_meta", "{} of the documents' metadata", "filters on them miss those documents"),
            (missing, "doc_acl", "{} of the documents' labels", "principals holding them do not see those documents"),
            (extra, "doc_meta", "{} not in the documents' metadata", "filters on them match documents that do not say so"),
            (extra, "doc_acl", "{} not in the documents' labels", "principals holding them see documents not labelled so")):
        n, example = found[table]
        if n:
            verb = "lacks" if found is missing else "has"
            problems.append(f"{table} {verb} {wording.format(_count(n, 'row'))} (e.g. {example}): {effect}; "
                            f"`ragdb reindex` writes the filter index anew")
    return problems


def _compare_filter_rows(tally: _Tally, docs: list[tuple[int, Any, Any]], meta_rows: list[tuple[Any, ...]],
                         acl_rows: list[tuple[Any, ...]], missing: dict[str, list[Any]],
                         extra: dict[str, list[Any]]) -> None:
    """Compare a block of documents' filter index rows with what their metadata and labels give."""
    want_meta: Counter[tuple[Any, ...]] = Counter()
    want_acl: set[tuple[Any, ...]] = set()
    unreadable: set[int] = set()  # documents whose own JSON is damaged: reported, their rows not compared
    for doc_id, metadata, acl in docs:
        meta, labels = stored_filter_rows(doc_id, metadata, acl)
        if meta is None:
            tally.add("documents.metadata is not a JSON object", "document", f"document {doc_id}")
        if labels is None:
            tally.add("documents.acl is not a JSON array of strings", "document", f"document {doc_id}")
        if meta is None or labels is None:
            unreadable.add(doc_id)
            continue
        want_meta.update(_as_stored(r) for r in meta)
        want_acl.update(labels)
    have_meta = Counter(_as_stored(r) for r in meta_rows if r[0] not in unreadable)
    have_acl = {tuple(r) for r in acl_rows if r[0] not in unreadable}
    for table, lacking, surplus in (("doc_meta", want_meta - have_meta, have_meta - want_meta),
                                    ("doc_acl", Counter(want_acl - have_acl), Counter(have_acl - want_acl))):
        for found, rows in ((missing, lacking), (extra, surplus)):
            if rows:
                entry = found[table]
                entry[0] += sum(rows.values())
                if entry[1] is None:
                    entry[1] = _filter_row(min(rows, key=repr))


def _as_stored(row: Sequence[Any]) -> tuple[Any, ...]:
    """A doc_meta row (doc id, key, value, num, at) with its value compared as the JSON
    number it is written as: a float as the decimal of its shortest repr. PostgreSQL's
    jsonb keeps 1e23 as the numeric 100000000000000000000000 and gives it back as that
    int, which is not the float 1e23 (99999999999999991611392) but is the same stored
    number (issue 32, item 11); SQLite gives the float back."""
    doc_id, key, value, *rest = row
    if type(value) is float:
        # a whole number past 2**53 as the integer it is (PostgreSQL holds it so: its
        # shortest repr, 2.0**60 as 1.152921504606847e18, is another integer)
        value = int(value) if math.isfinite(value) and value.is_integer() and abs(value) >= 2 ** 53 \
            else Decimal(repr(value))
    return (doc_id, key, value, *rest)


def _filter_row(row: tuple[Any, ...]) -> str:
    """A filter index row as a problem's example."""
    if len(row) == 2:
        return f"document {row[0]}, label {row[1]!r}"
    value = str(row[2]) if isinstance(row[2], Decimal) else repr(row[2])
    return f"document {row[0]}, {row[1]!r} = {value}"


def _vector_hash_problems(store: Store) -> list[str]:
    """A vector whose text hash is not its chunk's text would be copied to other chunks
    of that text (vector reuse), so every recorded hash is verified."""
    tally = _Tally()
    for block in store.hashed_vector_texts():
        for cid, digest, raw in block:  # text_hash is SHA-256 of the UTF-8 text
            if raw is None or hashlib.sha256(raw).digest() != digest:
                tally.add("vectors.text_hash does not match its chunk's text", "vector", f"chunk {cid}")
    return tally.problems()


def _chunk_text_problems(store: Store, tally: _Tally, rows: Iterable[tuple[int, int, Any, Any, str, bytes | None]],
                         texts: dict[int, str]) -> None:
    for cid, doc_id, start, end, kind, raw in rows:
        doc = texts.get(doc_id)
        where = f"chunk {cid} of document {doc_id}"
        if raw is None:  # no copy: the chunk is its whole document
            if doc is not None and (start != 0 or end != len(doc)):
                tally.add("chunks.text is NULL (the whole document) but the chunk is not its whole document",
                          "chunk", f"{where}: [{start}:{end}] of {len(doc)} characters")
            continue
        text = _decode(store, tally, "chunks.text", "chunk", where, kind, raw)
        if text is None or doc is None:
            continue
        if not (type(start) is int and type(end) is int) or text != doc[start:end]:
            tally.add("chunks.text differs from its document's text[start:end]", "chunk", f"{where}: [{start}:{end}]")


def _decode(store: Store, tally: _Tally, column: str, noun: str, where: str, kind: str,
            raw: bytes | None) -> str | None:
    """A stored text, or None (reported) when it is not TEXT or a compressed text (a zstd
    frame, :mod:`ragdb.storage.textcodec`) that decodes, or not valid UTF-8."""
    if kind == "blob" and raw is not None and raw[:4] == ZSTD_MAGIC:
        try:
            raw = store.text_codec().decode_bytes(raw)
        except TextDamaged as e:
            tally.add(f"{column} is compressed and cannot be read back", noun, f"{where}: {e}")
            return None
    elif kind != "text" or raw is None:
        tally.add(f"{column} is not stored as text", noun, f"{where}: {kind}")
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        tally.add(f"{column} is not valid UTF-8", noun, f"{where}: byte {e.start}")
        return None


def _sorted_rows(parts: list[np.ndarray], skip_terms: set[int] | None = None) -> np.ndarray:
    if not parts:
        return np.zeros((0, 3), np.int64)
    a = np.concatenate(parts)
    if skip_terms:
        a = a[~np.isin(a[:, 0], np.fromiter(skip_terms, np.int64, len(skip_terms)))]
    if len(a) == 0:
        return np.zeros((0, 3), np.int64)
    return a[np.lexsort((a[:, 1], a[:, 0]))]
