"""The compiled scoring kernel (ragdb/index/ckernel.pyx) against the numpy reference: the same
hits in the same order with the same scores, bit for bit, under filters, principals,
exclusions, phrases, fields, boosts, prefixes, fuzzy words, min_score, explain and any k; and
how the kernel is chosen (RAGDB_KERNEL, ``ragdb --version``, ``ragdb stats``)."""

import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ragdb
from ragdb.errors import InvalidInput
from ragdb.index import kernel

from cli_helpers import ROOT

compiled_only = pytest.mark.skipif("compiled" not in kernel.available() and os.environ.get("CI") != "true",
                                   reason="the compiled kernel is not installed")

WORDS = ["retrieval", "index", "document", "deleted", "search", "model", "answer", "evidence", "apple",
         "检索", "增强", "生成", "知识库", "向量"]

docs_ = st.lists(st.tuples(st.lists(st.sampled_from(WORDS), min_size=1, max_size=12).map(" ".join),
                           st.sampled_from(["", "Retrieval guide", "Apple notes", "知识库 说明"]),
                           st.integers(0, 2), st.sampled_from([(), ("a",), ("b",), ("a", "b")])),
                 min_size=1, max_size=25)
word_ = st.sampled_from(WORDS + ["retriev*", "docum*", "serch~", "evidense~", "title:apple", "title:retrieval"])
query_ = st.lists(st.one_of(word_, word_.map(lambda w: f"{w}^2" if "~" not in w and "*" not in w else w),
                            st.sampled_from(WORDS).map(lambda w: f"-{w}"),
                            st.tuples(st.sampled_from(WORDS), st.sampled_from(WORDS)).map(lambda p: f'"{p[0]} {p[1]}"'),
                            st.just("OR")),
                  min_size=1, max_size=5).map(" ".join)
options_ = st.fixed_dictionaries({}, optional={
    "k": st.integers(1, 12), "scorer": st.sampled_from(["bm25", "tfidf"]), "filter": st.sampled_from([{"g": 1}, {"g": {"$ne": 2}}]),
    "principals": st.sampled_from([ragdb.ALL, ["a"], ["b"], []]), "min_score": st.sampled_from([0.5, 2.0]),
    "explain": st.booleans(), "syntax": st.sampled_from(["plain", "query"]), "fuzzy": st.sampled_from([0, 1])})


def _run(db, queries, options):
    return [[(h.chunk_id, h.source, h.score, dict(h.explain), h.confidence) for h in db.search(q, **options)]
            for q in queries]


