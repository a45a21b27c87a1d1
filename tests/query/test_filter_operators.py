"""Filter operators ($eq ... $contains), facets and search offsets against brute force.

The reference below evaluates a filter on the model of each stored document (its
metadata, source, version, timestamp, labels) and on each stored chunk's text,
in plain Python, without ragdb's parser or SQL; ISO dates come with their
instants from the generator, so the reference never parses a date either.
"""

from __future__ import annotations

import fnmatch
import operator
import sqlite3
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ragdb
from ragdb.models.embeddings import HashEmbedder
from ragdb.errors import InvalidInput
from ragdb.storage import migration_files

ALL = ragdb.ALL
MAX = ragdb.options.MAX_K
PROPERTY = settings(max_examples=60, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
BROAD = settings(PROPERTY, max_examples=200)  # small in-memory databases: many examples are cheap

# ------------------------------------------------------------------------------ the model

EN = ["alpha", "beta", "gamma", "delta", "valve", "pump"]
ZH = ["退款", "政策", "检索", "增强", "生成"]
#: one query holding every word and every CJK character: it matches every chunk
EVERYTHING = " ".join(EN + sorted({c for w in ZH for c in w}))

T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)
#: date strings in several ISO-8601 spellings, with their instants (the reference's only "parser")
INSTANT: dict[str, float] = {}


def _date(minutes: int, style: int) -> str:
    when = T0 + timedelta(minutes=minutes)
    if style == 0:
        when = when.replace(hour=0, minute=0)
        text = when.strftime("%Y-%m-%d")
    elif style == 1:
        text = when.strftime("%Y-%m-%dT%H:%M:%SZ")
    elif style == 2:  # the same instant written at +02:00
        text = when.astimezone(timezone(timedelta(hours=2))).strftime("%Y-%m-%dT%H:%M:%S+02:00")
    else:
        text = when.strftime("%Y-%m-%d %H:%M")
    INSTANT[text] = when.timestamp()
    return text


MINUTES = [0, 90, 1440, 2880]
DATES = [_date(m, s) for m in MINUTES for s in range(4)]
NOT_DATES = ["2024-13-01", "2024-02-30", "2024"]
NUMBERS = [-1, 0, 1, 1.0, 2, 2.5, 3, 2 ** 53 + 1, float(2 ** 53)]
STRINGS = ["en", "de", "1", "", "退款"]
TAGS = ["x", "y", "1", 1, 1.0, 2.5, True, False, DATES[1], DATES[6]]
SCALARS = NUMBERS + STRINGS + DATES[::3] + NOT_DATES[:1] + [True, False]
META_KEYS = ["n", "d", "s", "tags"]
SOURCES = ["a/x.md", "a/y.txt", "b/x.md", "b/z.md", "c.md", "zh/文档.md", "d.md", "e.md"]
GLOBS = ["a/*", "*.md", "b/?.md", "c.md", "zh/*"]
TIMESTAMPS = [_date(m, 1) for m in MINUTES + [5000]]  # document timestamps (ISO, Z)


def meta_value(key: str) -> st.SearchStrategy[Any]:
    pool = {"n": NUMBERS + [True, "3"], "d": DATES + NOT_DATES, "s": STRINGS, "tags": TAGS}[key]
    one = st.sampled_from(pool)
    return st.one_of(one, one, st.lists(one, max_size=3), st.just(None),
                     st.lists(st.lists(one, max_size=1), max_size=1))


metadata = st.fixed_dictionaries({}, optional={k: meta_value(k) for k in META_KEYS})
text = st.lists(st.sampled_from(EN + ZH), min_size=1, max_size=9).map(
    lambda ws: "".join(w if w in ZH else f" {w} " for w in ws).strip())
documents = st.lists(st.fixed_dictionaries({
    "source": st.sampled_from(SOURCES),
    "text": text,
    "version": st.sampled_from([None, "1", "2"]),
    "timestamp": st.sampled_from(TIMESTAMPS),
    "metadata": metadata,
    "acl": st.sampled_from([[], [], ["a"], ["b"], ["a", "b"], ["*"]]),
}), min_size=2, max_size=10)
PRINCIPALS = st.sampled_from([ALL, ALL, None, ["a"], ["b", "c"]])

# ------------------------------------------------------------------------------ filters


def _range_operand(key: str) -> st.SearchStrategy[Any]:
    if key == "timestamp":
        return st.sampled_from(TIMESTAMPS + DATES[:4])
    return st.sampled_from(NUMBERS + [1.5, 10] + DATES)


def _eq_operand(key: str) -> st.SearchStrategy[Any]:
    if key == "source":
        return st.sampled_from(SOURCES + GLOBS)
    if key == "version":
        return st.sampled_from(["1", "2", "3"])
    if key == "timestamp":
        return st.sampled_from(TIMESTAMPS + DATES[4:8])
    return st.sampled_from(SCALARS + NOT_DATES)


def key_ops(key: str) -> st.SearchStrategy[dict[str, Any]]:
    eq = _eq_operand(key)
    ops: dict[str, st.SearchStrategy[Any]] = {
        "$eq": eq, "$ne": eq, "$in": st.lists(eq, max_size=3), "$nin": st.lists(eq, max_size=3),
        "$exists": st.booleans()}
    if key not in ("source", "version"):
        for op in ("$gt", "$gte", "$lt", "$lte"):
            ops[op] = _range_operand(key)
    names = sorted(ops)
    return st.lists(st.sampled_from(names), min_size=1, max_size=2, unique=True).flatmap(
        lambda chosen: st.fixed_dictionaries({op: ops[op] for op in chosen}))


KEYS = META_KEYS + ["absent", "source", "version", "timestamp"]


def key_condition(key: str) -> st.SearchStrategy[Any]:
    plain = st.one_of(_eq_operand(key), st.lists(_eq_operand(key), min_size=1, max_size=3))
    ops = key_ops(key)
    return st.one_of(plain, ops, ops.map(lambda m: {"$not": m}))


