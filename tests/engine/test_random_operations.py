"""Random sequences of operations against a database file: everything a reader can observe
equals a fresh build of the same documents, in every handle.

Each example opens a file (``keep_versions`` on or off, ``public_unlabeled`` on or off, one
of two chunkers; postings flushed every few chunks and merged after two segments, as in
``test_reopen.py``) and applies a random list of operations: adds, batches (some holding
one bad record, which writes nothing of the batch; some in batches of two or three),
replaces, identical re-adds (unchanged), in-place updates of metadata and labels, deletes
by source, glob, filter and id, deletes of the newest documents (issue 27: handles opened
after that failed to search), optimizes with and without VACUUM (here and from another
handle), transaction blocks that raise midway (rolled back), a second collection created,
written and dropped, and close+reopen of the writing handle. :class:`Model` follows what
the file must hold.

At checkpoints during the sequence and after it, :func:`observe` (searches with every
query form, both lexical scorers and several principals; counts; facets; ``documents()``;
``get(source=)``; ``query_plan``) of the writing handle, of a handle opened before the
first write, of a newly opened handle and (after the sequence) of a fresh process equals
that of a fresh build (``add_many`` of the latest documents, same settings), and
``check()`` finds nothing. A fresh build holds no older versions and other ids, so only
the latest versions are compared, and by source, never by id.
"""

from __future__ import annotations

import contextlib
import copy
import fnmatch
import inspect
import os
import subprocess
import sys
from pathlib import Path
from unittest import mock

import orjson
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

import ragdb
from ragdb.errors import CollectionExists, CollectionNotFound, InvalidInput

EXAMPLES = int(os.environ.get("RAGDB_HYPOTHESIS_EXAMPLES", "20"))

WORDS = ["apple", "note", "retrieval", "augmented", "generation", "index", "search", "model", "answer",
         "evidence", "guide", "检索", "增强", "生成", "知识库", "模型", "答案", "证据", "向量"]
TITLES = [None, "Install guide", "Apple notes", "用户手册"]
DAYS = [f"2026-02-{d:02d}T00:00:00Z" for d in range(1, 29)]
SOURCES = ["a/0", "a/1", "a/2", "b/0", "b/1", "b/2"]
GLOBS = ["a/*", "b/[01]", "n/*", "?/1", "*"]
#: the filters of delete(filter=) and, for the model, whether a version's metadata matches each
FILTERS = [
    ({"lang": "en"}, lambda m: m.get("lang") == "en"),
    ({"n": {"$gte": 3}}, lambda m: isinstance(m.get("n"), int) and m["n"] >= 3),
    ({"tags": "x"}, lambda m: "x" in m.get("tags", ())),
    ({"flag": True}, lambda m: m.get("flag") is True),
    ({"$not": {"lang": "zh"}}, lambda m: m.get("lang") != "zh"),
]
#: plain words, Chinese, a phrase, a Chinese phrase, a prefix, fuzzy words, an exclusion, a field,
#: a metadata filter in the query, OR
QUERIES = ["apple retrieval", "检索增强生成", "知识库 model answer", '"apple note"', '"检索增强"', "retr* evidence",
           "aple~ modle~", "search -model", "title:guide apple", "apple lang:en", "note OR 向量"]
BAD_RECORDS = [{"text": 5, "source": "bad"}, {"text": "apple", "source": "bad", "metadata": "m"},
               {"text": "apple", "source": "bad", "acl": "a"}, {"text": "apple", "source": "bad", "timestamp": "soon"}]


# -- what a reader observes ----------------------------------------------------------------------