@compiled_only
@settings(max_examples=int(os.environ.get("RAGDB_HYPOTHESIS_EXAMPLES", "60")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(docs=docs_, queries=st.lists(query_, min_size=1, max_size=4), options=options_,
       deletes=st.lists(st.integers(0, 24), max_size=3))
def test_the_kernels_give_the_same_hits_order_and_scores(docs, queries, options, deletes):
    with ragdb.open(":memory:", chunker="none") as db:
        for i, (text, title, g, acl) in enumerate(docs):
            db.add(text, source=f"d{i:02d}", title=title or None, metadata={"g": g}, acl=list(acl))
        for d in deletes:
            db.delete(source=f"d{d:02d}")
        before = kernel.use("compiled")
        try:
            got = _run(db, queries, options)
            kernel.use("numpy")
            want = _run(db, queries, options)
        finally:
            kernel.use(before)
        assert got == want  # exact: chunk ids, order, float scores, explain, confidences


@compiled_only
def test_top_k_keeps_ties_at_the_cut_and_orders_equal_scores_by_id():
    from ragdb.index import ckernel

    scores = np.array([0.0, 2.0, 1.0, 2.0, 1.0, 3.0, 1.0, -1.0, 5.0])
    mask = np.array([1, 1, 1, 1, 1, 1, 1, 1, 0], np.uint8)
    ids, sc = ckernel.top_k(scores, mask, 4, -np.inf)  # the 4th best is 1.0: all three 1.0s stay
    assert ids.tolist() == [5, 1, 3, 2, 4, 6] and sc.tolist() == [3.0, 2.0, 2.0, 1.0, 1.0, 1.0]
    ids, sc = ckernel.top_k(scores, mask, 2, 2.5)  # the floor first, then k
    assert ids.tolist() == [5] and sc.tolist() == [3.0]
    ids, _ = ckernel.top_k(scores, mask, 100, -np.inf)  # never 0, negative or masked scores
    assert ids.tolist() == [5, 1, 3, 2, 4, 6]


@compiled_only
def test_a_posting_outside_the_scored_chunks_is_an_error_not_a_write_past_the_array():
    from ragdb.index import ckernel

    scores, norm = np.zeros(4), np.ones(4)
    with pytest.raises(IndexError):
        ckernel.bm25_accumulate(scores, norm, [(np.array([1, 4], np.uint32), np.array([1, 1], np.uint8))],
                                [1.0], [1.0], [False], 1.2)
    with pytest.raises(ValueError):  # ids and tfs of different lengths
        ckernel.bm25_accumulate(scores, norm, [(np.array([1, 2], np.int64), np.array([1], np.uint16))],
                                [1.0], [1.0], [False], 1.2)
    with pytest.raises(TypeError):  # a float array is no postings
        ckernel.bm25_accumulate(scores, norm, [(np.array([1.0]), np.array([1], np.uint16))],
                                [1.0], [1.0], [False], 1.2)


def test_an_unknown_kernel_is_refused():
    with pytest.raises(InvalidInput, match="unknown kernel"):
        kernel.use("fortran")


def _cli(args, env_kernel):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAGDB_KERNEL": env_kernel}
    return subprocess.run([sys.executable, "-c", "from ragdb.cli.main import main; main()", *args],
                          capture_output=True, text=True, env=env, check=True).stdout


def test_ragdb_version_and_stats_say_which_kernel_runs(tmp_path):
    assert "scoring kernel: numpy" in _cli(["--version"], "numpy")
    path = str(tmp_path / "kb.db")
    with ragdb.open(path) as db:
        db.add("one document", source="a")
    assert '"kernel": "numpy"' in _cli(["-d", path, "stats", "--json"], "numpy")
    if "compiled" in kernel.available():
        assert "scoring kernel: compiled" in _cli(["--version"], "")
        assert "compiled" in _cli(["-d", path, "stats"], "")


@compiled_only
@settings(max_examples=200, deadline=None)
@given(ids=st.lists(st.integers(0, 70), max_size=40, unique=True).map(sorted),
       mask=st.lists(st.booleans(), max_size=64), wide=st.booleans())
def test_any_allowed_agrees_with_numpy(ids, mask, wide):
    """The compiled early-stopping check of whether a mask allows one of a term's chunks, against
    numpy's gather; ids past the mask's end are never allowed, uint32 and int64 ids alike."""
    from ragdb.index import ckernel

    arr = np.array(ids, dtype=np.int64 if wide else np.uint32)
    m = np.array(mask, dtype=bool)
    expected = bool(np.any(m[arr[arr < len(m)].astype(np.intp)])) if len(arr) else False
    assert ckernel.any_allowed(arr, m.view(np.uint8)) is expected


@st.composite
def _scoring_inputs(draw):
    """Postings of a few terms over up to 3,000 chunks (sorted ids, tfs of 1-3 and lengths from
    a short list: many equal scores), a mask, k, a floor and weights (fields' units too)."""
    n = draw(st.integers(1, 3000))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    lengths = rng.choice(np.array([3, 5, 8, 13]), n).astype(np.float64)
    norm = 1.2 * (1 - 0.75 + 0.75 * lengths / lengths.mean())
    postings, idfs, weights, flats = [], [], [], []
    for _ in range(draw(st.integers(0, 7))):
        share = draw(st.sampled_from([0.001, 0.01, 0.1, 0.5, 0.9]))
        ids = np.flatnonzero(rng.random(n) < share)
        id_type = draw(st.sampled_from([np.uint32, np.int64]))
        tf_type = draw(st.sampled_from([np.uint8, np.uint16, np.int64]))
        postings.append(None if draw(st.integers(0, 9)) == 0 else
                        (ids.astype(id_type), rng.integers(1, 4, len(ids)).astype(tf_type)))
        idfs.append(float(np.log(1 + (n - len(ids) + 0.5) / (len(ids) + 0.5))))
        weights.append(draw(st.sampled_from([1.0, 1.0, 2.0, 0.5])))
        flats.append(draw(st.integers(0, 4)) == 0)
    mask = (rng.random(max(0, n + draw(st.integers(-5, 5)))) < draw(st.sampled_from([1.0, 0.9, 0.3, 0.01]))).astype(np.uint8)
    k = draw(st.integers(1, 120))
    floor = draw(st.sampled_from([-np.inf, 0.0, 0.5, 2.0, 5.0]))
    return norm, postings, idfs, weights, flats, mask, k, floor


@compiled_only
@settings(max_examples=int(os.environ.get("RAGDB_HYPOTHESIS_EXAMPLES", "300")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(inputs=_scoring_inputs())
def test_pruned_top_k_is_the_exhaustive_top_k(inputs):
    """``bm25_top_k`` against every posting scored then ``top_k``: the same ids, order and
    scores, bit for bit, with many ties, masks shorter and longer than the chunks, floors, any
    k; and its work array is left all zeros. Each of its ways (every window's terms split by
    their bounds where they allow it, MaxScore; no window split, every posting scored; and its
    own choice per window), in windows of 64 chunks (many windows, chunks left to each) and of
    8,192 (one), on the same inputs."""
    from ragdb.index import ckernel

    norm, postings, idfs, weights, flats, mask, k, floor = inputs
    n = len(norm)
    scores = np.empty(n)
    ckernel.bm25_accumulate(scores, norm, postings, idfs, weights, flats, 1.2)
    m = min(len(mask), n)
    expected = ckernel.top_k(scores[:m], mask[:m], k, floor)
    try:
        for window in (64, 8192):
            for mode in (1, 2, 0):  # pruned, in full, chosen
                ckernel._mode = mode
                ckernel._window = window
                acc = np.zeros(n)
                got = ckernel.bm25_top_k(acc, norm, postings, idfs, weights, flats, 1.2, mask, k, floor)
                assert got[0].tolist() == expected[0].tolist(), (mode, window)
                assert got[1].tolist() == expected[1].tolist(), (mode, window)
                assert not acc.any(), (mode, window)
    finally:
        ckernel._mode = 0
        ckernel._window = 8192


@compiled_only
@pytest.mark.parametrize("mode", [0, 1, 2])
def test_pruned_top_k_holds_exact_scores_to_the_floor_itself(mode):
    """A floor a rounding step above a chunk's score keeps it out, as ``top_k`` keeps it out:
    a window scored in full holds exact scores (it kept scores up to 1e-9 below the floor)."""
    from ragdb.index import ckernel

    n = 10
    norm = np.full(n, 1.2)
    postings = [(np.arange(n, dtype=np.uint32), np.ones(n, np.uint8))]
    scores = np.empty(n)
    ckernel.bm25_accumulate(scores, norm, postings, [1.0], [1.0], [False], 1.2)
    mask = np.ones(n, np.uint8)
    try:
        ckernel._mode = mode
        for floor in (float(np.nextafter(scores[0], np.inf)), float(scores[0]) * (1 + 1e-10)):
            assert ckernel.top_k(scores, mask, 5, floor)[0].tolist() == []
            got = ckernel.bm25_top_k(np.zeros(n), norm, postings, [1.0], [1.0], [False], 1.2, mask, 5, floor)
            assert got[0].tolist() == [] and got[1].tolist() == []
        got = ckernel.bm25_top_k(np.zeros(n), norm, postings, [1.0], [1.0], [False], 1.2, mask, 5, float(scores[0]))
        assert got[0].tolist() == list(range(n))  # (at the floor: kept, ties at the cut too)
    finally:
        ckernel._mode = 0


@compiled_only
def test_min_score_just_above_a_hit_drops_it_in_both_kernels():
    import math

    with ragdb.open(":memory:", chunker="none") as db:
        for i in range(10):
            db.add(f"alpha beta document number {i}", source=f"d{i}")
        score = db.search("alpha", k=5)[0].score
        before = kernel.use("compiled")
        try:
            for name in ("compiled", "numpy"):
                kernel.use(name)
                assert db.search("alpha", k=5, min_score=math.nextafter(score, math.inf)) == [], name
                assert len(db.search("alpha", k=5, min_score=score)) == 5, name
        finally:
            kernel.use(before)


@compiled_only
@pytest.mark.parametrize("mode", [1, 2])
def test_bad_postings_in_top_k_are_errors_and_leave_the_work_array_zero(mode):
    """A negative chunk id (possible in int64 postings) or one past the chunks scored raises in
    either way of ``bm25_top_k``, before anything is scored; a term out of order (postings are
    sorted: only a damaged index has one) with such an id met while scoring raises too, after
    the postings before it were added, without writing past the arrays, and so does one whose
    id goes back past the start of the window being scored (windows of 64 chunks here): either
    way the work array is all zeros again (the next search reuses it)."""
    from ragdb.index import ckernel

    try:
        ckernel._mode = mode
        ckernel._window = 64
        for n, bad_ids in [(8, [-2, 1, 3]), (8, [-1]), (8, [2, 8]), (8, [1, 3, -2]), (8, [1, 9, 3]),
                           (8, [1, 2**40, 3]), (200, [100, 2, 150]), (200, [10, 70, 65, 199, 130])]:
            norm = np.ones(n)
            good = (np.array([0, 2, 5], np.int64), np.array([1, 2, 1], np.int64))
            ids = np.array(bad_ids, np.int64)
            acc = np.zeros(n)
            with pytest.raises(IndexError):
                ckernel.bm25_top_k(acc, norm, [good, (ids, np.ones(len(ids), np.int64))], [2.0, 1.0],
                                   [1.0, 1.0], [False, False], 1.2, np.ones(n, np.uint8), 3, 0.0)
            assert not acc.any()
    finally:
        ckernel._mode = 0
        ckernel._window = 8192


@compiled_only
@pytest.mark.parametrize("n_terms, share, full_at", [(3, 0.4, ()), (16, 0.01, (10, 1000))])
def test_top_k_chooses_its_way_by_the_query_and_gives_the_same_hits(n_terms, share, full_at):
    """Left to choose (``_mode`` 0), ``bm25_top_k`` splits the windows of a query whose common
    terms hold most postings (~240,000 postings in 3 terms: the two commonest, ~200,000, hold
    too little between them to lift a chunk into the k best, at k=10 and k=1,000) and scores in
    full one whose terms are of similar sizes (~25,000 in 16: the commonest that cannot lift a
    chunk hold less than 4 times the others' postings); the exhaustive hits either way, with a
    k larger than some terms' postings and a mask."""
    from ragdb.index import ckernel

    rng = np.random.default_rng(7)
    n = 300_000
    norm = 1.2 * (0.25 + 0.75 * rng.choice(np.array([0.5, 1.0, 2.0]), n))
    postings, idfs = [], []
    for i in range(n_terms):
        ids = np.flatnonzero(rng.random(n) < share * (i + 1) / n_terms)
        postings.append((ids.astype(np.uint32), rng.integers(1, 5, len(ids)).astype(np.uint16)))
        idfs.append(float(np.log(1 + (n - len(ids) + 0.5) / (len(ids) + 0.5))))
    weights, flats = [1.0] * n_terms, [False] * n_terms
    mask = (rng.random(n) < 0.7).astype(np.uint8)
    scores = np.empty(n)
    ckernel.bm25_accumulate(scores, norm, postings, idfs, weights, flats, 1.2)
    for k in (10, 1000):
        expected = ckernel.top_k(scores, mask, k, 0.0)
        acc = np.zeros(n)
        before = ckernel.full_count()
        got = ckernel.bm25_top_k(acc, norm, postings, idfs, weights, flats, 1.2, mask, k, 0.0)
        assert ckernel.full_count() == before + (k in full_at)  # the way it chose
        assert got[0].tolist() == expected[0].tolist() and got[1].tolist() == expected[1].tolist()
        assert not acc.any()


def test_chunks_whose_text_has_no_terms_score_their_fields_without_nans():
    """Every chunk's text a stopword: the average length is 0, and BM25's length part was 0 / 0
    (NaNs and a RuntimeWarning, an InternalError where warnings are errors). Each chunk is of
    the average length then; the titles still match (under either kernel: RAGDB_KERNEL=numpy
    runs this too)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with ragdb.open(":memory:") as db:
            db.add("the", source="docs/install.md", title="install guide")
            db.add("of", source="docs/b.md", title="guide")
            hits = db.search("install guide", explain=True)
            assert [h.source for h in hits] == ["docs/install.md", "docs/b.md"]
            assert all(np.isfinite(h.score) and h.score > 0 and np.isfinite(h.confidence) for h in hits)
            assert db.facets("source", "guide").total == 2 and db.check() == []
            db.build_prompt("install guide")
            db.add("install notes", source="docs/c.md")  # a first text term: an average length again
            assert db.search("install")[0].source == "docs/c.md"