leaf = st.one_of(
    st.sampled_from(KEYS).flatmap(lambda k: key_condition(k).map(lambda c: {k: c})),
    st.sampled_from(EN + ZH + ["款政", "lph", "Alpha", "a b", "pump valve", "策检"]).map(lambda s: {"$contains": s}),
)
compound = st.recursive(leaf, lambda inner: st.one_of(
    st.lists(inner, min_size=1, max_size=3).map(lambda fs: {"$and": fs}),
    st.lists(inner, min_size=1, max_size=3).map(lambda fs: {"$or": fs}),
    inner.map(lambda f: {"$not": f}),
    st.lists(inner, min_size=2, max_size=2).map(lambda fs: {**fs[0], **fs[1]}),
), max_leaves=4)
#: one key's operators (ranges on metadata and timestamps often), or a tree of them
simple = st.sampled_from(META_KEYS + ["timestamp", "version", "source"]).flatmap(
    lambda k: key_ops(k).map(lambda m: {k: m}))
filters_ = st.one_of(simple, compound)


def derived(data: Any, model: dict[int, dict]) -> dict:
    """A filter on a value some stored document has: equality and range boundaries meet."""
    pairs = [(k, x) for m in model.values() for k in META_KEYS for x in values(m, k)]
    pairs += [("timestamp", m["timestamp"]) for m in model.values()]
    if not pairs:
        return {}
    key, x = data.draw(st.sampled_from(pairs), label="stored value")
    ordered = key == "timestamp" or (isinstance(x, (int, float)) and not isinstance(x, bool)) or x in INSTANT
    ops = ["$eq", "$ne", "$in", "$nin"] + (["$gt", "$gte", "$lt", "$lte"] * 2 if ordered else [])
    chosen = data.draw(st.lists(st.sampled_from(ops), min_size=1, max_size=2, unique=True), label="operators")
    other = data.draw(_eq_operand(key), label="other value")
    flt = {key: {op: [x, other] if op in ("$in", "$nin") else x for op in chosen}}
    return data.draw(st.sampled_from([flt, {"$not": flt}, {"$or": [flt, {"$contains": "pump"}]}]),
                     label="derived filter")

# ------------------------------------------------------------------------------ the reference


def values(doc: dict, key: str) -> list[Any]:
    """A key's filterable values: its scalars and a list's scalar elements."""
    if key == "source":
        return [doc["source"]]
    if key == "version":
        return [] if doc["version"] is None else [doc["version"]]
    if key == "timestamp":
        return [INSTANT[doc["timestamp"]]]
    if key not in doc["metadata"]:
        return []
    v = doc["metadata"][key]
    return [x for x in (v if isinstance(v, list) else [v]) if isinstance(x, (str, int, float, bool))]


def equal(key: str, stored: Any, wanted: Any) -> bool:
    if key == "source":
        wanted = str(wanted)
        return fnmatch.fnmatchcase(stored, wanted) if any(c in wanted for c in "*?[") else stored == wanted
    if key == "version":
        return stored == str(wanted)
    if key == "timestamp":
        return stored == INSTANT[wanted]
    if isinstance(stored, str) or isinstance(wanted, str):
        return isinstance(stored, str) and isinstance(wanted, str) and stored == wanted
    return stored == wanted  # numbers (booleans as 1/0) numerically


RELATIONS = {"$gt": operator.gt, "$gte": operator.ge, "$lt": operator.lt, "$lte": operator.le}


def in_range(key: str, stored: Any, op: str, bound: Any) -> bool:
    if key == "timestamp":
        return RELATIONS[op](stored, INSTANT[bound])
    if isinstance(bound, str):  # a date: only dates compare, as instants
        return isinstance(stored, str) and stored in INSTANT and RELATIONS[op](INSTANT[stored], INSTANT[bound])
    if isinstance(stored, bool) or not isinstance(stored, (int, float)):
        return False
    return RELATIONS[op](stored, bound)


def key_matches(key: str, ops: dict, doc: dict) -> bool:
    vals = values(doc, key)
    together = [(op, arg) for op, arg in ops.items() if op in ("$eq", "$in", "$gt", "$gte", "$lt", "$lte")]

    def holds(x: Any, op: str, arg: Any) -> bool:
        if op == "$eq":
            return equal(key, x, arg)
        if op == "$in":
            return any(equal(key, x, a) for a in arg)
        return in_range(key, x, op, arg)

    ok = not together or any(all(holds(x, op, arg) for op, arg in together) for x in vals)
    for op, arg in ops.items():
        if op == "$ne":
            ok = ok and not any(equal(key, x, arg) for x in vals)
        elif op == "$nin":
            ok = ok and not any(equal(key, x, a) for x in vals for a in arg)
        elif op == "$exists":
            ok = ok and (key in ("source", "timestamp") or bool(vals)) == arg
        elif op == "$not":
            ok = ok and not key_matches(key, arg, doc)
    return ok


def matches(flt: dict, doc: dict, chunk_text: str) -> bool:
    for key, cond in flt.items():
        if key == "$and":
            ok = all(matches(f, doc, chunk_text) for f in cond)
        elif key == "$or":
            ok = any(matches(f, doc, chunk_text) for f in cond)
        elif key == "$not":
            ok = not matches(cond, doc, chunk_text)
        elif key == "$contains":
            ok = cond in chunk_text
        elif isinstance(cond, dict):
            ok = key_matches(key, cond, doc)
        else:
            ok = key_matches(key, {"$in": cond if isinstance(cond, list) else [cond]}, doc)
        if not ok:
            return False
    return True


def visible(doc: dict, principals: Any, public_unlabeled: bool) -> bool:
    if principals is ALL:
        return True
    if doc["acl"]:
        return bool(set(doc["acl"]) & (set(principals or ()) | {"*"}))
    return public_unlabeled


def facet_reference(docs: dict[int, dict], chunks: list[tuple[int, int, str]], key: str, by: str
                    ) -> tuple[dict[Any, int], int, int]:
    """(value -> count, total, missing) over ``chunks`` (chunk id, doc id, text) that matched."""
    units = chunks if by == "chunks" else list({d: (0, d, "") for _, d, _ in chunks}.values())
    counts: dict[Any, int] = {}
    missing = 0
    for _cid, doc_id, _text in units:
        distinct = list(dict.fromkeys(values(docs[doc_id], key)))  # 1, 1.0 and True are one value
        if not distinct:
            missing += 1
        for v in distinct:
            counts[v] = counts.get(v, 0) + 1
    return counts, len(units), missing


