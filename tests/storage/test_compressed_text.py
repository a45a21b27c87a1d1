"""Compressed document text (SQLite, migration 0010, ragdb/storage/textcodec.py).

``documents.text`` and ``chunks.text`` hold TEXT (every older database, short texts) or a
zstd frame, with a dictionary each collection trains from its first texts. Every path that
reads text must give back exactly the text that was added: get, search hits, ``$contains``,
export records, vector reuse and ``check``; a damaged frame is a :class:`TextDamaged` for a
reader and a problem for ``check``; an older (uncompressed) database migrates to the same
texts and the same search results.
"""

from __future__ import annotations

import io
import os
import sqlite3
import string
import tempfile
import threading
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ragdb
from ragdb.errors import InvalidInput, RagdbError, TextDamaged
from ragdb.files.transfer import export_jsonl
from ragdb.models.embeddings import HashEmbedder
from ragdb.storage import textcodec

EXAMPLES = int(os.environ.get("RAGDB_HYPOTHESIS_EXAMPLES", "60"))

WORDS = ("retrieval database index posting vector chunk query token analyzer segment compress "
         "dictionary frame sqlite collection 检索 数据库 索引 北京 天气").split()


def seed_texts(n: int = 40) -> list[str]:
    """Texts enough (with the thresholds lowered, see ``small_training``) to train a dictionary."""
    return [" ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(40 + i % 13)) + f" number {i}."
            for i in range(n)]


@pytest.fixture
def small_training(monkeypatch):
    """A collection trains its dictionary from a few texts (the real thresholds want 1 MiB)."""
    monkeypatch.setattr(textcodec, "TRAIN_MIN_TEXTS", 8)
    monkeypatch.setattr(textcodec, "TRAIN_MIN_BYTES", 2000)
    monkeypatch.setattr(textcodec, "TRAIN_EVERY", 16)
    monkeypatch.setattr(textcodec, "DICT_SIZE", 4096)


def stored(path: Path, sql: str) -> list[tuple]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def exported(db: ragdb.Database) -> dict[str, str]:
    buf = io.BytesIO()
    export_jsonl(db, buf, principals=ragdb.ALL)
    return {r["source"]: r["text"] for r in map(orjson.loads, buf.getvalue().splitlines()) if "source" in r}


# ---------------------------------------------------------------------------- the codec itself

@settings(max_examples=EXAMPLES * 3, deadline=None)
@given(text=st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=3000))
def test_codec_round_trip_of_any_text(text):
    codec = textcodec.TextCodec(lambda dict_id: None)
    packed = codec.encode(text, 0)
    assert codec.decode(packed) == text
    assert isinstance(packed, str) or (len(packed) < len(text.encode()) and packed[:4] == textcodec.ZSTD_MAGIC)


def test_short_and_incompressible_texts_stay_text():
    codec = textcodec.TextCodec(lambda dict_id: None)
    assert codec.encode("", 0) == "" and codec.encode("short", 0) == "short"
    noise = os.urandom(400).hex()[:300] + "🎉" * 3
    assert codec.encode("a" * 300, 0) != "a" * 300  # compressible: a frame
    assert codec.decode(codec.encode(noise, 0)) == noise


def _codec_with_dict(texts: list[str]) -> tuple[textcodec.TextCodec, int]:
    import zstandard

    content = zstandard.train_dictionary(4096, [t.encode() for t in texts], dict_id=40000, level=3).as_bytes()
    return textcodec.TextCodec(lambda dict_id: content if dict_id == 40000 else None), 40000


_AHEAD_TEXTS = st.lists(st.one_of(st.sampled_from(seed_texts(20)),  # long ones, some repeated
                                  st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=300),
                                  # just over the 64 bytes a frame needs to gain: a frame is longer
                                  st.text(alphabet=string.ascii_letters + string.digits, min_size=64, max_size=90)),
                        min_size=1, max_size=40)


