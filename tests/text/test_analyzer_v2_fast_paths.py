"""The analyzer's fast paths give exactly what the plain rules give: text that is not ASCII
but has no CJK is split by bytes (the same tokens as the version 2 token pattern), and a text
analyzed after one with new words learns before it counts."""

from __future__ import annotations

import unicodedata

from hypothesis import given, settings
from hypothesis import strategies as st

from ragdb.text import analysis
from ragdb.text.analysis import Analyzer

# Mostly ASCII with other characters among it: letters with accents, Greek, dashes, quotes,
# full-width forms, combining marks, surrogate-free arbitrary Unicode.
mixed = st.text(st.one_of(st.sampled_from(list("abcXYZ019 .-_:+#'\n\t,;()\"/")),
                          st.sampled_from(list("éßΣβ–—’“”ＡＢ１ﬁ\u0301\u00a0\u2009×°")),
                          st.characters(blacklist_categories=("Cs",))), max_size=80)


def _plain(text: str) -> list[str]:
    return analysis._RAW2.findall(text)


@settings(max_examples=500, deadline=None)
@given(text=mixed)
def test_mixed_text_splits_into_the_pattern_s_tokens(text):
    norm = unicodedata.normalize("NFKC", text).casefold()
    if analysis._CJK_CHAR.search(norm) is not None:
        return
    got = analysis._raw_tokens2(norm)
    assert [t.decode("ascii") if isinstance(t, bytes) else t for t in got] == _plain(norm)
    assert all(isinstance(t, str) or t.isascii() for t in got)


@settings(max_examples=300, deadline=None)
@given(texts=st.lists(mixed, min_size=1, max_size=6))
def test_term_counts_equal_those_of_the_plain_tokens(texts):
    """A fresh analyzer's counts over a sequence of texts (so the memo and the learn-first mode
    are exercised) equal counts made from the pattern's string tokens by another fresh one."""
    fast, plain = Analyzer(), Analyzer()
    for text in texts:
        got = fast.term_counts(text)
        # (what the analyzer reads: ASCII lowered, other text NFKC and case folded, which is not
        # lowered again: "Ꭰ" folds to itself, and lower() would make it "ꭰ")
        norm = text.lower() if text.isascii() else unicodedata.normalize("NFKC", text).casefold()
        if analysis._CJK_CHAR.search(norm) is not None:
            continue
        want = plain._counts(_plain(norm), [])
        assert list(got.items()) == list(want.items())
        assert getattr(got, "overlaps", 0) == getattr(want, "overlaps", 0)


def test_english_and_chinese_samples_count_alike():
    samples = ["The naïve café served crème brûlée — twice, in 2.5 hrs (node.js & C++ e-mail).",
               "β-catenin and TNF-α levels rose 3–5× after IL‑6 “treatment”; U.S.A. e.g. don’t",
               "ＡＢＣ １２３ ﬁnance Straße", "北京大学 and 清华 mixed 中文 text."]
    fast, plain = Analyzer(), Analyzer()
    for text in samples * 2:
        got = fast.term_counts(text)
        norm = unicodedata.normalize("NFKC", text).casefold()
        if analysis._CJK_CHAR.search(norm) is None:
            want = plain._counts(_plain(norm), [])
            assert list(got.items()) == list(want.items())
        assert got == Analyzer().term_counts(text)
