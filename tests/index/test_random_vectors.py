"""Random histories of a database with vectors: whatever was embedded when, vector and hybrid
search equal those of a fresh build of the latest documents, fully embedded with the same
embedder.

Each example opens a file (``keep_versions`` on or off, ``public_unlabeled`` on or off, one of
two chunkers, the writing handle with or without ``embedder=``, approximate search ``on`` or
``off``) and applies a random history: the lexical writes of
``tests/engine/test_random_operations.py`` (adds, batches, replaces, identical re-adds,
metadata and label updates, deletes by id, source, glob and filter, writes through a second
handle, transactions that raise midway, optimizes, close and reopen), small edits and copies of
a stored text (so unchanged chunks keep, and other chunks take over, their vectors), and the
vector steps: ``db.embed()`` with the embedder or the recorded model, an embedder that fails
on its n-th call (the chunks it did not reach stay pending; the message says how many), an add
through a handle whose embedder always fails (the text stays, its chunks pending), the
handle's embedder and ``embed_on_add`` switched on and off, a second handle that embeds on add
or embeds what is pending (``full_scan`` or not),
a transaction that adds, embeds and searches and then raises (nothing of it stays), a refused
switch to another model, and ``rebuild``.

At checkpoints, before anything is embedded: stored vectors plus pending chunks are the stored
chunks; each stored vector of a latest chunk is the fresh build's vector of that chunk, byte for
byte (reused vectors are the right ones); and an exact vector search of every copy equals the
fresh build's restricted to the chunks that have a vector. At some checkpoints and at the end
``db.embed()`` fills the pending chunks, and then every handle (the writer, a handle opened
before the first write, one opened now) answers vector and hybrid searches (every fusion, the
callers None, labels and ``ragdb.ALL``, filters, since/until, a small pool, ``k`` cuts and an
offset, ``explain``) exactly as the fresh build does (vector scores bit for bit; hybrid within
1e-9), searches of every stored version equal between the handles,
nothing is pending, and ``check()`` finds nothing.

With ``ann="on"`` (usearch installed) the writer and the reader search through the HNSW graph,
kept in step across the history, reopenings, other handles' writes and a rolled-back
transaction: the graph only proposes candidates, each re-scored exactly, and with these small
collections (a few dozen vectors, far under the graph's ``ef``) every chunk is proposed, so the
answers equal exact search. Separately, restricted ANN searches never return a chunk outside
the restriction or one deleted or replaced, and return ``k`` hits whenever ``k`` qualify
(docs/dense-and-hybrid.md, *Approximate search*).

The same histories run on PostgreSQL (a schema of its own on the test server; skipped without
one). ``RAGDB_HYPOTHESIS_EXAMPLES`` sets the example count (default 8 on SQLite, half as many on
PostgreSQL: about 20 s in all).
"""

from __future__ import annotations

import contextlib
import copy
import os
import uuid
from unittest import mock

import pytest
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

import ragdb
from conftest import with_schema
from engine.test_random_operations import (
    BAD_RECORDS, DAYS, WORDS, Model, Rollback, Run, additions, assert_same, deletions, existing, records, sources,
)
from ragdb.errors import EmbeddingError, InvalidInput
from ragdb.index import ann as ann_module
from ragdb.models.embeddings import HashEmbedder

EXAMPLES = int(os.environ.get("RAGDB_HYPOTHESIS_EXAMPLES", "8"))
DIMS = 16
OTHER = HashEmbedder(12)  # another model: refused while vectors of hash-16 exist
HAS_ANN = ann_module.ann_available()

#: queries of the vector and hybrid searches: words, Chinese, a phrase, an exclusion, a filter, OR
VQUERIES = ["apple retrieval", "检索增强生成", '"apple note" model', "search -model", "note OR 向量 lang:en"]
FUSIONS = [{"fusion": "adaptive", "alpha": 0.6}, {"fusion": "weighted", "alpha": 0.5}, {"fusion": "rrf", "rrf_k": 10}]
CALLERS = {"anonymous": None, "a": ["a"], "b,c": ["b", "c"], "ALL": ragdb.ALL}
BIG_K = 1000