@settings(max_examples=EXAMPLES, deadline=None)
@given(texts=_AHEAD_TEXTS, slow=st.booleans())
def test_texts_compressed_ahead_store_what_a_write_would(texts, slow):
    """Compressed ahead of their write in the background thread (a bulk load's next batch), the
    texts store exactly what compressing them in the write stores: the same frames, short and
    incompressible texts as they are, a text given twice once. Texts not handed over are
    compressed in the write; after the session is closed nothing is taken from it."""
    codec, dict_id = _codec_with_dict(seed_texts(40))
    plain, _ = _codec_with_dict(seed_texts(40))
    session = codec.ahead()
    try:
        if slow:  # one call a text, as with python-zstandard's cffi backend
            import unittest.mock
            with unittest.mock.patch.object(textcodec, "MULTI_COMPRESS", False):
                session.submit(texts[::2], dict_id)
                codec.encode(texts[0], dict_id)  # (the thread is done)
        else:
            session.submit(texts[::2], dict_id)
        session.submit(texts[1::3], dict_id)
        for t in texts + ["not handed over " * 20]:
            got = codec.encode(t, dict_id)
            assert got == plain.encode(t, dict_id)
            assert plain.decode(got) == t
    finally:
        session.close()
    assert codec._made_ahead(texts[0], dict_id) is None
    assert codec.encode(texts[0], dict_id) == plain.encode(texts[0], dict_id)


