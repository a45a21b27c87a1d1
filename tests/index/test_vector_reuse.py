"""Vectors of unchanged text are reused, never re-embedded (issue 14): a replaced
document's unchanged chunks keep their vectors, any new chunk whose text is already
stored takes its vector over, embedding dedupes equal texts, and adds embed only
with ``embed_on_add`` on."""

from __future__ import annotations

import sqlite3

import pytest
import sqlite_utils
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ragdb
from ragdb.models.embeddings import HashEmbedder
from ragdb.errors import EmbeddingError, InvalidInput
from ragdb.storage import build_migrations, migration_files
from ragdb.storage.vectors import text_hash


class CountingEmbedder:
    """A HashEmbedder that counts its embedding calls and the texts it was given."""

    def __init__(self, dimensions: int = 32) -> None:
        self.inner = HashEmbedder(dimensions)
        self.name = self.inner.name
        self.dimensions = dimensions
        self.calls = 0
        self.texts: list[str] = []

    def embed(self, texts):
        self.calls += 1
        self.texts.extend(texts)
        return self.inner.embed(texts)

    def embed_query(self, text):
        return self.inner.embed_query(text)


class FailingEmbedder(CountingEmbedder):
    def embed(self, texts):
        raise RuntimeError("endpoint down")


PARAS = [f"Paragraph {i} tells of topic{i} and subject{i * 7} with word{i % 4} in it." for i in range(15)]


def doc(paras):
    return "\n\n".join(paras)


def stored_vectors(db, latest_only=True):
    """(source, start, end) -> vector bytes of the stored chunks with a vector."""
    conn = sqlite3.connect(db.path)
    try:
        rows = conn.execute(
            'SELECT d.source, c.start, c."end", v.vector FROM vectors v JOIN chunks c ON c.id = v.chunk_id '
            "JOIN documents d ON d.id = c.doc_id" + (" WHERE d.latest = 1" if latest_only else "")).fetchall()
    finally:
        conn.close()
    out = {(s, a, b): bytes(v) for s, a, b, v in rows}
    assert len(out) == len(rows)
    return out


def fresh_vectors(tmp_path, docs, name="fresh.db"):
    """The vectors of a fresh build of ``docs`` (source -> text), everything embedded."""
    with ragdb.open(tmp_path / name, chunker="paragraph", public_unlabeled=True) as fresh:
        fresh.add_many([{"text": t, "source": s} for s, t in docs.items()])
        if docs:
            fresh.embed(HashEmbedder(32))
        return stored_vectors(fresh), fresh_hits(fresh)


QUERIES = ["topic3 subject21", "word1 paragraph", "edited line", "topic14 word2 extra"]


def fresh_hits(db):
    if not db.vector_info().vectors:
        return []
    return [[(h.source, h.start, h.end, h.score) for h in db.search(q, 20, scorer="vector",
                                                                      embedder=HashEmbedder(32))]
            for q in QUERIES]


@pytest.fixture
def emb():
    return CountingEmbedder(32)


@pytest.fixture
def vdb(tmp_path, emb):
    """A database (paragraph chunks, unlabeled chunks public) whose adds embed with ``emb``."""
    with ragdb.open(tmp_path / "kb.db", chunker="paragraph", public_unlabeled=True, embedder=emb) as db:
        yield db


def test_one_line_edit_embeds_one_chunk(vdb, emb, tmp_path):
    first = vdb.add_many([{"text": doc(PARAS), "source": "a.md"}])
    assert first[0].chunk_count == 15 and (first.embedded, first.reused) == (15, 0)
    assert len(emb.texts) == 15 and emb.calls == 1
    edited = PARAS[:7] + ["Paragraph 7 was edited: one line changed."] + PARAS[8:]
    calls = emb.calls
    report = vdb.add_many([{"text": doc(edited), "source": "a.md"}])
    assert report.replaced == (report[0].id,) and (report.embedded, report.reused) == (1, 14)
    assert emb.calls == calls + 1 and emb.texts[15:] == ["Paragraph 7 was edited: one line changed."]
    info = vdb.vector_info()
    assert (info.vectors, info.pending) == (15, 0)
    assert vdb.check() == []
    # the vectors equal those of a fresh build that embedded everything
    want_vectors, want_hits = fresh_vectors(tmp_path, {"a.md": doc(edited)})
    assert stored_vectors(vdb) == want_vectors
    assert fresh_hits(vdb) == want_hits
    # replacing with the same text changes nothing, embeds nothing
    again = vdb.add_many([{"text": doc(edited), "source": "a.md"}])
    assert again.unchanged and (again.embedded, again.reused) == (0, 0) and emb.calls == calls + 1


