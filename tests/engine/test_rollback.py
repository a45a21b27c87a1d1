"""What a rolled-back transaction leaves behind: nothing. A handle that saw the undone writes
searches afterwards exactly as a reopened handle and a fresh build of the surviving documents
do, even when later writes bring the file to the undone write's generation again."""

from __future__ import annotations

import pytest

import ragdb


def results(db, query, **kw):
    return [(h.source, round(h.score, 9)) for h in db.search(query, k=10, **kw)]


def fresh(records, query, **kw):
    with ragdb.open(":memory:") as db:
        db.add_many(records)
        return results(db, query, **kw)


def undone(db, write, search):
    """``write`` then ``search`` inside a transaction that rolls back."""
    with pytest.raises(RuntimeError), db.transaction():
        write()
        search()
        raise RuntimeError("undo")


def test_field_terms_seen_in_an_undone_write_do_not_hide_a_title_written_after(tmp_path):
    """A search inside the transaction found no title terms (generation g+1); the rollback
    undid it, and a titled document brought the file to g+1 again: the handle's search once
    left the title out (its cache of which fields hold terms was keyed by the generation)."""
    path = tmp_path / "kb.db"
    with ragdb.open(path) as db:
        db.add("alpha beta", source="x")
        undone(db, lambda: db.add("gamma", source="y"), lambda: db.search("install"))
        db.add("delta", source="z", title="install guide")
        got = results(db, "install")
    with ragdb.open(path) as again:
        assert results(again, "install") == got
    want = fresh([{"text": "alpha beta", "source": "x"},
                  {"text": "delta", "source": "z", "title": "install guide"}], "install")
    assert got == want and [s for s, _ in got] == ["z"]


def test_a_metadata_key_of_an_undone_write_is_no_field_after_it(tmp_path):
    """Inside the transaction ``lang`` was a metadata key, so ``lang:en`` a field filter; after
    the rollback no document has it, and ``lang:en`` is words again (it stayed a filter)."""
    path = tmp_path / "kb.db"
    with ragdb.open(path) as db:
        db.add("lang en alpha", source="x")
        undone(db, lambda: db.add("beta", source="y", metadata={"lang": "en"}), lambda: db.search("lang:en"))
        db.add("gamma lang en", source="z")
        got = results(db, "lang:en")
        assert db.query_plan("lang:en").filters == ()
    with ragdb.open(path) as again:
        assert results(again, "lang:en") == got
    assert got == fresh([{"text": "lang en alpha", "source": "x"}, {"text": "gamma lang en", "source": "z"}],
                        "lang:en")
    assert sorted(s for s, _ in got) == ["x", "z"]


@pytest.mark.parametrize("make_other", [True, False])
def test_a_collection_whose_creation_was_undone_is_gone_for_its_handle(tmp_path, make_other):
    """A collection made inside a transaction that rolled back: its id is handed out again
    (the AUTOINCREMENT counter rolls back too), and its handle once read and wrote the next
    collection's documents. The handle now raises CollectionNotFound, and the collection made
    after keeps what was written to it alone."""
    from ragdb.errors import CollectionNotFound

    path = tmp_path / "kb.db"
    with ragdb.open(path) as db:
        with pytest.raises(RuntimeError), db.transaction():
            c1 = db.collection("c1")
            c1.add("alpha beta", source="a")
            raise RuntimeError("undo")
        assert [c.name for c in db.collections()] == ["default"]
        if make_other:
            c3 = db.collection("c3")
            c3.add("gamma delta", source="secret-of-c3")
        for call in (lambda: c1.search("gamma"), lambda: c1.add("via c1", source="from-c1"), lambda: c1.documents(),
                     lambda: c1.count()):
            with pytest.raises(CollectionNotFound):
                call()
        if make_other:
            assert [d.source for d in c3.documents()] == ["secret-of-c3"] and c3.check() == []
        again = db.collection("c1")  # made again by its name: a collection of its own
        again.add("epsilon", source="e")
        assert [d.source for d in again.documents()] == ["e"] and db.check() == []
