"""Vectors: storage, exact search and its cache, pending chunks, agreement with a rebuild
(hybrid search and fusion: tests/index/hybrid/)."""

from __future__ import annotations

import hashlib
import json
import sqlite3

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ragdb
from ragdb.index import vectors as V
from ragdb.storage import vectors as storage_vectors
from ragdb.models.embeddings import HashEmbedder
from ragdb.errors import EmbeddingError, InvalidInput
from vector_helpers import DOCS, fill, hybrid_search, vector_search


@pytest.fixture
def emb():
    return HashEmbedder(64)


@pytest.fixture
def db(emb):
    with ragdb.open(":memory:") as d:
        fill(d)
        assert d.embed(emb) == len(DOCS)
        yield d


def fingerprint(hits):
    return [(h.source, h.start, h.end, h.text, h.score) for h in hits]


# -- storage -------------------------------------------------------------------


def test_migration_tables_and_model_record(tmp_path, emb):
    path = tmp_path / "v.db"
    with ragdb.open(path) as d:
        fill(d)
        d.embed(emb)
    conn = sqlite3.connect(path)
    names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    assert {"vectors", "vector_log", "vector_stats", "chunks_delete_vectors"} <= names
    value = conn.execute("SELECT value FROM settings WHERE key = 'embedding'").fetchone()[0]
    assert json.loads(value) == {"model": "hash-64", "dimensions": 64, "dtype": "float32"}
    blob = conn.execute("SELECT vector FROM vectors LIMIT 1").fetchone()[0]
    vec = np.frombuffer(blob, "<f4")
    assert vec.shape == (64,) and abs(float(np.linalg.norm(vec)) - 1) < 1e-6
    conn.close()


def test_put_normalizes_and_search_is_exact_cosine(emb):
    with ragdb.open(":memory:") as d:
        fill(d)
        st_ = d._store
        with d._store.write():
            st_.set_vector_model("toy", 3)
            ids = [1, 2, 3, 4, 5]
            vecs = [np.array(v, np.float32) for v in ([3, 0, 0], [1, 1, 0], [0, 2, 0], [-1, 0, 0], [0, 0, 0])]
            assert st_.put_vectors(list(zip(ids, vecs))) == 5
            assert st_.put_vectors([(999, np.ones(3))]) == 0  # no such chunk: skipped
        with d._store.read():
            assert st_.vector_count() == 5
            got_ids, mat = st_.all_vectors()
        assert got_ids.tolist() == ids
        assert np.allclose(np.linalg.norm(mat[:4], axis=1), 1) and not mat[4].any()
        vi = V.VectorIndex(d._store)
        with d._store.read():
            vi.sync()
        res = vi.search(np.array([1.0, 0, 0]), 10)
        assert [c for c, _ in res] == [1, 2, 3, 5, 4]
        assert res[0][1] == 1.0 and res[1][1] == pytest.approx(2 ** -0.5) and res[4][1] == -1.0
        # positive only; k cut; ties broken by chunk id; with_ties keeps all tied at the cut
        assert [c for c, _ in vi.search(np.array([1.0, 0, 0]), 10, min_score=0.0)] == [1, 2]
        assert [c for c, _ in vi.search(np.array([0, 0, 1.0]), 2)] == [1, 2]
        assert [c for c, _ in vi.search(np.array([0, 0, 1.0]), 2, with_ties=True)] == [1, 2, 3, 4, 5]
        # the mask is over chunk ids; ids past its end are not allowed
        mask = np.zeros(3, bool)
        mask[2] = True
        assert [c for c, _ in vi.search(np.array([1.0, 0, 0]), 10, mask)] == [2]
        assert vi.search(np.zeros(3), 5) == []
        with pytest.raises(EmbeddingError):
            vi.search(np.ones(4), 5)
        with d._store.write(), pytest.raises(EmbeddingError, match="2 dimensions"):
            st_.put_vectors([(1, np.ones(2))])