def test_unchanged_text_reuses_even_a_moved_chunk(vdb, emb):
    """Reuse is by text, not position: reordered, duplicated and moved paragraphs embed nothing."""
    vdb.add(doc(PARAS), source="a.md")
    n = len(emb.texts)
    shuffled = PARAS[::-1] + PARAS[:2]
    report = vdb.add_many([{"text": doc(shuffled), "source": "a.md"}])
    assert (report.embedded, report.reused) == (0, 17) and len(emb.texts) == n
    assert vdb.vector_info().pending == 0 and vdb.check() == []


def test_any_stored_chunk_of_the_same_text_is_reused(vdb, emb):
    vdb.add(doc(PARAS[:5]), source="a.md")
    n = len(emb.texts)
    # another source holding two known paragraphs and one new
    report = vdb.add_many([{"text": doc([PARAS[1], "A brand new paragraph.", PARAS[3]]), "source": "b.md"}])
    assert (report.embedded, report.reused) == (1, 2) and emb.texts[n:] == ["A brand new paragraph."]
    # renaming a document (add under the new source, then delete the old) embeds nothing
    n = len(emb.texts)
    with vdb.transaction():
        moved = vdb.add_many([{"text": doc(PARAS[:5]), "source": "c.md"}])
        vdb.delete(source="a.md")
    assert (moved.embedded, moved.reused) == (0, 5) and len(emb.texts) == n
    assert vdb.vector_info().vectors == 8 and vdb.check() == []


def test_deleting_the_old_version_keeps_the_vectors_taken_over(tmp_path, emb):
    with ragdb.open(tmp_path / "kv.db", chunker="paragraph", keep_versions=True, public_unlabeled=True,
                    embedder=emb) as db:
        old = db.add(doc(PARAS), source="a.md")
        edited = PARAS[:3] + ["Paragraph three, rewritten."] + PARAS[4:]
        report = db.add_many([{"text": doc(edited), "source": "a.md"}])
        new = report[0]
        assert (report.embedded, report.reused) == (1, 14) and len(emb.texts) == 16
        # the kept old version keeps its own 15 vectors; the new one has 15 more
        info = db.vector_info()
        assert (info.vectors, info.pending) == (30, 0)
        before = stored_vectors(db)
        assert db.delete(old.id) == 1
        assert db.vector_info().vectors == 15 and stored_vectors(db) == before and db.check() == []
        hits = db.search("topic5 subject35", 3, scorer="vector")
        assert hits and hits[0].doc_id == new.id and hits[0].text == PARAS[5]
        # deleting the latest version instead promotes the old one with its vectors intact
        newer = db.add_many([{"text": doc(PARAS), "source": "a.md"}])
        assert (newer.embedded, newer.reused) == (1, 14)  # paragraph 3's vector went with the old version
        assert db.delete(newer[0].id) == 1 and db.get(new.id).latest
        assert stored_vectors(db) == before and db.check() == []


def test_replacing_without_vectors_reuses_the_stored_ones_in_the_write(tmp_path, emb):
    """No embedder on this connection: the unchanged chunks still get their vectors
    in the write; only the edited one waits for ``embed``."""
    path = tmp_path / "kb.db"
    with ragdb.open(path, chunker="paragraph", public_unlabeled=True, embedder=emb) as db:
        db.add(doc(PARAS), source="a.md")
    with ragdb.open(path) as db:
        assert db.embedder is None
        edited = PARAS[:-1] + ["The last paragraph, replaced."]
        report = db.add_many([{"text": doc(edited), "source": "a.md"}])
        assert (report.embedded, report.reused) == (0, 14)
        info = db.vector_info()
        assert (info.vectors, info.pending) == (14, 1)
        n = len(emb.texts)
        assert db.embed(emb) == 1 and emb.texts[n:] == ["The last paragraph, replaced."]
        assert db.check() == []


