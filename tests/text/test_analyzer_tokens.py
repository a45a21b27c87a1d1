"""Analyzer.tokens (terms with offsets and positions) and Analyzer.dropped, for both
analyzer versions: tokens give exactly the terms term_counts gives, at spans of the
original text that analyze to them."""

from collections import Counter

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import ragdb
from ragdb.text.analysis import Token

V1 = {"name": "ragdb", "version": 1, "stem": "english", "stopwords": "english+chinese", "cjk": "bigram"}
ANALYZERS = {
    "v1": ragdb.Analyzer.from_config(V1),
    "v1-simple": ragdb.Analyzer(stem=None, stopwords=None, version=1),
    "v2": ragdb.Analyzer(),
    "v2-simple": ragdb.Analyzer.from_spec("simple"),
}

# Pieces the analysis treats differently: technical words and their joiners, clitics,
# one-letter words, numbers, long words, full-width forms, ligatures and letters that
# NFKC or case folding change (lengths change too), combining marks, CJK with and
# without stopwords, and separators of every kind.
_PIECES = st.sampled_from(
    ["C++", "c#", "F#", "g++", "++", "#", "+", ".NET", "ASP.NET", ".net", "node.js", "Node.JS.", "e-mail", "email",
     "E-Mail", "x86_64", "x86-64", "std::vector", "a::b::c", "::", ":", "CMAKE_CXX_STANDARD", "__init__", "foo__bar",
     "3.11", "v2.0.1", "0.5-9.6", "1.2.3.4", ".5", "-5", "e.g.", "i.e.", "U.S.A.", "a.b", "x.", "T-cell",
     "state-of-the-art", "3-5", "--", "-", "_", ".", "..", "...", "'", "\u2019", "don't", "it's", "I'd",
     "Alzheimer's", "O'Brien", "rock'n'roll", "students'", "The", "running", "DOGS", "a", "I", "D", "x", "7", "42",
     "a" * 65, "b" * 64 + "1", "c" * 130, "d" * 63 + "-x", "x-" + "y" * 64, "ＡＢＣ", "１２３", "ﬁsh", "Straße", "İ",
     "ǅ", "e\u0301", "\u0301", "ｶﾞ", "ﾞ", "½", "㍱", "㊙", "㋀", "naïve", "café", "Ωmega", "什么是", "几乎", "谁", "吗", "检索增强生成",
     "向量", "数据库", "の", "使用C++编程", "😀", "\u00a0", "\u200b", "\n", "\t", " ", "  ", "", "(", ")", ",", "!", "?",
     "/", "\"", "—"])
_TEXT = st.one_of(
    st.lists(_PIECES, max_size=30).map("".join),
    st.lists(_PIECES, max_size=30).map(" ".join),
    st.text(max_size=120),
    st.text(alphabet=st.characters(max_codepoint=127), max_size=200),
    st.text(alphabet="aZ9_.-:+#' \u2019é中文", max_size=60),
)


def _check_tokens(an: ragdb.Analyzer, text: str) -> list[Token]:
    tokens = an.tokens(text)
    assert Counter(t.term for t in tokens) == Counter(an.term_counts(text))
    assert Counter(t.term for t in tokens) == Counter(an.terms(text))
    for t in tokens:
        assert 0 <= t.start < t.end <= len(text), t
        # the span of the original text that produced the term analyzes to it (a CJK
        # bigram's span holds both its characters, a compound's whole form its parts)
        assert t.term in an.terms(text[t.start:t.end]), (t, text[t.start:t.end])
    assert [t.start for t in tokens] == sorted(t.start for t in tokens)  # text order
    assert [t.position for t in tokens] == sorted(t.position for t in tokens)
    return tokens