class Embedder(HashEmbedder):
    """``hash-16`` (the same model as the recorded one), counting its calls; with ``fail_at``, every
    call from the ``fail_at``-th on raises (an endpoint that went down)."""

    def __init__(self, fail_at: int | None = None) -> None:
        super().__init__(DIMS)
        self.fail_at = fail_at
        self.calls = 0

    def embed(self, texts):
        self.calls += 1
        if self.fail_at is not None and self.calls >= self.fail_at:
            raise RuntimeError("embedding endpoint down")
        return super().embed(texts)


# -- observations -------------------------------------------------------------------------------

def hit_values(h) -> list:
    return [h.source, h.start, h.end, h.text, h.score, h.confidence, h.version, h.timestamp, h.title,
            dict(h.metadata), [[d.source, d.score] for d in h.duplicates]]


def vector_observe(db, embedder) -> dict[str, list]:
    """What the exact-vs-fresh comparison reads: vector searches (scores compared exactly) under
    ``"vector ..."``, hybrid ones under ``"hybrid ..."``."""

    def hits(query, k=40, **kw):
        return [hit_values(h) for h in db.search(query, k, embedder=embedder, **kw)]

    out: dict[str, list] = {}
    for q in VQUERIES:
        for name, p in CALLERS.items():
            out[f"vector {q!r} {name}"] = hits(q, scorer="vector", principals=p)
            out[f"hybrid {q!r} {name}"] = hits(q, scorer="hybrid", principals=p)
        for fusion in FUSIONS:
            out[f"hybrid {q!r} {fusion}"] = hits(q, scorer="hybrid", principals=ragdb.ALL, **fusion)
        for scorer in ("vector", "hybrid"):
            out[f"{scorer} {q!r} n>=2"] = hits(q, scorer=scorer, filter={"n": {"$gte": 2}}, principals=ragdb.ALL)
            out[f"{scorer} {q!r} since/until"] = hits(q, scorer=scorer, since=DAYS[5], until=DAYS[20],
                                                      principals=["a"])
        out[f"vector {q!r} source a/*"] = hits(q, scorer="vector", filter={"source": "a/*"})
        out[f"vector {q!r} all copies"] = hits(q, scorer="vector", collapse=False, principals=ragdb.ALL)
        out[f"vector {q!r} k=3"] = hits(q, 3, scorer="vector", principals=ragdb.ALL)
        out[f"vector {q!r} k=2 offset=2"] = hits(q, 2, scorer="vector", offset=2, principals=ragdb.ALL)
        out[f"hybrid {q!r} pool=3"] = hits(q, 5, scorer="hybrid", pool=3, fusion="weighted", principals=ragdb.ALL)
        out[f"hybrid {q!r} explain"] = [[h.source, h.start, h.score, h.explain] for h in db.search(
            q, 5, scorer="hybrid", explain=True, principals=ragdb.ALL, embedder=embedder)]
    return out


def all_versions_observe(db, embedder) -> dict[str, list]:
    """Searches of every stored version (a fresh build holds only the latest: these are compared
    between the handles on the history's database)."""
    out = {}
    for q in VQUERIES[:3]:
        for scorer in ("vector", "hybrid"):
            out[f"{scorer} {q!r} versions=all"] = [
                hit_values(h) for h in db.search(q, 40, scorer=scorer, versions="all", collapse=False,
                                                 principals=ragdb.ALL, embedder=embedder)]
    return out


def assert_observed(got: dict, want: dict, where: str) -> None:
    assert got.keys() == want.keys()
    for key in want:
        if key.startswith("vector"):
            assert got[key] == want[key], f"{where}: {key}:\n{got[key]}\n!=\n{want[key]}"
        else:
            assert_same(got[key], want[key], where, key)


def latest_vectors(db) -> dict[tuple[str, int, int], bytes]:
    """(source, start, end) -> stored vector bytes, of the latest versions' chunks with a vector
    (read through the handle's connection: a file or a PostgreSQL schema)."""
    with db._store.read():
        rows = db._store.conn.execute(
            'SELECT d.source, c.start, c."end", v.vector FROM vectors v JOIN chunks c ON c.id = v.chunk_id '
            "JOIN documents d ON d.id = c.doc_id WHERE d.latest = 1").fetchall()
    out = {(s, a, b): bytes(v) for s, a, b, v in rows}
    assert len(out) == len(rows)
    return out