def test_stored_vectors_record_their_text_hash(emb):
    """put_vectors records the SHA-256 of each chunk's text (from the stored text unless
    given); vectors_by_hash finds them; copy_vectors with existing_only skips deleted chunks."""
    with ragdb.open(":memory:") as d:
        fill(d)
        st_ = d._store
        with st_.write():
            st_.set_vector_model(emb.name, emb.dimensions)
            assert st_.put_vectors([(1, emb.embed([DOCS[0][1]])[0]), (99, np.ones(64))]) == 1
            assert st_.put_vectors([(2, emb.embed([DOCS[1][1]])[0])], [b"given"]) == 1
            with pytest.raises(InvalidInput, match="2 hashes for 1 vectors"):
                st_.put_vectors([(3, np.ones(64))], [b"a", b"b"])
            hashes = dict(st_.conn.execute("SELECT chunk_id, text_hash FROM vectors"))
            assert hashes == {1: storage_vectors.text_hash(DOCS[0][1]), 2: b"given"}
            found = st_.vectors_by_hash([storage_vectors.text_hash(DOCS[0][1]), b"given", b"absent"])
            assert set(found) == {storage_vectors.text_hash(DOCS[0][1]), b"given"}
            assert st_.copy_vectors([(3, found[b"given"], b"given"), (98, found[b"given"], b"given")],
                                    existing_only=True) == 1
            assert st_.vectors_for([3])[1].tolist() == st_.vectors_for([2])[1].tolist()
        assert storage_vectors.text_hash("é") == hashlib.sha256("é".encode()).digest()


def test_float16_vectors(emb):
    with ragdb.open(":memory:") as d:
        fill(d)
        st_ = d._store
        with d._store.write():
            st_.set_vector_model(emb.name, emb.dimensions, dtype="float16")
            st_.put_vectors([(1, emb.embed([DOCS[0][1]])[0])])
            assert len(d._store.conn.execute("SELECT vector FROM vectors").fetchone()[0]) == 128
        hits = vector_search(d, DOCS[0][1], 3, emb)
        assert hits[0].source == "a.md" and hits[0].score == pytest.approx(1.0, abs=1e-3)
        assert d.check() == []


def test_exact_scores_do_not_depend_on_row_position(emb):
    """float32 BLAS results depend on a row's position; the two-stage search's do not."""
    rng = np.random.default_rng(7)
    mat = rng.standard_normal((3000, 96)).astype(np.float32)
    mat /= np.linalg.norm(mat, axis=1, keepdims=True)
    q = rng.standard_normal(96)

    def index(perm):
        vi = V.VectorIndex(None)  # type: ignore[arg-type]
        vi.dims, vi.n = 96, len(perm)
        vi.ids, vi.matrix = np.asarray(perm, np.int64) + 1, np.ascontiguousarray(mat[perm])
        return vi

    a = index(np.arange(3000)).search(q, 50)
    b = index(rng.permutation(3000)).search(q, 50)
    assert a == b
    exact = (mat.astype(np.float64) @ (q / np.linalg.norm(q))).astype(np.float32)
    best = np.argsort(-exact, kind="stable")[:50] + 1
    assert [c for c, _ in a] == best.tolist()


# -- model record --------------------------------------------------------------------


def test_model_mismatch_is_a_clear_error_and_rebuild_switches(db, emb):
    other = HashEmbedder(32)
    with pytest.raises(EmbeddingError, match=r"hash-64.*hash-32.*--rebuild"):
        db.embed(other)
    with pytest.raises(EmbeddingError, match="hash-64"):
        db.check_embedder(other)
    with pytest.raises(EmbeddingError, match="hash-32"):
        vector_search(db, "cat", 3, other)
    with pytest.raises(EmbeddingError):
        hybrid_search(db, "cat", 3, other)
    db.check_embedder(emb)
    assert db.embed(other, rebuild=True) == len(DOCS)
    with db._store.read():
        assert db._store.vector_model() == {"model": "hash-32", "dimensions": 32,
                                                          "dtype": "float32"}
    assert vector_search(db, "cat on the mat", 1, other)[0].source == "a.md"
    with pytest.raises(EmbeddingError, match="hash-32"):
        vector_search(db, "cat", 3, emb)
    # the recorded model is the default embedder
    assert db.recorded_embedder().name == "hash-32"
    assert vector_search(db, "cat on the mat", 1)[0].source == "a.md"
    assert db.check() == []


