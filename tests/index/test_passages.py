"""Collapsing copies of one passage in C (ragdb/index/cpassages.pyx) against the numpy reference
(ragdb/index/hits.py): the very same shingle values for any text, the same pairs of copies, and
the same values in every process (no per-process string hashing)."""

import random
import re
import subprocess
import sys
import unicodedata

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragdb.index import hits, kernel, unitables

from cli_helpers import ROOT

TRICKY = [
    "", "a", "two words", "one two three two three one two three",
    "## fs.readFile\n\nThe `fs.readFile` method **reads** [files](x.html#a).",
    "<h2>fs.readFile</h2><p>the fs.readFile method reads files.</p>",
    "一个中文段落 Größe STRASSE straße ﬁle <b>x</b> ](y) 东京タワー・x_y 한국어",
    "x" * 300 + " yy " + "z" * 1000,
    "<" + "a" * 199 + ">b <" + "a" * 200 + ">c <" + "ß" * 150 + "> d",  # the tag limit counts before case folding
    "a]( b) c](d)e <\n> <> f ]( ) g](h\x1ci) j",
    "A\x1c](b\x1c)c Ab]( x) snake_case_word CamelCase 3.14 ½ ²",
    "p < 0.05 and q > 0.01 in the < 5 group",
    "\ud800 lone surrogate \udfff text",
    # markup in text of each width (PEP 393: 1, 2 and 4 bytes a character), Unicode whitespace
    # ending a Markdown link's target (\\s is str.isspace), NFKC's no-break space
    "café naïve <b>Bold</b> ](x) a](b\x85c) d](e) Ünï ÀÉ",
    "Ünï ]( x) a](b\x85c) d](e\u2028f) <p\x85>x</p> g](h)i Σίσυφος ΣΊΣΥΦΟΣ",
    "café ](x\xa0y) naïve <b>bold</b> ](z) end",
    "😀 emoji <b>😀</b> word😀word ]( 😀) a](😀)b 𐐀 after",
    # a link target holds no "]", a tag no "<" (so no scan of markup overlaps the next one's)
    "x](a](b) c <p <b>q</b> r ](y]z) <s<t>",
    "](a" * 2000 + " then words <" * 500 + "end>",
]

# (ß, İ and ŉ case fold to two characters, 𐐀 is a letter past the compiled folding table, Σ
# folds to σ, ，and ｡ need NFKC)
text_ = st.lists(st.sampled_from(list("ab Cé ß_<>]()\n\x1c\x85\u2028\xa0一二タ한½İŉ𐐀😀ΣＡ，｡") + ["the ", "word ", "](x) ", "<b>"]),
                 max_size=40).map("".join)


def _both(fn, *args):
    before = kernel.use("numpy")
    try:
        expected = fn(*args)
        kernel.use("compiled")
        return expected, fn(*args)
    finally:
        kernel.use(before)


def test_shingles_are_the_references_in_each_kernel(each_kernel):
    for text in TRICKY:
        got = hits.passage_shingles(text)
        before = kernel.use("numpy")
        try:
            assert isinstance(got, bytes) and got == hits.passage_shingles(text), text[:40]
        finally:
            kernel.use(before)


@settings(max_examples=200, deadline=None)
@given(text=text_)
def test_compiled_shingles_equal_numpys(text):
    if "compiled" not in kernel.available():
        return
    expected, got = _both(hits.passage_shingles, text)
    assert got == expected


def test_markup_scans_stop_at_the_next_opener():
    """A Markdown link's target ends at its first ``)`` and holds no space and no ``]``; an HTML
    tag holds no ``<``. So a scan for markup stops where the next one could start, and a text
    of openers without a closer is read once, not once from each opener."""
    assert hits._MARKUP.sub(" ", "a](b](c) d](e]f) <p <b>q <x<y>") == "a](b  d](e]f) <p  q <x "
    assert hits._MARKUP.sub(" ", "see [docs](https://x.org/a_(b)c) and <a href='/p'>it</a>") == (
        "see [docs c) and  it ")
    # the numbers and shingles of such a text (which took seconds from each opener before)
    assert hits.passage_numbers("](1" * 20_000) == ("1",) * 20_000
    expected, got = _both(hits.passage_shingles, "](a b" * 20_000)
    assert got == expected and len(expected) == 4 * (2 * 20_000 - 2)


