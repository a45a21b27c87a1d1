"""Handles opened after writes: a reopened handle, a second handle, a fresh process and an
optimize from another handle answer like a fresh build, whatever was deleted before
(the newest chunks, the oldest, the middle ones, everything), on SQLite and PostgreSQL.

Issue 27: deleting the newest documents left postings holding chunk ids above the highest
surviving chunk; every handle opened afterwards sized its per-chunk arrays by that chunk,
and search and optimize failed with an IndexError while ``check()`` said ok.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import uuid
from unittest import mock

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ragdb
from ragdb.errors import InternalError, RagdbError

from cli_helpers import ROOT, run, serving
from conftest import with_schema

EXAMPLES = int(os.environ.get("RAGDB_HYPOTHESIS_EXAMPLES", "40"))
QUERIES = ["apple note", "retrieval generation", "检索增强生成", "model answer evidence", "知识库 search", "向量 apple"]
WORDS = ["apple", "note", "retrieval", "augmented", "generation", "index", "search", "model", "answer", "evidence",
         "检索", "增强", "生成", "知识库", "模型", "答案", "证据", "向量"]


def fingerprint(hits):
    return [(h.source, h.start, h.end, h.text, h.score) for h in hits]


def searches(db):
    """Every query with both lexical scorers (and a phrase and an exclusion), as fingerprints."""
    out = []
    for q in QUERIES:
        for scorer in ("bm25", "tfidf"):
            out.append(fingerprint(db.search(q, k=50, scorer=scorer)))
        out.append(fingerprint(db.search(f'"{q}" -index', k=50)))
    return out


def fresh_searches(live, chunker):
    with ragdb.open(":memory:", chunker=chunker) as fresh:
        fresh.add_many([{"text": t, "source": s} for s, t in sorted(live.items())])
        return searches(fresh)


def assert_same(got, want):
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert [x[:4] for x in a] == [x[:4] for x in b]
        for x, y in zip(a, b):
            assert abs(x[4] - y[4]) <= 1e-9


#: a fresh process: opens the database, prints the searches as JSON
PROCESS = """
import sys, orjson, ragdb
QUERIES = orjson.loads(sys.argv[2])
with ragdb.open(sys.argv[1]) as db:
    out = []
    for q in QUERIES:
        for scorer in ("bm25", "tfidf"):
            out.append([(h.source, h.start, h.end, h.text, h.score) for h in db.search(q, k=50, scorer=scorer)])
        out.append([(h.source, h.start, h.end, h.text, h.score) for h in db.search(f'"{q}" -index', k=50)])
    sys.stdout.buffer.write(orjson.dumps(out))