def vector_counts(db) -> tuple[int, int, int]:
    """(vectors, pending, stored chunks), which must add up."""
    info, stats = db.vector_info(), db.stats()
    assert info.vectors + info.pending == stats.stored_chunks, (info, stats)
    return info.vectors, info.pending, stats.stored_chunks


# -- the steps ---------------------------------------------------------------------------------------

edits = st.one_of(
    st.tuples(st.just("edit"), existing, st.sampled_from(WORDS)),   # one word appended: the early chunks unchanged
    st.tuples(st.just("copy"), existing, sources),                   # a stored text under another source
)
writes = st.one_of(additions, additions, deletions, edits)
vector_steps = st.one_of(
    st.tuples(st.just("embed"), st.sampled_from([1, 2, 64]), st.booleans()),  # True: the embedder given
    st.tuples(st.just("embed_fail"), st.sampled_from([1, 2, 3]), st.integers(1, 3)),
    st.tuples(st.just("add_fail"), sources, records),
    st.tuples(st.just("embedder"), st.sampled_from(["set", "unset", "unset", "on_add_off", "on_add_on"])),
    st.tuples(st.just("embed_elsewhere"), st.lists(writes, max_size=3)),
    st.tuples(st.just("embed_other"), st.sampled_from([1, 3, 64]), st.booleans()),  # True: full_scan
    st.tuples(st.just("embed_transaction"), st.lists(writes, min_size=1, max_size=3)),
    st.tuples(st.just("switch")),
    st.tuples(st.just("rebuild")),
)
step = st.one_of(
    writes, writes, writes, writes, additions,
    vector_steps, vector_steps, vector_steps,
    st.tuples(st.just("bad_batch"), st.lists(st.tuples(st.one_of(st.none(), sources), records), max_size=3),
              st.integers(0, 3), st.sampled_from(BAD_RECORDS)),
    st.tuples(st.just("optimize"), st.booleans()),
    st.tuples(st.just("elsewhere"), st.lists(writes, max_size=3), st.booleans()),
    st.tuples(st.just("transaction"), st.lists(writes, min_size=1, max_size=3)),
    st.tuples(st.just("reopen"), st.sampled_from([False, False, True])),  # True: the new handle embeds on add
    st.tuples(st.just("checkpoint"), st.booleans()),  # True: embed, then compare everything
    st.tuples(st.just("checkpoint"), st.just(False)),
)
#: a first batch (a history that starts from an empty file mostly tests an empty file), then the steps
histories = st.tuples(
    st.tuples(st.just("add_many"), st.lists(st.tuples(st.one_of(st.none(), sources), records), min_size=2,
                                            max_size=8), st.sampled_from([1000, 3])),
    st.lists(step, min_size=4, max_size=25)).map(lambda first_rest: [first_rest[0], *first_rest[1]])