def test_compressing_ahead_with_the_cffi_backend():
    """python-zstandard's cffi backend has no multi_compress_to_buffer: in a process that
    imports it (its import policy), a bulk load compresses ahead one text at a time, and the
    file holds the bytes this process's backend writes."""
    import subprocess
    import sys

    script = (
        "import sys, sqlite3, ragdb\n"
        "from ragdb.storage import textcodec as t\n"
        "assert t.zstandard.backend == 'cffi' and not t.MULTI_COMPRESS\n"
        "t.TRAIN_MIN_TEXTS, t.TRAIN_MIN_BYTES, t.DICT_SIZE = 8, 2000, 4096\n"
        "real, taken = t.TextCodec._made_ahead, []\n"
        "t.TextCodec._made_ahead = lambda self, x, d: taken.append(real(self, x, d)) or taken[-1]\n"
        "import tests.storage.test_compressed_text as m\n"
        "texts = m.seed_texts(400)\n"
        "with ragdb.open(sys.argv[1]) as db:\n"
        "    db.add_many(({'text': x, 'source': f's{i}'} for i, x in enumerate(texts)), batch_size=40, workers=0,"
        " chunker='none')\n"
        "    assert [db.get(source=f's{i}').text for i in range(400)] == texts\n"
        "assert sum(x is not None for x in taken) == 400 - 240, len(taken)\n")  # batches past POOL_AFTER
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "PYTHON_ZSTANDARD_IMPORT_POLICY": "cffi"}
        run = subprocess.run([sys.executable, "-c", script, str(Path(tmp) / "cffi.db")], env=env,
                             cwd=Path(__file__).parents[2], capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr[-2000:]
        # the same bytes as the C backend: the dictionary trained from the same texts, each frame
        codec_rows = stored(Path(tmp) / "cffi.db", "SELECT content FROM text_dictionaries")
        content = codec_rows[0][0]
        dict_id = stored(Path(tmp) / "cffi.db", "SELECT id FROM text_dictionaries")[0][0]
        plain = textcodec.TextCodec(lambda i: content if i == dict_id else None)
        texts = seed_texts(400)
        rows = stored(Path(tmp) / "cffi.db", "SELECT text FROM documents ORDER BY id")
        assert [r[0] for r in rows[40:]] == [plain.encode(t, dict_id) for t in texts[40:]]


def test_frames_made_ahead_with_another_dictionary_of_that_id_are_not_used():
    """A rollback may undo a dictionary's row, and the next one trained can get the same id
    with other content: what was compressed ahead with the old one is not used then."""
    import zstandard

    codec, dict_id = _codec_with_dict(seed_texts(40))
    texts = seed_texts(6)
    other = zstandard.train_dictionary(4096, [t.upper().encode() for t in seed_texts(40)], dict_id=dict_id,
                                       level=3).as_bytes()
    fresh = textcodec.TextCodec(lambda i: other if i == dict_id else None)
    session = codec.ahead()
    try:
        session.submit(texts[:3], dict_id)
        codec.encode(texts[0], dict_id)  # (the thread is done)
        codec.add_dict(dict_id, other)  # trained again, same id
        assert [codec.encode(t, dict_id) for t in texts[:3]] == [fresh.encode(t, dict_id) for t in texts[:3]]
        session.submit(texts[3:], dict_id)
        assert codec._made_ahead(texts[3], dict_id) is not None
        codec.forget()  # a rollback: dictionaries are read again, frames made ahead dropped
        assert codec._made_ahead(texts[3], dict_id) is None
    finally:
        session.close()


def test_a_bulk_load_compresses_its_batches_ahead(tmp_path, small_training, monkeypatch):
    """``add_many`` hands each batch, once the analysis workers would have been forked
    (``POOL_AFTER`` records), to the background thread while it writes the batch before:
    those batches' texts, documents' and chunks' alike, are all taken from it, and the file
    holds what a load without it holds. The thread ends with the load, also when a record is
    invalid (the batches before it are written)."""
    from ragdb.engine.prepare import POOL_AFTER

    found: dict[str, bool] = {}
    real = textcodec.TextCodec._made_ahead

    def spy(self, text, dict_id):
        made = real(self, text, dict_id)
        found[text] = made is not None
        return made

    monkeypatch.setattr(textcodec.TextCodec, "_made_ahead", spy)
    batch = 40
    texts = seed_texts(POOL_AFTER + 4 * batch)
    records = [{"text": t + (" " + t if i % 3 == 0 else ""), "source": f"s{i}"} for i, t in enumerate(texts)]
    chunker = "window:size=40,overlap=0"
    with ragdb.open(tmp_path / "kb.db") as db:
        db.add_many(records, batch_size=batch, workers=0, chunker=chunker)
        assert db.check() == []
        assert [db.get(source=f"s{i}").text for i in range(len(texts))] == [r["text"] for r in records]
        assert not [t for t in threading.enumerate() if t.name.startswith("ragdb-zstd")]
    first = POOL_AFTER // batch * batch  # the first record of the first batch handed over (its last is past POOL_AFTER)
    assert [found.get(r["text"]) for r in records[first:]] == [True] * (len(records) - first)
    assert not any(found.get(r["text"]) for r in records[:first])
    assert sum(found.values()) > len(records) - first  # chunks' own texts too
    monkeypatch.setattr(textcodec.TextCodec, "_made_ahead", lambda self, text, dict_id: None)
    with ragdb.open(tmp_path / "plain.db") as db:
        db.add_many(records, batch_size=batch, workers=0, chunker=chunker)
    sql = ("SELECT 'd', id, typeof(text), CAST(text AS BLOB) FROM documents UNION ALL "
           "SELECT 'c', id, typeof(text), CAST(text AS BLOB) FROM chunks ORDER BY 1, 2")
    assert stored(tmp_path / "kb.db", sql) == stored(tmp_path / "plain.db", sql)
    with ragdb.open(tmp_path / "kb.db") as db:  # reopened: the texts search and read back
        hit = db.search("retrieval database", k=1)[0]
        assert hit.text in db.get(hit.doc_id).text
    monkeypatch.setattr(textcodec.TextCodec, "_made_ahead", spy)
    bad = [*records[:first + 2 * batch], {"text": ""}, *records[:batch]]
    with ragdb.open(tmp_path / "bad.db") as db:
        with pytest.raises(InvalidInput):
            db.add_many(bad, batch_size=batch, workers=0, chunker=chunker)
        assert not [t for t in threading.enumerate() if t.name.startswith("ragdb-zstd")]
        assert db.stats().documents == first + 2 * batch
        assert db.check() == []


# ---------------------------------------------------------------------------- the database, end to end

def test_a_collection_trains_its_dictionary_and_compresses_with_it(tmp_path, small_training):
    path = tmp_path / "kb.db"
    texts = seed_texts()
    with ragdb.open(path) as db:
        db.add_many(({"text": t, "source": f"s{i}"} for i, t in enumerate(texts)), chunker="none")
        assert db.check() == []
        assert [db.get(source=f"s{i}").text for i in range(len(texts))] == texts
    dicts = stored(path, "SELECT id, collection_id FROM text_dictionaries")
    assert len(dicts) == 1 and dicts[0][0] >= textcodec.FIRST_DICT_ID and dicts[0][1] == 0
    kinds = stored(path, "SELECT typeof(text), CAST(text AS BLOB) FROM documents")
    assert all(k == "blob" for k, _ in kinds)
    from zstandard import get_frame_parameters
    assert {get_frame_parameters(raw).dict_id for _, raw in kinds} == {dicts[0][0]}
    # the content hash stays the text's own (unchanged texts are still recognised on a re-add)
    with ragdb.open(path) as db:
        again = db.add(texts[0], source="s0", chunker="none")
        assert again.id == db.get(source="s0").id


def test_one_document_at_a_time_trains_a_dictionary_too(tmp_path, small_training):
    path = tmp_path / "kb.db"
    texts = seed_texts(40)
    with ragdb.open(path) as db:
        for i, t in enumerate(texts):
            db.add(t, source=f"s{i}", chunker="none")
        assert db.check() == []
        assert [db.get(source=f"s{i}").text for i in range(len(texts))] == texts
    assert len(stored(path, "SELECT id FROM text_dictionaries")) == 1


def test_a_damaged_stored_text_does_not_fail_training(tmp_path, small_training):
    """Training from the stored texts leaves out one that cannot be read (check reports it)."""
    path = tmp_path / "kb.db"
    texts = seed_texts(20)
    with ragdb.open(path) as db:
        for i, t in enumerate(texts[:10]):
            db.add(t, source=f"s{i}", chunker="none")
    conn = sqlite3.connect(path)
    conn.execute("UPDATE documents SET text = x'28b52ffd00ffffffff' WHERE source = 's3'")
    conn.commit()
    conn.close()
    with ragdb.open(path) as db:
        for i, t in enumerate(texts[10:], 10):
            db.add(t, source=f"s{i}", chunker="none")
        assert db.get(source="s19").text == texts[19]
        assert any("documents.text is compressed and cannot be read back" in p for p in db.check())
    assert len(stored(path, "SELECT id FROM text_dictionaries")) == 1


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=400),
       words=st.lists(st.sampled_from(WORDS), min_size=1, max_size=30))