def test_a_failed_write_copies_nothing(vdb, emb):
    vdb.add(doc(PARAS), source="a.md")
    before, info = stored_vectors(vdb), vdb.vector_info()
    with pytest.raises(RuntimeError, match="rolled back"), vdb.transaction():
        vdb.add_many([{"text": doc(PARAS[:-1] + ["changed"]), "source": "a.md"}])
        raise RuntimeError("rolled back")
    assert stored_vectors(vdb) == before and vdb.vector_info() == info and vdb.check() == []
    hits = vdb.search("topic2 subject14", 1, scorer="vector")
    assert hits[0].source == "a.md" and hits[0].text == PARAS[2]


def test_replacing_a_source_twice_in_one_batch(vdb, emb):
    vdb.add(doc(PARAS[:4]), source="a.md")
    report = vdb.add_many([{"text": doc(PARAS[:3] + ["first edit"]), "source": "a.md"},
                           {"text": doc(PARAS[:2] + ["first edit", "second edit"]), "source": "a.md"}])
    assert [c.status for c in report.changes] == ["replaced", "replaced"]
    # the first version's chunks took their vectors over, and the second took them from it
    assert emb.texts[4:] == ["first edit", "second edit"] and report.embedded == 2
    assert vdb.get(source="a.md").id == report[1].id
    info = vdb.vector_info()
    assert (info.vectors, info.pending) == (4, 0) and vdb.check() == []


def test_embed_on_add(tmp_path, emb):
    path = tmp_path / "kb.db"
    with ragdb.open(path, chunker="paragraph", public_unlabeled=True, embedder=emb, embed_on_add=False) as db:
        assert db.embed_on_add is False and db.embedder is emb
        report = db.add_many([{"text": doc(PARAS[:3]), "source": "a.md"}])
        assert (report.embedded, report.reused) == (0, 0) and emb.calls == 0
        assert db.vector_info().pending == 3
        assert db.embed() == 3 and emb.calls == 1  # the database's embedder
        # off, a replacement still takes over the vectors of unchanged text
        report = db.add_many([{"text": doc(PARAS[:4]), "source": "a.md"}])
        assert (report.embedded, report.reused) == (0, 3) and db.vector_info().pending == 1
        db.embed_on_add = True
        report = db.add_many([{"text": doc(PARAS[:5]), "source": "a.md"}])
        # the chunk left pending before is embedded too
        assert (report.embedded, report.reused) == (2, 3) and emb.texts[3:] == PARAS[3:5]
        assert db.vector_info().pending == 0 and db.check() == []
        with pytest.raises(InvalidInput, match="embed_on_add"):
            db.embed_on_add = "yes"
    with pytest.raises(InvalidInput, match="embed_on_add"):
        ragdb.open(path, embed_on_add=1)
    with ragdb.open(path) as db:
        assert db.embed_on_add is True  # the default: an embedder given to open embeds on add


def test_embedding_dedupes_equal_texts(tmp_path, emb):
    """Chunks written before any vector existed: ``embed`` sends each distinct text once,
    in the same batch or a later one."""
    with ragdb.open(tmp_path / "kb.db", chunker="paragraph", public_unlabeled=True) as db:
        db.add_many([{"text": doc(PARAS[:4] + PARAS[:2]), "source": "a.md"},
                     {"text": doc(PARAS[2:6]), "source": "b.md"}])
        assert db.vector_info().pending == 10
        assert db.embed(emb, batch_size=3) == 10
        assert sorted(emb.texts) == sorted(PARAS[:6])
        assert db.vector_info().pending == 0 and db.check() == []
        want, _ = fresh_vectors(tmp_path, {"a.md": doc(PARAS[:4] + PARAS[:2]), "b.md": doc(PARAS[2:6])})
        assert stored_vectors(db) == want