def observe(db, sources, queries):
    """Everything compared with a fresh build, as JSON values. Self-contained: a fresh process
    runs this function's source (see PROCESS)."""
    import ragdb
    from ragdb.errors import DocumentNotFound

    callers = {"anonymous": None, "a": ["a"], "b,c": ["b", "c"], "ALL": ragdb.ALL}

    def hits(query, **kw):
        return [[h.source, h.start, h.end, h.text, h.score, h.confidence, h.version, h.timestamp, h.title,
                 dict(h.metadata), [[d.source, d.score] for d in h.duplicates]]
                for h in db.search(query, k=40, **kw)]

    def doc(d):
        return [d.source, d.version, d.timestamp, d.content_hash, dict(d.metadata), list(d.acl), d.chunk_count,
                d.latest, d.text]

    def facet(f):
        return [[list(p) for p in f.counts], f.total, f.missing, f.omitted]

    out = {}
    for q in queries:
        for name, p in callers.items():
            for scorer in ("bm25", "tfidf"):
                out[f"search {q!r} {scorer} {name}"] = hits(q, scorer=scorer, principals=p)
        out[f"search {q!r} n>=2"] = hits(q, filter={"n": {"$gte": 2}}, principals=ragdb.ALL)
        out[f"search {q!r} source a/*"] = hits(q, filter={"source": "a/*"})
        out[f"search {q!r} all copies"] = hits(q, collapse=False, principals=ragdb.ALL)
        for name in ("anonymous", "ALL"):
            plan = db.query_plan(q, principals=callers[name])
            out[f"plan {q!r} {name}"] = [plan.terms, plan.unknown, plan.expansions, plan.suggestions, plan.phrases,
                                         plan.excluded, plan.filters, plan.error]
    for name, p in callers.items():
        out[f"count {name}"] = db.count(principals=p)
        out[f"documents {name}"] = [doc(d) for d in db.documents(principals=p)]
        out[f"facets lang {name}"] = facet(db.facets("lang", principals=p))
        out[f"facets tags apple {name}"] = facet(db.facets("tags", "apple OR 检索", principals=p, by="documents"))
    out["count lang:en a"] = db.count(filter={"lang": "en"}, principals=["a"])
    out["documents a/*"] = [doc(d) for d in db.documents("a/*", principals=ragdb.ALL)]
    out["documents tags:x"] = [doc(d) for d in db.documents(filter={"tags": "x"}, principals=ragdb.ALL)]
    out["facets source"] = facet(db.facets("source", "apple", principals=ragdb.ALL))
    out["facets n"] = facet(db.facets("n", principals=ragdb.ALL))
    out["facets title"] = facet(db.facets("title", '"检索增强"', principals=ragdb.ALL))
    for source in sources:
        for name in ("anonymous", "ALL"):
            try:
                out[f"get {source} {name}"] = doc(db.get(source=source, principals=callers[name]))
            except DocumentNotFound:
                out[f"get {source} {name}"] = None
    s = db.stats()
    out["stats"] = [s.documents, s.chunks, s.vocabulary, s.postings, s.avg_chunk_length]
    return out


def observed(db, sources):
    """:func:`observe` of ``db``, through JSON as a fresh process's comes."""
    return orjson.loads(orjson.dumps(observe(db, sources, QUERIES)))


#: a fresh process: runs observe()'s source, opens the database, prints the observations as JSON
PROCESS = """
import sys, orjson, ragdb
exec(sys.argv[2])
with ragdb.open(sys.argv[1]) as db:
    sys.stdout.buffer.write(orjson.dumps(observe(db, *orjson.loads(sys.argv[3]))))
"""


def process_observed(path: str, sources, kernel: str):
    root = str(Path(ragdb.__file__).resolve().parent.parent)
    done = subprocess.run([sys.executable, "-c", PROCESS, path, inspect.getsource(observe),
                           orjson.dumps([sources, QUERIES]).decode()],
                          capture_output=True, env={**os.environ, "PYTHONPATH": root, "RAGDB_KERNEL": kernel},
                          timeout=120)
    assert done.returncode == 0, done.stderr.decode()
    return orjson.loads(done.stdout)