def test_any_text_round_trips_through_every_read(small_training, text, words):
    """add / get / search / $contains / export / check / a fresh handle, on a database with
    a dictionary, for arbitrary Unicode text (CJK included, no surrogates)."""
    body = " ".join(words) + " " + text
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "kb.db"
        with ragdb.open(path, embedder=HashEmbedder()) as db:
            db.add_many(({"text": t, "source": f"seed{i}"} for i, t in enumerate(seed_texts(12))), chunker="none")
            try:
                db.add(text, source="bare", chunker="none")
            except InvalidInput:  # empty after cleaning: refused as it always was
                bare = None
            else:
                bare = db.get(source="bare").text
            doc = db.add(body, source="doc", chunker="window:size=8,overlap=2")
            stored_text = db.get(source="doc").text
            assert stored_text is not None
            if bare is not None:
                assert db.get(source="bare").text == bare
            hits = db.search(words[0], k=100, filter={"$contains": words[0]})
            assert hits and all(words[0] in h.text for h in hits)
            for h in hits:  # a hit's text is its span of its document's text
                whole = db.get(h.doc_id).text
                assert whole is not None and h.text == whole[h.start:h.end]
            assert any(h.doc_id == doc.id for h in hits)
            assert exported(db)["doc"] == stored_text
            assert db.check() == []
        with ragdb.open(path, readonly=True) as db:  # a fresh handle: its own codec, dictionary read back
            assert db.get(source="doc").text == stored_text
            if bare is not None:
                assert db.get(source="bare").text == bare
            assert db.count(filter={"$contains": words[-1]}) >= 1
            assert db.check() == []


