"""Filters, versions, time travel and permissions, applied inside the index."""

from __future__ import annotations

import sqlite3

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ragdb
from ragdb.errors import InvalidInput
from ragdb.storage import migration_files


def srcs(hits):
    return [(h.source, h.version) for h in hits]


def _fill(d):
    d.add("alpha beta", source="a", version="1", timestamp="2026-01-01T00:00:00Z",
          metadata={"lang": "en", "tags": ["x", "y"]}, acl=["team:a"])
    d.add("alpha gamma", source="a", version="2", timestamp="2026-02-01T00:00:00Z",
          metadata={"lang": "en", "tags": ["y"]}, acl=["team:a"])
    d.add("alpha delta", source="docs/b.md", timestamp="2026-01-15T00:00:00Z",
          metadata={"lang": "zh", "n": 3, "draft": True}, acl=["user:bob"])
    d.add("alpha epsilon", source="docs/c.md", timestamp="2026-03-01T00:00:00Z")
    return d


@pytest.fixture
def db():
    with ragdb.open(":memory:", keep_versions=True) as d:
        yield _fill(d)


@pytest.fixture
def closed_db():
    """``db`` with ``public_unlabeled`` off: a document without labels is seen by principals=ALL only."""
    with ragdb.open(":memory:", keep_versions=True, public_unlabeled=False) as d:
        yield _fill(d)


ALL = ragdb.ALL  # the full view: these tests are about filters, not access labels


def test_default_sees_latest_versions_only(db):
    assert sorted(srcs(db.search("alpha", principals=ALL))) == [("a", "2"), ("docs/b.md", None), ("docs/c.md", None)]


def test_versions_all_and_as_of(db):
    assert ("a", "1") in srcs(db.search("alpha", versions="all", principals=ALL))
    assert sorted(srcs(db.search("alpha", as_of="2026-01-20T00:00:00Z", principals=ALL))) == \
        [("a", "1"), ("docs/b.md", None)]
    assert sorted(srcs(db.search("alpha", as_of="2026-02-01T00:00:00Z", principals=ALL))) == \
        [("a", "2"), ("docs/b.md", None)]
    assert db.search("alpha", as_of="2025-12-31T00:00:00Z", principals=ALL) == []


def test_metadata_source_version_tag_filters(db):
    assert srcs(db.search("alpha", filter={"lang": "zh"}, principals=ALL)) == [("docs/b.md", None)]
    assert srcs(db.search("alpha", filter={"n": 3}, principals=ALL)) == [("docs/b.md", None)]
    assert srcs(db.search("alpha", filter={"draft": True}, principals=ALL)) == [("docs/b.md", None)]
    assert sorted(srcs(db.search("alpha", filter={"source": "docs/*"}, principals=ALL))) == \
        [("docs/b.md", None), ("docs/c.md", None)]
    assert srcs(db.search("alpha", filter={"source": ["a", "docs/c.md"], "lang": "en"}, principals=ALL)) == \
        [("a", "2")]
    assert srcs(db.search("alpha", filter={"version": "1"}, versions="all", principals=ALL)) == [("a", "1")]
    assert srcs(db.search("alpha", filter={"tags": "x"}, principals=ALL)) == []  # only the old version had x
    assert srcs(db.search("alpha", filter={"tags": ["x", "y"]}, principals=ALL)) == [("a", "2")]
    assert srcs(db.search("alpha", filter={"lang": ["zh", "en"]}, since="2026-01-10T00:00:00Z",
                          until="2026-01-31T00:00:00Z", principals=ALL)) == [("docs/b.md", None)]


def test_hostile_filter_keys_and_values_are_data(db):
    evil = 'x"; DROP TABLE chunks; --'
    assert db.search("alpha", filter={evil: "1"}, principals=ALL) == []
    assert db.search("alpha", filter={"lang": evil}, principals=ALL) == []
    assert db.search("alpha", filter={"source": "' OR 1=1 --"}, principals=ALL) == []
    assert db.check() == []
    assert len(db.search("alpha", principals=ALL)) == 3
    with pytest.raises(InvalidInput, match=r"filter 'lang': unknown operator '\$regex'"):
        db.search("alpha", filter={"lang": {"$regex": "x"}})
    with pytest.raises(InvalidInput):
        db.search("alpha", filter={"lang": []})
    with pytest.raises(InvalidInput):
        db.search("alpha", filter="lang=zh")  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="timestamp"):
        db.search("alpha", since="last tuesday")


def test_principals_deny_unlabeled_when_public_unlabeled_off(closed_db):
    db = closed_db
    assert srcs(db.search("alpha", principals=["user:bob"])) == [("docs/b.md", None)]
    assert srcs(db.search("alpha", principals=["team:a", "user:bob"])) in (
        [("a", "2"), ("docs/b.md", None)], [("docs/b.md", None), ("a", "2")])
    assert db.search("alpha", principals=[]) == []
    assert db.search("alpha", principals=["nobody"]) == []
    assert db.search("alpha") == []  # the anonymous caller: nothing is public
    assert len(db.search("alpha", principals=ALL)) == 3


def test_principals_see_unlabeled_by_default(db):
    """A new database has public_unlabeled on: a document without labels is seen by every caller."""
    assert srcs(db.search("alpha", principals=["user:bob"])) in (
        [("docs/b.md", None), ("docs/c.md", None)], [("docs/c.md", None), ("docs/b.md", None)])
    assert srcs(db.search("alpha", principals=[])) == [("docs/c.md", None)]
    assert srcs(db.search("alpha", principals=["nobody"])) == [("docs/c.md", None)]
    assert srcs(db.search("alpha")) == [("docs/c.md", None)]  # anonymous: the public documents only