@settings(max_examples=400, deadline=None)
@given(_TEXT)
@example("C++ and C# on .NET, node.js e-mail x86_64 std::vector CMAKE_CXX_STANDARD 3.11 v2.0.1 vitamin D")
@example("ＡＢＣ ﬁsh Straße ｶﾞ ½ 使用C++编程")
@pytest.mark.parametrize("name", sorted(ANALYZERS))
def test_tokens_are_the_terms_at_their_spans(name, text):
    _check_tokens(ANALYZERS[name], text)


@settings(max_examples=200, deadline=None)
@given(_TEXT)
@pytest.mark.parametrize("name", sorted(ANALYZERS))
def test_fast_paths_agree_with_the_general_path(name, text):
    """ASCII text is split by bytes.translate and read through a memo; the same words in
    non-ASCII text go through the regular expressions (an em dash is only a separator)."""
    an = ANALYZERS[name]
    fresh = ragdb.Analyzer.from_config(an.config())
    assert fresh.terms(text + " \u2014") == an.terms(text) == fresh.terms(text)
    counts = fresh.term_counts(text)
    assert counts == an.term_counts(text) == dict(Counter(an.terms(text)))
    assert list(counts) == list(dict.fromkeys(an.terms(text)))  # order of first appearance
    assert getattr(counts, "overlaps", 0) == getattr(an.term_counts(text + " \u2014"), "overlaps", 0)


@settings(max_examples=300, deadline=None)
@given(_TEXT)
@example("state of the art: C++ node.js e-mail 检索增强生成 Ｄｅｌｅｔｅ ﬁle")
@pytest.mark.parametrize("name", sorted(ANALYZERS))
def test_positions_are_the_tokens_positions(name, text):
    """positions() (phrase checks) gives each term the positions tokens() gives it, warm or cold."""
    an = ANALYZERS[name]
    want: dict[str, list[int]] = {}
    for t in an.tokens(text):
        want.setdefault(t.term, []).append(t.position)
    assert an.positions(text) == want
    assert ragdb.Analyzer.from_config(an.config()).positions(text) == want  # a fresh analyzer's memo
    assert an.positions(text) == want  # again, from the memo


@settings(max_examples=200, deadline=None)
@given(_TEXT, st.lists(_PIECES, max_size=3))
@pytest.mark.parametrize("name", sorted(ANALYZERS))
def test_positions_of_some_terms(name, text, pieces):
    an = ANALYZERS[name]
    wanted = set(an.terms(" ".join(pieces))) | set(list(an.positions(text))[:2])
    assert an.positions_of(text, wanted) == {t: p for t, p in an.positions(text).items() if t in wanted}


@settings(max_examples=150, deadline=None)
@given(_TEXT, st.lists(_PIECES, max_size=3), st.sampled_from([1, 3, 8, 40]), st.sampled_from([0, 1, 3, 10_000]))
def test_positions_of_with_a_memo_that_fills_up(text, pieces, budget, run_pairs):
    """The positions memo is bounded in (term, position) pairs (a CJK run is hundreds): one
    that fills up and is emptied mid-text, even a budget below one run, changes no answer; nor
    do CJK runs too long to be remembered (POS_MEMO_RUN_PAIRS), which it never holds."""
    from unittest import mock

    import ragdb.text.analysis

    with mock.patch.object(ragdb.text.analysis, "POS_MEMO_PAIRS", budget), \
            mock.patch.object(ragdb.text.analysis, "POS_MEMO_RUN_PAIRS", run_pairs):
        an = ragdb.Analyzer()
        full = ragdb.Analyzer().positions(text)
        wanted = set(an.terms(" ".join(pieces))) | set(list(full)[:2])
        for _ in range(2):  # cold, then with whatever the memo kept
            assert an.positions_of(text, wanted) == {t: p for t, p in full.items() if t in wanted}
            assert an.positions(text) == full
            held = [len(terms) for terms, _positions, _width in an._pos_memo.values()]
            assert an._pos_pairs == sum(held)
            cjk = [len(terms) for run, (terms, _p, _w) in an._pos_memo.items()
                   if isinstance(run, str) and ragdb.text.analysis._CJK_CHAR.match(run)]
            assert all(n <= run_pairs for n in cjk)
            assert an._pos_pairs <= budget or len(held) == 1  # one run over the budget is kept alone


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(alphabet=st.characters(categories=["Lu", "Ll", "Lt", "Lm", "Lo", "Nd", "Nl", "No"]),
                         min_size=1, max_size=140),
                 st.sampled_from(["a" * 64, "a" * 65, "b" * 129, "x86", "Straße", "ǅ", "½", "covid19", "ｶ"])))