def stored_chunks(db: ragdb.Database) -> list[tuple[int, int, str]]:
    """(chunk id, doc id, text) of every stored chunk, read through one unfiltered search."""
    hits = db.search(EVERYTHING, k=MAX, principals=ALL, versions="all", collapse=False)
    assert len(hits) == db.stats().stored_chunks  # the query matches every chunk
    return sorted((h.chunk_id, h.doc_id, h.text) for h in hits)


# ------------------------------------------------------------------------------ the property


def _check(db: ragdb.Database, docs: dict[int, dict], flt: dict, principals: Any, public: bool) -> None:
    chunks = stored_chunks(db)
    want = [(c, d, t) for c, d, t in chunks if visible(docs[d], principals, public) and matches(flt, docs[d], t)]
    got = db.search(EVERYTHING, k=MAX, filter=flt, principals=principals, collapse=False)
    assert sorted(h.chunk_id for h in got) == [c for c, _, _ in want], flt
    want_docs = sorted({d for _, d, _ in want})
    listed = db.documents(filter=flt, principals=principals)
    assert sorted(d.id for d in listed) == want_docs, flt
    assert [d.source for d in listed] == sorted(d.source for d in listed)  # still by source
    assert db.count(filter=flt, principals=principals) == len(want_docs), flt
    for by in ("chunks", "documents"):
        key = META_KEYS[len(want) % len(META_KEYS)]
        f = db.facets(key, filter=flt, principals=principals, by=by)
        counts, total, missing = facet_reference(docs, want, key, by)
        assert (dict(f), f.total, f.missing) == (counts, total, missing), (key, by, flt)
        assert [n for _, n in f] == sorted((n for _, n in f), reverse=True)


@BROAD
@given(docs=documents, flts=st.lists(filters_, min_size=2, max_size=4), doomed=filters_, principals=PRINCIPALS,
       public=st.booleans(), new_meta=metadata, data=st.data())
def test_operators_equal_the_brute_force_before_and_after_deletes(docs, flts, doomed, principals, public, new_meta,
                                                                  data):
    with ragdb.open(":memory:", chunker="window:size=3,overlap=1", public_unlabeled=public) as db:
        model: dict[int, dict] = {}
        for d in docs:
            stored = db.add(d["text"], source=d["source"], version=d["version"], timestamp=d["timestamp"],
                            metadata=d["metadata"], acl=d["acl"])
            model = {i: m for i, m in model.items() if m["source"] != d["source"]}  # a replaced version goes
            model[stored.id] = {**d, "timestamp": stored.timestamp}  # unchanged content keeps its time
        flts = flts + [derived(data, model), derived(data, model)]
        for flt in flts:
            _check(db, model, flt, principals, public)

        # delete(filter=): the documents with a chunk meeting the filter, whoever could see them
        chunks = stored_chunks(db)
        gone = {d for _, d, t in chunks if matches(doomed, model[d], t)}
        assert db.delete(filter=doomed) == len(gone)
        model = {i: m for i, m in model.items() if i not in gone}
        assert sorted(d.id for d in db.documents(principals=ALL)) == sorted(model)
        if model:  # metadata changed in place: filters see the new values (and their numbers) at once
            first = min(model)
            db.update(first, metadata=new_meta)
            model[first] = {**model[first], "metadata": new_meta}
        for flt in flts:
            _check(db, model, flt, principals, public)
        assert db.check() == []


@BROAD
@given(docs=documents, flt=st.one_of(st.just({}), filters_), principals=PRINCIPALS, public=st.booleans(),
       query=st.sampled_from(["alpha", "退款", "pump 政策", "gamma beta", "nothing"]),
       key=st.sampled_from(META_KEYS + ["source", "version"]), by=st.sampled_from(["chunks", "documents"]),
       limit=st.sampled_from([None, 1, 2]))
def test_facets_of_a_query_count_every_match_the_caller_may_see(docs, flt, principals, public, query, key, by,
                                                                 limit):
    with ragdb.open(":memory:", chunker="window:size=3,overlap=1", public_unlabeled=public) as db:
        model: dict[int, dict] = {}
        for d in docs:
            stored = db.add(d["text"], source=d["source"], version=d["version"], timestamp=d["timestamp"],
                            metadata=d["metadata"], acl=d["acl"])
            model = {i: m for i, m in model.items() if m["source"] != d["source"]}
            model[stored.id] = {**d, "timestamp": stored.timestamp}
        terms = set(db.analyzer.terms(query))
        want = [(c, d, t) for c, d, t in stored_chunks(db)
                if visible(model[d], principals, public) and matches(flt, model[d], t)
                and terms & set(db.analyzer.terms(t))]
        f = db.facets(key, query, filter=flt, principals=principals, by=by, limit=limit)
        counts, total, missing = facet_reference(model, want, key, by)
        ordered = sorted(counts.items(), key=lambda vn: (-vn[1], isinstance(vn[0], str), vn[0]))
        assert [n for _, n in f] == [n for _, n in ordered][:limit]
        assert dict(f) == dict(ordered[:limit]) and (f.total, f.missing) == (total, missing)
        assert f.omitted == len(ordered) - len(f)
        # the chunks a search of the same query sees are the ones counted
        if by == "chunks" and f.total:
            hits = db.search(query, k=MAX, filter=flt, principals=principals, collapse=False)
            assert len(hits) == f.total


@pytest.mark.parametrize("query", ["beta", '"alpha beta"', "beta -delta", "alpha AND delta", "title:beta",
                                   "beta^2 zzz", "alp*", "(alpha OR gamma) -beta", "zzz"])
