"""The analyzer's fast paths against the plain definition of its terms (version 1, which
databases built before version 2 keep; version 2's rules are in test_analysis_v2.py)."""

import re
import unicodedata
from collections import Counter

import Stemmer
from hypothesis import given, settings
from hypothesis import strategies as st

import ragdb
from ragdb.text.analysis import _CJK_CHAR, _TERM_RE, _WORD_RE, CHINESE_STOPWORDS, ENGLISH_STOPWORDS

_STEM = Stemmer.Stemmer("english")


V1 = {"name": "ragdb", "version": 1, "stem": "english", "stopwords": "english+chinese", "cjk": "bigram"}


def reference_terms(text: str) -> list[str]:
    """The default analyzer of version 1 by its definition: NFKC, casefold, the word regex over
    non-CJK runs, stopwords out, Snowball stems; then CJK unigrams + bigrams
    without Chinese stopwords."""
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
    return words + [t for t in cjk if t not in CHINESE_STOPWORDS]


# Text built from the pieces the fast paths treat differently: ASCII words and
# punctuation, single letters and digits, words longer than MAX_TOKEN_CHARS,
# accented and full-width letters, ligatures and ß (NFKC/casefold change them),
# stopwords in any case, CJK runs, underscores and emoji.
_PIECES = st.sampled_from(
    ["The", "running", "DOGS", "a", "I", "7", "42", "x1", "don't", "it's", "e-mail", "foo_bar",
     "café", "Straße", "什么是", "几乎", "谁", "吗", "ﬁsh", "ＡＢＣ", "１２３", "Ωmega", "naïve", "检索增强生成", "向量", "数据库",
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
    an = ragdb.Analyzer.from_config(V1)
    expected = reference_terms(text)
    assert an.terms(text) == expected
    counts = an.term_counts(text)
    assert counts == dict(Counter(expected))
    assert list(counts) == list(dict(Counter(expected)))  # order of first appearance (forward index order)
    # a second pass goes through the memo and must agree with the first
    assert an.terms(text) == expected and an.term_counts(text) == counts


def test_long_words_are_cut_like_the_regex():
    an = ragdb.Analyzer(stem=None, stopwords=None, version=1)
    assert an.terms("a" * 65) == ["a" * 64]
    assert an.terms("b" * 64 + "1") == ["b" * 64, "1"]
    assert an.terms("x y 7 z9") == ["7", "z9"]
    assert re.fullmatch(r"[^\W_]{2,64}|\d", "z9")
    # version 2 cuts long words the same way and keeps one-letter words
    v2 = ragdb.Analyzer(stem=None, stopwords=None)
    assert v2.terms("a" * 65) == ["a" * 64, "a"]
    assert v2.terms("b" * 64 + "1") == ["b" * 64, "1"]
    assert v2.terms("x y 7 z9") == ["x", "y", "7", "z9"]


def test_chinese_question_words_are_stopwords():
    an = ragdb.Analyzer()
    terms = an.terms("向量数据库是什么？谁发明的？几乎")
    assert not {"什么", "什", "么", "谁"} & set(terms)
    assert {"向量", "数据", "据库", "是", "几乎", "乎"} <= set(terms)  # 几乎 is a word, not "how many"
    # databases made with English stopwords only keep their analysis
    old = ragdb.Analyzer.from_config({"name": "ragdb", "version": 1, "stem": "english",
                                      "stopwords": "english", "cjk": "bigram"})
    assert {"什么", "什", "么"} <= set(old.terms("什么"))


def test_question_word_does_not_outrank_the_answer():
    docs = {"song": "歌曲《什么》：什么也不说，什么也不做。",
            "vdb": "向量数据库存储向量，并支持相似度检索，常用于检索增强生成。",
            "sql": "关系数据库用表存储数据，以结构化查询语言访问。"}
    for stopwords, best in (("english+chinese", "vdb"), ("english", "song")):
        with ragdb.open(":memory:", analyzer={"name": "ragdb", "version": 1, "stem": "english",
                                              "stopwords": stopwords, "cjk": "bigram"}) as db:
            for source, text in docs.items():
                db.add(text, source=source, chunker="none")
            assert db.search("向量是什么？", k=3)[0].source == best