def assert_same(got, want, where: str, path: str = "") -> None:
    """``got`` equals ``want``, scores (floats) within 1e-9; the message names the handle and the
    observation."""
    if isinstance(want, float) and isinstance(got, float):
        assert abs(got - want) <= 1e-9 * max(1.0, abs(want)), f"{where}: {path}: {got!r} != {want!r}"
    elif isinstance(want, dict) and isinstance(got, dict):
        assert got.keys() == want.keys(), f"{where}: {path}: keys {sorted(got)} != {sorted(want)}"
        for key in want:
            assert_same(got[key], want[key], where, f"{path} {key}" if path else key)
    elif isinstance(want, list) and isinstance(got, list):
        assert len(got) == len(want), f"{where}: {path}: {len(got)} items != {len(want)}\n{got}\n!=\n{want}"
        for i, (a, b) in enumerate(zip(got, want)):
            try:
                assert_same(a, b, where, f"{path}[{i}]")
            except AssertionError as e:
                if "\nwhole: " in str(e):
                    raise
                raise AssertionError(f"{e}\nwhole: {got}\n!=\n{want}") from None
    else:
        assert got == want, f"{where}: {path}: {got!r} != {want!r}"


# -- the model -----------------------------------------------------------------------------------

def normal_acl(acl) -> tuple[str, ...]:
    return tuple(sorted(set(acl)))


class Model:
    """What the file must hold: per source its stored versions, oldest first (the latest last),
    the sources in the order of their latest version's add; and the ``side`` collection
    (source -> text) while it exists."""

    def __init__(self, keep_versions: bool) -> None:
        self.keep = keep_versions
        self.stored: dict[str, list[dict]] = {}
        self.side: dict[str, str] | None = None
        self.seen: set[str] = {*SOURCES, "bad"}  # every source a get() asks for

    def add(self, source: str, record: dict) -> str:
        """The add of ``record`` (text, title, metadata, acl or None, timestamp); returns the change."""
        self.seen.add(source)
        versions = self.stored.get(source)
        latest = versions[-1] if versions else None
        acl = normal_acl(record["acl"]) if record["acl"] is not None else (latest["acl"] if latest else ())
        new = {"text": record["text"], "title": record["title"], "metadata": copy.deepcopy(record["metadata"]),
               "acl": acl, "timestamp": record["timestamp"]}
        if latest is not None and all(new[k] == latest[k] for k in ("text", "title", "metadata", "acl")):
            return "unchanged"
        older = self.stored.pop(source, [])  # (popped: the source is the newest now)
        self.stored[source] = [*older, new] if self.keep else [new]
        return "replaced" if latest is not None else "added"

    def latest(self) -> dict[str, dict]:
        return {source: versions[-1] for source, versions in self.stored.items()}

    def delete_where(self, doomed) -> None:
        """Deletes every stored version ``doomed(source, version)`` says."""
        for source in list(self.stored):
            kept = [v for v in self.stored[source] if not doomed(source, v)]
            if kept:
                self.stored[source] = kept
            else:
                del self.stored[source]

    def records(self) -> list[dict]:
        return [{"text": v["text"], "source": s, "title": v["title"], "metadata": v["metadata"], "acl": list(v["acl"]),
                 "timestamp": v["timestamp"]} for s, v in sorted(self.latest().items())]


# -- the operations --------------------------------------------------------------------------------

texts = st.lists(st.sampled_from(WORDS), min_size=1, max_size=14).map(" ".join)
metadata = st.fixed_dictionaries({}, optional={
    "lang": st.sampled_from(["en", "zh"]), "n": st.integers(0, 4), "w": st.sampled_from([0.5, 2.25, -1.0]),
    "flag": st.booleans(), "tags": st.lists(st.sampled_from(["x", "y", "z"]), max_size=2, unique=True)})
labels = st.lists(st.sampled_from(["a", "b", ragdb.PUBLIC]), max_size=2)
acls = st.one_of(st.none(), labels)
records = st.fixed_dictionaries({"text": texts, "title": st.sampled_from(TITLES), "metadata": metadata,
                                 "acl": acls, "timestamp": st.sampled_from(DAYS)})
sources = st.sampled_from(SOURCES)
existing = st.integers(0, 50)  # one of the stored sources, by position (modulo how many there are)