def test_facets_of_a_query_count_what_its_search_returns(query):
    """Phrases, exclusions, required words, fields and titles: the facets of a query count
    the chunks its search returns (they counted every chunk holding one of its text terms:
    a phrase's or an excluded word's chunks too, never a chunk matched by its title)."""
    from collections import Counter

    with ragdb.open(":memory:", chunker="none") as db:
        db.add("alpha beta gamma", source="a.md")
        db.add("beta alpha delta", source="b.md")
        db.add("gamma", source="c.md", title="beta notes")
        db.add("alpha gamma", source="d.md")
        hits = db.search(query, k=MAX, collapse=False)
        f = db.facets("source", query)
        assert dict(f) == dict(Counter(h.source for h in hits)) and f.total == len(hits)


# ------------------------------------------------------------------------------ offset

PAGE_TEXTS = st.lists(st.lists(st.sampled_from(EN[:4] + ZH[:2]), min_size=1, max_size=4).map(" ".join),
                      min_size=1, max_size=25)


@PROPERTY
@given(texts=PAGE_TEXTS, k=st.integers(1, 6), offset=st.integers(0, 12),
       scorer=st.sampled_from(["bm25", "tfidf", "vector", "hybrid"]),
       query=st.sampled_from(["alpha beta", "退款 gamma", "delta"]))
def test_a_page_is_that_slice_of_the_deeper_search(texts, k, offset, scorer, query):
    """search(k, offset) == search(k + offset)[offset:], and pages of k concatenate into one
    search (equal scores are frequent here: many texts are equal or alike)."""
    with ragdb.open(":memory:", chunker="none", embedder=HashEmbedder(16)) as db:
        db.add_many([{"text": t, "source": f"s{i:02d}"} for i, t in enumerate(texts)])

        def key(hits):
            return [(h.chunk_id, h.score) for h in hits]

        deep = db.search(query, k=k + offset, scorer=scorer)
        assert key(db.search(query, k=k, offset=offset, scorer=scorer)) == key(deep[offset:])
        pages = []
        for start in range(0, k + offset, k):
            pages += db.search(query, k=k, offset=start, scorer=scorer)
        assert key(pages)[:k + offset] == key(deep)


def test_offset_is_checked_like_k():
    with ragdb.open(":memory:") as db:
        db.add("alpha beta", source="a")
        for bad in (-1, 1.5, "2", True, None):
            with pytest.raises(InvalidInput, match="offset"):
                db.search("alpha", offset=bad)
        with pytest.raises(InvalidInput, match="offset \\+ k must be at most 10000"):
            db.search("alpha", k=10, offset=MAX - 9)
        assert db.search("alpha", k=10, offset=MAX - 10) == []
        assert ragdb.SearchOptions(k=5, offset=5).depth == 10
        assert ragdb.SearchOptions(k=5, offset=5).replace(offset=0).depth == 5


# ------------------------------------------------------------------------------ examples and errors


@pytest.fixture
def kb():
    with ragdb.open(":memory:", chunker="none") as db:
        db.add("pump maintenance 退款政策", source="ops/pump.md", timestamp="2024-01-05T00:00:00Z",
               metadata={"year": 2020, "tags": ["x", "y"], "published": "2024-01-05", "draft": True})
        db.add("valve notes", source="ops/valve.md", version="2", timestamp="2024-03-01T00:00:00Z",
               metadata={"year": 2023.5, "published": "2024-03-01T10:00:00+02:00", "draft": 1})
        db.add("revenue figures", source="fin/q3.md", metadata={"year": "2021", "tags": [1, 5]})
        db.add("empty metadata", source="misc/none.md", metadata={"tags": None, "year": []})
        yield db


def sources(db, flt, **kw):
    return sorted(d.source for d in db.documents(filter=flt, principals=ALL, **kw))


def test_examples(kb):
    assert sources(kb, {"year": {"$gte": 2020, "$lt": 2022}}) == ["ops/pump.md"]  # "2021" is text
    assert sources(kb, {"year": {"$gt": 2020}}) == ["ops/valve.md"]
    assert sources(kb, {"published": {"$gt": 0}}) == []  # a number never compares with a date
    assert sources(kb, {"year": {"$lt": "2030-01-01"}}) == []  # nor a date with a number
    assert sources(kb, {"published": {"$gte": "2024-02-01"}}) == ["ops/valve.md"]
    # 10:00+02:00 is 08:00Z: a date-time compares as an instant
    assert sources(kb, {"published": {"$lt": "2024-03-01T09:00:00Z"}}) == ["ops/pump.md", "ops/valve.md"]
    assert sources(kb, {"year": {"$ne": 2020}}) == ["fin/q3.md", "misc/none.md", "ops/valve.md"]
    assert sources(kb, {"tags": {"$exists": True}}) == ["fin/q3.md", "ops/pump.md"]  # null: no value
    assert sources(kb, {"tags": {"$exists": False}}) == ["misc/none.md", "ops/valve.md"]
    assert sources(kb, {"$or": [{"year": 2020}, {"source": "fin/*"}]}) == ["fin/q3.md", "ops/pump.md"]
    assert sources(kb, {"$not": {"source": {"$in": ["ops/*"]}}}) == ["fin/q3.md", "misc/none.md"]
    assert sources(kb, {"$contains": "款政"}) == ["ops/pump.md"]
    assert sources(kb, {"$contains": "Pump"}) == []  # case-sensitive
    assert sources(kb, {"version": {"$exists": False}}) == ["fin/q3.md", "misc/none.md", "ops/pump.md"]
    assert sources(kb, {"draft": True}) == sources(kb, {"draft": {"$eq": 1}}) == ["ops/pump.md", "ops/valve.md"]
    assert sources(kb, {"draft": {"$gte": 1}}) == ["ops/valve.md"]  # a boolean is never in a range
    assert sources(kb, {"timestamp": {"$lt": "2024-02-01"}}) == ["ops/pump.md"]
    assert sources(kb, {"timestamp": "2024-01-05T01:00:00+01:00"}) == ["ops/pump.md"]
    assert sources(kb, {"tags": {"$in": []}}) == [] and len(sources(kb, {"tags": {"$nin": []}})) == 4
    assert sources(kb, {"year": {"$not": {"$lt": 2021}}}) == ["fin/q3.md", "misc/none.md", "ops/valve.md"]
    # operators of one mapping hold for the same element of a list; $and lets elements differ
    assert sources(kb, {"tags": {"$gt": 2, "$lt": 4}}) == []
    assert sources(kb, {"$and": [{"tags": {"$gt": 2}}, {"tags": {"$lt": 4}}]}) == ["fin/q3.md"]
    assert sources(kb, {"tags": {"$gt": 2, "$ne": 1}}) == []  # $ne: no element equals 1
    # the plain form is the $eq/$in shorthand
    for plain, ops in (({"tags": ["x", 5]}, {"tags": {"$in": ["x", 5]}}), ({"source": "ops/*"}, {"source": {"$eq": "ops/*"}})):
        assert sources(kb, plain) == sources(kb, ops)


