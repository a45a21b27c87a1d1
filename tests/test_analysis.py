"""The analyzer's fast paths against the plain definition of its terms."""

import re
import unicodedata
from collections import Counter

import Stemmer
from hypothesis import given, settings
from hypothesis import strategies as st

import ragdb
from ragdb.analysis import _CJK_CHAR, _TERM_RE, _WORD_RE, ENGLISH_STOPWORDS

_STEM = Stemmer.Stemmer("english")


def reference_terms(text: str) -> list[str]:
    """The default analyzer by its definition: NFKC, casefold, the word regex over
    non-CJK runs, stopwords out, Snowball stems; then CJK unigrams + bigrams."""
    text = unicodedata.normalize("NFKC", text).casefold()
    words: list[str] = []
    cjk: list[str] = []
    for run in _TERM_RE.findall(text):
        if _CJK_CHAR.match(run):
            cjk.extend(run)
            cjk.extend(run[i:i + 2] for i in range(len(run) - 1))
        else:
            words.extend(_WORD_RE.findall(run))
    words = [_STEM.stemWord(w) for w in words if w not in ENGLISH_STOPWORDS]
    return words + cjk


# Text built from the pieces the fast paths treat differently: ASCII words and
# punctuation, single letters and digits, words longer than MAX_TOKEN_CHARS,
# accented and full-width letters, ligatures and ß (NFKC/casefold change them),
# stopwords in any case, CJK runs, underscores and emoji.
_PIECES = st.sampled_from(
    ["The", "running", "DOGS", "a", "I", "7", "42", "x1", "don't", "it's", "e-mail", "foo_bar",
     "café", "Straße", "ﬁsh", "ＡＢＣ", "１２３", "Ωmega", "naïve", "检索增强生成", "向量", "数据库",
     "の", "😀", "a" * 65, "b" * 64 + "1", "c" * 130, "z", ".", ",", "!", "\n", "\t", " ", "  ", "",
     "(", ")", "\u00a0", "\u200b", "#", "é", "İ"]
)
_TEXT = st.one_of(
    st.lists(_PIECES, max_size=40).map("".join),
    st.lists(_PIECES, max_size=40).map(" ".join),
    st.text(max_size=200),
    st.text(alphabet=st.characters(max_codepoint=127), max_size=300),
)


@settings(max_examples=600, deadline=None)
@given(_TEXT)
def test_terms_match_the_definition(text):
    an = ragdb.Analyzer()
    expected = reference_terms(text)
    assert an.terms(text) == expected
    counts = an.term_counts(text)
    assert counts == dict(Counter(expected))
    assert list(counts) == list(dict(Counter(expected)))  # order of first appearance (forward index order)
    # a second pass goes through the memo and must agree with the first
    assert an.terms(text) == expected and an.term_counts(text) == counts


def test_long_words_are_cut_like_the_regex():
    an = ragdb.Analyzer(stem=None, stopwords=None)
    assert an.terms("a" * 65) == ["a" * 64]
    assert an.terms("b" * 64 + "1") == ["b" * 64, "1"]
    assert an.terms("x y 7 z9") == ["7", "z9"]
    assert re.fullmatch(r"[^\W_]{2,64}|\d", "z9")