"""


def process_searches(path: str):
    done = subprocess.run([sys.executable, "-c", PROCESS, path, orjson.dumps(QUERIES).decode()],
                          capture_output=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert done.returncode == 0, done.stderr.decode()
    return [[tuple(h) for h in hits] for hits in orjson.loads(done.stdout)]


# -- the reproduction -------------------------------------------------------------------------------

def reproduce(path: str) -> None:
    db = ragdb.open(path, chunker="none")
    db.add_many([{"text": f"apple note number {i}", "source": f"keep/{i}.md"} for i in range(1500)])
    db.add_many([{"text": f"apple extra {i}", "source": f"oops/{i}.md"} for i in range(1000)])  # flushed
    db.delete(source="oops/*", glob=True)  # the newest 1,000 chunks
    before = fingerprint(db.search("apple", 5))
    db.close()
    with ragdb.open(path) as other:
        assert other.check() == []
        assert fingerprint(other.search("apple", 5)) == before
        assert len(other.search("apple note", 50)) == 50
        other.optimize()
        assert fingerprint(other.search("apple", 5)) == before
        assert other.check() == []
    want = fresh_searches({f"keep/{i}.md": f"apple note number {i}" for i in range(1500)}, "none")
    if path.startswith("postgresql"):
        with ragdb.open(path) as third:
            assert_same(searches(third), want)
    else:
        assert_same(process_searches(path), want)  # a fresh process


def test_deleting_the_newest_documents_then_reopening(tmp_path):
    reproduce(str(tmp_path / "tiny.db"))


def test_deleting_the_newest_documents_then_reopening_on_postgres(pg_url):
    reproduce(pg_url)


# -- check() and reindex on ids past the counter ----------------------------------------------------

def damage_the_id_counter(path) -> list:
    """A file whose postings hold chunk ids at or past ``stats.next_chunk_id`` (damage no write
    makes: the 1,000 newest documents deleted, then the counter and the flush mark set back
    to the highest surviving chunk); returns the top hits it gave before."""
    with ragdb.open(path, chunker="none") as db:
        db.add_many([{"text": f"apple note number {i}", "source": f"keep/{i}.md"} for i in range(1500)])
        db.add_many([{"text": f"apple extra {i}", "source": f"oops/{i}.md"} for i in range(1000)])
        db.delete(source="oops/*", glob=True)
        want = fingerprint(db.search("apple", 5))
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE stats SET next_chunk_id = 1501, flushed_upto = 1500, generation = generation + 1, "
                     "flush_count = flush_count + 1")
    conn.close()
    return want


def test_check_names_ids_a_view_cannot_hold_and_reindex_repairs_them(tmp_path, runner):
    """Stored chunk ids at or past ``stats.next_chunk_id`` are out of the bounds of an open
    database's view: check() says so and what to run, search and optimize fail with a
    RagdbError naming the database (never a bare IndexError), and reindex repairs it."""
    path = tmp_path / "kb.db"
    want = damage_the_id_counter(path)
    with ragdb.open(path) as db:
        problems = db.check()
        assert any(p.startswith("postings.chunk_ids holds a chunk id outside 1..1500 (stats.next_chunk_id 1501): "
                                "search and optimize fail on it; run `ragdb reindex` in") for p in problems), problems
        assert any(p.startswith("chunk_log names a chunk id past stats.next_chunk_id 1501") for p in problems), problems
        with pytest.raises(InternalError, match=r"kb\.db: search failed unexpectedly.*ragdb check") as err:
            db.search("apple", 5)
        assert isinstance(err.value, RagdbError) and isinstance(err.value.__cause__, IndexError)
        with pytest.raises(RagdbError):
            db.optimize(vacuum=False)
    result = run(runner, "-d", path, "check", ok=False)
    assert result.exit_code == 1 and "run `ragdb reindex`" in result.output
    run(runner, "-d", path, "reindex")
    with ragdb.open(path) as db:
        assert db.check() == []
        assert fingerprint(db.search("apple", 5)) == want
        db.add("apple fresh", source="new.md")  # ids handed out after the repair do not collide
        assert db.check() == [] and "new.md" in [h.source for h in db.search("fresh")]


def test_the_server_answers_500_and_healthz_503_while_search_fails(tmp_path):
    """A worker whose searches fail says so at /healthz (503, naming what failed) instead of
    "ok", logs the error and answers the search with a 500 without its details; once a
    request succeeds again (after `ragdb reindex` from another process), /healthz is 200."""
    path = tmp_path / "kb.db"
    with ragdb.open(path) as db:
        db.add("apple", source="a.md")
    with serving(str(path), tmp_path) as url:
        assert httpx.post(url + "/search", json={"query": "apple", "k": 3}).status_code == 200
        damage_the_id_counter(path)
        r = httpx.post(url + "/search", json={"query": "apple", "k": 3})
        assert r.status_code == 500 and r.json()["error"]["type"] == "InternalError"
        assert "IndexError" not in r.text and str(path) not in r.text  # details stay in the log
        h = httpx.get(url + "/healthz")
        assert h.status_code == 503 and "InternalError on POST /search" in h.json()["error"]["message"]
        log = next(tmp_path.glob("serve-*.err"))
        assert "InternalError on POST /search" in log.read_text() and "IndexError" in log.read_text()
        log.write_text("")  # the logged traceback is this test's point, not a failure of the server
        with ragdb.open(path) as db:
            db.reindex()
        assert httpx.post(url + "/search", json={"query": "apple", "k": 3}).status_code == 200
        assert httpx.get(url + "/healthz").status_code == 200


# -- the random histories ---------------------------------------------------------------------------

step = st.one_of(
    st.tuples(st.just("add"), st.integers(0, 9), st.lists(st.sampled_from(WORDS), min_size=1, max_size=20)
              .map(" ".join)),
    st.tuples(st.just("add_batch"), st.integers(1, 9), st.integers(0, 5)),   # new sources, the newest chunks
    st.tuples(st.just("delete"), st.integers(0, 9), st.just(0)),
    st.tuples(st.sampled_from(["delete_newest", "delete_oldest", "delete_middle"]), st.integers(1, 6), st.just(0)),
    st.tuples(st.sampled_from(["empty", "optimize", "reopen", "second_handle", "optimize_elsewhere"]),
              st.just(0), st.just(0)),
    st.tuples(st.just("process"), st.just(0), st.just(0)),
)
histories = st.lists(step, min_size=1, max_size=18)


class History:
    """A random history against one database: ``live`` follows what a fresh build would
    hold (source -> text, in the order the sources were added)."""

    def __init__(self, path: str, chunker: str, process: bool) -> None:
        self.path, self.chunker, self.process = path, chunker, process
        self.db = ragdb.open(path, chunker=chunker)
        self.live: dict[str, str] = {}
        self.serial = 0

    def compare(self, db: ragdb.Database) -> None:
        assert_same(searches(db), fresh_searches(self.live, self.chunker))

    def apply(self, op: str, a: int, b) -> None:
        db, live = self.db, self.live
        if op == "add":
            db.add(b, source=f"doc{a}", chunker=self.chunker)
            live.pop(f"doc{a}", None)
            live[f"doc{a}"] = b
        elif op == "add_batch":
            records = []
            for i in range(a):
                self.serial += 1
                text = " ".join(WORDS[(self.serial * 7 + j * 3 + b) % len(WORDS)] for j in range(3 + (i + b) % 9))
                records.append({"text": text, "source": f"batch{self.serial}"})
            db.add_many(records, chunker=self.chunker)
            live.update((r["source"], r["text"]) for r in records)
        elif op == "delete":
            db.delete(source=f"doc{a}")
            live.pop(f"doc{a}", None)
        elif op.startswith("delete_"):
            order = list(live)  # oldest first
            n = min(a, len(order))
            start = {"delete_newest": len(order) - n, "delete_oldest": 0,
                     "delete_middle": (len(order) - n) // 2}[op]
            for source in order[start:start + n]:
                db.delete(source=source)
                del live[source]
        elif op == "empty":
            db.delete(source="*", glob=True)
            live.clear()
        elif op == "optimize":
            db.optimize(vacuum=False)
        elif op == "reopen":
            db.close()
            self.db = ragdb.open(self.path)
            self.compare(self.db)
        elif op == "second_handle":
            with ragdb.open(self.path) as other:
                self.compare(other)
                assert other.check() == []
            self.compare(db)
        elif op == "optimize_elsewhere":
            with ragdb.open(self.path) as other:
                other.optimize(vacuum=False)
            self.compare(db)
        elif op == "process":
            if self.process:
                assert_same(process_searches(self.path), fresh_searches(live, self.chunker))
        else:  # pragma: no cover - the strategy makes no other step
            raise AssertionError(op)

    def run(self, ops) -> None:
        try:
            for op in ops:
                self.apply(*op)
            self.compare(self.db)
            assert self.db.check() == []
            with ragdb.open(self.path) as last:
                self.compare(last)
        finally:
            self.db.close()


def small_segments():
    """Flushes every few chunks and merges after two segments, so a short history crosses
    flush and merge boundaries (and merges in parts of a few postings); the per-chunk arrays
    get no spare capacity (1,024 slots at least otherwise), so an id past their end fails
    at once instead of only past a thousand chunks."""
    import ragdb.index.inverted
    import ragdb.engine.write

    stack = [mock.patch.object(ragdb.engine.write, "FLUSH_THRESHOLD", 4), mock.patch.object(ragdb.index.inverted, "MAX_SEGMENTS", 2),
             mock.patch.object(ragdb.index.inverted, "MERGE_PART_POSTINGS", 7),
             mock.patch.object(ragdb.index.inverted, "_capacity", lambda size: size)]
    for p in stack:
        p.start()
    return stack


@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(ops=histories, chunker=st.sampled_from(["none", "window:size=6,overlap=2"]))
def test_handles_opened_after_any_history_equal_a_fresh_build(tmp_path_factory, ops, chunker, each_kernel):
    """After any history of adds, replaces, deletes (newest, oldest, middle, all), optimizes
    and reopenings, on a file that flushes every few chunks: a reopened handle, a second
    handle, a fresh process and the writer after another handle's optimize all answer like
    a fresh build of the live documents, and check() finds nothing."""
    path = str(tmp_path_factory.mktemp("reopen") / "kb.db")
    patches = small_segments()
    try:
        History(path, chunker, process=True).run(ops)
    finally:
        for p in patches:
            p.stop()


@settings(max_examples=max(EXAMPLES // 2, 5), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(ops=histories, chunker=st.sampled_from(["none", "window:size=6,overlap=2"]))
def test_handles_opened_after_any_history_equal_a_fresh_build_on_postgres(pg_server, ops, chunker):
    """The same histories on PostgreSQL (a fresh process reads a SQLite file only: its step
    is skipped here; the reopened and second handles are new connections)."""
    import psycopg

    schema = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")  # a generated name, not input
    patches = small_segments()
    try:
        History(with_schema(pg_server, schema), chunker, process=False).run(ops)
    finally:
        for p in patches:
            p.stop()
        with psycopg.connect(pg_server, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


def test_a_second_handle_closed_in_this_process_keeps_the_first_ones_locks(tmp_path):
    """Opening and closing a second handle of a file in this process must not drop the first
    handle's SQLite locks (closing any descriptor of a file drops every POSIX lock the process
    holds on it: ragdb's header check used to do that). Without its locks, another process
    closing its connection took the file for unused and deleted the -wal under the open
    handle, whose next write failed with "disk I/O error" (found by the random histories)."""
    path = tmp_path / "kb.db"
    with ragdb.open(path, chunker="none") as db:
        db.add("apple first", source="a.md")
        with ragdb.open(path) as other:
            assert [h.source for h in other.search("apple")] == ["a.md"]
        with ragdb.open(path, readonly=True) as other:
            assert other.count() == 1
        assert [h[0] for h in process_searches(str(path))[0]] == ["a.md"]
        assert (tmp_path / "kb.db-wal").exists()  # the other process left the open handle's log alone
        db.add("apple second", source="b.md")
        assert sorted(h.source for h in db.search("apple")) == ["a.md", "b.md"]
        assert db.check() == []


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_closing_twice_is_harmless_and_a_closed_handle_says_so(tmp_path, request, backend):
    path = str(tmp_path / "kb.db") if backend == "sqlite" else request.getfixturevalue("pg_url")
    db = ragdb.open(path)
    db.add("apple", source="a.md")
    db.close()
    db.close()  # raised sqlite3.ProgrammingError
    for read in (lambda: db.search("apple"), lambda: db.add("pear", source="p.md"), db.stats):
        with pytest.raises(RagdbError, match="closed"):
            read()
    with ragdb.open(path) as again:
        assert [h.source for h in again.search("apple")] == ["a.md"]


def test_document_ids_past_int32_are_held_whole(tmp_path):
    """A view keeps each chunk's document id in int32 until an id needs more: a document id past
    2**31 (a knowledge base that has seen billions of documents) makes it int64, in a handle
    that adds the document and in every handle opened later, flushed or not. The id is what
    a hit of a chunk that is its whole document reads its row by (numpy would have wrapped it
    into int32 without a word: another document's row, or none)."""
    path = str(tmp_path / "kb.db")
    big = 2**31 + 5
    with ragdb.open(path) as db:
        db.add("apple orchard notes", source="a.md", chunker="none")
    con = sqlite3.connect(path)
    with con:  # the id the next document gets
        con.execute("UPDATE stats SET next_doc_id = ? WHERE id = 1", (big,))
    con.close()
    with ragdb.open(path) as db:
        db.add("pear orchard notes", source="b.md", chunker="none")
        (hit,) = db.search("pear", k=5)
        assert (hit.source, hit.doc_id, hit.text) == ("b.md", big, "pear orchard notes")
    for flush in (False, True):  # reopened through the change log, then through the snapshot of a flush
        with ragdb.open(path) as db:
            if flush:
                db.optimize()
            (hit,) = db.search("pear", k=5)
            assert (hit.source, hit.doc_id, hit.text) == ("b.md", big, "pear orchard notes")
            assert [h.source for h in db.search("orchard", k=5, filter={"source": "b.md"})] == ["b.md"]
            # counts and filters by document: arrays as long as the matches, not the largest id
            # (facets took 62 s and 18 GiB here)
            assert db.facets("source", by="documents").counts == (("a.md", 1), ("b.md", 1))
            assert db.facets("source", query="pear").counts == (("b.md", 1),)
        with ragdb.open(path) as db:
            (hit,) = db.search("pear", k=5)
            assert (hit.source, hit.doc_id, hit.text) == ("b.md", big, "pear orchard notes")
