"""A bulk load pauses Python's cyclic collector while it writes (collector_paused) and leaves it
as it found it; single adds never touch it."""

from __future__ import annotations

import gc

import pytest

import ragdb
from ragdb.engine.write import collector_paused


@pytest.fixture
def collector_on():
    was = gc.isenabled()
    gc.enable()
    yield
    # as it was, whatever the test did (one switches it off: left so, every later test of the
    # session ran without the collector)
    if was:
        gc.enable()
    else:
        gc.disable()


def _records(seen: list[bool], n: int):
    for i in range(n):
        seen.append(gc.isenabled())
        yield {"text": f"document number {i} about topic {i % 3}", "source": f"s{i}"}


def test_a_bulk_load_pauses_the_collector_and_switches_it_on_again(tmp_path, collector_on):
    db = ragdb.open(tmp_path / "a.db")
    seen: list[bool] = []
    report = db.add_many(_records(seen, 12), batch_size=2, workers=0)
    assert len(report.added) == 12
    assert seen[0] is True and False in seen  # paused from its second batch on
    assert gc.isenabled()


def test_a_load_of_one_batch_leaves_the_collector_alone(tmp_path, collector_on):
    db = ragdb.open(tmp_path / "a.db")
    seen: list[bool] = []
    db.add_many(_records(seen, 3), batch_size=10, workers=0)
    db.add("one more", source="x")
    assert all(seen) and gc.isenabled()


def test_a_collector_switched_off_stays_off(tmp_path, collector_on):
    db = ragdb.open(tmp_path / "a.db")
    gc.disable()
    db.add_many(_records([], 8), batch_size=2, workers=0)
    assert not gc.isenabled()


def test_a_failing_load_switches_it_on_again(tmp_path, collector_on):
    db = ragdb.open(tmp_path / "a.db")

    def records():
        yield from _records([], 6)
        yield {"text": ""}  # invalid: raises after the batches before it were written

    with pytest.raises(ragdb.errors.InvalidInput):
        db.add_many(records(), batch_size=2, workers=0)
    assert gc.isenabled()


def test_overlapping_pauses_end_with_the_last(collector_on):
    first, second = collector_paused(), collector_paused()
    first.__enter__()
    second.__enter__()
    assert not gc.isenabled()
    first.__exit__(None, None, None)
    assert not gc.isenabled()
    second.__exit__(None, None, None)
    assert gc.isenabled()