def test_copy_between_databases_carries_the_texts(tmp_path, small_training):
    from ragdb.files.transfer import copy_database

    src, dst = tmp_path / "a.db", tmp_path / "b.db"
    texts = seed_texts()
    with ragdb.open(src) as db:
        db.add_many(({"text": t, "source": f"s{i}"} for i, t in enumerate(texts)), chunker="window:size=10,overlap=2")
    copy_database(str(src), str(dst))
    with ragdb.open(dst) as db:
        assert [db.get(source=f"s{i}").text for i in range(len(texts))] == texts
        assert db.check() == []
    # the target compresses with its own dictionary: frames never name the source's
    assert stored(dst, "SELECT count(*) FROM documents WHERE typeof(text) = 'blob'")[0][0] == len(texts)


def test_collections_keep_their_own_dictionaries(tmp_path, small_training):
    path = tmp_path / "kb.db"
    with ragdb.open(path) as db:
        other = db.collection("other")
        db.add_many(({"text": t, "source": f"s{i}"} for i, t in enumerate(seed_texts())), chunker="none")
        other.add_many(({"text": t.upper(), "source": f"s{i}"} for i, t in enumerate(seed_texts())), chunker="none")
        assert db.get(source="s3").text == seed_texts()[3] and other.get(source="s3").text == seed_texts()[3].upper()
    assert sorted(r[0] for r in stored(path, "SELECT collection_id FROM text_dictionaries")) == [0, 1]
    with ragdb.open(path, collection="other") as db:
        assert db.get(source="s5").text == seed_texts()[5].upper()
        assert db.check() == []
    with ragdb.open(path) as db:  # a dropped collection's dictionary is retired, never reused
        db.drop_collection("other")
        again = db.collection("other")
        again.add_many(({"text": t, "source": f"s{i}"} for i, t in enumerate(seed_texts())), chunker="none")
        assert again.get(source="s5").text == seed_texts()[5]
    rows = sorted(stored(path, "SELECT id, collection_id FROM text_dictionaries"))
    assert rows[:2] == [(textcodec.FIRST_DICT_ID, 0), (textcodec.FIRST_DICT_ID + 1, -1)]
    assert rows[2][0] == textcodec.FIRST_DICT_ID + 2 and rows[2][1] == stored(
        path, "SELECT id FROM collections WHERE name = 'other'")[0][0]


# ---------------------------------------------------------------------------- damage

@pytest.fixture
def compressed_kb(tmp_path, small_training) -> Path:
    path = tmp_path / "kb.db"
    with ragdb.open(path, embedder=HashEmbedder()) as db:
        db.add_many(({"text": t, "source": f"s{i}"} for i, t in enumerate(seed_texts())), chunker="none")
    return path


def damage(path: Path, sql: str) -> None:
    conn = sqlite3.connect(path)
    try:
        conn.execute(sql)
        conn.commit()
    finally:
        conn.close()


@pytest.mark.parametrize("sql, needle", [
    ("UPDATE documents SET text = substr(text, 1, length(text) - 5) WHERE source = 's3'",
     "documents.text is compressed and cannot be read back"),
    ("DELETE FROM text_dictionaries", "documents.text is compressed and cannot be read back"),
    ("UPDATE documents SET text = x'28b52ffd00ffffffffffffff' WHERE source = 's3'",
     "documents.text is compressed and cannot be read back"),
    ("UPDATE documents SET text = x'0102030405' WHERE source = 's3'", "documents.text is not stored as text"),
])
def test_damaged_compressed_text_is_reported_and_raises_a_ragdb_error(compressed_kb, sql, needle):
    damage(compressed_kb, sql)
    with ragdb.open(compressed_kb, embedder=HashEmbedder()) as db:
        assert any(needle in p for p in db.check()), db.check()
        with pytest.raises(TextDamaged):
            db.get(source="s3")
        with pytest.raises(RagdbError):  # every reader of the text: a RagdbError, never another exception
            list(db.records(principals=ragdb.ALL))
        with pytest.raises(TextDamaged):  # through SQL (ragdb_instr): the same error
            db.count(filter={"$contains": "zzz-not-there"})
        with pytest.raises(TextDamaged):  # a search's hits: their texts decoded together
            db.search(" ".join(seed_texts()[3].split()[:12]), k=100, principals=ragdb.ALL)