@example("a" * 200)
def test_a_word_of_word_characters_is_planned_as_one_word(word):
    """tokens() plans a run of word characters alone as one word (cut at MAX_TOKEN_CHARS), not
    through _plan2's expressions: the same items and width as _plan2 gives it."""
    from ragdb.text import analysis

    if not word.isalnum():
        return
    plan: list = []
    width = analysis._word_items(word, 0, 0, plan)
    assert (plan, width) == analysis._plan2(word)


_JOINED_COMMON = ["tissue-resident", "0.05", "24.7-fold", "-0.5", "world-wide.", "u.s.a", "e.g", "b-cell",
                  "il-10", "0.5-9.6", "a-b-c", "x-ray:", "--a", "tgf-β", "1.2.3", "a" * 70 + "-b", "e-" + "m" * 64]


@settings(max_examples=500, deadline=None)
@given(st.one_of(st.text(alphabet="ab1e\u00e9\u00b2\u03b2.-:_'+#", max_size=24),
                 st.lists(st.sampled_from(["a", "b", "1", "23", "e", "g", "ie", "x" * 63, "y" * 65, "\u00bd"]),
                          min_size=1, max_size=5).flatmap(
                     lambda parts: st.lists(st.sampled_from([".", "-"]), min_size=len(parts) - 1,
                                            max_size=len(parts) - 1).map(
                         lambda joins: "".join(p + j for p, j in zip(parts, joins + [""])))),
                 st.sampled_from(_JOINED_COMMON)))
@example("a." * 40 + "b")
@example("e.g")
@example("-i.e.")
@example("x-u.s.a-0.5")
def test_joined_tokens_are_planned_as_the_unit_expression_plans_them(raw):
    """_joined_plan (words joined by hyphens and dots, planned with str.split) gives the
    items and width of the unit expression (_unit_plan), wherever it gives a plan."""
    from ragdb.text import analysis

    found = analysis._joined_plan(raw)
    if found is not None:
        assert found == analysis._unit_plan(raw)
    assert analysis._plan2(raw) == analysis._unit_plan(raw)


_TOKEN_SHAPES = ["cells", "cells.", "cells:", "the", "the.", "small-scale", "age-dependent.", "30-fold", "3-10",
                 "e-mail", "b-cell", "\u00b2-x", "0.58", "47.6:", "0.58.", "1.21-5.80", "x86_64", "node.js", "u.s.a",
                 "-0.5", "word-", "a--b", "alzheimer's", "c++", ".net", "is-the", "the-is", "0.the", "x" * 65,
                 "x" * 65 + ".", "y" * 30 + "-" + "z" * 65, "9" * 40 + "." + "9" * 30, "\u03b2-catenin", "\u00bd.5"]


@settings(max_examples=300, deadline=None)
@given(tokens=st.lists(st.one_of(st.sampled_from(_TOKEN_SHAPES),
                                 st.text(alphabet="ab1e\u00e9\u00b2\u03b2.-:_'+#", min_size=1, max_size=12)),
                       min_size=1, max_size=12, unique=True),
       language=st.sampled_from(["english", None]))