additions = st.one_of(
    st.tuples(st.just("add"), sources, records),
    st.tuples(st.just("add_many"), st.lists(st.tuples(st.one_of(st.none(), sources), records), min_size=1,
                                            max_size=6), st.sampled_from([1000, 2, 3])),
    st.tuples(st.just("replace"), existing, texts, st.booleans()),  # True: acl=None (keeps the labels)
    st.tuples(st.just("readd"), existing),
    st.tuples(st.just("update"), existing, st.one_of(st.tuples(metadata, st.none()), st.tuples(st.none(), labels),
                                                     st.tuples(metadata, labels))),
)
deletions = st.one_of(
    st.tuples(st.just("delete_source"), sources),
    st.tuples(st.just("delete_glob"), st.sampled_from(GLOBS)),
    st.tuples(st.just("delete_filter"), st.integers(0, len(FILTERS) - 1)),
    st.tuples(st.just("delete_latest"), existing),
    st.tuples(st.just("delete_newest"), st.integers(1, 4)),
)
writes = st.one_of(additions, additions, deletions)  # (a file that is empty most of the time tests little)
step = st.one_of(
    writes, writes, writes, writes, writes,
    st.tuples(st.just("bad_batch"), st.lists(st.tuples(st.one_of(st.none(), sources), records), max_size=4),
              st.integers(0, 4), st.sampled_from(BAD_RECORDS)),
    st.tuples(st.just("optimize"), st.booleans()),
    st.tuples(st.just("elsewhere"), st.lists(writes, max_size=3), st.booleans()),
    st.tuples(st.just("transaction"), st.lists(writes, min_size=1, max_size=4)),
    st.tuples(st.just("collection"), st.sampled_from(["create", "add", "add", "drop"]), sources, texts),
    st.tuples(st.just("reopen")),
    st.tuples(st.just("checkpoint")),
)
histories = st.lists(step, min_size=3, max_size=30)


class Rollback(Exception):
    """Raised inside a transaction block: every write of the block is undone."""


