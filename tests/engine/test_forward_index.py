"""A write's forward indexes are made for the whole batch at once (forward_indexes): the same
blobs and lengths as forward_index gives each chunk, whatever its counts."""

from __future__ import annotations

from array import array

from hypothesis import given, settings
from hypothesis import strategies as st

from ragdb.engine.write import forward_index, forward_indexes
from ragdb.index import kernel
from ragdb.text.analysis import Analyzer, PackedCounts, TermCounts

terms = st.text(min_size=1, max_size=6)
counts = st.dictionaries(terms, st.one_of(st.integers(1, 300), st.integers(1, 200_000)), max_size=12)
fields = st.one_of(st.none(), st.dictionaries(terms.map(lambda t: "\x01t" + t), st.integers(1, 70_000), max_size=4))


def _as(kind: str, c: dict[str, int], overlaps: int):
    if kind == "packed":
        return PackedCounts(tuple(c), array("I", c.values()), overlaps)
    if kind == "term":
        out = TermCounts(c)
        out.overlaps = overlaps
        return out
    return dict(c)


@settings(max_examples=200, deadline=None)
@given(chunks=st.lists(st.tuples(counts, fields, st.sampled_from(["packed", "term", "dict"]), st.integers(0, 3)),
                       max_size=8))
def test_the_batch_gives_each_chunk_what_forward_index_gives(chunks):
    items = [(_as(kind, c, min(overlaps, sum(c.values()))), f) for c, f, kind, overlaps in chunks]
    ids = {t: i + 1 for i, t in enumerate(sorted({t for c, f in items for t in (*c, *(f or ()))}))}
    assert forward_indexes(items, ids) == [forward_index(c, ids, f) for c, f in items]


def test_a_count_past_uint32_is_capped_as_forward_index_caps_it():
    items = [({"a": 1 << 40, "b": 2}, None), ({"c": 7}, {"\x01tx": 1})]
    ids = {"a": 1, "b": 2, "c": 3, "\x01tx": 4}
    assert forward_indexes(items, ids) == [forward_index(c, ids, f) for c, f in items]


def test_real_text_counts_agree():
    analyzer = Analyzer()
    texts = ["Node.js and C++ in x86_64; the e-mail said U.S.A. twice, node.js again.",
             "北京是中国的首都。北京大学 and Beijing", "", "..."]
    items = [(analyzer.term_counts(t), None) for t in texts]
    ids = {t: i for i, t in enumerate(sorted({t for c, _f in items for t in c}))}
    assert forward_indexes(items, ids) == [forward_index(c, ids, f) for c, f in items]


def _numbered(vocabulary, terms_counts):
    """PackedCounts as a worker's result gives them: numbers in ``vocabulary`` (grown here)."""
    from ragdb.text.analysis import PackedCounts

    numbers = array("I")
    for t in terms_counts:
        known = vocabulary.names.many(range(len(vocabulary.names)))
        if t not in known:
            vocabulary.names.add(t)  # (a result's new terms, here one at a time)
            known.append(t)
        numbers.append(known.index(t))
    return PackedCounts(None, array("I", terms_counts.values()), 0, numbers, vocabulary)


def test_numbered_counts_map_through_the_cached_ids_until_the_index_token_changes():
    from ragdb.engine.write import _NumberedTerms
    from ragdb.index.terms import TermDict
    from ragdb.text.analysis import WorkerVocabulary

    vocabulary = WorkerVocabulary()
    chunks = [_numbered(vocabulary, {"b": 2, "a": 1}), {"c": 1, "a": 4}, _numbered(vocabulary, {"c": 3})]
    old, new = object(), object()
    steps = [(old, {"a": 1, "b": 2, "c": 3}, {"a", "b", "c"}),
             (old, {"a": 1, "b": 2, "c": 3}, set()),  # cached: nothing looked up again
             (new, {"a": 7, "b": 5, "c": 9}, {"a", "b", "c"})]  # term ids changed (a vocabulary clean-up)
    for token, ids, unknown in steps:
        numbered = _NumberedTerms(chunks, token)
        assert numbered.positions == {0, 2}
        assert set(numbered.unknown_terms()) == unknown
        numbered.resolve(TermDict(ids))
        items = [(c, None) for c in chunks]
        assert forward_indexes(items, ids, numbered.term_ids()) == [forward_index(c, ids) for c, _f in items]


@settings(max_examples=200, deadline=None)
@given(chunk=st.tuples(counts, fields, st.sampled_from(["packed", "term", "dict"]), st.integers(0, 3)),
       base=st.sampled_from([0, 1 << 20, (1 << 32) - 200]))
def test_a_single_chunk_packs_as_in_a_batch_in_each_kernel(chunk, base):
    """A single add's one chunk takes its own path (``pack_forward_one``): the same blobs, length
    and decoded ids and tfs as the chunk gets in a batch, with either kernel."""
    c, f, kind, overlaps = chunk
    item = (_as(kind, c, min(overlaps, sum(c.values()))), f)
    names = sorted({*c, *(f or ())})
    ids = {t: base + 7 * i for i, t in enumerate(reversed(names))}  # ids not in the analyzer's order
    for name in ("compiled", "numpy"):
        before = kernel.use(name)
        try:
            one: list = []
            two: list = []
            got = forward_indexes([item], ids, decoded=one)
            assert got == forward_indexes([item, item], ids, decoded=two)[:1] == [forward_index(item[0], ids, f)]
            assert len(one) == 1
            for a, b in zip(one[0], two[0]):
                assert a.dtype == b.dtype and a.tolist() == b.tolist()
        finally:
            kernel.use(before)