def test_decode_many_is_decode_of_each_text(compressed_kb):
    """``TextCodec.decode_many`` (the texts of a search's hits, under one hold of the lock) gives
    what ``decode`` gives for each value, and for a damaged one the same ``TextDamaged``, after
    which the codec still decodes (its lock was released)."""
    import zstandard

    conn = sqlite3.connect(compressed_kb)
    try:
        codec = textcodec.new_codec(conn)
        values = [t for (t,) in conn.execute("SELECT text FROM documents ORDER BY id")] + [None, "plain"]
        assert any(isinstance(v, bytes) for v in values)
        assert codec.decode_many(values) == [codec.decode(v) for v in values]
        good = next(v for v in values if isinstance(v, bytes))
        text = codec.decode(good)
        damaged = [b"\x01\x02\x03\x04\x05", good[:len(good) // 2], textcodec.ZSTD_MAGIC + b"\xff" * 12,
                   zstandard.ZstdCompressor().compress(b"\xff\xfe" * 40)]
        for bad in damaged:
            with pytest.raises(TextDamaged) as one:
                codec.decode(bad)
            with pytest.raises(TextDamaged) as many:
                codec.decode_many(["text", good, bad, good])
            assert str(many.value) == str(one.value)
            done: list = []
            worker = threading.Thread(target=lambda out=done: out.append(codec.decode_many([good, "text"])),
                                      daemon=True)
            worker.start()
            worker.join(10)
            assert done == [[text, "text"]], bad  # (a lock left held: the thread waits, done stays empty)
    finally:
        conn.close()


def test_a_frame_that_decodes_to_other_text_fails_the_content_hash(compressed_kb, small_training):
    conn = sqlite3.connect(compressed_kb)
    codec = textcodec.new_codec(conn)
    (dict_id,) = conn.execute("SELECT max(id) FROM text_dictionaries").fetchone()
    conn.execute("UPDATE documents SET text = ? WHERE source = 's4'", [codec.encode("other text " * 20, dict_id)])
    conn.commit()
    conn.close()
    with ragdb.open(compressed_kb) as db:
        assert any("documents.text does not match its content_hash" in p for p in db.check())


# ---------------------------------------------------------------------------- migration of older databases

def uncompress(path: Path) -> None:
    """Make ``path`` what a ragdb before migration 0010 wrote: plain TEXT, no dictionary table,
    0010 not applied."""
    conn = sqlite3.connect(path)
    try:
        codec = textcodec.new_codec(conn)
        prefixes = [""] + [f"c{cid}_" for (cid,) in conn.execute("SELECT id FROM collections WHERE id != 0")]
        for table in (p + t for p in prefixes for t in ("documents", "chunks")):
            rows = conn.execute(f"SELECT id, text FROM {table} WHERE typeof(text) = 'blob'").fetchall()
            conn.executemany(f"UPDATE {table} SET text = ? WHERE id = ?", [(codec.decode(t), i) for i, t in rows])
        conn.execute("DROP TABLE text_dictionaries")
        conn.execute("DELETE FROM _sqlite_migrations WHERE name = '0010_compressed_text'")
        conn.commit()
    finally:
        conn.close()


def test_an_uncompressed_database_migrates_to_the_same_texts_and_results(tmp_path, small_training):
    path = tmp_path / "kb.db"
    texts = seed_texts(60)
    with ragdb.open(path) as db:
        db.add_many(({"text": t, "source": f"s{i}"} for i, t in enumerate(texts)), chunker="window:size=12,overlap=3")
        other = db.collection("other")
        other.add_many(({"text": t, "source": f"o{i}"} for i, t in enumerate(texts[:20])), chunker="none")
    uncompress(path)
    assert stored(path, "SELECT count(*) FROM documents WHERE typeof(text) != 'text'") == [(0,)]
    queries = ["retrieval index", "北京 天气", "number 7", "compress dictionary frame"]

    def results(db):
        return [[(h.doc_id, h.chunk_id, round(h.score, 9), h.text) for h in db.search(q, k=100)] for q in queries]

    # the old file's texts, read with plain SQL before it migrates
    conn = sqlite3.connect(path)
    before_texts = dict(conn.execute("SELECT source, text FROM documents"))
    before_chunks = conn.execute("SELECT id, text FROM chunks ORDER BY id").fetchall()
    conn.close()
    with ragdb.open(path) as db:  # migrates: trains a dictionary, compresses every stored text
        after = results(db)
        assert {f"s{i}": db.get(source=f"s{i}").text for i in range(len(texts))} == before_texts
        assert db.check() == []
        assert db.collection("other").get(source="o3").text == texts[3]
    assert stored(path, "SELECT count(*) FROM documents WHERE typeof(text) = 'text'") == [(0,)]
    assert stored(path, "SELECT count(*) FROM c1_documents WHERE typeof(text) = 'text'") == [(0,)]
    assert sorted(r[0] for r in stored(path, "SELECT collection_id FROM text_dictionaries")) == [0, 1]
    codec_conn = sqlite3.connect(path)
    codec = textcodec.new_codec(codec_conn)
    assert [(i, codec.decode(t)) for i, t in codec_conn.execute("SELECT id, text FROM chunks ORDER BY id")] == \
        before_chunks
    codec_conn.close()
    # the same results as an uncompressed database: build the reference afresh without compressing
    ref = tmp_path / "ref.db"
    with ragdb.open(ref) as db:
        db.add_many(({"text": t, "source": f"s{i}"} for i, t in enumerate(texts)), chunker="window:size=12,overlap=3")
    uncompress(ref)
    conn = sqlite3.connect(ref)
    conn.execute("INSERT INTO _sqlite_migrations (migration_set, name, applied_at) "
                 "VALUES ('ragdb', '0010_compressed_text', '2026-01-01')")
    conn.execute("CREATE TABLE text_dictionaries (id INTEGER PRIMARY KEY, collection_id INTEGER NOT NULL, "
                 "created_at TEXT NOT NULL, content BLOB NOT NULL)")
    conn.commit()
    conn.close()
    with ragdb.open(ref) as db:  # plain TEXT read by this version (0010 marked applied)
        assert stored(ref, "SELECT count(*) FROM documents WHERE typeof(text) != 'text'") == [(0,)]
        assert results(db) == after


# ---------------------------------------------------------------------------- PostgreSQL (plain text)

def test_compressed_sqlite_round_trips_through_postgresql(pg_url, tmp_path, small_training):
    """PostgreSQL keeps plain text: a copy from a compressed SQLite file carries the texts
    (not the frames), and a copy back compresses them with the new file's own dictionary."""
    from ragdb.files.transfer import copy_database

    src, back = tmp_path / "a.db", tmp_path / "b.db"
    texts = seed_texts()
    with ragdb.open(src) as db:
        db.add_many(({"text": t, "source": f"s{i}"} for i, t in enumerate(texts)), chunker="window:size=10,overlap=2")
        want = [[(h.source, h.text) for h in db.search(q, k=50)] for q in ("retrieval index", "北京")]
        contains = db.count(filter={"$contains": "检索 数据库"})
    assert stored(src, "SELECT count(*) FROM documents WHERE typeof(text) = 'blob'") == [(len(texts),)]
    copy_database(str(src), pg_url)
    copy_database(pg_url, str(back))
    for target in (pg_url, str(back)):
        with ragdb.open(target) as db:
            assert [db.get(source=f"s{i}").text for i in range(len(texts))] == texts
            assert [[(h.source, h.text) for h in db.search(q, k=50)] for q in ("retrieval index", "北京")] == want
            assert db.count(filter={"$contains": "检索 数据库"}) == contains
            assert db.check() == []
    assert stored(back, "SELECT count(*) FROM documents WHERE typeof(text) = 'blob'") == [(len(texts),)]
