"""The generation cache behind a search's hit fields and passage shingles
(``ragdb.index.cache.GenerationCache``): bounded by what its entries count for, first in first
out a generation at a time, an entry put again taking the old one's place."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from hypothesis import given, settings, strategies as st

from ragdb.index.cache import GenerationCache


def sized(value: tuple[int, int]) -> int:
    return value[1]


@settings(deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(1, 30)), max_size=300),
       st.integers(20, 400), st.integers(2, 6))
def test_the_cache_keeps_the_newest_entries_within_its_capacity(puts, capacity, generations):
    """Against a model: the entries held are those of the last puts, in order, back to some
    point (a generation's start), each key's newest; the count is within the capacity and, once
    full, not below what the generations but the one being filled hold: each closed when the
    next entry did not fit in it, so each holds more than its share less that entry (an earlier
    bound, capacity - 2 shares, held only for entries small next to a share: hypothesis found
    generations of 29 units closed by entries of up to 29)."""
    cache: GenerationCache[int, tuple[int, int]] = GenerationCache(capacity, sized, generations)
    put: list[tuple[int, tuple[int, int] | None]] = []  # None: a put too large to keep
    for n, (key, size) in enumerate(puts):
        value = (n, size)  # (distinct values: identity tells a put again from the first)
        cache.put(key, value)
        put.append((key, value if size <= cache.share else None))
        assert cache.units() <= capacity
        # what is held: the newest value of each key among a suffix of the puts kept
        held = cache.get_many(range(41))
        assert len(held) == len(cache)
        for k, v in held.items():
            assert cache.get(k) is v and k in cache
            assert v == next(val for key_, val in reversed(put) if key_ == k)  # its newest
        if held:
            first = min(v[0] for v in held.values())
            newest = dict(put[first:])  # (later puts overwrite earlier)
            assert held == {k: v for k, v in newest.items() if v is not None}
        # what the cache counts: every kept put (the newest generation's counted as they come)
        assert cache.units() >= sum(v[1] for v in held.values())
    kept = [s for _k, s in puts if s <= cache.share]
    if sum(kept) > capacity:  # it filled once at least: an oldest generation was dropped
        assert cache.units() >= (generations - 1) * (cache.share - max(kept) + 1)


def test_an_entry_larger_than_a_generation_is_not_kept():
    cache: GenerationCache[str, tuple[int, int]] = GenerationCache(100, sized, 4)
    cache.put("small", (0, 25))
    cache.put("large", (1, 26))
    assert cache.get("small") == (0, 25) and cache.get("large") is None and len(cache) == 1
    cache.put("small", (2, 26))  # (its entry before goes too: it is no longer the key's)
    assert cache.get("small") is None and len(cache) == 0


def test_a_key_put_again_keeps_its_new_value_when_the_old_generation_goes():
    cache: GenerationCache[str, tuple[int, int]] = GenerationCache(40, sized, 2)  # generations of 20
    cache.put("a", (0, 15))
    cache.put("b", (1, 10))  # a new generation: "a" in the older one
    cache.put("a", (2, 5))   # "a" again, in the newest
    cache.put("c", (3, 10))  # the generation of the first "a" goes
    assert cache.get("a") == (2, 5) and cache.get("b") == (1, 10) and cache.get("c") == (3, 10)
    assert cache.pop("a") == (2, 5) and "a" not in cache and cache.get("a") is None
    cache.clear()
    assert len(cache) == 0 and cache.units() == 0 and cache.get_many(["b", "c"]) == {}


def test_fewer_than_two_generations_are_refused():
    with pytest.raises(ValueError, match="two generations"):
        GenerationCache(100, sized, 1)


def in_threads(work: Callable[[int], None], n: int = 4) -> list[BaseException]:
    """Run ``work(0)`` ... ``work(n - 1)`` in ``n`` threads at once; what they raised."""
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            work(i)
        except BaseException as e:  # noqa: BLE001 - returned to the test
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def test_threads_sharing_the_cache_find_only_what_was_put():
    """Threads putting and reading at once (as searches on one handle do, without a lock):
    nothing raises, every entry found is one that was put for its key, and the cache stays
    within its capacity (plus an entry a thread may add while another starts a generation)."""
    cache: GenerationCache[int, tuple[int, int]] = GenerationCache(2_000, sized, 4)

    def work(seed: int) -> None:
        for n in range(20_000):
            key = (n * 7919 + seed * 104_729) % 600
            cache.put(key, (key, 1 + key % 7))
            for k, v in cache.get_many(range(key, key + 20)).items():
                assert v == (k, 1 + k % 7)
            assert cache.units() <= 2_000 + 4 * 7

    errors = in_threads(work)
    assert not errors, errors


def test_threads_searching_one_handle_through_small_caches_get_one_threads_hits(tmp_path, monkeypatch):
    """Four threads search one handle whose hit and shingle caches hold a few passages each
    (every search starts generations and drops them, while the other threads read): each
    search returns what one thread with the default caches does, texts, scores and the copies
    folded into each hit included."""
    import random

    import ragdb
    from ragdb.engine import search
    from ragdb.index import inverted

    rng = random.Random(7)
    vocab = [f"w{i}" for i in range(300)]
    records = []
    for i in range(120):
        words = " ".join(rng.choices(vocab, k=60))
        records.append({"text": f"Passage {i}. {words}.", "source": f"p{i}.md"})
        if i % 3 == 0:  # a copy as HTML: folded into the Markdown one's hit
            records.append({"text": f"<p>Passage {i}. {words}.</p>", "source": f"p{i}.html"})
    queries = [" ".join(rng.choices(vocab, k=3)) for _ in range(40)]

    def answer(db, q):
        return [(h.chunk_id, h.score, h.text, [d.chunk_id for d in h.duplicates]) for h in db.search(q, k=15)]

    path = str(tmp_path / "kb.db")
    with ragdb.open(path, chunker="none") as db:
        db.add_many(records)
        want = {q: answer(db, q) for q in queries}
    assert any(d for hits in want.values() for *_rest, d in hits)  # (copies were folded)
    monkeypatch.setattr(inverted, "HIT_CACHE_BYTES", 20_000)  # ~25 passages' fields
    monkeypatch.setattr(search, "SHINGLES_KEPT", 600)         # ~10 passages' shingles
    wrong: list[object] = []
    with ragdb.open(path) as db:

        def work(seed: int) -> None:
            order = random.Random(seed).sample(queries, len(queries))
            for q in order * 3:
                got = answer(db, q)
                if got != want[q]:
                    wrong.append((q, got, want[q]))

        wrong += in_threads(work)
        met = {c for hits in want.values() for c, *_rest in hits}
        assert len(db._engine.index._rows) < len(met) and len(db._searcher._shingles) < len(met)  # (they dropped some)
        assert db._engine.index._rows.units() <= 20_000 + 4 * 2_000  # (a thread's entry or two past it)
    assert not wrong, wrong[:1]