def test_words_are_the_regular_expressions():
    """The numpy path finds words with a table of character classes: they are ``WORDS_SOURCE``'s."""
    for text in TRICKY[:-1]:
        prepared = hits._MARKUP.sub(" ", text).casefold()
        words = re.findall(hits.WORDS_SOURCE, prepared)
        got = hits.word_hashes(prepared)
        assert len(got) == len(words)
        # one word at a time gives the same hash: words are cut where the regular expression cuts them
        assert got.tolist() == [int(hits.word_hashes(w)[0]) for w in words]


def test_shingle_counts_and_sets():
    def values(text):
        return hits.shingle_values(hits.passage_shingles(text)).tolist()

    assert len(values("")) == 0
    assert len(values("one")) == 1
    assert len(values("one two")) == 1
    assert len(values("one two three four")) == 2
    # a repeated shingle repeats; its set is what passages compare
    again = values("a b c a b c")
    assert len(again) == 4 and len(set(again)) == 3


def test_shingles_are_the_low_32_bits_of_the_64_bit_hashes(each_kernel):
    """A shingle is the low half of the polynomial of its three words' 64-bit hashes
    (``word_hashes``), as native uint32 bytes; a text of fewer words is one shingle."""
    mask = (1 << 64) - 1
    mix1, mix2 = int(hits._MIX1), int(hits._MIX2)
    for text in ("the fs.readFile method reads files", "one two", "一个中文段落", "word"):
        prepared = hits._MARKUP.sub(" ", text).casefold()
        h = [int(v) for v in hits.word_hashes(prepared)]
        if len(h) >= 3:
            want = [((a * mix1 + b * mix2 + c) & mask) & 0xFFFFFFFF for a, b, c in zip(h, h[1:], h[2:])]
        else:
            want = [((h[0] * mix1 + (h[1] * mix2 if len(h) > 1 else 0)) & mask) & 0xFFFFFFFF]
        got = hits.passage_shingles(text)
        assert isinstance(got, bytes) and len(got) == 4 * len(want)
        assert hits.shingle_values(got).tolist() == want, text


def test_shingles_are_bytes_or_native_uint32_arrays_in_both_kernels():
    """Both kernels take the same two kinds of shingles (bytes of whole uint32 values, native
    uint32 arrays) and refuse everything else, other widths, byte orders and buffers included
    (the compiled count reads aligned uint32 values)."""
    import array
    import ctypes

    one = np.arange(3, dtype=np.uint32)
    assert hits.shingle_values(one.tobytes()).tolist() == hits.shingle_values(one).tolist() == [0, 1, 2]
    refused = [np.arange(3, dtype=np.int64), np.arange(3, dtype=np.int32), np.arange(12, dtype=np.uint8),
               np.arange(3, dtype=">u4" if sys.byteorder == "little" else "<u4"), array.array("f", [1, 2, 3]),
               memoryview(b"x" + one.tobytes())[1:], bytearray(one.tobytes()), one[::2],
               (ctypes.c_float * 3)(), b"abc", [0, 1, 2]]
    compiled = hits._cpassages
    for bad in refused:
        with pytest.raises(TypeError):
            hits.shingle_values(bad)
        if compiled is not None:
            with pytest.raises(TypeError):
                compiled.same_pairs([one.tobytes(), bad], 0.6, 0.9, 16)
    if compiled is not None:
        assert compiled.same_pairs([one.tobytes(), one], 0.6, 0.9, 16) == [(1, 0)]
    if array.array("I").itemsize == 4:  # (a buffer of native uint32 items, numpy's or not)
        assert hits.shingle_values(array.array("I", [0, 1, 2])).tolist() == [0, 1, 2]


def test_shingles_are_the_same_in_every_process():
    code = ("from ragdb.index import hits, kernel; kernel.use('numpy'); "
            "print(hits.shingle_values(hits.passage_shingles('The fs.readFile method reads files')).tolist())")
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True,
                           env={"PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT)}).stdout
            for seed in ("1", "2")}
    assert len(outs) == 1