class VectorRun(Run):
    """A history of :mod:`tests.engine.test_random_operations`'s kind, with vectors."""

    def __init__(self, path: str, workdir: str, chunker: str, keep_versions: bool, public_unlabeled: bool, ann: str,
                 embed_on_open: bool) -> None:
        """``path``: a file or a PostgreSQL URL; the fresh builds are files in ``workdir``."""
        self.path, self.workdir, self.chunker, self.kernel = path, workdir, chunker, "numpy"
        self.options = {"chunker": chunker, "keep_versions": keep_versions, "public_unlabeled": public_unlabeled}
        self.ann = ann
        self.emb = Embedder()
        self.db = ragdb.open(path, embedder=self.emb if embed_on_open else None, **self.options)
        self.db.ann = ann
        self.reader = ragdb.open(path)
        self.reader.ann = ann
        self.model = Model(keep_versions)
        self.serial = 0
        self.builds = 0  # fresh builds made (each its own file)

    def open(self, embed: bool = False, **keywords):
        db = ragdb.open(self.path, embedder=self.emb if embed else None, **keywords)
        db.ann = self.ann
        return db

    # writes -----------------------------------------------------------------------------------------
    def write(self, db, model: Model, op: tuple) -> None:
        if op[0] in ("edit", "copy"):
            source = self.pick(model, op[1])
            if source is None:
                return
            latest = model.latest()[source]
            if op[0] == "edit":
                self.add(db, model, source, {**latest, "text": f"{latest['text']} {op[2]}", "acl": None})
            else:
                self.add(db, model, op[2], {**latest, "acl": list(latest["acl"])})
        else:
            super().write(db, model, op)

    def apply(self, op: tuple) -> None:
        kind, db = op[0], self.db
        if kind == "embed":
            self.embed(db, op[1], op[2])
        elif kind == "embed_fail":
            vectors, pending, _ = vector_counts(db)
            failing = Embedder(fail_at=op[2])
            try:
                stored = db.embed(failing, batch_size=op[1])
            except EmbeddingError as e:
                event("an embedder failed midway")
                after = vector_counts(db)
                assert after[1] > 0 and after[0] == vectors + pending - after[1], (after, vectors, pending)
                assert f"; {after[1]} chunks are pending" in str(e) and "embedding endpoint down" in str(e), str(e)
            else:
                assert stored == pending and vector_counts(db)[1] == 0
        elif kind == "add_fail":  # the text is committed whatever the embedder does
            with self.open() as other:
                other.embedder = Embedder(fail_at=1)
                try:
                    self.add(other, self.model, op[1], op[2])
                except EmbeddingError as e:
                    event("an add's embedder failed")
                    assert "embedding endpoint down" in str(e)
                    assert vector_counts(other)[1] > 0
                else:
                    assert vector_counts(other)[1] == 0
        elif kind == "embedder":
            if op[1] == "set":
                db.embedder = self.emb
            elif op[1] == "unset":
                db.embedder = None
            else:
                db.embed_on_add = op[1] == "on_add_on"
        elif kind == "embed_elsewhere":
            with self.open(embed=True) as other:
                for inner in op[1]:
                    self.write(other, self.model, inner)
        elif kind == "embed_other":  # another handle embeds what is pending
            with self.open() as other:
                _, pending, chunks = vector_counts(other)
                assert other.embed(self.emb, batch_size=op[1], full_scan=op[2]) == pending
                assert vector_counts(other) == (chunks, 0, chunks)
        elif kind == "embed_transaction":
            self.embed_rolled_back(db, op[1])
        elif kind == "switch":
            self.switch(db)
        elif kind == "rebuild":
            _, _, chunks = vector_counts(db)
            assert db.embed(self.emb, rebuild=True) == chunks
            assert vector_counts(db) == (chunks, 0, chunks)
        elif kind == "reopen":
            self.db.close()
            self.db = self.open(embed=op[1])
        elif kind == "checkpoint":
            if op[1]:
                self.compare()
            else:
                self.compare_pending()
        else:
            super().apply(op)

    def embed(self, db, batch_size: int, given_embedder: bool) -> None:
        vectors, pending, chunks = vector_counts(db)
        if not given_embedder and db.embedder is None and db.vector_info().model is None:
            with pytest.raises(InvalidInput, match="no embedding model"):
                db.embed(batch_size=batch_size)
            return
        stored = db.embed(self.emb if given_embedder else None, batch_size=batch_size)
        assert stored == pending
        assert vector_counts(db) == (chunks, 0, chunks)

    def embed_rolled_back(self, db, ops) -> None:
        """Writes, an embed and a vector search in a transaction that raises: nothing stays."""
        before = vector_counts(db)
        scratch = copy.deepcopy(self.model)
        with pytest.raises(Rollback), db.transaction() as t:
            for inner in ops:
                self.write(t, scratch, inner)
            t.embed(self.emb)
            if scratch.stored:
                t.search("apple note 检索", 5, scorer="vector", embedder=self.emb, principals=ragdb.ALL)
            raise Rollback
        assert vector_counts(db) == before

    def switch(self, db) -> None:
        """Another model is refused while vectors exist, everywhere it could come in."""
        before = vector_counts(db)
        if before[0] == 0:
            db.check_embedder(OTHER)  # nothing to disagree with; the switch itself is not made here
            return
        event("a switch of model refused")
        with pytest.raises(EmbeddingError, match=r"hash-16.*hash-12"):
            db.embed(OTHER)
        with pytest.raises(EmbeddingError, match="hash-16"):
            db.embedder = OTHER
        with pytest.raises(EmbeddingError, match="hash-12"):
            db.search("apple", scorer="vector", embedder=OTHER)
        with pytest.raises(EmbeddingError, match="hash-16"):
            ragdb.open(self.path, embedder=OTHER)
        assert db.embedder in (None, self.emb) and db.vector_info().model == "hash-16"
        assert vector_counts(db) == before

    # comparisons ----------------------------------------------------------------------------------
    def fresh_path(self) -> str:
        self.builds += 1
        return os.path.join(self.workdir, f"fresh-{self.builds}.db")

    def fresh(self, path: str):
        fresh = ragdb.open(path, **self.options)
        fresh.add_many(self.model.records(), chunker=self.chunker)
        fresh.embed(Embedder())
        assert fresh.vector_info().pending == 0
        return fresh

    def compare_pending(self) -> None:
        """Before embedding: the vectors stored are the right ones, and exact vector search sees
        exactly the chunks that have one."""
        fresh_path = self.fresh_path()
        with self.fresh(fresh_path) as fresh:
            want_vectors = latest_vectors(fresh)
            got_vectors = latest_vectors(self.db)
            event(f"a pending checkpoint, {'some' if got_vectors else 'no'} latest vectors, "
                  f"{'some' if len(got_vectors) < len(want_vectors) else 'none'} pending")
            assert got_vectors.keys() <= want_vectors.keys()
            for key, vector in got_vectors.items():
                assert vector == want_vectors[key], key
            for db in (self.db, self.reader):
                vector_counts(db)
                assert db.check() == []
            exact_reader = self.open()
            exact_reader.ann = "off"
            with exact_reader:
                for q in VQUERIES[:3]:
                    want = [[h.source, h.start, h.end, h.score]
                            for h in fresh.search(q, BIG_K, scorer="vector", collapse=False, embedder=self.emb,
                                                  principals=ragdb.ALL)
                            if (h.source, h.start, h.end) in got_vectors]
                    for db in (self.db, self.reader, exact_reader):
                        try:
                            got = [[h.source, h.start, h.end, h.score]
                                   for h in db.search(q, BIG_K, scorer="vector", collapse=False, embedder=self.emb,
                                                      principals=ragdb.ALL)]
                        except EmbeddingError as e:  # chunks stored, no vector at all
                            assert db.vector_info().vectors == 0 and "ragdb embed" in str(e)
                            got = []
                        assert got == want, (q, db.ann)

    def compare(self) -> None:
        """After a final ``db.embed()``: every handle answers as a fresh, fully embedded build."""
        vectors, pending, chunks = vector_counts(self.db)
        event(f"a comparison with {'some' if vectors else 'no'} vectors and {'some' if pending else 'no'} pending")
        assert self.db.embed(self.emb) == pending
        fresh_path = self.fresh_path()
        with self.fresh(fresh_path) as fresh:
            want = vector_observe(fresh, self.emb)
            want_vectors = latest_vectors(fresh)
            s = fresh.stats()
            want_stats = [s.documents, s.chunks, s.vocabulary, s.postings, s.avg_chunk_length]
            assert fresh.stats().documents == len(self.model.stored)
        assert latest_vectors(self.db) == want_vectors
        exact = self.open()
        exact.ann = "off"
        with exact:
            want_all = all_versions_observe(exact, None)
        with self.open() as now:
            handles = {"the writing handle": self.db, "the handle opened before the writes": self.reader,
                       "a handle opened now": now}
            for where, db in handles.items():
                assert vector_counts(db) == (chunks, 0, chunks), where
                s = db.stats()
                assert_same([s.documents, s.chunks, s.vocabulary, s.postings, s.avg_chunk_length], want_stats,
                            where)
                # the handles without an embedder use the recorded model's
                assert_observed(vector_observe(db, self.emb if where != "a handle opened now" else None), want,
                                where)
                assert_observed(all_versions_observe(db, self.emb), want_all, where)
                assert db.check() == []
            if HAS_ANN and self.ann == "on":
                self.compare_ann(now)

    def compare_ann(self, db) -> None:
        """Restricted ANN searches: nothing outside the restriction, nothing deleted or replaced,
        ``k`` hits whenever ``k`` qualify, each score the exact one."""
        exact = self.open()
        exact.ann = "off"
        with exact:
            for q in VQUERIES:
                for restriction in ({"principals": ["a"]}, {"filter": {"lang": "en"}, "principals": ragdb.ALL},
                                    {"since": DAYS[10], "principals": ragdb.ALL}, {"principals": ragdb.ALL,
                                                                                   "versions": "all"}):
                    every = {(h.chunk_id, h.score) for h in exact.search(q, BIG_K, scorer="vector", collapse=False,
                                                                          **restriction)}
                    for k in (1, 3, 10):
                        got = db.search(q, k, scorer="vector", collapse=False, **restriction)
                        event(f"an ANN search ran {db._vectors.last_strategy}")
                        assert {(h.chunk_id, h.score) for h in got} <= every, (q, restriction)
                        assert len(got) == min(k, len(every)), (q, restriction, k)

    def run(self, ops) -> None:
        try:
            for op in ops:
                self.apply(op)
            self.compare()
        finally:
            self.db.close()
            self.reader.close()


