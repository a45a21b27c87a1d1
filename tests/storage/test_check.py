"""``Database.check`` and ``ragdb check`` see damage done behind ragdb's back.

Each test builds a real database file, corrupts it through the sqlite3 module
(as a stray script or a broken disk would), and expects a problem naming the
table and column from ``db.check()`` and ``problem:`` lines (exit 1, no
internal error) from ``ragdb check``; never an exception.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

import ragdb
from ragdb.models.embeddings import HashEmbedder
from ragdb.errors import StorageError

from cli_helpers import run

ENGLISH = ("The quick brown fox jumps over the lazy dog near the river bank. " * 6
           + "Foxes and dogs rarely share a meal, but this one was different. " * 4)
CHINESE = "数据库检索系统使用倒排索引。北京的天气很好，我们去公园散步吧。" * 8


def build(path: Path) -> None:
    """A healthy database: English and Chinese text, single and multi-chunk documents
    (chunk-level texts), a flush, deletes before and after it, a replaced source, vectors."""
    with ragdb.open(path, embedder=HashEmbedder()) as db:
        db.add(ENGLISH, source="en/long.txt", chunker="window:size=20,overlap=5")
        db.add(CHINESE, source="zh/long.txt", chunker="window:size=15,overlap=3")
        db.add("A short note about foxes.", source="en/short.txt", chunker="none")
        db.add("短文：狐狸和狗。", source="zh/short.txt", chunker="none")
        db.add("Soon gone, before the flush.", source="gone/early.txt", chunker="none")
        db.delete(source="gone/early.txt")
        db.add("Flushed, then deleted: its terms ride on the change log.", source="gone/late.txt",
               chunker="none")
        db.optimize(vacuum=False)  # flush: postings segments, empty change log
        db.delete(source="gone/late.txt")  # a flushed latest chunk deleted: chunk_log.terms
        db.add("The dog sleeps after the flush, in the tail.", source="en/tail.txt", chunker="none")
        db.add(ENGLISH.replace("fox", "cat"), source="en/long.txt", chunker="window:size=20,overlap=5")


@pytest.fixture
def kb(tmp_path: Path) -> Path:
    path = tmp_path / "kb.db"
    build(path)
    return path


def plain_texts(conn: sqlite3.Connection) -> None:
    """Store every compressed text as plain TEXT (as every database before migration 0010 did),
    so that a corruption is written against the text (``replace(text, ...)``) and damages it as
    a stray script or a broken disk would (compressed text's own damage: its tests below)."""
    from ragdb.storage.textcodec import new_codec

    codec = new_codec(conn)
    for table in ("documents", "chunks"):
        rows = conn.execute(f"SELECT id, text FROM {table} WHERE typeof(text) = 'blob'").fetchall()
        conn.executemany(f"UPDATE {table} SET text = ? WHERE id = ?", [(codec.decode(t), i) for i, t in rows])


def corrupt(path: Path, *statements: str, params: tuple = ()) -> None:
    conn = sqlite3.connect(path)
    try:
        plain_texts(conn)
        for sql in statements:
            conn.execute(sql, params)
        conn.commit()
    finally:
        conn.close()


def one(path: Path, sql: str) -> tuple:
    conn = sqlite3.connect(path)
    try:
        row = conn.execute(sql).fetchone()
    finally:
        conn.close()
    assert row is not None, sql
    return row


def problems_of(path: Path, quick: bool = False) -> list[str]:
    with ragdb.open(path) as db:
        return db.check(quick=quick)


def assert_reported(path: Path, runner, needle: str, quick: bool = False) -> list[str]:
    problems = problems_of(path, quick)
    assert any(needle in p for p in problems), problems
    result = run(runner, "-d", path, "check", *(["--quick"] if quick else []), ok=False)
    assert result.exit_code == 1, result.output
    assert "internal error" not in result.output and "Traceback" not in result.output, result.output
    lines = result.output.splitlines()
    assert lines and all(line.startswith("problem: ") for line in lines), result.output
    assert any(needle in line for line in lines), result.output
    return problems


# ----------------------------------------------------------------------------- healthy


def test_healthy_database_has_no_problem(kb, runner):
    with sqlite3.connect(kb) as conn:  # the fixture holds what the corruptions below need
        assert conn.execute("SELECT count(*) FROM postings").fetchone()[0] > 0
        assert conn.execute("SELECT count(*) FROM chunks WHERE text IS NOT NULL").fetchone()[0] > 0
        assert conn.execute("SELECT count(*) FROM chunk_log WHERE terms IS NOT NULL").fetchone()[0] >= 1
        assert conn.execute("SELECT count(*) FROM chunks WHERE id > (SELECT flushed_upto FROM stats)"
                            ).fetchone()[0] > 0
        assert conn.execute("SELECT count(*) FROM vectors").fetchone()[0] > 0
        assert conn.execute("SELECT count(*) FROM documents WHERE latest = 0").fetchone()[0] == 0
    conn.close()
    with ragdb.open(kb) as db:
        assert db.check() == []
        assert db.check(quick=True) == []
        assert [h.source for h in db.search("狐狸")] == ["zh/short.txt"]
    assert run(runner, "-d", kb, "check").output.startswith("ok")
    assert run(runner, "-d", kb, "check", "--quick").output.startswith("ok")


def test_healthy_database_with_kept_versions(tmp_path):
    path = tmp_path / "kept.db"
    with ragdb.open(path, keep_versions=True) as db:
        db.add(ENGLISH, source="a.txt", chunker="window:size=20,overlap=5")
        db.add(ENGLISH + " Appended.", source="a.txt", chunker="window:size=20,overlap=5")
        db.add(CHINESE, source="b.txt", chunker="window:size=15,overlap=3")
        assert db.check() == [] and db.check(quick=True) == []


def test_help_mentions_quick(runner):
    out = run(runner, "check", "--help").output
    assert "--quick" in out and "text" in out


# ----------------------------------------------------------------------------- texts (item 4)

TEXT_CORRUPTIONS: dict[str, tuple[Callable[[Path], None], str]] = {
    "document text changed": (
        lambda p: corrupt(p, "UPDATE documents SET text = 'other' WHERE source = 'en/short.txt'"),
        "documents.text does not match its content_hash"),
    "document text not UTF-8": (
        lambda p: corrupt(p, "UPDATE documents SET text = CAST(x'fffe' AS TEXT) WHERE source = 'zh/short.txt'"),
        "documents.text is not valid UTF-8"),
    "document text a blob": (
        lambda p: corrupt(p, "UPDATE documents SET text = CAST(text AS BLOB) WHERE source = 'en/tail.txt'"),
        "documents.text is not stored as text"),
    "long document text changed": (
        lambda p: corrupt(p, "UPDATE documents SET text = replace(text, '北京', '上海') WHERE source = 'zh/long.txt'"),
        "documents.text does not match its content_hash"),
    "chunk text changed": (
        lambda p: corrupt(p, "UPDATE chunks SET text = 'other' WHERE id = (SELECT min(id) FROM chunks "
                             "WHERE text IS NOT NULL)"),
        "chunks.text differs from its document's text[start:end]"),
    "chunk text not UTF-8": (
        lambda p: corrupt(p, "UPDATE chunks SET text = CAST(x'e4b8' AS TEXT) WHERE id = (SELECT max(id) FROM chunks "
                             "WHERE text IS NOT NULL AND doc_id = (SELECT id FROM documents "
                             "WHERE source = 'zh/long.txt'))"),
        "chunks.text is not valid UTF-8"),
    "chunk text a blob": (
        lambda p: corrupt(p, "UPDATE chunks SET text = CAST(text AS BLOB) WHERE id = (SELECT max(id) FROM chunks "
                             "WHERE text IS NOT NULL)"),
        "chunks.text is not stored as text"),
    "chunk text dropped": (
        lambda p: corrupt(p, "UPDATE chunks SET text = NULL WHERE id = (SELECT max(id) FROM chunks "
                             "WHERE text IS NOT NULL)"),
        "chunks.text is NULL"),
    "chunk span moved": (
        lambda p: corrupt(p, 'UPDATE chunks SET start = start + 1 WHERE id = (SELECT min(id) FROM chunks '
                             'WHERE text IS NOT NULL AND doc_id = (SELECT id FROM documents '
                             "WHERE source = 'zh/long.txt'))"),
        "chunks.text differs from its document's text[start:end]"),
}


@pytest.mark.parametrize("name", list(TEXT_CORRUPTIONS))
def test_text_damage_is_reported_by_full_check_only(kb, runner, name):
    damage, needle = TEXT_CORRUPTIONS[name]
    damage(kb)
    problems = assert_reported(kb, runner, needle)
    assert len(problems) == 1, problems  # no knock-on problem from the index checks
    assert problems_of(kb, quick=True) == []  # quick skips the text pass, and says nothing of it
    assert run(runner, "-d", kb, "check", "--quick").exit_code == 0


def test_text_problems_are_counted_with_an_example(kb):
    corrupt(kb, "UPDATE documents SET text = 'other' WHERE source IN ('en/short.txt', 'en/tail.txt')")
    ids = one(kb, "SELECT min(id) FROM documents WHERE source IN ('en/short.txt', 'en/tail.txt')")
    problems = problems_of(kb)
    assert problems == [f"documents.text does not match its content_hash in 2 documents (e.g. document {ids[0]})"]


def test_search_on_damaged_text_is_seen_by_check(kb):
    """The failure the issue describes: text that is not UTF-8 passed check() and then broke search."""
    corrupt(kb, "UPDATE documents SET text = CAST(x'fffe' AS TEXT) WHERE source = 'en/short.txt'")
    with ragdb.open(kb) as db:
        assert any("documents.text is not valid UTF-8" in p for p in db.check())


def test_text_pass_reads_in_blocks(kb, monkeypatch):
    """Texts are read a block at a time, each block's chunks with it (small blocks: every boundary)."""
    from ragdb.storage import Store

    original = Store.document_text_blocks
    monkeypatch.setattr(Store, "document_text_blocks", lambda self: original(self, rows=1))
    assert problems_of(kb) == []
    corrupt(kb, "UPDATE chunks SET text = 'other' WHERE id = (SELECT max(id) FROM chunks WHERE text IS NOT NULL)")
    assert any("chunks.text differs" in p for p in problems_of(kb))


# ----------------------------------------------------------------------------- packed columns (item 5)

FIRST_SEGMENT = "(term_id, segment) = (SELECT term_id, segment FROM postings ORDER BY term_id, segment LIMIT 1)"
FLUSHED_CHUNK = ("(SELECT max(c.id) FROM chunks c WHERE c.latest = 1 AND c.id <= (SELECT flushed_upto FROM stats))")
TAIL_CHUNK = "(SELECT max(id) FROM chunks WHERE id > (SELECT flushed_upto FROM stats))"
LONG_SEGMENT = ("(term_id, segment) = (SELECT term_id, segment FROM postings WHERE n >= 2 "
                "ORDER BY term_id, segment LIMIT 1)")

PACKED_CORRUPTIONS: dict[str, tuple[list[str], str]] = {
    "postings.chunk_ids one byte": (
        [f"UPDATE postings SET chunk_ids = x'00' WHERE {FIRST_SEGMENT}"], "postings.chunk_ids"),
    "postings.chunk_ids text": (
        [f"UPDATE postings SET chunk_ids = CAST(x'ff' AS TEXT) WHERE {FIRST_SEGMENT}"],
        "postings.chunk_ids is not a blob"),
    "postings.chunk_ids integer": (
        [f"UPDATE postings SET chunk_ids = 7 WHERE {FIRST_SEGMENT}"], "postings.chunk_ids is not a blob"),
    "postings.tfs odd": (
        [f"UPDATE postings SET tfs = x'000000' WHERE {FIRST_SEGMENT}"], "postings.tfs"),
    "postings.tfs short": (
        [f"UPDATE postings SET tfs = substr(tfs, 1, length(tfs) - 2) WHERE {LONG_SEGMENT}"], "postings.n"),
    "postings.n": (
        [f"UPDATE postings SET n = n + 1 WHERE {FIRST_SEGMENT}"], "postings.n"),
    "postings.chunk_ids order": (
        [f"UPDATE postings SET chunk_ids = x'0200000001000000', tfs = x'01000100', n = 2 WHERE {FIRST_SEGMENT}"],
        "postings.chunk_ids is not strictly increasing"),
    "chunks.terms flushed": (
        [f"UPDATE chunks SET terms = x'00' WHERE id = {FLUSHED_CHUNK}"], "chunks.terms"),
    "chunks.terms tail": (
        [f"UPDATE chunks SET terms = x'0000' WHERE id = {TAIL_CHUNK}"], "chunks.terms"),
    "chunks.terms text": (
        [f"UPDATE chunks SET terms = CAST(x'ffffffff' AS TEXT) WHERE id = {TAIL_CHUNK}"],
        "chunks.terms is not a blob"),
    "chunks.tfs": (
        [f"UPDATE chunks SET tfs = x'00' WHERE id = {FLUSHED_CHUNK}"], "chunks.tfs"),
    "chunks.terms longer than tfs": (  # a packed blob (schema 11) grown by 4 bytes: still packed, too long
        [f"UPDATE chunks SET terms = CAST(terms || x'01000000' AS BLOB) WHERE id = {TAIL_CHUNK}"],
        "chunks.terms is not a packed forward index: not the length its terms and their escapes take"),
    "chunks.terms raw longer than tfs": (  # a raw row (as written before schema 11) with a tf too few
        [f"UPDATE chunks SET terms = x'0100000002000000', tfs = x'0100' WHERE id = {TAIL_CHUNK}"],
        "chunks.terms and chunks.tfs differ in length"),
    "chunks.tfs of a packed row": (
        [f"UPDATE chunks SET tfs = CAST(tfs || x'01' AS BLOB) WHERE id = {FLUSHED_CHUNK}"],
        "chunks.tfs is not as many uint8 or uint16 values as chunks.terms has terms"),
    "chunk_log.terms": (
        ["UPDATE chunk_log SET terms = x'000000' WHERE terms IS NOT NULL"], "chunk_log.terms"),
    "chunk_log.terms text": (
        ["UPDATE chunk_log SET terms = 'text' WHERE terms IS NOT NULL"], "chunk_log.terms is not a blob"),
    "vectors.vector short": (
        ["UPDATE vectors SET vector = x'00' WHERE chunk_id = (SELECT min(chunk_id) FROM vectors)"], "vectors.vector"),
    "vectors.vector text of the right length": (
        ["UPDATE vectors SET vector = CAST(vector AS TEXT) WHERE chunk_id = (SELECT min(chunk_id) FROM vectors)",
         "UPDATE vectors SET vector = printf('%.256c', 'a') WHERE chunk_id = (SELECT max(chunk_id) FROM vectors)"],
        "vectors.vector is not 64 float32 values"),
}


@pytest.mark.parametrize("name", list(PACKED_CORRUPTIONS))
def test_malformed_packed_column_is_reported(kb, runner, name):
    statements, needle = PACKED_CORRUPTIONS[name]
    corrupt(kb, *statements)
    assert_reported(kb, runner, needle)
    assert_reported(kb, runner, needle, quick=True)


def test_malformed_postings_blob_no_longer_raises(kb, runner):
    """The report of the issue: ValueError (buffer size must be a multiple of element size)."""
    corrupt(kb, "UPDATE postings SET chunk_ids = x'00'")
    problems = assert_reported(kb, runner, "postings.chunk_ids is neither postings.n uint32 values nor postings.n packed gaps")
    assert len(problems) == 1, problems  # every segment skipped: nothing else to compare, nothing else wrong


def test_malformed_forward_index_is_skipped_by_the_later_checks(kb):
    """A chunk whose forward index is unreadable is reported once: the postings comparison
    leaves it out on both sides, instead of reporting the postings as wrong as well."""
    cid = one(kb, f"SELECT {FLUSHED_CHUNK}")[0]
    old = one(kb, f"SELECT id FROM chunks WHERE latest = 1 AND id < {cid} AND id <= (SELECT flushed_upto FROM stats)")
    corrupt(kb, "UPDATE chunks SET terms = x'00' WHERE id = ?", params=(old[0],))
    problems = problems_of(kb)
    assert problems[0].startswith("chunks.terms is not a packed forward index: shorter than its terms need in 1 chunk "
                                  "(e.g. chunk ")
    assert not any("postings disagree" in p for p in problems), problems


@pytest.mark.parametrize("table, column, declared", [
    ("postings", "chunk_ids", "chunk_ids  BLOB NOT NULL"),
    ("postings", "tfs", "tfs        BLOB NOT NULL"),
    ("chunks", "terms", "terms     BLOB NOT NULL"),
    ("chunks", "tfs", "tfs       BLOB NOT NULL"),
    ("vectors", "vector", "vector    BLOB NOT NULL"),
])
def test_null_in_a_packed_column_is_reported(kb, runner, table, column, declared):
    """NOT NULL keeps NULL out; a schema edited behind ragdb's back lets it in."""
    conn = sqlite3.connect(kb)
    try:
        sql = conn.execute("SELECT sql FROM sqlite_master WHERE name = ?", [table]).fetchone()[0]
        assert declared in sql
        version = conn.execute("PRAGMA schema_version").fetchone()[0]
        conn.execute("PRAGMA writable_schema = ON")
        conn.execute("UPDATE sqlite_master SET sql = replace(sql, ?, ?) WHERE name = ?",
                     [declared, declared.replace(" NOT NULL", ""), table])
        conn.execute(f"PRAGMA schema_version = {version + 1}")
        conn.execute("PRAGMA writable_schema = OFF")
        conn.commit()
    finally:
        conn.close()
    key = {"postings": "term_id = (SELECT min(term_id) FROM postings)", "chunks": f"id = {FLUSHED_CHUNK}",
           "vectors": "chunk_id = (SELECT min(chunk_id) FROM vectors)"}[table]
    corrupt(kb, f"UPDATE {table} SET {column} = NULL WHERE {key}")
    assert one(kb, f"SELECT count(*) FROM {table} WHERE {column} IS NULL")[0] >= 1
    assert_reported(kb, runner, f"{table}.{column} is not")


def test_malformed_embedding_record_is_reported(kb, runner):
    corrupt(kb, "UPDATE settings SET value = '{\"model\": \"hash-64\"}' WHERE key = 'embedding'")
    assert_reported(kb, runner, "the recorded embedding model is malformed")


# ----------------------------------------------------------------------------- the filter index
# doc_meta and doc_acl are what metadata filters and access labels read: a row too many
# shows a document to a principal it does not name, a row too few hides it.


def labelled(path: Path) -> None:
    """Documents with metadata of every kind the filter index holds (strings, numbers,
    booleans, dates, lists with a repeated element) and access labels; an update, a
    replacement and a delete."""
    with ragdb.open(path, public_unlabeled=False) as db:
        db.add("salaries of the team", source="hr/pay.md", acl=["hr", "finance"],
               metadata={"lang": "en", "tags": ["pay", "pay", "2024"], "n": 1.5, "draft": True,
                         "when": "2024-05-01"})
        db.add("the public handbook", source="pub/handbook.md", acl=["*"], metadata={"lang": "en", "n": 3})
        db.add("员工手册", source="zh/handbook.md", acl=["staff"], metadata={"lang": "zh"})
        doomed = db.add("soon gone", source="tmp/gone.md", acl=["hr"], metadata={"lang": "en"})
        db.delete(doomed.id)
        old = db.add("salaries, first draft", source="hr/draft.md", acl=["hr"], metadata={"v": 1})
        db.add("salaries, second draft", source="hr/draft.md", metadata={"v": 2})  # keeps its labels
        db.update(old.id + 1, metadata={"v": 3, "tags": ["final"]})


@pytest.fixture
def labelled_kb(tmp_path: Path) -> Path:
    path = tmp_path / "labelled.db"
    labelled(path)
    return path


def visible(path: Path, query: str, **options) -> list[str]:
    with ragdb.open(path) as db:
        return sorted(h.source for h in db.search(query, **options))


def test_healthy_filter_index_has_no_problem(labelled_kb, tmp_path):
    assert one(labelled_kb, "SELECT count(*) FROM doc_meta")[0] >= 10
    assert one(labelled_kb, "SELECT count(*) FROM doc_acl")[0] == 5
    assert problems_of(labelled_kb) == [] and problems_of(labelled_kb, quick=True) == []
    kept = tmp_path / "kept.db"
    with ragdb.open(kept, keep_versions=True) as db:
        db.add("one", source="a.md", acl=["x"], metadata={"k": "v1"})
        db.add("two", source="a.md", acl=["y"], metadata={"k": ["v2", "v3"]})
        assert db.check() == []


def test_extra_label_is_reported_and_reindex_removes_it(labelled_kb, runner):
    """A stray doc_acl row shows a document to principals it does not name."""
    assert visible(labelled_kb, "员工手册", principals=["hr"]) == []
    doc = one(labelled_kb, "SELECT id FROM documents WHERE source = 'zh/handbook.md'")[0]
    corrupt(labelled_kb, "INSERT INTO doc_acl (doc_id, label) VALUES (?, 'hr')", params=(doc,))
    assert visible(labelled_kb, "员工手册", principals=["hr"]) == ["zh/handbook.md"]  # the leak
    problems = assert_reported(labelled_kb, runner, f"doc_acl has 1 row not in the documents' labels "
                                                    f"(e.g. document {doc}, label 'hr')")
    assert problems == assert_reported(labelled_kb, runner, "doc_acl has 1 row", quick=True)
    assert len(problems) == 1, problems
    assert "`ragdb reindex`" in problems[0]
    assert run(runner, "-d", labelled_kb, "reindex").exit_code == 0
    assert problems_of(labelled_kb) == []
    assert visible(labelled_kb, "员工手册", principals=["hr"]) == []
    assert visible(labelled_kb, "员工手册", principals=["staff"]) == ["zh/handbook.md"]


def test_missing_label_is_reported_and_reindex_restores_it(labelled_kb, runner):
    corrupt(labelled_kb, "DELETE FROM doc_acl WHERE label = 'finance'")
    assert visible(labelled_kb, "salaries", principals=["finance"]) == []
    assert_reported(labelled_kb, runner, "doc_acl lacks 1 row of the documents' labels (e.g. document 1, "
                                         "label 'finance'): principals holding them do not see those documents")
    with ragdb.open(labelled_kb) as db:
        report = db.reindex()
        assert report.documents == 4 and db.check() == []
    assert visible(labelled_kb, "salaries", principals=["finance"]) == ["hr/pay.md"]


@pytest.mark.parametrize("statements, needles", [
    (["DELETE FROM doc_meta WHERE key = 'tags' AND rowid = (SELECT min(rowid) FROM doc_meta WHERE value = 'pay')"],
     ["doc_meta lacks 1 row of the documents' metadata (e.g. document 1, 'tags' = 'pay')"]),
    (["UPDATE doc_meta SET value = 'fr' WHERE value = 'zh'"],
     ["doc_meta lacks 1 row of the documents' metadata (e.g. document 3, 'lang' = 'zh')",
      "doc_meta has 1 row not in the documents' metadata (e.g. document 3, 'lang' = 'fr')"]),
    (["UPDATE doc_meta SET num = 2.5 WHERE key = 'n' AND num = 1.5"], ["doc_meta lacks 1 row", "doc_meta has 1 row"]),
    (["UPDATE doc_meta SET at = at + 1 WHERE key = 'when'"], ["doc_meta lacks 1 row", "doc_meta has 1 row"]),
    (["INSERT INTO doc_meta (doc_id, key, value) VALUES (99, 'lang', 'en')"],  # of no document: SQLite's
     ["foreign key violation in doc_meta",                                     # check sees it too
      "doc_meta has 1 row not in the documents' metadata (e.g. document 99, 'lang' = 'en')"]),
    (["INSERT INTO doc_acl (doc_id, label) VALUES (4, 'hr')"],  # the deleted document's id
     ["foreign key violation in doc_acl", "doc_acl has 1 row not in the documents' labels (e.g. document 4, label 'hr')"]),
])
def test_filter_index_damage_is_reported_and_reindex_repairs_it(labelled_kb, runner, statements, needles):
    """A changed row is a row missing and a row too many; each kind is one problem."""
    queries = ({"lang": "en"}, {"tags": "pay"}, {"n": {"$gt": 1}}, {"when": {"$gte": "2024-01-01"}})
    with ragdb.open(labelled_kb) as db:
        before = [sorted(h.source for h in db.search("salaries handbook", filter=f, principals=ragdb.ALL))
                  for f in queries]
    corrupt(labelled_kb, *statements)
    problems = assert_reported(labelled_kb, runner, needles[0])
    assert len(problems) == len(needles) and all(p.startswith(n) for p, n in zip(problems, needles)), problems
    run(runner, "-d", labelled_kb, "reindex")
    with ragdb.open(labelled_kb) as db:
        assert db.check() == []
        assert before == [sorted(h.source for h in db.search("salaries handbook", filter=f, principals=ragdb.ALL))
                          for f in queries]


def test_damaged_metadata_json_is_reported_once_and_reindex_refuses(labelled_kb, runner):
    """A document whose own metadata is not JSON: reported as such, its filter rows not
    compared (they cannot be judged); reindex cannot rebuild from it and changes nothing."""
    corrupt(labelled_kb, "UPDATE documents SET metadata = '{not json' WHERE source = 'pub/handbook.md'",
            "UPDATE documents SET acl = '[1, 2]' WHERE source = 'zh/handbook.md'")
    problems = assert_reported(labelled_kb, runner, "documents.metadata is not a JSON object in 1 document "
                                                    "(e.g. document 2)")
    assert any(p.startswith("documents.acl is not a JSON array of strings in 1 document (e.g. document 3)")
               for p in problems), problems
    assert len(problems) == 2, problems
    rows = one(labelled_kb, "SELECT count(*), (SELECT count(*) FROM doc_acl) FROM doc_meta")
    with ragdb.open(labelled_kb) as db, pytest.raises(StorageError, match="document 2: its stored metadata"):
        db.reindex()
    assert one(labelled_kb, "SELECT count(*), (SELECT count(*) FROM doc_acl) FROM doc_meta") == rows


def test_filter_index_is_compared_in_blocks(tmp_path, monkeypatch):
    """Blocks of two documents: rows at every block boundary, and past the last document,
    are compared with their own document's."""
    from ragdb.storage.store import Store

    path = tmp_path / "many.db"
    with ragdb.open(path) as db:
        db.add_many({"text": f"doc {i}", "source": f"d{i}", "metadata": {"i": i, "even": i % 2 == 0},
                     "acl": [f"g{i % 3}"]} for i in range(9))
    blocks = []
    original = Store.document_filter_blocks

    def small(self, rows=4096):
        for block in original(self, 2):
            blocks.append(len(block))
            yield block

    monkeypatch.setattr(Store, "document_filter_blocks", small)
    assert problems_of(path) == [] and blocks == [2, 2, 2, 2, 1]
    corrupt(path, "UPDATE doc_meta SET value = 7 WHERE key = 'i' AND doc_id IN (2, 9)",
            "INSERT INTO doc_acl (doc_id, label) VALUES (10, 'g0')")
    problems = problems_of(path)
    assert problems == [
        "foreign key violation in doc_acl rowid None",
        "doc_meta lacks 2 rows of the documents' metadata (e.g. document 2, 'i' = 1): filters on them miss those "
        "documents; `ragdb reindex` writes the filter index anew",
        "doc_meta has 2 rows not in the documents' metadata (e.g. document 2, 'i' = 7): filters on them match "
        "documents that do not say so; `ragdb reindex` writes the filter index anew",
        "doc_acl has 1 row not in the documents' labels (e.g. document 10, label 'g0'): principals holding them "
        "see documents not labelled so; `ragdb reindex` writes the filter index anew"], problems