@pytest.mark.parametrize("flt, message", [
    ({"year": {"$gt": "x"}}, "filter 'year': $gt needs a number or an ISO date, got 'x'"),
    ({"year": {"$gt": ["x"]}}, "filter 'year': $gt needs a number or an ISO date, got ['x']"),
    ({"year": {"$lte": True}}, "filter 'year': $lte needs a number or an ISO date, got True"),
    ({"year": {"$gt": float("nan")}}, "filter 'year': $gt needs a finite number, got nan"),
    ({"year": float("nan")}, "filter 'year': values must be finite numbers, got nan"),
    ({"year": {"$ne": float("inf")}}, "filter 'year': $ne values must be finite numbers, got inf"),
    ({"year": {"$nin": [1, float("-inf")]}}, "filter 'year': $nin values must be finite numbers, got -inf"),
    ({"year": {"$in": 3}}, "filter 'year': $in takes a list of values, got 3"),
    ({"year": {"$eq": [1, 2]}}, "filter 'year': $eq takes one value, got [1, 2] (use $in for a list)"),
    ({"year": {"$eq": None}}, "filter 'year': $eq values must be strings, numbers or booleans, got None"),
    ({"year": {"$exists": 1}}, "filter 'year': $exists takes true or false, got 1"),
    ({"year": {"$regex": "x"}}, "filter 'year': unknown operator '$regex'"),
    ({"year": {"$and": []}}, "filter 'year': $and stands where keys do"),
    ({"year": {}}, "filter 'year': an empty operator mapping"),
    ({"year": {"gt": 1}}, "filter 'year': values must be strings, numbers or booleans, or a mapping of operators"),
    ({"year": {"$not": 3}}, "filter 'year': $not takes a mapping of operators, got 3"),
    ({"source": {"$gt": "a"}}, "filter 'source': $gt does not apply to source"),
    ({"version": {"$lt": "2"}}, "filter 'version': $lt does not apply to version"),
    ({"timestamp": {"$gt": "soon"}}, "filter 'timestamp': $gt: timestamp 'soon' is not ISO-8601"),
    ({"timestamp": {"$in": "2024-01-01"}}, "filter 'timestamp': $in takes a list of values"),
    ({"$foo": 1}, "filter: unknown operator '$foo' (a metadata key cannot start with '$')"),
    ({"$gt": 1}, "filter: unknown operator '$gt' ($gt belongs in a key's mapping"),
    ({"$and": []}, "filter: $and takes a non-empty list of filters, got []"),
    ({"$or": {"a": 1}}, "filter: $or takes a non-empty list of filters"),
    ({"$or": [1]}, "filter: each item of $or must be a mapping"),
    ({"$not": [{"a": 1}]}, "filter: $not must be a mapping"),
    ({"$contains": ""}, "filter: $contains takes a non-empty string"),
    ({"$contains": 5}, "filter: $contains takes a non-empty string"),
])
def test_invalid_filters_name_the_key_and_the_operator(kb, flt, message):
    for call in (lambda: kb.search("pump", filter=flt), lambda: kb.documents(filter=flt),
                 lambda: kb.count(filter=flt), lambda: kb.delete(filter=flt), lambda: kb.facets("year", filter=flt)):
        with pytest.raises(InvalidInput) as e:
            call()
        assert message in str(e.value)
    assert kb.count(principals=ALL) == 4  # nothing was deleted


def test_nesting_is_bounded(kb):
    deep: dict = {"year": 2020}
    for _ in range(40):
        deep = {"$not": deep}
    with pytest.raises(InvalidInput, match="nested more than 32 levels"):
        kb.search("pump", filter=deep)
    ok: dict = {"year": 2020}
    for _ in range(30):
        ok = {"$not": ok}
    assert sources(kb, ok) == ["ops/pump.md"]  # an even number of negations


def test_operator_filters_are_data_never_sql(kb):
    evil = "x') OR 1=1; DROP TABLE doc_meta; --"
    assert sources(kb, {evil: {"$gt": 1}}) == []
    assert sources(kb, {"year": {"$in": [evil]}}) == []
    assert sources(kb, {"$contains": evil}) == []
    assert sources(kb, {"$or": [{evil: {"$exists": False}}, {"source": evil}]}) == sorted(
        d.source for d in kb.documents(principals=ALL))
    assert kb.check() == []


def test_operator_masks_are_cached_per_generation(kb, monkeypatch):
    store = kb._store
    calls = []
    for name in ("filtered_doc_ids", "filtered_chunk_ids"):
        original = getattr(store, name)
        monkeypatch.setattr(store, name, lambda *a, _o=original, _n=name, **k: calls.append(_n) or _o(*a, **k))
    ranged = {"year": {"$gte": 2020, "$lt": 2024}}
    contains = {"$contains": "pump", "year": {"$exists": True}}
    for _ in range(3):
        kb.search("pump valve", filter=ranged)
        kb.search("pump valve", filter={"year": {"$lt": 2024, "$gte": 2020}})  # the same filter
        kb.search("pump valve", filter=contains)
    assert calls == ["filtered_doc_ids", "filtered_chunk_ids"]
    kb.add("pump again", source="new.md", metadata={"year": 2021})
    assert {h.source for h in kb.search("pump", filter=ranged)} == {"ops/pump.md", "new.md"}
    assert calls[2:] == ["filtered_doc_ids"]