@contextlib.contextmanager
def ann_saved_often(often: bool):
    """With ``often``, the graph's cache file is rewritten at every close that has any unsaved
    change, so later handles load it and replay the log from there."""
    with mock.patch.object(ann_module, "SAVE_AFTER", 1 if often else ann_module.SAVE_AFTER):
        yield


@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                 HealthCheck.data_too_large])
@given(ops=histories, chunker=st.sampled_from(["none", "window:size=6,overlap=2"]), keep_versions=st.booleans(),
       public_unlabeled=st.booleans(), ann=st.sampled_from(["on", "off"] if HAS_ANN else ["off"]),
       embed_on_open=st.booleans(), save_often=st.booleans())
def test_random_vector_histories_equal_a_fresh_embedded_build(tmp_path_factory, ops, chunker, keep_versions,
                                                              public_unlabeled, ann, embed_on_open, save_often):
    """After any history of writes, embeddings (whole, failed midway, on add, rolled back) and
    reopenings, every handle's vector and hybrid searches equal a fresh build's, exact or ANN."""
    note(f"chunker={chunker!r}, keep_versions={keep_versions}, public_unlabeled={public_unlabeled}, ann={ann!r}, "
         f"embed_on_open={embed_on_open}, save_often={save_often}\nops={ops!r}")
    workdir = tmp_path_factory.mktemp("vec")
    with ann_saved_often(save_often):
        VectorRun(str(workdir / "kb.db"), str(workdir), chunker, keep_versions, public_unlabeled, ann,
                  embed_on_open).run(ops)


