"""A bulk load's tail sealed between flushes (``ragdb.database.BULK_SEAL_CHUNKS``,
``Index.seal_tail``): the load answers as one-by-one adds of the same documents do, from the
writer, a second handle, a reopened file and a fresh process, and a load that stops at a bad
record leaves sealed chunks that searches, deletes, ``check()`` and the next flush handle."""

from __future__ import annotations

import subprocess
import sys

import pytest

import ragdb
from ragdb.errors import RagdbError

from bulk_helpers import QUERIES, seal_hits as _hits, seal_records as _records


def _fresh(tmp_path, records, name: str = "fresh.db") -> list:
    with ragdb.open(tmp_path / name, chunker="none") as fresh:
        for r in records:
            fresh.add(r["text"], source=r["source"])
        return _hits(fresh)


def _in_fresh_process(path) -> list:
    code = ("import json, sys, ragdb\n"
            f"db = ragdb.open({str(path)!r})\n"
            f"print(json.dumps([[(h.source, round(h.score, 9)) for h in db.search(q, k=50)] for q in {QUERIES!r}]))\n"
            "print(json.dumps(db.check()))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    import json
    return [[tuple(h) for h in q] for q in json.loads(out[0])] + [json.loads(out[1])]


@pytest.mark.parametrize("flush", [11, 1000])
def test_a_sealed_bulk_load_answers_as_one_by_one_adds(tmp_path, monkeypatch, each_kernel, flush):
    from ragdb import database

    monkeypatch.setattr(database, "BULK_SEAL_CHUNKS", 3)
    monkeypatch.setattr(database, "BULK_FLUSH_CHUNKS", flush)  # 11: flushes of sealed parts in mid-load
    records = _records(60)
    path = tmp_path / "kb.db"
    with ragdb.open(path, chunker="none") as db, ragdb.open(path) as other:
        other.search("retrieval")  # opened before the load: catches up after it
        db.add_many(records, batch_size=2, workers=0)
        s = db.stats()
        if flush == 11:
            assert s.pending_chunks == 0 and s.segments == s.vocabulary
        else:  # (a load below the flush threshold leaves its tail sealed, unflushed)
            assert s.pending_chunks == 60 and s.segments == 0
        assert db.check() == []
        want = _fresh(tmp_path, records)
        assert _hits(db) == want
        assert _hits(other) == want
    with ragdb.open(path) as db:
        assert _hits(db) == want
    assert _in_fresh_process(path) == [*want, []]


def test_a_bulk_load_stopped_by_a_bad_record_leaves_its_sealed_chunks_searchable(tmp_path, monkeypatch,
                                                                                each_kernel):
    from ragdb import database

    monkeypatch.setattr(database, "BULK_SEAL_CHUNKS", 3)
    monkeypatch.setattr(database, "BULK_FLUSH_CHUNKS", 1000)  # nothing flushes: the tail stays sealed
    records = _records(25)
    path = tmp_path / "kb.db"
    with ragdb.open(path, chunker="none") as db:
        with pytest.raises(RagdbError):
            db.add_many([*records, {"text": 42, "source": "bad"}, *_records(30)[25:]], batch_size=2, workers=0)
        stored = {d.source for d in db.documents()}
        written = [r for r in records if r["source"] in stored]
        assert len(written) >= 20  # the batches before the bad record were written
        assert db.stats().pending_chunks == len(written)
        assert db.check() == []
        assert _hits(db) == _fresh(tmp_path, written)
        with ragdb.open(path) as other:
            assert _hits(other) == _hits(db)
        # deleting documents whose chunks are sealed (the first), and one of the last
        for source in ("s0", "s4", written[-1]["source"]):
            assert db.delete(source=source) == 1
        kept = [r for r in written if r["source"] not in ("s0", "s4", written[-1]["source"])]
        assert db.check() == []
        want = _fresh(tmp_path, kept, "fresh2.db")
        assert _hits(db) == want
        db.add("word7 again", source="after")  # appended after the sealed parts
        kept.append({"text": "word7 again", "source": "after"})
        want = _fresh(tmp_path, kept, "fresh3.db")
        assert _hits(db) == want and db.check() == []
        assert _in_fresh_process(path) == [*want, []]
        db.optimize()  # the flush of the sealed parts and the entries after them
        assert db.stats().pending_chunks == 0 and db.check() == []
        assert _hits(db) == want
    assert _in_fresh_process(path) == [*want, []]


def test_an_interrupt_inside_a_seal_drops_the_view_and_loses_nothing(tmp_path, monkeypatch):
    """A KeyboardInterrupt in the middle of ``Index.seal_tail`` (here: while it reads the
    entries' chunk ids, after grouping them) leaves no chunk both sealed and still an entry:
    the handle reloads its view from the file, and the next flush writes each posting once."""
    import numpy as np

    from ragdb import database
    from ragdb.index import inverted

    monkeypatch.setattr(database, "BULK_SEAL_CHUNKS", 3)
    monkeypatch.setattr(database, "BULK_FLUSH_CHUNKS", 1000)
    real_seal, real_fromiter, calls = inverted.Index.seal_tail, np.fromiter, []

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    def seal(self):
        calls.append(1)
        if len(calls) != 2:
            return real_seal(self)
        monkeypatch.setattr(np, "fromiter", interrupted)
        try:
            return real_seal(self)
        finally:
            monkeypatch.setattr(np, "fromiter", real_fromiter)

    monkeypatch.setattr(inverted.Index, "seal_tail", seal)
    records = _records(12)
    path = tmp_path / "kb.db"
    with ragdb.open(path, chunker="none") as db:
        with pytest.raises(KeyboardInterrupt):
            db.add_many(records, batch_size=2, workers=0)
        stored = {d.source for d in db.documents()}
        written = [r for r in records if r["source"] in stored]
        want = _fresh(tmp_path, written)
        assert _hits(db) == want and db.check() == []
        db.optimize()
        assert db.check() == [] and _hits(db) == want
    assert _in_fresh_process(path) == [*want, []]
