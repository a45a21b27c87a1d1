"""The analyzer's hot loop in C (ragdb/text/canalysis.pyx) against the Python reference
(ragdb/text/analysis.py): the same terms, counts, order and overlaps, and the same packed
worker results (term numbers included), for every configuration the compiled path takes."""

from __future__ import annotations

import contextlib
import re
import sys
import unicodedata

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ragdb.index import kernel
from ragdb.text import analysis
from ragdb.text.analysis import Analyzer

canalysis = pytest.importorskip("ragdb.text.canalysis")

CONFIGS = [
    {},
    {"stem": None, "stopwords": None},
    {"stopwords": "english"},
    {"stopwords": "chinese"},
    {"stem": None},
    {"stopwords": None},
]


@contextlib.contextmanager
def kernel_in_use(name):
    """Run with kernel ``name`` (the switch turns the compiled analysis on or off), then the one before."""
    before = kernel.use(name)
    try:
        yield
    finally:
        kernel.use(before)


@pytest.fixture(autouse=True)
def compiled_path():
    """These tests run the compiled analysis (whatever RAGDB_KERNEL says) beside the reference."""
    with kernel_in_use("compiled"):
        yield


def python_path():
    """Run the Python reference (the kernel switch turns the compiled analysis off)."""
    return kernel_in_use("numpy")


def view(counts):
    """What a term count shows: its terms and counts in order, and its overlaps."""
    return list(counts.items()), getattr(counts, "overlaps", 0), type(counts).__name__, vars(counts)


def pack_all(analyzer, parts):
    local = analysis.Numbering()
    return [analysis._pack(analyzer, part, local) for part in parts], local.terms_now()


# Fragments that exercise each rule: compounds, symbols, clitics, abbreviations, long words,
# full-width forms, ligatures, characters whose case folding is not one to one, combining
# marks, Hangul, kana, CJK (with stopwords), astral ideographs, emoji, digits of other scripts.
FRAGMENTS = [
    "node.js", "C++", "c#", "e-mail", "x-ray", "don't", "Alzheimer's", "U.S.A.", "e.g.", "x86_64",
    "std::vector", "3.11", "v2.0.1", ".NET", "-5", "+word", "word.", "word:", "The", "running",
    "tissue-resident", "0.5-9.6", "CMAKE_CXX_STANDARD", "a" * 70, "ab" * 40 + ".x", "ＡＢＣ１２３", "ﬁne",
    "Straße", "İstanbul", "ǅemal", "ΣΑΣ", "cafe\u0301", "naïve", "résumé", "한국어", "カタカナ", "ひらがな",
    "什么是检索增强生成", "为什么", "几乎", "北京大学", "𠀀𠀁𠀂", "😀", "١٢٣", "٣.١٤", "Ⅻ", "½", "²",
    "it\u2019s", "\u2019s", "__init__", "a::b", "--", "...", "++", "#", "'", "\u3000", "\u30fb",
    "\uff0c", "\u00a0", "\u200b", "ß", "ŉ", "ﬀ", "Ǆ", "ﬆ", "\u0345", "Ꭰ", "ꭰ", "\U0001d400",
    "24.7-fold", "world-wide.", "e.g", "i.e.", "x-ray.", "1.-2", "a-.b", "-mbp", "golli-mbp", "a.b.c",
    "1.2.3", "a-" + "b" * 64, "b" * 64 + "-c", "e." + "f" * 70, "the-of", "+x", "#x", "-", ".", ":",
]
SEPARATORS = [" ", "  ", "\n", ", ", ". ", "-", ".", "_", ":", "'", "(", ")", "", "\t", "，", "。"]
pieces = st.one_of(
    st.sampled_from(FRAGMENTS),
    st.sampled_from(SEPARATORS),
    st.characters(blacklist_categories=("Cs",)),  # any code point but a lone surrogate
    st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7e), max_size=12),
    st.text(alphabet=st.characters(min_codepoint=0x4e00, max_codepoint=0x4e40), max_size=6),
)
texts = st.lists(pieces, max_size=40).map("".join)