@settings(max_examples=max(1, EXAMPLES // 2), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                 HealthCheck.data_too_large])
@given(ops=histories, chunker=st.sampled_from(["none", "window:size=6,overlap=2"]), keep_versions=st.booleans(),
       public_unlabeled=st.booleans(), ann=st.sampled_from(["on", "off"] if HAS_ANN else ["off"]),
       embed_on_open=st.booleans())
def test_random_vector_histories_on_postgres_equal_a_fresh_embedded_build(pg_server, tmp_path_factory, ops, chunker,
                                                                          keep_versions, public_unlabeled, ann,
                                                                          embed_on_open):
    """The same on PostgreSQL (docs/postgresql.md: vectors work there as on SQLite): a schema of
    its own on the test server, compared with a fresh SQLite build; skipped without a server. The
    graph of ``ann="on"`` lives in memory there (no file beside a URL)."""
    import psycopg

    note(f"chunker={chunker!r}, keep_versions={keep_versions}, public_unlabeled={public_unlabeled}, ann={ann!r}, "
         f"embed_on_open={embed_on_open}\nops={ops!r}")
    schema = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")  # a generated name, not input
    try:
        workdir = tmp_path_factory.mktemp("vecpg")
        VectorRun(with_schema(pg_server, schema), str(workdir), chunker, keep_versions, public_unlabeled, ann,
                  embed_on_open).run(ops)
    finally:
        with psycopg.connect(pg_server, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
