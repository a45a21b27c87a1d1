"""A cache bounded by a size, whose entries leave in generations: what a search keeps of the
chunks it met (hit fields, :meth:`ragdb.index.inverted.Index.hit_protos`; passage shingles,
``ragdb.engine.search.Searcher``) for the next searches.

The entries live in one dict, looked up in one comprehension a search (:meth:`get_many`). Each
entry put also goes into the newest of a few generations (its key and value appended to two
lists). When the newest holds its share of the capacity, a new generation starts, and with
``generations`` of them the oldest goes: its keys are dropped from the dict, with no size to
compute again. First in, first out, a generation at a time: with four generations the cache
holds between 3/4 of its capacity and all of it, for entries small next to a generation's share
(as hits and shingles are: a generation closes when the next entry does not fit in it).

Why not the dict alone, cut to 3/4 when full (what both caches were): the cut walked the oldest
quarter of the entries in Python computing each one's size, then (the shingles) copied the rest
into a new dict and counted them again. That cost 2-3.5 ms in about one search of 25 at the
realistic 100k corpus, for each cache (~8% of searches, the ones its p95 is made of).

Why not one dict per generation: a search's hits were then looked up in up to four dicts
(10k, most hits cached: p50 +5-10%); moving the hits found in older generations into the newest
(an LRU's order) cost more than the hits it kept (184 moves a search at 100k, ~0.5 ms), and the
hit rate did not change.

Why not a library: ``functools.lru_cache`` is bounded by a count, not a size; cachetools'
``LRUCache`` and ``FIFOCache`` take a ``getsizeof`` but go through Python code for every
lookup and evict one entry at a time.

Threads sharing a handle use one cache; only starting a generation takes a lock (without it,
two threads could each start one and leave five generations for good: the threads test caught
the count over its bound). Lookups and puts are one or two dict or
list operations each, atomic under the GIL: a race can lose an entry (a miss later) or
miscount one until its generation goes, never return a wrong one (an entry leaves with its
generation only where the dict still holds that very value).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Iterable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

__all__ = ["GenerationCache"]


class GenerationCache(Generic[K, V]):
    """At most ``capacity`` units (what ``size_of`` counts of an entry: bytes, shingles) of
    entries in ``generations`` generations. An entry larger than one generation's share
    (``capacity // generations``) is not kept (nor the key's entry before it)."""

    def __init__(self, capacity: int, size_of: Callable[[V], int], generations: int = 4) -> None:
        if generations < 2:
            raise ValueError("a generation cache needs at least two generations")
        self.capacity = capacity
        self.generations = generations
        #: the units a generation takes before a new one starts
        self.share = max(1, capacity // generations)
        self._size_of = size_of
        self._entries: dict[K, V] = {}
        self._gens: list[tuple[list[K], list[V]]] = [([], [])]  # (keys, values) put, oldest first
        self._units: list[int] = [0]  # what each generation counts for, oldest first
        self._rotating = threading.Lock()  # (taken to start a generation only: not on lookups)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def units(self) -> int:
        """The units the cache counts as held: of every entry put in the generations kept (an
        entry put again, or popped, counts until its generation goes)."""
        return sum(self._units)

    def get(self, key: K) -> V | None:
        return self._entries.get(key)

    def get_many(self, keys: Iterable[K]) -> dict[K, V]:
        """key -> entry of those of ``keys`` the cache holds."""
        entries = self._entries
        return {k: v for k in keys if (v := entries.get(k)) is not None}

    def put(self, key: K, value: V) -> None:
        """Keep ``value`` for ``key`` (in place of any entry it had)."""
        size = self._size_of(value)
        if size > self.share:
            self._entries.pop(key, None)
            return
        if self._units[-1] + size > self.share and self._gens[-1][0]:
            with self._rotating:
                if self._units[-1] + size > self.share and self._gens[-1][0]:  # (not started by another thread)
                    while len(self._gens) >= self.generations:
                        self._drop_oldest()
                    self._gens.append(([], []))
                    self._units.append(0)
        keys, values = self._gens[-1]
        keys.append(key)
        values.append(value)
        self._entries[key] = value
        self._units[-1] += size

    def _drop_oldest(self) -> None:
        keys, values = self._gens.pop(0)
        self._units.pop(0)
        entries = self._entries
        for k, v in zip(keys, values):
            if entries.get(k) is v:  # (not put again since)
                entries.pop(k, None)

    def pop(self, key: K) -> V | None:
        """Drop the entry of ``key``; it, or None."""
        return self._entries.pop(key, None)

    def clear(self) -> None:
        with self._rotating:
            self._entries = {}
            self._gens = [([], [])]
            self._units = [0]