def test_a_failing_embedder_leaves_the_reused_vectors_and_the_rest_pending(tmp_path, emb):
    path = tmp_path / "kb.db"
    with ragdb.open(path, chunker="paragraph", public_unlabeled=True, embedder=emb) as db:
        db.add(doc(PARAS[:5]), source="a.md")
    with ragdb.open(path, embedder=FailingEmbedder(32)) as db:
        with pytest.raises(EmbeddingError, match="1 chunks are pending"):
            db.add_many([{"text": doc(PARAS[:4] + ["new"]), "source": "a.md"}])
        info = db.vector_info()
        assert (info.vectors, info.pending) == (4, 1) and db.check() == []


def test_float16_vectors_are_copied_bytes_for_bytes(tmp_path):
    e = HashEmbedder(32)
    with ragdb.open(tmp_path / "kb.db", chunker="paragraph", public_unlabeled=True) as db:
        db.add(doc(PARAS[:3]), source="a.md")
        with db._store.write():
            db._store.set_vector_model(e.name, e.dimensions, dtype="float16")
        assert db.embed(e) == 3
        before = stored_vectors(db)
        assert all(len(b) == 64 for b in before.values())
        report = db.add_many([{"text": doc(PARAS[:2] + ["other"]), "source": "a.md"}])
        assert report.reused == 2
        after = stored_vectors(db)
        assert len(after) == 2 and set(after.values()) <= set(before.values())
        assert db.embed(e) == 1 and db.check() == []


def test_adds_without_vectors_hash_nothing(tmp_path, monkeypatch):
    """The reuse lookups cost a database without vectors nothing: no text is hashed."""
    from ragdb.engine import write

    hashed = []
    monkeypatch.setattr(write, "text_hash", lambda t: hashed.append(t) or text_hash(t))
    with ragdb.open(tmp_path / "kb.db", chunker="paragraph") as db:
        db.add_many([{"text": doc(PARAS), "source": "a.md"}])
        db.add_many([{"text": doc(PARAS[1:]), "source": "a.md"}])
        assert hashed == []
        db.embed(HashEmbedder(32))
        hashed.clear()
        db.add_many([{"text": doc(PARAS[2:]), "source": "a.md"}])
        assert sorted(hashed) == sorted(PARAS[2:])


# ----------------------------------------------------------------------------- migration 0005


def _downgrade_to_schema_4(path):
    """Make a current database look as schema 4 left it: vectors without text_hash."""
    conn = sqlite3.connect(path)
    conn.execute("DROP INDEX vectors_text_hash")
    conn.execute("ALTER TABLE vectors DROP COLUMN text_hash")
    conn.execute("DELETE FROM _sqlite_migrations WHERE name = '0005_vector_text_hash'")
    conn.commit()
    conn.close()


def test_migration_from_schema_4_reuses_the_old_vectors(tmp_path, emb):
    path = tmp_path / "old.db"
    with ragdb.open(path, chunker="paragraph", public_unlabeled=True, embedder=emb) as db:
        db.add(doc(PARAS), source="a.md")
        db.add(doc(["Other document, first part.", "Other document, second part."]), source="b.md")
        before = stored_vectors(db)
    _downgrade_to_schema_4(path)
    with ragdb.open(path, embedder=emb) as db:
        conn = sqlite3.connect(path)
        assert conn.execute("SELECT count(*) FROM vectors WHERE text_hash IS NULL").fetchone()[0] == 17
        conn.close()
        assert stored_vectors(db) == before and db.check() == []
        n = len(emb.texts)
        # the replaced version's vectors have no hash yet: computed from their text
        report = db.add_many([{"text": doc(PARAS[:-1] + ["A new ending."]), "source": "a.md"}])
        assert (report.embedded, report.reused) == (1, 14) and emb.texts[n:] == ["A new ending."]
        # embedding filled in the hash of every old vector: other documents' are found too
        conn = sqlite3.connect(path)
        assert conn.execute("SELECT count(*) FROM vectors WHERE text_hash IS NULL").fetchone()[0] == 0
        stored = dict(conn.execute("SELECT chunk_id, text_hash FROM vectors"))
        conn.close()
        for cid, text in db._store.chunk_texts_of(list(stored)):
            assert stored[cid] == text_hash(text)
        report = db.add_many([{"text": "Other document, second part.", "source": "c.md"}])
        assert (report.embedded, report.reused) == (0, 1)
        assert db.check() == []