def test_the_character_classes_are_the_regular_expressions_over_every_code_point():
    everything = "".join(map(chr, range(sys.maxunicode + 1)))
    got = canalysis.word_class(everything)
    cjk = re.compile(rf"[{analysis._CJK}]")
    word = re.compile(rf"(?:[^\W{analysis._CJK}]|[.\-:+#'\u2019])")  # _TERM2_RE's word class
    raw = analysis._RAW2  # text without CJK
    for code, klass in enumerate(got):
        ch = chr(code)
        want = 2 if cjk.fullmatch(ch) else 1 if word.fullmatch(ch) else 0
        assert klass == want, (hex(code), klass, want)
        if want != 2:
            assert (raw.fullmatch(ch) is not None) == (want == 1), hex(code)
    for code in range(128):  # and ASCII text's bytes.translate split
        assert (analysis._ASCII_SPLIT2[code] != 0x20) == (got[code] == 1), code


@pytest.mark.slow
@pytest.mark.parametrize("config", CONFIGS, ids=repr)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=st.lists(texts, min_size=1, max_size=6))
def test_compiled_term_counts_are_the_reference(config, batch):
    compiled = Analyzer(**config)
    assert compiled.compiled() is not None
    with python_path():
        reference = Analyzer(**config)
        assert reference.compiled() is None
        want = [view(reference.term_counts(t)) for t in batch]
        want_many = [view(c) for c in reference.term_counts_many(batch)]
    assert [view(compiled.term_counts(t)) for t in batch] == want
    assert [view(c) for c in compiled.term_counts_many(batch)] == want_many == want
    assert compiled.compiled() is not None  # (the switch came back)


@pytest.mark.slow
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(parts=st.lists(st.lists(texts, max_size=5), min_size=1, max_size=5), limit=st.sampled_from([3, 40, 10**6]))
def test_compiled_packs_are_the_reference(parts, limit):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(analysis, "WORKER_VOCABULARY", limit)  # the numbering starts again: restarts included
        compiled = Analyzer()
        with python_path():
            want = pack_all(Analyzer(), parts)
        assert pack_all(compiled, parts) == want


def test_one_analyzer_keeps_giving_the_reference_as_its_memos_fill_and_empty(monkeypatch):
    monkeypatch.setattr(canalysis, "MEMO_TOKENS", 5)
    monkeypatch.setattr(canalysis, "MAX_TERMS", 12)
    batch = [f"document {i} about node.js, e-mail and retrieval 检索增强{i} " + FRAGMENTS[i % len(FRAGMENTS)]
             for i in range(60)]
    compiled = Analyzer()
    with python_path():
        reference = Analyzer()
        want = [view(reference.term_counts(t)) for t in batch]
        want_packs = pack_all(Analyzer(), [batch[i:i + 7] for i in range(0, 60, 7)])
    assert [view(compiled.term_counts(t)) for t in batch] == want
    assert [view(c) for c in compiled.term_counts_many(batch)] == want
    assert pack_all(compiled, [batch[i:i + 7] for i in range(0, 60, 7)]) == want_packs


def test_a_pack_goes_on_from_the_numbering_it_is_given():
    """The term numbers come from the caller's dict: a new dict starts from 0, a dict numbered
    before (by another path) goes on where it stood."""
    parts = [["retrieval augmented generation"], ["检索增强生成 retrieval"], ["generation of node.js"]]
    with python_path():
        ref = Analyzer()
        local = analysis.Numbering()
        want = [analysis._pack(ref, p, local) for p in parts]
    fast = Analyzer()
    local2 = analysis.Numbering()
    got = [analysis._pack(fast, parts[0], local2)]
    assert local2.holder is not None and local2.terms == {}  # the compiled analysis holds the numbers
    with python_path():  # the middle part numbered by the reference, into the same numbering
        got.append(analysis._pack(fast, parts[1], local2))
    got.append(analysis._pack(fast, parts[2], local2))
    assert got == want and local2.terms_now() == local.terms_now()
    assert analysis._pack(fast, parts[0], analysis.Numbering()) == want[0]  # another one: from 0 again