def test_no_vectors_yet(emb):
    with ragdb.open(":memory:") as d:
        assert vector_search(d, "anything", 3, emb) == []  # empty database
        fill(d)
        with pytest.raises(EmbeddingError, match="ragdb embed"):
            vector_search(d, "cat", 3, emb)
        with pytest.raises(EmbeddingError, match="ragdb embed"):
            vector_search(d, "cat", 3)


# -- deletion and pending chunks ------------------------------------------------------------


def vector_ids(d):
    return [r[0] for r in d._store.conn.execute("SELECT chunk_id FROM vectors ORDER BY chunk_id")]


def test_deleting_documents_deletes_their_vectors(db, emb):
    before = vector_ids(db)
    assert len(before) == len(DOCS)
    doc = db.documents("a.md")[0]
    db.delete(doc.id)
    assert len(vector_ids(db)) == len(DOCS) - 1
    assert all(h.source != "a.md" for h in vector_search(db, "cat sat on the mat", 10, emb))
    # replacing a document deletes its old chunks' vectors; the new chunk is pending
    db.add("Dogs sleep all day.", source="b.md", chunker="none")
    assert len(vector_ids(db)) == len(DOCS) - 2
    with db._store.read():
        assert db._store.unembedded_count() == 1
    assert db.embed(emb) == 1
    assert vector_search(db, "dogs sleep all day", 1, emb)[0].source == "b.md"
    db.delete(source="*.md", glob=True)
    assert vector_ids(db) == []
    assert db.check() == [] and db.check() == []


def test_embed_pending_fills_pending_chunks_and_survives_failures(emb):
    class Flaky:
        name, dimensions = emb.name, emb.dimensions

        def __init__(self):
            self.calls = 0

        def embed(self, texts):
            self.calls += 1
            if self.calls == 2:
                raise RuntimeError("endpoint down")
            return emb.embed(texts)

    with ragdb.open(":memory:") as d:
        fill(d)
        storage = d._store
        with d._store.read():
            assert storage.unembedded_count() == len(DOCS)
        flaky = Flaky()
        with pytest.raises(EmbeddingError, match="endpoint down.*3 chunks are pending.*ragdb embed"):
            d.embed(flaky, batch_size=2)
        # the first batch landed, the rest is pending; the text is all there
        assert len(vector_ids(d)) == 2 and d.stats().documents == len(DOCS)
        assert {h.source for h in d.search("mat")} == {"a.md", "e.md"}
        with d._store.read():
            assert storage.unembedded_count() == 3 and storage.embedded_upto() == 2
        progress = []
        assert d.embed(flaky, batch_size=2, progress=lambda done, total: progress.append((done, total))) == 3
        assert progress == [(2, 3), (3, 3)]
        with d._store.read():
            assert storage.unembedded_count() == 0 and storage.embedded_upto() == 5
            assert storage.unembedded_chunks() == []
        assert d.embed(emb) == 0
        # an embedder returning garbage stores nothing
        class Bad:
            name, dimensions = emb.name, emb.dimensions

            def embed(self, texts):
                return np.full((len(texts), 64), np.nan, np.float32)

        d.add("new text about mats", source="f.md")
        with pytest.raises(EmbeddingError, match="NaN"):
            d.embed(Bad())
        with d._store.read():
            assert storage.unembedded_count() == 1
        # a hole below the watermark (made by hand) is found by a full scan
        d._store.conn.execute("DELETE FROM vectors WHERE chunk_id = 1")
        assert d.check() != []
        assert d.embed(emb) == 1  # only f.md
        assert d.embed(emb, full_scan=True) == 1
        assert d.check() == [] and d.check() == []


def test_missing_chunks_text_of_multi_chunk_documents(emb):
    text = "\n\n".join(f"Paragraph {i} talks about topic {i}." for i in range(4))
    with ragdb.open(":memory:") as d:
        d.add(text, source="p.md", chunker="paragraph")
        d.add("single whole document", source="s.md", chunker="none")
        with d._store.read():
            rows = d._store.unembedded_chunks()
        assert [t for _, t in rows] == [f"Paragraph {i} talks about topic {i}." for i in range(4)] + [
            "single whole document"]
        assert [t for _, t in d._store.unembedded_chunks(limit=2, after=rows[1][0])] == [
            rows[2][1], rows[3][1]]