@pytest.mark.parametrize("last", [p.stem for p in migration_files()][:-1])
def test_migration_from_every_older_schema(tmp_path, emb, last):
    """A database left at any older schema migrates to 0005 and reuses vectors from then on."""
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    build_migrations(stop_after=last).apply(sqlite_utils.Database(conn))
    conn.commit()
    conn.close()
    with ragdb.open(path, chunker="paragraph", public_unlabeled=True, embedder=emb) as db:
        db.add(doc(PARAS[:6]), source="a.md")
        report = db.add_many([{"text": doc(PARAS[:5] + ["edited"]), "source": "a.md"}])
        assert (report.embedded, report.reused) == (1, 5) and len(emb.texts) == 7
        assert db.check() == []
    conn = sqlite3.connect(path)
    names = [r[0] for r in conn.execute("SELECT name FROM _sqlite_migrations ORDER BY id")]
    conn.close()
    assert names == [p.stem for p in migration_files()]


# ----------------------------------------------------------------------------- property


WORDS = ["alpha", "beta", "gamma", "delta", "edited", "line", "topic3", "subject21", "word1", "paragraph"]
# A small pool, so documents share paragraphs often (each text is reused or not by chance),
# plus now and then a paragraph never seen before.
POOL = [" ".join(WORDS[i:i + 1 + i % 3]) for i in range(8)]
PARAGRAPH = st.sampled_from(POOL) | st.lists(st.sampled_from(WORDS), min_size=1, max_size=4).map(" ".join)
SOURCES = st.sampled_from(["a.md", "b.md", "c.md"])
OPS = st.lists(st.one_of(
    st.tuples(st.just("put"), SOURCES, st.lists(PARAGRAPH, min_size=1, max_size=5)),
    st.tuples(st.just("delete"), SOURCES, st.none()),
    st.tuples(st.just("embed_on_add"), st.booleans(), st.none()),
    st.tuples(st.just("embed"), st.none(), st.none()),
), max_size=12)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS)
def test_reuse_equals_a_fresh_build(tmp_path_factory, ops):
    """After random adds, replaces and deletes, some embedded on add and some not,
    the stored vectors and vector search equal a fresh build that embedded everything."""
    tmp = tmp_path_factory.mktemp("reuse")
    emb = CountingEmbedder(32)
    docs: dict[str, str] = {}
    written = 0
    with ragdb.open(tmp / "kb.db", chunker="paragraph", public_unlabeled=True, embedder=emb) as db:
        for op, arg, paras in ops:
            if op == "put":
                text = doc(paras)
                pending = db.vector_info().pending
                report = db.add_many([{"text": text, "source": arg}])
                if not report.unchanged:
                    written += report[0].chunk_count
                    # (an embedding add gives vectors to chunks left pending before it too)
                    assert report.embedded + report.reused <= report[0].chunk_count + (pending if db.embed_on_add else 0)
                docs[arg] = text
            elif op == "delete":
                db.delete(source=arg)
                docs.pop(arg, None)
            elif op == "embed_on_add":
                db.embed_on_add = arg
            else:
                db.embed()
        db.embed()
        assert db.vector_info().pending == 0 and db.check() == []
        assert len(emb.texts) <= written  # never more texts embedded than chunks written
        want_vectors, want_hits = fresh_vectors(tmp, docs)
        assert stored_vectors(db) == want_vectors
        assert fresh_hits(db) == want_hits


def test_check_finds_a_text_hash_that_is_not_its_chunks_text(tmp_path, emb):
    path = tmp_path / "kb.db"
    with ragdb.open(path, embedder=emb) as db:
        db.add(doc(PARAS), source="a.md")
        assert db.check() == []
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("UPDATE vectors SET text_hash = ? WHERE chunk_id = (SELECT min(chunk_id) FROM vectors)",
                     [text_hash("some other text")])
    conn.close()
    with ragdb.open(path) as db:
        problems = db.check()
        assert any("vectors.text_hash does not match its chunk's text" in p for p in problems), problems
        assert db.check(quick=True) == []  # the text pass is what reads it