def test_a_numbering_passes_between_compiled_analyses_and_outlives_a_forgotten_table(monkeypatch):
    """One worker numbering packed by two compiled analyses in turn (each takes the numbers
    from the other), one of which forgets its terms in between (a full table: its numbers go
    back into the numbering's dict first), numbers as the reference does."""
    monkeypatch.setattr(canalysis, "MAX_TERMS", 12)
    parts = [[f"doc {i} about node.js 检索{i} word{i}", f"more {i % 3} words"] for i in range(12)]
    with python_path():
        want = pack_all(Analyzer(), parts)
    a, b = Analyzer(), Analyzer()
    local = analysis.Numbering()
    got = []
    for i, part in enumerate(parts):
        if i % 4 == 1:  # a, holding the numbers, gets a table of more than 12 terms: forgotten
            a.term_counts(f"unrelated text {i} with enough distinct new words to fill it all up")
        got.append(analysis._pack(a if i % 2 == 0 else b, part, local))
        assert local.terms == {} and local.holder is not None
    assert (got, local.terms_now()) == want
    assert local.holder is None and len(local.terms) == len(want[1])


def test_the_python_path_runs_where_the_compiled_one_does_not_apply():
    assert Analyzer(version=1).compiled() is None
    assert Analyzer(cjk="jieba").compiled() is None

    class Mine(Analyzer):
        pass

    assert Mine().compiled() is None
    with python_path():
        assert Analyzer().compiled() is None
    assert Analyzer().compiled() is not None


# learned in the compiled code: words once their ends are stripped, and words joined by hyphens and dots
WORD_TOKENS = ["running", "the", "the.", "cells.", "ratio:", "a.", "5.", "naïve", "straße:", "²", "١٢٣",
               "x" * analysis.MAX_TOKEN_CHARS, "y" * analysis.MAX_TOKEN_CHARS + ".", "-5", "end:.", "word..",
               "+plus", "#tag", "'quoted'", "’ok’", "__init", "e-mail", "node.js", "u.s.a.", "e.g.",
               "i.e", "0.5-9.6", "tissue-resident.", "24.7-fold", "world-wide.", "x-ray", "-mbp", "golli-mbp",
               "a-b-c", "1-a", "a-" + "b" * analysis.MAX_TOKEN_CHARS, "a-" + "b" * (analysis.MAX_TOKEN_CHARS - 1),
               "c" * 70 + "-d", "e." + "f" * 70, "the-of", "a.b.c", "1.2.3", "ab.c-d.e", "٣.١٤", "ß-x"]
# the Python rules' (a clitic, "_", "::", "..", a symbol, a word past MAX_TOKEN_CHARS)
OTHER_TOKENS = ["don't", "x86_64", "c++", ".net", "z" * (analysis.MAX_TOKEN_CHARS + 1),
                "w" * (analysis.MAX_TOKEN_CHARS + 1) + ".", "a::b", "a..b", "it’s-x", "c#", "-.5", "a-_b",
                "std::vector"]


@pytest.mark.parametrize("config", CONFIGS, ids=repr)
def test_tokens_that_are_one_word_are_learned_in_the_compiled_code(config):
    """Only the tokens that are neither one word (once their ends are stripped) nor words joined
    by hyphens and dots reach the Python rules; the terms are the reference's either way."""
    analyzer = Analyzer(**config)
    sent: list[str] = []

    def expand(tokens):
        sent.extend(tokens)
        return analyzer._expand_list(tokens)

    stem = analyzer._stemmer.stemWords if analyzer._stemmer is not None else None
    fast = canalysis.Analysis(expand, analyzer._cjk_stop, analysis.TermCounts, analysis._OVERLAP,
                              analyzer._stop, stem, analysis.MAX_TOKEN_CHARS, analysis.DOTTED_STOPWORDS)
    text = " ".join(WORD_TOKENS + OTHER_TOKENS)
    got = fast.counts([text])
    assert sorted(sent) == sorted(OTHER_TOKENS)
    with python_path():
        want = Analyzer(**config).term_counts(text)
    assert view(got[0]) == view(want)
    sent.clear()  # and with no word rules given, every token goes to expand
    slow = canalysis.Analysis(expand, analyzer._cjk_stop, analysis.TermCounts, analysis._OVERLAP)
    assert view(slow.counts([text])[0]) == view(want)
    assert sorted(sent) == sorted({unicodedata.normalize("NFKC", t).casefold() for t in WORD_TOKENS + OTHER_TOKENS})


def test_a_text_that_is_not_a_string_fails_as_in_the_reference():
    with pytest.raises(AttributeError):
        Analyzer().term_counts(None)  # type: ignore[arg-type]
    with python_path(), pytest.raises(AttributeError):
        Analyzer().term_counts(None)  # type: ignore[arg-type]