class Run:
    """One random history against the file at ``path``: ``db`` writes, ``reader`` was opened
    before the first write and only reads."""

    def __init__(self, path: str, chunker: str, keep_versions: bool, public_unlabeled: bool, kernel: str) -> None:
        self.path, self.chunker, self.kernel = path, chunker, kernel
        self.options = {"chunker": chunker, "keep_versions": keep_versions, "public_unlabeled": public_unlabeled}
        self.db = ragdb.open(path, **self.options)
        self.reader = ragdb.open(path)
        self.model = Model(keep_versions)
        self.serial = 0

    # writes ---------------------------------------------------------------------------------------
    def pick(self, model: Model, index: int) -> str | None:
        stored = list(model.stored)
        return stored[index % len(stored)] if stored else None

    def batch(self, pairs) -> list[tuple[str, dict]]:
        out = []
        for source, record in pairs:
            if source is None:  # a new source: the newest documents
                self.serial += 1
                source = f"n/{self.serial}"
            out.append((source, record))
        return out

    def add(self, db, model: Model, source: str, record: dict) -> None:
        before = model.latest().get(source)
        want = model.add(source, record)
        report = self.add_rows(db, [{**record, "source": source}])
        assert report.changes[0].status == want, (source, record, before)

    def add_rows(self, db, rows: list[dict], **keywords):
        """``db.add_many(rows)`` with this run's chunker (tests/client/test_random_remote.py: a
        server's client sends none)."""
        return db.add_many(rows, chunker=self.chunker, **keywords)

    def write(self, db, model: Model, op: tuple) -> None:
        kind = op[0]
        if kind == "add":
            self.add(db, model, op[1], op[2])
        elif kind == "add_many":
            pairs = self.batch(op[1])
            want = [model.add(source, record) for source, record in pairs]
            report = self.add_rows(db, [{**record, "source": source} for source, record in pairs], batch_size=op[2])
            assert [c.status for c in report.changes] == want, pairs
        elif kind in ("replace", "readd", "update", "delete_latest"):
            source = self.pick(model, op[1])
            if source is None:
                return
            latest = model.latest()[source]
            if kind == "replace":
                self.add(db, model, source, {**latest, "text": op[2], "acl": None if op[3] else list(latest["acl"])})
            elif kind == "readd":
                doc = db.get(source=source, principals=ragdb.ALL)
                report = self.add_rows(db, [{**latest, "source": source, "acl": list(latest["acl"])}])
                assert (report.changes[0].status, report[0].id) == ("unchanged", doc.id)
                assert model.add(source, {**latest, "acl": list(latest["acl"])}) == "unchanged"
            elif kind == "update":
                doc = db.get(source=source, principals=ragdb.ALL)
                new_metadata, new_acl = op[2]
                db.update(doc.id, metadata=new_metadata, acl=new_acl)
                if new_metadata is not None:
                    latest["metadata"] = copy.deepcopy(new_metadata)
                if new_acl is not None:  # the kept older versions get the latest's labels too
                    for version in model.stored[source]:
                        version["acl"] = normal_acl(new_acl)
            else:
                doc = db.get(source=source, principals=ragdb.ALL)
                assert db.delete(doc.id) == 1
                model.stored[source].pop()
                if not model.stored[source]:
                    del model.stored[source]
        elif kind == "delete_source":
            n = len(model.stored.get(op[1], ()))
            assert db.delete(source=op[1]) == n
            model.stored.pop(op[1], None)
        elif kind == "delete_glob":
            n = sum(len(v) for s, v in model.stored.items() if fnmatch.fnmatchcase(s, op[1]))
            assert db.delete(source=op[1], glob=True) == n
            model.delete_where(lambda s, v: fnmatch.fnmatchcase(s, op[1]))
        elif kind == "delete_filter":
            condition, matches = FILTERS[op[1]]
            n = sum(matches(v["metadata"]) for versions in model.stored.values() for v in versions)
            assert db.delete(filter=condition) == n, condition
            model.delete_where(lambda s, v: matches(v["metadata"]))
        elif kind == "delete_newest":
            newest = list(model.stored)[-op[1]:]
            for source in newest:
                db.delete(source=source)
                del model.stored[source]
        else:  # pragma: no cover - the strategy makes no other write
            raise AssertionError(op)

    def apply(self, op: tuple) -> None:
        kind = op[0]
        if kind == "bad_batch":
            pairs = self.batch(op[1])
            bad = {**op[3], "source": "bad"}
            rows = [{**record, "source": source} for source, record in pairs]
            rows.insert(op[2] % (len(rows) + 1), bad)
            with pytest.raises(InvalidInput):
                self.db.add_many(rows, chunker=self.chunker)
        elif kind == "optimize":
            self.db.optimize(vacuum=op[1])
        elif kind == "elsewhere":  # another handle writes, then optimizes or not
            with ragdb.open(self.path) as other:
                for inner in op[1]:
                    self.write(other, self.model, inner)
                if op[2]:
                    other.optimize(vacuum=False)
        elif kind == "transaction":
            self.rolled_back(self.db, op[1])
        elif kind == "collection":
            self.collection(*op[1:])
        elif kind == "reopen":
            self.db.close()
            self.db = ragdb.open(self.path)
        elif kind == "checkpoint":
            self.compare(process=False)
        else:
            self.write(self.db, self.model, op)

    def rolled_back(self, db, ops) -> None:
        """``ops`` written in a transaction of ``db`` that raises at its end: none of them stays
        (the model's copy takes them, the model nothing)."""
        scratch = copy.deepcopy(self.model)
        with pytest.raises(Rollback), db.transaction() as t:
            for inner in ops:
                self.write(t, scratch, inner)
            raise Rollback

    def collection(self, action: str, source: str, text: str) -> None:
        model = self.model
        if action == "create":
            if model.side is None:
                self.db.create_collection("side", chunker="none")
                model.side = {}
            else:
                with pytest.raises(CollectionExists):
                    self.db.create_collection("side")
        elif action == "add":
            self.db.collection("side").add(text, source=source, chunker="none")
            model.side = {**(model.side or {}), source: text}
        elif model.side is None:
            with pytest.raises(CollectionNotFound):
                self.db.drop_collection("side")
        else:
            self.db.drop_collection("side")
            model.side = None

    # comparisons ----------------------------------------------------------------------------------
    def compare(self, process: bool) -> dict[str, dict]:
        """Compares every handle with a fresh build; returns each handle's observations (for
        tests/storage/test_random_operations_postgres.py, which compares two backends')."""
        sources = sorted(self.model.seen)
        with ragdb.open(":memory:", **self.options) as fresh:
            fresh.add_many(self.model.records(), chunker=self.chunker)
            want = observed(fresh, sources)
            assert fresh.stats().documents == len(self.model.stored)
        assert self.db.check() == []
        seen = {"the writing handle": observed(self.db, sources),
                "the handle opened before the writes": observed(self.reader, sources)}
        with ragdb.open(self.path) as other:
            seen["a handle opened now"] = observed(other, sources)
            assert other.check() == []
            self.compare_side(other)
        self.compare_side(self.db)
        if process:
            seen["a fresh process"] = process_observed(self.path, sources, self.kernel)
        for where, got in seen.items():
            assert_same(got, want, where)
        return seen

    def compare_side(self, db) -> None:
        side = self.model.side
        if side is None:
            with pytest.raises(CollectionNotFound):
                db.collection("side", create=False)
            return
        with ragdb.open(":memory:", chunker="none") as fresh:
            fresh.add_many([{"text": t, "source": s} for s, t in sorted(side.items())])
            handle = db.collection("side", create=False)
            for q in QUERIES[:4]:
                got = [[h.source, h.text, h.score] for h in handle.search(q, k=40)]
                assert_same(got, [[h.source, h.text, h.score] for h in fresh.search(q, k=40)], "the side collection")
            assert handle.count() == len(side)
            assert handle.check() == []

    def run(self, ops) -> None:
        try:
            for op in ops:
                self.apply(op)
            self.compare(process=True)
        finally:
            self.db.close()
            self.reader.close()