def test_principals_never_leak_through_facets_counts_and_operators():
    with ragdb.open(":memory:", chunker="none", public_unlabeled=True) as db:
        db.add("secret plan", source="s1", metadata={"team": "hr", "level": 9}, acl=["hr"])
        db.add("secret salaries", source="s2", metadata={"team": "hr", "level": 7}, acl=["hr"])
        db.add("public plan", source="p1", metadata={"team": "all", "level": 1})
        for who in (None, ["eng"]):
            assert dict(db.facets("team", principals=who)) == {"all": 1}
            assert dict(db.facets("team", "secret plan", principals=who)) == {"all": 1}
            assert dict(db.facets("level", filter={"level": {"$gt": 5}}, principals=who)) == {}
            assert db.count(filter={"$not": {"team": "all"}}, principals=who) == 0
            assert db.count(filter={"team": {"$ne": "all"}}, principals=who) == 0
            assert db.search("secret", filter={"$contains": "secret"}, principals=who) == []
            assert db.documents(filter={"$or": [{"level": {"$gte": 0}}, {"$contains": "s"}]}, principals=who) \
                == db.documents(principals=who)
        f = db.facets("team", principals=["hr"], by="documents")
        assert list(f) == [("hr", 2), ("all", 1)] and (f.total, f.missing) == (3, 0)
        assert dict(db.facets("level", principals=ALL, filter={"level": {"$gt": 5}})) == {9: 1, 7: 1}


def test_facet_values_and_order():
    with ragdb.open(":memory:", chunker="window:size=2,overlap=0") as db:
        db.add("a b c d", source="x", metadata={"k": [1, 1.0, "1"], "flag": True})   # two chunks
        db.add("a b", source="y", metadata={"k": 1.0, "flag": 1})
        db.add("a b", source="z", metadata={"k": ["b", "a", True]})
        f = db.facets("k")
        # 1, 1.0 and True are one value (as $eq sees them), shown as the integer; then by value
        assert list(f) == [(1, 4), ("1", 2), ("a", 1), ("b", 1)]
        assert type(f[0][0]) is int and (f.total, f.missing, f.omitted) == (4, 0, 0)
        assert list(db.facets("k", by="documents")) == [(1, 3), ("1", 1), ("a", 1), ("b", 1)]
        assert list(db.facets("k", by="documents", limit=2)) == [(1, 3), ("1", 1)]
        assert db.facets("k", by="documents", limit=2).omitted == 2
        assert list(db.facets("flag", by="documents")) == [(1, 2)]
        only_bool = db.facets("flag", filter={"source": "x"}, by="documents")
        assert list(only_bool) == [(True, 1)] and type(only_bool[0][0]) is bool
        assert db.facets("nothing").missing == 4 and list(db.facets("nothing")) == []
        assert list(db.facets("source", by="documents")) == [("x", 1), ("y", 1), ("z", 1)]
        db.add("a b", source="w", metadata={"both": [True, 1], "one": [True, True]})
        assert [(v, type(v), n) for v, n in db.facets("both")] == [(1, int, 1)]
        assert [(v, type(v), n) for v, n in db.facets("one")] == [(True, bool, 1)]
        for bad, message in ((("k",), {"by": "rows"}), (("timestamp",), {}), (("",), {}), (("k", 5), {}),
                             (("k",), {"limit": 0}), (("$or",), {})):
            with pytest.raises(InvalidInput, match="facets"):
                db.facets(*bad, **message)


# ------------------------------------------------------------------------------ migration


def _doc_meta(path):
    conn = sqlite3.connect(path)
    rows = conn.execute("SELECT doc_id, key, value, typeof(value), num, typeof(num), at FROM doc_meta").fetchall()
    conn.close()
    return sorted(rows, key=repr)


def test_migration_back_fills_the_numbers_the_write_path_stores(tmp_path):
    path = tmp_path / "old.db"
    meta = [{"n": 1, "f": 2.5, "b": True, "z": False, "big": 2 ** 62, "d": "2024-05-01T09:30:00+02:00"},
            {"list": [3, "2024-01-01", "text", True, None, [4]], "day": "2024-02-29", "bad": "2024-02-30"},
            {"nested": {"n": 1}, "none": None, "s": "plain", "n": -7, "t": ("tuple", 8)}]
    with ragdb.open(path) as db:
        for i, m in enumerate(meta):
            db.add(f"text {i}", source=f"s{i}", metadata=m)
        db.update(1, metadata={**meta[0], "n": 2})  # through update too
    written = _doc_meta(path)
    assert ("list", 3) in [(r[1], r[2]) for r in written] and ("t", 8) in [(r[1], r[2]) for r in written]
    by_value = {(r[1], r[2]): (r[4], r[6]) for r in written}
    assert by_value[("b", 1)] == (None, None) and by_value[("n", -7)] == (-7, None)  # a boolean has neither
    assert by_value[("day", "2024-02-29")] == (None, 1709164800.0) and by_value[("bad", "2024-02-30")] == (None, None)
    (name,) = [p.stem for p in migration_files() if p.stem.endswith("_filter_operators")]
    conn = sqlite3.connect(path)  # schema 5 as it was: no num or at, no indexes on them
    for column in ("num", "at"):
        conn.execute(f"DROP INDEX doc_meta_{column}")
        conn.execute(f"ALTER TABLE doc_meta DROP COLUMN {column}")
    conn.execute("DELETE FROM _sqlite_migrations WHERE name = ?", [name])
    conn.commit()
    conn.close()
    with ragdb.open(path) as db:
        assert _doc_meta(path) == written
        assert sorted(d.source for d in db.documents(filter={"n": {"$gt": 0}})) == ["s0"]
        assert sorted(d.source for d in db.documents(filter={"d": {"$lt": "2024-05-01T08:00:00.000001Z"}})) == ["s0"]
        assert db.check() == []