def _copies(rng: random.Random) -> list[str]:
    base = ["The fs.readFile method reads the entire contents of a file asynchronously, decoded "
            "when the encoding option is given. " * rng.randint(1, 3),
            "Streams read a file piece by piece; the encoding option sets the string encoding.",
            "一个中文段落，讲的是知识库里的同一节内容，被复制了好几次。" * 2,
            " ".join(f"w{rng.randint(0, 40)}" for _ in range(60))]
    out = []
    for text in base:
        out.append(text)
        for _ in range(rng.randint(0, 3)):
            words = text.split(" ")
            kind = rng.random()
            if kind < 0.3:
                out.append(" ".join(words[rng.randint(0, max(1, len(words) // 4)):]))
            elif kind < 0.6:
                out.append("## " + text.replace(" the ", " <b>the</b> "))
            else:
                out.append(" ".join(w if rng.random() > 0.15 else "zz" for w in words))
    rng.shuffle(out)
    return out


def test_same_pairs_are_the_references_in_each_kernel(each_kernel):
    rng = random.Random(7)
    for _ in range(40):
        texts = _copies(rng)
        sets = [hits.passage_shingles(t) for t in texts]
        got = hits.same_pairs(sets)
        shared = hits.shared_shingles(sets)
        sizes = [len(set(hits.shingle_values(s).tolist())) for s in sets]
        expected = [(i, j) for i in range(len(sets)) for j in range(i)
                    if hits.same_passage(int(shared[i, j]), sizes[i], sizes[j])]
        assert got == expected


def test_same_pairs_count_repeats_once(each_kernel):
    a = hits.passage_shingles("a b c a b c a b c d")  # 8 shingles, 4 distinct
    b = hits.passage_shingles("a b c d")               # 2 of them
    # Jaccard 2/4 < 0.6 counted as sets (as sequences it would be 2/8, or 4/8 with repeats shared)
    assert hits.same_pairs([a, b]) == []
    assert hits.same_pairs([a, hits.passage_shingles("b c a b c d a")]) == [(1, 0)]
    assert hits.same_pairs([a]) == [] and hits.same_pairs([]) == []


def test_same_pairs_of_many_long_passages_are_the_references(each_kernel):
    """Enough shingles (60,000) that the compiled bitmaps grow past their smallest size."""
    rng = random.Random(11)
    base = ["".join(rng.choice("的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动")
                    for _ in range(600)) for _ in range(6)]
    texts = []
    for _ in range(100):
        t = rng.choice(base)
        start = rng.randint(0, 200)
        texts.append(t[start:start + rng.randint(300, 600)] + "".join(rng.choice("天地玄黄") for _ in range(20)))
    sets = [hits.passage_shingles(t) for t in texts]
    assert sum(map(len, sets)) > 4 * 40_000
    got = hits.same_pairs(sets)
    shared = hits.shared_shingles(sets)
    sizes = [len(set(hits.shingle_values(s).tolist())) for s in sets]
    expected = [(i, j) for i in range(len(sets)) for j in range(i)
                if hits.same_passage(int(shared[i, j]), sizes[i], sizes[j])]
    assert got == expected and len(expected) > 10


# characters NFKC changes (one for one or not), combining marks, Hangul jamo, and plain ones
_NFKC_ALPHABET = (list("，（）：；！？。、　ａＺ０９｡ｶﾞﾟ\u00a0²½ﬁ①㈱㍻豈ǅ") + ["\u0301", "\u0308", "\u0327", "\u3099",
                  "\u309a", "\u1100", "\u1161", "\u11a8", "\u0338"] + list("aeAE=<か가中 "))


@settings(max_examples=300, deadline=None)
@given(text=st.lists(st.sampled_from(_NFKC_ALPHABET), max_size=30).map("".join))
def test_compat_folding_keeps_nfkc(text):
    """The compiled path's shortcut to NFKC (one-character forms replaced first) is NFKC."""
    compiled = hits._cpassages
    if compiled is None:
        return
    assert hits._nfkc(text, compiled) == unicodedata.normalize("NFKC", text)


def test_compat_folding_of_every_mapped_character():
    compiled = hits._cpassages
    if compiled is None:
        return
    table = hits._compat_table()
    mapped = [chr(c) for c in range(len(table)) if table[c] != c]
    assert len(mapped) > 300 and "，" in mapped and "ａ" in mapped
    for ch in mapped:
        for text in (ch, "a" + ch + "\u0301", ch + "\u0301", "가" + ch + "\u11a8", ch * 3 + "中"):
            assert hits._nfkc(text, compiled) == unicodedata.normalize("NFKC", text), repr(text)


def _reference_pairs(sets):
    shared = hits.shared_shingles(sets)
    sizes = [len(set(hits.shingle_values(s).tolist())) for s in sets]
    return [(i, j) for i in range(len(sets)) for j in range(i) if hits.same_passage(int(shared[i, j]), sizes[i], sizes[j])]


@pytest.mark.parametrize("n", [2, 40, 256, 300])
def test_compiled_pair_counts_agree(n):
    """The compiled module counts shared shingles in a matrix with bitsets for shingles in many
    passages (up to 256 passages), else pair by pair: both give the reference's pairs, with
    runs common to most passages (as in Chinese text) and near copies."""
    compiled = hits._cpassages
    if compiled is None:
        pytest.skip("no compiled module")
    rng = random.Random(n)
    common = "的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动"
    base = ["".join(rng.choice(common) for _ in range(300)) for _ in range(4)]
    texts = [rng.choice(base)[rng.randint(0, 60):][:rng.randint(40, 240)] + common[:rng.randint(0, 30)]
             for _ in range(n)]
    sets = [hits.passage_shingles(t) for t in texts]
    args = (hits.DUPLICATE_JACCARD, hits.DUPLICATE_CONTAINMENT, hits.DUPLICATE_MIN_SHINGLES)
    expected = _reference_pairs(sets)
    assert compiled.same_pairs(sets, *args) == expected and (expected or n < 40)
    assert _every_compiled_count(compiled, sets, args) == [expected] * 3


def _every_compiled_count(compiled, sets, args):
    """The compiled pairs of ``sets``: filtered first (the default), every pair counted in a
    matrix (up to 256 passages), every pair counted pair by pair."""
    out = [compiled.same_pairs(sets, *args)]
    compiled._full_pairs = True
    try:
        out.append(compiled.same_pairs(sets, *args))
        compiled._sparse_pairs = True
        out.append(compiled.same_pairs(sets, *args))
    finally:
        compiled._full_pairs = compiled._sparse_pairs = False
    return out


@st.composite
def _shingle_sets(draw):
    """Passages of shingles (uint32 values from a small pool, so many are shared, with repeats
    within a passage), and copies of some of them with a few shingles dropped or added, near
    the thresholds of Jaccard and containment (both ways: a copy may be the larger)."""
    pool = draw(st.integers(2, 400))
    n = draw(st.integers(0, 90))
    sets: list[list[int]] = []
    for _ in range(n):
        if sets and draw(st.booleans()):
            base = draw(st.sampled_from(sets))
            kept = [v for v in base if draw(st.integers(0, 99)) >= draw(st.sampled_from([0, 3, 10, 30]))]
            fresh = draw(st.lists(st.integers(pool, pool + 10_000), max_size=draw(st.sampled_from([0, 2, 8, 40]))))
            sets.append(kept + fresh)
        else:
            size = draw(st.sampled_from([0, 1, 5, 15, 16, 17, 30, 120]))
            sets.append(draw(st.lists(st.integers(-pool, pool), min_size=size, max_size=size)))
    return [np.asarray(s, dtype=np.int64).astype(np.uint32) for s in sets]  # (negatives wrap)


_THRESHOLDS = [(hits.DUPLICATE_JACCARD, hits.DUPLICATE_CONTAINMENT, hits.DUPLICATE_MIN_SHINGLES),
               (0.3, 0.5, 4), (0.9, 0.99, 1), (0.0, 0.9, 16), (0.6, 0.0, 16), (1.0, 1.0, 0),
               (float("nan"), 0.9, 16), (0.6, float("nan"), 16), (float("inf"), 0.9, 16), (2.0, 2.0, 0),
               (3.0, 0.9, 16), (0.6, 1.5, 16), (1e-300, 0.9, 16), (-1.0, 0.9, 16), (0.6, 0.9, -5)]


@settings(max_examples=300, deadline=None)
@given(sets=_shingle_sets(), args=st.sampled_from(_THRESHOLDS))
def test_compiled_pairs_filtered_or_not_are_the_references(sets, args):
    """Whichever way the compiled module counts (the passages that may be the smaller of a
    pair filtered first, or every pair), it gives the reference's pairs, the thresholds
    given included (those the filter leaves to the full count too: none, NaN, infinite)."""
    compiled = hits._cpassages
    if compiled is None:
        return
    _assert_reference_pairs(compiled, sets, args)


def _assert_reference_pairs(compiled, sets, args):
    shared = hits.shared_shingles(sets)
    sizes = [len(set(hits.shingle_values(s).tolist())) for s in sets]
    jaccard, containment, min_shingles = args

    def same(sh: int, a: int, b: int) -> bool:  # hits.same_passage with these thresholds
        small = min(a, b)
        return sh > 0 and (sh >= jaccard * (a + b - sh) or (small >= min_shingles and sh >= containment * small))

    expected = [(i, j) for i in range(len(sets)) for j in range(i) if same(int(shared[i, j]), sizes[i], sizes[j])]
    assert _every_compiled_count(compiled, sets, args) == [expected] * 3


@pytest.mark.parametrize("sets, args, expected", [
    # two passages of 19 shingles sharing 18, Jaccard 18/20 = 0.9 exactly: 2j/(1+j) rounds up
    # from 18/19, so without a margin the filter would take neither for the smaller of a pair
    ([np.arange(19), np.r_[np.arange(18), 100]], (0.9, 0.99, 1), [(1, 0)]),
    # 18 of a passage of 20 inside one of 118 whose other 100 shingles are its own (containment
    # 0.9 exactly): only the smaller may be the smaller of a pair
    ([np.r_[np.arange(18), 500, 501], np.r_[np.arange(18), np.arange(1000, 1100)]], (0.6, 0.9, 16), [(1, 0)]),
    ([np.r_[np.arange(17), 500, 501, 502], np.r_[np.arange(17), np.arange(1000, 1100)]], (0.6, 0.9, 16), []),
    # the same passage three times, one copy with its shingles repeated
    ([np.arange(30), np.r_[np.arange(30), np.arange(30)], np.arange(30)], (0.6, 0.9, 16), [(1, 0), (2, 0), (2, 1)]),
])
def test_compiled_pairs_at_the_thresholds(sets, args, expected):
    """Pairs exactly at a threshold, found by the filter (which answers these calls)."""
    compiled = hits._cpassages
    if compiled is None:
        pytest.skip("no compiled module")
    sets = [np.asarray(s, dtype=np.uint32).tobytes() for s in sets]
    before = compiled.filtered_count()
    assert compiled.same_pairs(sets, *args) == expected
    assert compiled.filtered_count() == before + 1  # the filter answered, not the full count
    _assert_reference_pairs(compiled, sets, args)


def test_the_tables_are_their_definitions_character_by_character():
    """The case folding and raw tables, made a block at a time (and word characters found by a
    regular expression), equal their definitions for every BMP character on its own:
    ``str.casefold`` (``_MANY`` where it is several characters), ``str.isalnum`` and the CJK
    ranges as the class of the folded character."""
    many = hits._MANY
    fold = np.array([ord(f) if len(f := chr(c).casefold()) == 1 else many for c in range(0x10000)], np.uint32)
    assert np.array_equal(np.frombuffer(unitables.fold_table(), np.uint32), fold)
    classes = np.array([chr(c).isalnum() for c in range(0x10000)], np.uint32)
    for lo, hi in ((0x3040, 0x30FF), (0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xAC00, 0xD7AF), (0xF900, 0xFAFF)):
        classes[lo:hi + 1] = 2
    several = (fold == many) | (fold >= 0x10000)
    folded = np.where(several, 0, fold)
    raw = folded | (classes[folded] << np.uint32(24))
    raw[several] = many
    assert np.array_equal(hits._raw_table(), raw)
    assert hits._raw_table()[ord("_")] == ord("_") and hits._raw_table()[ord("ß")] == many
    # the numpy path's classes, over every code point (planes above the BMP included)
    every = np.array([chr(c).isalnum() for c in range(0x110000)], np.uint8)
    for lo, hi in ((0x3040, 0x30FF), (0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xAC00, 0xD7AF), (0xF900, 0xFAFF)):
        every[lo:hi + 1] = 2
    assert np.array_equal(hits._char_classes(), every)


def test_the_tables_are_the_compiled_modules_own_and_made_alike_without_it(monkeypatch):
    """The tables a search reads are the compiled module's constant data (no copy) where it was
    built from this Python's Unicode data, and the same tables made by ``unitables`` where the
    version differs (or the module lacks them)."""
    compiled = hits._cpassages
    if compiled is None:
        pytest.skip("no compiled module")
    version, *built = compiled.unicode_tables()
    assert version == unicodedata.unidata_version
    tables = hits._unicode_tables()
    for table, own in zip(tables, built):
        assert isinstance(own, memoryview) and own.readonly and len(own) == 4 * 0x10000
        assert np.shares_memory(table, np.frombuffer(own, np.uint32)) and not table.flags.writeable
    monkeypatch.setattr(hits, "_tables", None)
    monkeypatch.setattr(compiled, "unicode_tables", lambda: ("0.0.0", *built))  # built for another Python
    made = hits._unicode_tables()
    for table, own in zip(made, built):
        assert not np.shares_memory(table, np.frombuffer(own, np.uint32)) and not table.flags.writeable
        assert np.array_equal(table, np.frombuffer(own, np.uint32))


def test_the_raw_table_is_the_bmps_and_read_only():
    """``cpassages.shingles_raw`` refuses a table that is not one entry per BMP character (it
    reads any BMP character's entry), and the shared table cannot be changed by a caller."""
    if "compiled" not in kernel.available():
        pytest.skip("the compiled kernel is not installed")
    from ragdb.index import cpassages

    with pytest.raises(ValueError):
        cpassages.shingles_raw("é", np.zeros(256, np.uint32))
    table = hits._raw_table()
    assert len(table) == 0x10000 and not table.flags.writeable
    assert cpassages.shingles_raw("Größe", table) is None  # (ß folds to two characters: Python's path)


# NFKC's hazards for the one-pass path (cpassages.shingles_nfkc): full-width markup and
# brackets, the ideographic space, combining marks and kana voicing marks (also half-width),
# Hangul jamo that compose with a syllable or jamo before them, forms of several characters
# (ﬁ, ½, ſ folds to s outside the compatibility blocks), compatibility ideographs (one's form
# lies past the BMP), characters past the BMP with and without a form of their own
_NFKC_HAZARDS = (list("中文，。（）＜＞［］：　ａＡ０ｶﾞﾟか가각ﬁ½ſ①㈱豈丽ß") +
                 ["\u3099", "\u309a", "\u0301", "\u1100", "\u1161", "\u11a8", "\U0002F800", "\U0001F100",
                  "\U0001D400", "😀", "\u0345", "a", "Z", " ", "\n", "<", ">", "]", "(", ")", "<b>", "](x) ",
                  "［x］（y）", "＜b＞"])


@settings(max_examples=400, deadline=None)
@given(text=st.lists(st.sampled_from(_NFKC_HAZARDS), max_size=40).map("".join))
def test_the_one_pass_nfkc_shingles_are_the_references(text):
    """Where ``shingles_nfkc`` answers (every character safe), its shingles are the numpy
    reference's (NFKC, markup removed, case folded); either way the compiled
    ``passage_shingles`` is the reference's."""
    compiled = hits._cpassages
    if compiled is None:
        return
    expected, got = _both(hits.passage_shingles, text)
    assert got == expected
    one_pass = compiled.shingles_nfkc(text, hits._nfkc_table())
    assert one_pass is None or one_pass == expected


def test_the_one_pass_nfkc_path_takes_most_text():
    """Chinese with full-width punctuation, and accented or Greek Latin text, take the one
    pass; a character whose form is several, or that may compose, leaves it to Python."""
    if "compiled" not in kernel.available():
        pytest.skip("the compiled kernel is not installed")
    from ragdb.index import cpassages

    table = hits._nfkc_table()
    assert len(table) == 0x10000 and not table.flags.writeable
    for text in ("生命数耗完即算为什么？（游戏）：玩家，ＡＢＣ１２３。", "café naïve – “quoted” α-helix Σίσυφος ²"):
        assert cpassages.shingles_nfkc(text, table) == _both(hits.passage_shingles, text)[0], text
    for text in ("ﬁle", "½", "Größe", "か\u3099", "e\u0301", "가\u11a8", "\U0001F100", "ſ"):
        assert cpassages.shingles_nfkc(text, table) is None, text
    with pytest.raises(ValueError):
        cpassages.shingles_nfkc("é", np.zeros(256, np.uint32))


def test_the_nfkc_table_is_its_definition_character_by_character():
    """Every BMP character's entry: the raw table's entry of its one-character NFKC form, with
    SAFE exactly where that form is normalized alone, of combining class 0, folds to one
    character, and it and the character lie in the ranges the table checks or trusts; no character
    of those ranges is one a character before it composes with (every canonical composition
    of Python's Unicode data, and the Hangul jamo's), and the trusted ranges hold safe
    characters only."""
    raw, compat, table = hits._raw_table(), hits._compat_table(), hits._nfkc_table()
    composing = {0x1161 + v for v in range(21)} | {0x11A8 + t for t in range(27)}
    for code in range(0x110000):
        parts = unicodedata.decomposition(chr(code)).split()
        if len(parts) == 2 and not parts[0].startswith("<"):
            first, second = (int(p, 16) for p in parts)
            if unicodedata.normalize("NFC", chr(first) + chr(second)) == chr(code):  # not excluded
                composing.add(second)
    ranges = unitables.SAFE_CHECKED + unitables.SAFE_ALWAYS
    in_ranges = np.zeros(0x10000, bool)
    for lo, hi in ranges:
        in_ranges[lo:hi + 1] = True
    assert not [hex(c) for c in composing if c < 0x10000 and in_ranges[c] and not unicodedata.combining(chr(c))]
    for code in range(0x10000):
        form = int(compat[code])
        safe = bool(in_ranges[code] and form < 0x10000 and in_ranges[form] and raw[form] != hits._MANY
                    and unicodedata.is_normalized("NFKC", chr(form)) and not unicodedata.combining(chr(form))
                    and form not in composing)
        expected = (int(raw[form]) | hits._NFKC_SAFE) if safe else 0
        assert int(table[code]) == expected, hex(code)
    for lo, hi in unitables.SAFE_ALWAYS:  # trusted, not checked, when the table is made
        assert all(table[c] & hits._NFKC_SAFE for c in range(lo, hi + 1)), (hex(lo), hex(hi))
    # the compiled pass reads the CJK unified ideographs without the table: their entries
    assert all(int(table[c]) == c | (2 << 24) | hits._NFKC_SAFE for c in range(0x4E00, 0xA000))


def test_hits_are_made_alike_by_both_kernels():
    """``hits.make_hits``: the compiled one makes the same instance dicts (key for key, in
    the same order) as the Python one, each hit with metadata and explain dicts of its own."""
    from ragdb.types import Hit

    meta = {"tags": ["a", {"b": [1]}], "n": 1}
    protos = {7: hits.HitEntry(1, "a.md", "v1", "2024-01-01T00:00:00Z", "some text", 0, 9, 0, "a", None, meta),
              9: hits.HitEntry(2, "b.md", None, None, "other text", 3, 13, 1, None, "Intro", {}),
              11: hits.HitEntry(2, "b.md", None, None, "more", 13, 17, 2, None, None, {"x": "y"})}
    ids, scores = [9, 7, 11], [2.5, 1.0, 1.0]
    for explain, confidences in ((None, None), ({7: {"t": 0.5}, 9: {"u": 2.5}}, [0.9, 0.4, None])):
        made = _both(hits.make_hits, protos, ids, scores, explain, confidences)
        assert [list(vars(h).items()) for h in made[0]] == [list(vars(h).items()) for h in made[1]]
        for got in made:
            assert all(type(h) is Hit for h in got) and [h.chunk_id for h in got] == ids
            assert got[1].metadata == meta and got[1].metadata is not meta
            assert got[1].metadata["tags"] is not meta["tags"] and got[1].metadata["tags"][1] is not meta["tags"][1]
            assert got[1].explain == ({} if explain is None else {"t": 0.5})
            assert got[2].explain == {} and got[0].section == "Intro" and got[1].title == "a"
            assert [h.confidence for h in got] == (confidences or [None] * 3)
            assert got[0] == Hit(score=2.5, chunk_id=9, doc_id=2, source="b.md", version=None, timestamp=None,
                                 text="other text", start=3, end=13, ordinal=1, metadata={},
                                 explain={} if explain is None else {"u": 2.5},
                                 confidence=None if confidences is None else 0.9, section="Intro")
    if hits._cpassages is not None:
        with pytest.raises(TypeError):
            hits._cpassages.make_hits(Hit, {1: {"text": "x"}}, [1], [1.0], None, None, hits._own_metadata)
        with pytest.raises(ValueError):
            hits._cpassages.make_hits(Hit, protos, [7, 9], [1.0], None, None, hits._own_metadata)