@contextlib.contextmanager
def small_segments(whole_vocabulary: bool):
    """Flushes every few chunks and merges after two segments, so a short history crosses flush
    and merge boundaries; the per-chunk arrays get no spare capacity, so an id past their end
    fails at once (as ``test_reopen.small_segments``). Without ``whole_vocabulary`` the writers
    keep only the frequent terms and look the others up (as over ``WRITER_TERM_CACHE`` terms)."""
    import ragdb.engine.write
    import ragdb.index.inverted

    cache = ragdb.engine.write.WRITER_TERM_CACHE if whole_vocabulary else 0
    with mock.patch.object(ragdb.engine.write, "FLUSH_THRESHOLD", 4), \
            mock.patch.object(ragdb.engine.write, "WRITER_TERM_CACHE", cache), \
            mock.patch.object(ragdb.index.inverted, "MAX_SEGMENTS", 2), \
            mock.patch.object(ragdb.index.inverted, "MERGE_PART_POSTINGS", 7), \
            mock.patch.object(ragdb.index.inverted, "_capacity", lambda size: size):
        yield


@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                 HealthCheck.data_too_large])
@given(ops=histories, chunker=st.sampled_from(["none", "window:size=6,overlap=2"]), keep_versions=st.booleans(),
       public_unlabeled=st.booleans(), whole_vocabulary=st.booleans())
def test_random_operations_equal_a_fresh_build(tmp_path_factory, ops, chunker, keep_versions, public_unlabeled,
                                               whole_vocabulary, each_kernel):
    """After any sequence of writes, rollbacks, optimizes, collection changes and reopenings,
    every handle (the writer, one opened before the writes, one opened after, a fresh process)
    observes what a fresh build of the latest documents does, and check() finds nothing."""
    note(f"chunker={chunker!r}, keep_versions={keep_versions}, public_unlabeled={public_unlabeled}, "
         f"whole_vocabulary={whole_vocabulary}, kernel={each_kernel!r}\nops={ops!r}")
    path = str(tmp_path_factory.mktemp("ops") / "kb.db")
    with small_segments(whole_vocabulary):
        Run(path, chunker, keep_versions, public_unlabeled, each_kernel).run(ops)