def test_a_filter_in_steady_use_outlives_one_off_filters(kb, monkeypatch):
    store = kb._store
    calls = []
    original = store.filtered_doc_ids
    monkeypatch.setattr(store, "filtered_doc_ids", lambda *a, **k: calls.append(1) or original(*a, **k))
    steady = {"year": {"$gte": 2020}}
    for x in range(40):  # more one-off filters than the cache holds
        kb.search("pump", filter=steady)
        kb.search("pump", filter={"year": {"$gte": 1900 + x}})
    assert len(calls) == 41  # the steady one built once, each one-off once


def test_wide_filters_stay_within_sqlites_limits(kb):
    """Filters up to the stated limits (docs/limits.md): SQL nests the alternatives as
    balanced trees (SQLite refuses expressions deeper than 1000 and compound SELECTs of
    more than 500 terms) and binds at most a few thousand values."""
    from ragdb.query.filters import MAX_FILTER_CONDITIONS, MAX_FILTER_VALUES

    wide = MAX_FILTER_CONDITIONS - 1
    assert sources(kb, {"$or": [{"year": i} for i in range(2020 - wide + 1, 2021)]}) == ["ops/pump.md"]
    assert sources(kb, {f"k{i}": {"$exists": False} for i in range(MAX_FILTER_CONDITIONS)}) == sources(kb, {})
    assert sources(kb, {f"k{i}": {"$ne": 1} for i in range(wide)} | {"year": 2020}) == ["ops/pump.md"]
    assert sources(kb, {"$and": [{"$contains": "pump"}] * wide}) == ["ops/pump.md"]
    assert kb.count(filter={"$or": [{"$contains": w} for w in ("valve", "revenue")] * (wide // 2)},
                    principals=ALL) == 2
    assert sources(kb, {"year": {"$in": list(range(2021 - MAX_FILTER_VALUES, 2021))}}) == ["ops/pump.md"]
    assert sources(kb, {"$or": [{f"k{i}": i} for i in range(wide - 1)] + [{"year": 2020}]}) == ["ops/pump.md"]
    # a list of source globs: a chain of 1,000 ``GLOB ?`` was deeper than SQLite allows
    globs = [f"p{i}/*" for i in range(MAX_FILTER_VALUES - 1)] + ["ops/p*"]
    assert sources(kb, {"source": globs}) == ["ops/pump.md"]
    assert sources(kb, {"source": {"$nin": globs}}) == ["fin/q3.md", "misc/none.md", "ops/valve.md"]
    assert [h.source for h in kb.search("pump", filter={"source": globs})] == ["ops/pump.md"]


def test_principals_up_to_the_limit_are_served_and_more_are_refused():
    """A caller's principals are bound twice in a search's SQL: up to MAX_PRINCIPALS, with a
    filter's most values beside them, they stay within SQLite's default parameter limit; more
    are refused naming principals, on every read path (300,000 once came back as SQLite's
    "too many SQL variables")."""
    from ragdb.options import MAX_PRINCIPALS
    from ragdb.query.filters import MAX_FILTER_VALUES

    with ragdb.open(":memory:", chunker="none") as db:
        db.add("pump secret", source="hr/pump.md", acl=["team:hr"])
        db.add("pump public", source="ops/pump.md", metadata={"year": 2020})
        many = [f"group{i}" for i in range(MAX_PRINCIPALS - 1)] + ["team:hr"]
        wide = {"$or": [{"year": {"$in": list(range(MAX_FILTER_VALUES // 2))}},
                        {"k": {"$in": [str(i) for i in range(MAX_FILTER_VALUES // 2 - 1)]}}, {"source": "hr/pump.md"}]}
        assert [h.source for h in db.search("pump", principals=many, filter=wide)] == ["hr/pump.md", "ops/pump.md"]
        assert db.count(principals=many) == 2
        too_many = many + ["one more"]
        for call in (lambda: db.search("pump", principals=too_many), lambda: db.count(principals=too_many),
                     lambda: db.documents(principals=too_many), lambda: db.get(source="hr/pump.md", principals=too_many),
                     lambda: db.facets("year", principals=too_many), lambda: db.query_plan("pump", principals=too_many)):
            with pytest.raises(InvalidInput, match="more than the 5,000") as e:
                call()
            assert e.value.param == "principals"


@pytest.mark.parametrize("flt", [
    {"$or": [{"year": i} for i in range(10_000)]},  # issue 32: 6.2 s before, now refused at once
    {f"k{i}": {"$exists": False} for i in range(3000)},
    {"$and": [{"$contains": "pump"}] * 2000},
    {"year": {"$in": list(range(10_001))}},
    {"$or": [{"year": {"$in": list(range(n, n + 99))}} for n in range(0, 10_100, 100)]},
])
def test_filters_past_the_limits_are_refused(kb, flt):
    """A filter of more than MAX_FILTER_CONDITIONS keys and operators, or more than
    MAX_FILTER_VALUES values, is an InvalidInput naming the filter (HTTP 422, an MCP tool
    error), before any SQL is run (issue 32, item 1)."""
    for call in (lambda: kb.documents(filter=flt), lambda: kb.search("pump", filter=flt),
                 lambda: kb.count(filter=flt)):
        with pytest.raises(InvalidInput, match="filter: more than") as e:
            call()
        assert e.value.param == "filter"


def test_a_cyclic_filter_is_refused_not_walked_forever(kb):
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(InvalidInput):
        kb.documents(filter={"$or": loop})
    ring: dict[str, Any] = {}
    ring["$not"] = ring
    with pytest.raises(InvalidInput):
        kb.documents(filter=ring)


def test_an_or_of_equalities_is_one_list_per_key():
    """`$or` branches of equality on one key become one list of values (and equalities on
    several metadata keys one list of pairs), so the SQL grows with the filter, not with
    the filter times the documents (issue 32, item 1: 10,000 branches were 10,000 subqueries)."""
    from ragdb.query import filters

    def conds(flt):
        return filters.build(flt, to_epoch=lambda v, _label: v, principals=ALL).conditions

    assert conds({"$or": [{"team": f"t{i}"} for i in range(50)]}) == (
        filters.Condition("meta", "team", tuple(sorted((f"t{i}" for i in range(50)), key=repr))),)
    assert conds({"$or": [{"tags": "a"}, {"tags": {"$in": ["b", "a"]}}]}) == (
        filters.Condition("tags", None, ("a", "b")),)
    [c] = conds({"$or": [{"a": 1}, {"b": 2}, {"$or": [{"a": 3}, {"c": {"$eq": True}}]}]})
    assert c == filters.Condition("any_meta", None, (("a", (1, 3)), ("b", (2,)), ("c", (True,))))
    [c] = conds({"$or": [{"source": "x.md"}, {"source": "d/*"}, {"source": ["y.md"]}]})
    assert (c.kind, c.values) == ("source_glob", ("d/*", "x.md", "y.md"))
    [c] = conds({"$and": [{"k": {"$ne": 1}}, {"k": {"$nin": [2, 3]}}, {"j": {"$ne": 4}}]})
    assert c == filters.Condition("not", None, (filters.Condition("any_meta", None, (("j", (4,)), ("k", (1, 2, 3)))),))


GROUPED = [
    [{"year": 2020}, {"year": 2023.5}, {"year": "2021"}],
    [{"year": 2020}, {"tags": 5}, {"draft": True}, {"tags": {"$in": ["y"]}}],
    [{"source": "ops/*"}, {"source": "fin/q3.md"}, {"version": "2"}, {"version": ["3"]}],
    [{"timestamp": "2024-01-05T00:00:00Z"}, {"timestamp": {"$in": ["2024-03-01T00:00:00Z"]}}, {"tags": 1}],
    [{"year": {"$gte": 2021}}, {"tags": "x"}, {"year": 2020}, {"$contains": "revenue"}, {"nope": 1}],
    [{"$or": [{"tags": "x"}, {"year": "2021"}]}, {"$and": [{"draft": 1}, {"year": 2023.5}]}],
]


@pytest.mark.parametrize("branches", GROUPED)
def test_grouped_alternatives_mean_what_the_branches_mean(kb, branches):
    """An `$or` is the union of its branches and an `$and` of negations the intersection
    of their complements, however ragdb groups them into lists."""
    union = sorted({s for b in branches for s in sources(kb, b)})
    assert sources(kb, {"$or": branches}) == union
    everything = set(sources(kb, {}))
    assert sources(kb, {"$and": [{"$not": b} for b in branches]}) == sorted(everything - set(union))
    assert sources(kb, {"$not": {"$or": branches}}) == sorted(everything - set(union))


def test_metadata_values_are_filtered_as_json_stores_them(tmp_path):
    """A datetime, date or UUID value is stored as its string (orjson), a tuple as a list:
    the filter index and the returned Document take the stored form, so equality and range
    filters match what the document says (the filter index used to leave them out)."""
    import uuid

    day = datetime(2025, 6, 1, 12, 30)
    key = uuid.UUID(int=5)
    with ragdb.open(tmp_path / "kb.db") as db:
        doc = db.add("the published report", source="r.md",
                     metadata={"published": day, "day": day.date(), "id": key, "pair": ("x", 2),
                               "at": datetime(2025, 6, 1, 14, 30, tzinfo=timezone(timedelta(hours=2)))})
        stored = {"published": "2025-06-01T12:30:00", "day": "2025-06-01", "id": str(key), "pair": ["x", 2],
                  "at": "2025-06-01T14:30:00+02:00"}
        assert dict(doc.metadata) == stored == dict(db.get(doc.id).metadata)
        for f in ({"published": {"$gte": "2025-06-01"}}, {"published": {"$lt": "2025-06-01T12:30:00.001Z"}},
                  {"day": "2025-06-01"}, {"day": {"$gt": "2025-05-31T23:59:59Z"}}, {"id": str(key)},
                  {"pair": 2}, {"pair": "x"}, {"at": {"$eq": "2025-06-01T14:30:00+02:00"}},
                  {"at": {"$gte": "2025-06-01T12:30:00Z", "$lte": "2025-06-01T12:30:00Z"}}):
            assert [h.source for h in db.search("report", filter=f)] == ["r.md"], f
        assert [v for v, _n in db.facets("day")] == ["2025-06-01"]
        assert db.check() == []
        # the same metadata again is no change; through update() too
        assert db.add_many([{"text": "the published report", "source": "r.md",
                             "metadata": {"published": day, "day": day.date(), "id": key, "pair": ("x", 2),
                                          "at": datetime(2025, 6, 1, 14, 30, tzinfo=timezone(timedelta(hours=2)))}}]
                           ).unchanged == (doc.id,)
        db.update(doc.id, metadata={"when": day})
        assert [h.source for h in db.search("report", filter={"when": {"$gt": "2025-01-01"}})] == ["r.md"]
        assert db.check() == []


def test_migration_9_restores_the_rows_the_old_write_path_left_out(tmp_path):
    """A file written before schema 9 lacks the doc_meta rows of datetime/date/UUID values:
    check() says so, and opening it with this version derives them again from the JSON."""
    path = tmp_path / "old.db"
    with ragdb.open(path) as db:
        db.add("a dated note", source="n.md", metadata={"d": datetime(2024, 5, 1), "n": 1, "tags": ["a", "b"]})
        db.add("an undated note", source="u.md", metadata={"n": 2})
    written = _doc_meta(path)
    (name,) = [p.stem for p in migration_files() if p.stem.startswith("0009_")]
    conn = sqlite3.connect(path)  # what the old write path stored: no row for the datetime value
    conn.execute("DELETE FROM doc_meta WHERE key = 'd'")
    conn.commit()
    with ragdb.open(path) as db:
        assert [p.split(" (")[0] for p in db.check()] == ["doc_meta lacks 1 row of the documents' metadata"]
        assert db.count(filter={"d": {"$gte": "2024-01-01"}}) == 0
    conn.execute("DELETE FROM _sqlite_migrations WHERE name = ?", [name])  # schema 8, as it was
    conn.commit()
    conn.close()
    with ragdb.open(path) as db:
        assert _doc_meta(path) == written
        assert [d.source for d in db.documents(filter={"d": {"$gte": "2024-01-01"}})] == ["n.md"]
        assert db.check() == []