@example(tokens=_TOKEN_SHAPES, language="english")
@example(tokens=_TOKEN_SHAPES, language=None)
def test_new_tokens_learned_in_one_batch_get_their_terms_alone(tokens, language):
    """_expand_list (the compiled analysis's call for the tokens it has not met, all in one
    batch: one stemming call, a memo filled as it goes, which a word ending a sentence reads)
    gives each token the terms it gets alone, stopwords, overlap markers and over-long words
    included."""
    from ragdb.text.analysis import Analyzer

    analyzer = Analyzer(stem=language, stopwords=language)
    expected = [analyzer._expand2([t], {})[t] for t in tokens]
    assert analyzer._expand_list(list(tokens)) == expected
    assert analyzer._expand_list([t for t in tokens if t.isalnum()]) == [e for t, e in zip(tokens, expected)
                                                                          if t.isalnum()]


def test_the_common_joined_tokens_skip_the_unit_expression():
    """The common compounds and numbers take the quick path (else it would save nothing)."""
    from ragdb.text import analysis

    for raw in _JOINED_COMMON:
        assert analysis._joined_plan(raw) is not None, raw
    for raw in (".net", "c++", "don't", "a_b", "a::b", "a..b", "-", "."):
        assert analysis._joined_plan(raw) is None, raw


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=80), st.text(alphabet=st.characters(max_codepoint=0x303F), max_size=80),
                 st.lists(_PIECES, max_size=20).map(" ".join)))
def test_text_below_the_cjk_ranges_has_the_runs_of_the_cjk_free_expression(text):
    """Text with no character from U+3040 up has no CJK character, and there the runs of
    _RAW2 (compiled at import) are those of _TERM2_RE (compiled when CJK is met)."""
    from ragdb.text import analysis

    norm = analysis._normalize_map(text)[0]
    if analysis._below_cjk(norm):
        assert analysis._CJK_CHAR.search(norm) is None
        assert [(m.group(), m.start()) for m in analysis._RAW2.finditer(norm)] == \
               [(m.group(), m.start()) for m in analysis._TERM2_RE.finditer(norm)]
    else:
        assert max(norm) >= "\u3040"
    assert analysis.is_cjk(text) == (analysis._CJK_CHAR.search(text) is not None)