def test_public_unlabeled_setting(tmp_path):
    with ragdb.open(tmp_path / "p.db", public_unlabeled=True) as d:
        d.add("alpha", source="open")
        d.add("alpha", source="closed", acl=["g"])
        assert srcs(d.search("alpha", principals=["other"])) == [("open", None)]


def test_filter_applies_before_the_cut():
    with ragdb.open(":memory:") as d:
        # 200 strong matches in group "big", 10 weak matches in group "small"
        d.add_many([{"text": "needle needle needle", "source": f"big{i:03}", "metadata": {"g": "big"}}
                    for i in range(200)])
        d.add_many([{"text": "needle hay hay hay hay hay hay", "source": f"small{i:02}", "metadata": {"g": "small"}}
                    for i in range(10)])
        hits = d.search("needle", k=10, filter={"g": "small"}, collapse=False)  # identical texts: every copy
        assert len(hits) == 10 and all(h.source.startswith("small") for h in hits)
        assert len(d.search("needle", k=50, filter={"g": "small"}, collapse=False)) == 10


def test_replace_without_keeping_versions_drops_old(tmp_path):
    with ragdb.open(tmp_path / "r.db") as d:
        d.add("alpha one", source="s", version="1")
        d.add("alpha two", source="s", version="2")
        assert srcs(d.search("alpha", versions="all")) == [("s", "2")]
        assert d.stats().stored_documents == 1


def test_statistics_count_latest_versions_only():
    with ragdb.open(":memory:", keep_versions=True) as kept, ragdb.open(":memory:") as fresh:
        kept.add("apple banana cherry", source="s", version="1")
        kept.add("apple durian", source="s", version="2")
        kept.add("apple elderberry fig", source="t")
        fresh.add("apple durian", source="s", version="2")
        fresh.add("apple elderberry fig", source="t")
        for q in ("apple", "durian fig", "banana"):
            a = [(h.source, h.score) for h in kept.search(q)]
            b = [(h.source, h.score) for h in fresh.search(q)]
            assert a == b
        assert kept.stats().documents == 2 and kept.stats().stored_documents == 3
        assert kept.check() == []


def test_deleting_latest_promotes_previous_version():
    with ragdb.open(":memory:", keep_versions=True) as d:
        d.add("apple one", source="s", version="1")
        v2 = d.add("apple two", source="s", version="2")
        d.delete(v2.id)
        assert srcs(d.search("apple")) == [("s", "1")]
        assert d.check() == []


def test_migration_from_schema_1_backfills_filter_index(tmp_path):
    path = tmp_path / "old.db"
    with ragdb.open(path) as d:
        d.add("alpha beta", source="a", metadata={"lang": "en", "tags": ["t1"]}, acl=["g1"])
        d.add("alpha gamma", source="b", metadata={"lang": "zh"})
    # Turn it into a schema-1 database: drop what 0002 made and forget it was applied.
    conn = sqlite3.connect(path)
    for stmt in ("DROP TABLE doc_meta", "DROP TABLE doc_acl"):
        conn.execute(stmt)
    # and every later migration of doc_meta, which 0002 makes again
    later = [p.stem for p in migration_files() if p.stem.endswith("_filter_operators")]
    conn.execute("DELETE FROM _sqlite_migrations WHERE name = '0002_filters'")
    conn.executemany("DELETE FROM _sqlite_migrations WHERE name = ?", [(n,) for n in later])
    conn.commit()
    conn.close()
    with ragdb.open(path) as d:
        assert srcs(d.search("alpha", filter={"lang": "zh"})) == [("b", None)]
        assert srcs(d.search("alpha", filter={"tags": "t1"}, principals=ALL)) == [("a", None)]
        # a's label came back: g1 sees it (and b, unlabeled: public), the anonymous caller only b
        assert sorted(srcs(d.search("alpha", principals=["g1"]))) == [("a", None), ("b", None)]
        assert srcs(d.search("alpha")) == [("b", None)]
        assert d.check() == []
    names = [p.stem for p in migration_files()]
    conn = sqlite3.connect(path)
    applied = [r[0] for r in conn.execute("SELECT name FROM _sqlite_migrations ORDER BY id")]
    assert sorted(applied) == names


LABELS = ["a", "b", "c", "d"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops=st.lists(st.tuples(
        st.sampled_from(["add", "delete", "search"]),
        st.integers(0, 6),
        st.lists(st.sampled_from(LABELS), max_size=2),
        st.lists(st.sampled_from(LABELS), max_size=3),
    ), min_size=1, max_size=25),
    public=st.booleans(),
    keep=st.booleans(),
)
def test_filters_never_leak(ops, public, keep):
    """No sequence of adds, deletes and searches returns a chunk outside the caller's principals."""
    acl_of: dict[int, set[str]] = {}
    with ragdb.open(":memory:", public_unlabeled=public, keep_versions=keep, chunker="window:size=3,overlap=1") as d:
        for op, key, labels, principals in ops:
            if op == "add":
                doc = d.add(f"shared words doc{key} " + " ".join(labels) + f" v{len(acl_of)}",
                            source=f"s{key}", acl=labels)
                acl_of[doc.id] = set(labels)
            elif op == "delete":
                d.delete(source=f"s{key}")
            else:
                for versions in ("latest", "all"):
                    for h in d.search("shared words doc1 doc2 a b", k=50, principals=principals,
                                      versions=versions):
                        labels_h = acl_of[h.doc_id]
                        assert labels_h & set(principals) or (public and not labels_h)
        assert d.check() == []