# -- caches across connections ---------------------------------------------------------------


def test_cache_follows_writes_of_another_connection(tmp_path, emb):
    path = tmp_path / "shared.db"
    with ragdb.open(path) as one, ragdb.open(path) as two:
        fill(one, DOCS[:3])
        one.embed(emb)
        assert [h.source for h in vector_search(two, "cat sat on the mat", 1, emb)] == ["a.md"]
        # another connection adds and embeds
        fill(two, DOCS[3:])
        two.embed(emb)
        assert vector_search(one, DOCS[4][1], 1, emb)[0].source == "e.md"
        # another connection deletes
        two.delete(source="a.md")
        assert all(h.source != "a.md" for h in vector_search(one, "cat sat on the mat", 10, emb))
        # another connection replaces a document (old vector deleted, new one added)
        one.add("Particles and waves in quantum fields.", source="c.md", chunker="none")
        one.embed(emb)
        assert vector_search(two, "particles and waves in quantum fields", 1, emb)[0].score == pytest.approx(1.0)
        # another connection rebuilds with another model
        other = HashEmbedder(16)
        two.embed(other, rebuild=True)
        with pytest.raises(EmbeddingError, match="hash-16"):
            vector_search(one, "cat", 3, emb)
        assert vector_search(one, DOCS[1][1], 1, other)[0].source == "b.md"
        for d in (one, two):
            assert d.check() == []


def test_cut_log_forces_full_reload(tmp_path, emb, monkeypatch):
    monkeypatch.setattr(storage_vectors, "LOG_KEEP", 3)
    path = tmp_path / "cut.db"
    with ragdb.open(path) as one, ragdb.open(path) as two:
        fill(one, DOCS[:2])
        one.embed(emb)
        vector_search(two, "cat", 3, emb)
        epoch = two._vectors.version[0]
        fill(one, DOCS[2:])
        one.embed(emb, batch_size=1)  # several puts: the log is cut
        assert vector_search(two, DOCS[3][1], 1, emb)[0].source == "d.md"
        assert two._vectors.version[0] > epoch
        assert two.check() == [] and one.check() == []


SOURCES = [f"s{i}" for i in range(6)]
WORDS = ["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta"]
texts = st.lists(st.sampled_from(WORDS), min_size=1, max_size=6).map(" ".join)
ops = st.lists(st.one_of(st.tuples(st.just("add"), st.sampled_from(SOURCES), texts),
                         st.tuples(st.just("delete"), st.sampled_from(SOURCES), st.just(""))),
               min_size=1, max_size=14)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(ops=ops, query=texts, embed_every=st.integers(1, 4))
def test_vector_search_after_adds_and_deletes_equals_a_rebuild(tmp_path_factory, ops, query, embed_every):
    emb = HashEmbedder(16)
    path = tmp_path_factory.mktemp("prop") / "live.db"
    live: dict[str, str] = {}
    with ragdb.open(path) as writer, ragdb.open(path) as reader:
        for n, (op, source, text) in enumerate(ops):
            if op == "add":
                writer.add(text, source=source, chunker="none")
                live[source] = text
            elif source in live:
                writer.delete(source=source)
                del live[source]
            if n % embed_every == 0:
                writer.embed(emb)
                vector_search(reader, query, 4, emb) if live else None  # the reader caches mid-way
        writer.embed(emb)
        with ragdb.open(":memory:") as fresh:
            for source in sorted(live):
                fresh.add(live[source], source=source, chunker="none")
            fresh.embed(emb)
            for k in (1, 3, 10):
                want = fingerprint(vector_search(fresh, query, k, emb))
                assert fingerprint(vector_search(writer, query, k, emb)) == want
                assert fingerprint(vector_search(reader, query, k, emb)) == want
                for fusion in ("weighted", "rrf"):
                    want_h = fingerprint(hybrid_search(fresh, query, k, emb, fusion=fusion))
                    assert fingerprint(hybrid_search(reader, query, k, emb, fusion=fusion)) == want_h
        assert writer.check() == [] and reader.check() == []