def test_an_english_search_compiles_no_cjk_expression(tmp_path):
    """Searching English text, highlights and duplicate passages included, never compiles the
    regular expressions of the CJK ranges (each ~3-10 ms of a command-line search); a Chinese
    text then does."""
    import subprocess
    import sys

    db_path = tmp_path / "kb.db"
    with ragdb.open(str(db_path)) as db:
        db.add("Deleted documents leave the index at once; naïve café entries too.", source="a.md")
        db.add("Deleted documents leave the index at once; naïve café entries too!", source="a.html")
    probe = (
        "import ragdb\n"
        "from ragdb.text import analysis\n"
        "def compiled():\n"
        "    return sorted(n for n in ('_CJK_CHAR', '_TERM2_RE', '_TERM_RE')\n"
        "                  if getattr(analysis, n).compiled)\n"
        f"db = ragdb.open({str(db_path)!r})\n"
        "hits = db.search('deleted café documents', k=5, highlight=True)\n"
        "assert hits and hits[0].snippet is not None, hits\n"
        "print(compiled())\n"
        "db.search('删除文档', k=5, highlight=True)\n"
        "print(compiled())\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    english, chinese = out.stdout.splitlines()
    assert english == "[]"
    assert "_CJK_CHAR" in chinese


def _cluster_by_cluster(text):
    """_normalize_map's definition, one cluster at a time (what it did before it skipped the
    plain ASCII characters): the oracle of the test below."""
    import unicodedata

    if text.isascii():
        return text.lower(), None, None
    if unicodedata.is_normalized("NFKC", text):
        folded = text.casefold()
        if len(folded) == len(text):
            return folded, None, None
    nfkc = unicodedata.normalize
    bounds = [0] + [i for i in range(1, len(text)) if not unicodedata.combining(text[i])] + [len(text)]
    segs: list = []
    for a, b in zip(bounds, bounds[1:]):
        norm = nfkc("NFKC", text[a:b])
        if segs and not text[a].isascii():
            pa, _pb, pn = segs[-1]
            joined = nfkc("NFKC", text[pa:b])
            if joined != pn + norm:
                segs[-1] = (pa, b, joined)
                continue
        segs.append((a, b, norm))
    whole = unicodedata.normalize("NFKC", text).casefold()
    starts: list = []
    ends: list = []
    for a, b, norm in segs:
        n = len(norm.casefold())
        starts.extend([a] * n)
        ends.extend([b] * n)
    if "".join(norm.casefold() for _a, _b, norm in segs) != whole:
        return whole, [0] * len(whole), [len(text)] * len(whole)
    return whole, starts, ends


# characters that compose with what comes before them, or change under NFKC or case folding
_COMPOSING = st.sampled_from(["\u0301", "\u0308", "\u0327", "\u0338", "\u1161", "\u11a8", "\u1100", "\uac00",
                              "\uff76", "\uff9e", "\uff9f", "\u3099", "\u309a", "\u304b", "\u09be", "\u09c7",
                              "\u0cd5", "\u0cc6", "\u0cbf", "\u0cc2", "ß", "İ", "ﬁ", "Ａ", "½", "²", "µ", "Å",
                              "\u212b", "e", "E", "a", "1", " ", ".", "-", "\u00a0"])


@settings(max_examples=500, deadline=None)
@given(st.one_of(st.lists(_COMPOSING, max_size=30).map("".join), _TEXT,
                 st.lists(st.one_of(_COMPOSING, _PIECES), max_size=30).map("".join)))
@example("e\u0301\u0301x")
@example("\u1100\u1161\u11a8 a\u1161")
@example("a\uff9e")
@example("\u0301abc")
def test_the_normalization_map_is_the_cluster_by_cluster_definition(text):
    from ragdb.text import analysis

    assert analysis._normalize_map(text) == _cluster_by_cluster(text)


_FILLING = ["alpha beta gamma", "alpha-delta", "x alpha beta-gamma.zeta", "Running servers, e-mail and node.js",
            "state-of-the-art x-ray", "alpha", "检索增强 alpha-omega", "omega-alpha. gamma:"]


@pytest.mark.parametrize("kernel_name", ["compiled", "numpy"])
def test_tokens_and_terms_stay_right_as_the_word_tables_empty(monkeypatch, kernel_name):
    """The tables of known words are emptied when full (MEMO_SIZE distinct words): a compound
    whose one part was known and the other new raised KeyError there (a long-running server's
    highlights, after 200,000 distinct words). And a table emptied by another thread between
    learning and looking up (simulated: emptied right after each learning) changes nothing."""
    from ragdb.index import kernel
    from ragdb.text import analysis

    before = kernel.use(kernel_name)
    try:
        reference = ragdb.Analyzer()
        want = [(reference.tokens(t), reference.terms(t)) for t in _FILLING]
        monkeypatch.setattr(analysis, "MEMO_SIZE", 3)
        small = ragdb.Analyzer()
        assert [(small.tokens(t), small.terms(t)) for t in _FILLING] == want

        learn_words, learn2 = analysis.Analyzer._learn_words, analysis.Analyzer._learn2

        def learn_words_then_empty(self, words):
            learn_words(self, words)
            self._words.clear()

        def learn2_then_empty(self, words):
            learn2(self, words)
            self._memo.clear()

        monkeypatch.setattr(analysis, "MEMO_SIZE", 10**6)
        monkeypatch.setattr(analysis.Analyzer, "_learn_words", learn_words_then_empty)
        monkeypatch.setattr(analysis.Analyzer, "_learn2", learn2_then_empty)
        raced = ragdb.Analyzer()
        assert [(raced.tokens(t), raced.terms(t)) for t in _FILLING] == want
    finally:
        kernel.use(before)