def test_the_python_path_numbers_new_terms_in_order_of_first_appearance():
    with python_path():
        restarted, new, *_ = analysis._pack(Analyzer(), ["zeta alpha zeta beta", "gamma alpha"],
                                            analysis.Numbering())
    assert not restarted and new.split("\0") == ["zeta", "alpha", "beta", "gamma"]


def test_threads_analyzing_with_one_analyzer_get_the_reference():
    """A call running (in another thread: the loop gives up the GIL) sends the next one to the
    Python code, with the same results."""
    import threading

    batch = [f"thread text {i} node.js 检索增强{i % 7} word{i} " + " ".join(FRAGMENTS[i % 9:i % 9 + 20])
             for i in range(2000)]
    with python_path():
        want = [view(c) for c in Analyzer().term_counts_many(batch)]
    shared = Analyzer()
    got: dict[int, list] = {}

    def work(n: int) -> None:
        got[n] = [view(c) for c in shared.term_counts_many(batch)] + [view(shared.term_counts(t)) for t in batch[:200]]

    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # (threads switch often: calls overlap, measured: hundreds of fallbacks)
    try:
        threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    finally:
        sys.setswitchinterval(before)
    assert len(got) == 4 and all(g == want + want[:200] for g in got.values())


def token_view(analyzer, text):
    """A text's tokens both ways the analyzer gives them: Tokens, and the two columns."""
    terms, offsets = analyzer.token_table(text)
    return [tuple(t) for t in analyzer.tokens(text)], terms, offsets.tolist(), type(offsets).__name__


@pytest.mark.slow
@pytest.mark.parametrize("config", CONFIGS, ids=repr)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=st.lists(texts, min_size=1, max_size=6))
def test_compiled_tokens_are_the_reference(config, batch):
    """Offsets mapped back through normalization, positions, CJK unigrams and bigrams with
    stopwords left out, runs met before (memo) and not: the reference's tokens, in order."""
    compiled = Analyzer(**config)
    with python_path():
        reference = Analyzer(**config)
        want = [token_view(reference, t) for t in batch]
    assert [token_view(compiled, t) for t in batch] == want
    assert [token_view(compiled, t) for t in batch] == want  # (now from the memo)
    for (tokens, terms, offsets, _kind), text in zip(want, batch):  # (and the reference is what it says)
        assert terms == [t for t, *_ in tokens]
        assert offsets == [x for _t, *rest in tokens for x in rest]
        assert all(0 <= s <= e <= len(text) for _t, s, e, _p in tokens)


def test_compiled_tokens_stay_the_reference_as_the_memo_empties(monkeypatch):
    """A text whose new runs fill the memo past its size (emptied while learning them) still
    gets every token: the compiled table holds the entries it read before asking for more."""
    monkeypatch.setattr(analysis, "MEMO_SIZE", 4)
    batch = [f"document {i} about node.js, e-mail and running retrieval 检索增强{i} " + FRAGMENTS[i % len(FRAGMENTS)]
             for i in range(40)]
    compiled = Analyzer()
    with python_path():
        reference = Analyzer()
        want = [token_view(reference, t) for t in batch]
    assert [token_view(compiled, t) for t in batch] == want
    assert len(compiled._tok_memo) <= 4 + 12


def test_compiled_tokens_run_only_where_the_compiled_analysis_does():
    """Version 1 tokenizes in Python, the same with the switch either way; a subclass with
    tokens() of its own gets its columns from them."""
    text = "Running e-mail servers 检索增强生成"
    with python_path():
        want = token_view(Analyzer(version=1), text)
    assert Analyzer(version=1)._compiled_table(text) is None
    assert token_view(Analyzer(version=1), text) == want
    assert Analyzer()._compiled_table(text) is not None

    class Mine(Analyzer):
        def tokens(self, text):
            return [analysis.Token("x", 0, 1, 0), analysis.Token("y", 2, 4, 5)]

    terms, offsets = Mine().token_table(text)
    assert terms == ["x", "y"] and offsets.tolist() == [0, 1, 0, 2, 4, 5]

    class Counting(Analyzer):  # analyzes its own way, no tokens(): neither way gives any
        def term_counts(self, text):
            return {"x": 1}

    with pytest.raises(analysis.InvalidInput, match="does not provide tokens"):
        Counting().token_table(text)
