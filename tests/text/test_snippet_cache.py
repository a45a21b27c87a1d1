"""Highlights with the token cache (ragdb.text.snippets.TokenCache): byte-identical to the
highlights computed before the cache existed (that function is kept here, as it was), cold
and warm, and the cache stays within its bounds."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, given, settings, strategies as st

import ragdb
from ragdb.text.snippets import Match, TokenCache, highlight, snippet

EXAMPLES = int(os.environ.get("RAGDB_HYPOTHESIS_EXAMPLES", "60"))


def highlight_before_the_cache(analyzer, text, terms, phrases=()) -> list[Match]:
    """ragdb.text.snippets.highlight as it was before TokenCache (commit af563c3), verbatim."""
    wanted = set(terms)
    tokens = analyzer.tokens(text)
    raw: list[Match] = [(t.start, t.end, frozenset((t.term,))) for t in tokens if t.term in wanted]
    if phrases:
        at: dict[tuple[str, int], list[tuple[int, int]]] = {}
        for t in tokens:
            at.setdefault((t.term, t.position), []).append((t.start, t.end))
        positions: dict[str, list[int]] = {}
        for t in tokens:
            positions.setdefault(t.term, []).append(t.position)
        for seq in phrases:
            if not seq:
                continue
            first, off0 = seq[0]
            for p in sorted(set(positions.get(first, ()))):
                start_pos = p - off0
                found = [at.get((term, start_pos + off)) for term, off in seq]
                if all(found):
                    spans = [s for group in found if group for s in group]
                    keys = frozenset([term for term, _ in seq] + [" ".join(term for term, _ in seq)])
                    raw.append((min(s for s, _ in spans), max(e for _, e in spans), keys))
    raw.sort(key=lambda m: (m[0], m[1]))
    merged: list[Match] = []
    for start, end, keys in raw:
        if merged and start <= merged[-1][1]:
            s0, e0, k0 = merged[-1]
            merged[-1] = (s0, max(e0, end), k0 | keys)
        else:
            merged.append((start, end, keys))
    return merged


def phrase_of(an: ragdb.Analyzer, q: str) -> list[tuple[str, int]]:
    tokens = an.tokens(q)
    return [(t.term, t.position - min(x.position for x in tokens)) for t in tokens] if tokens else []


TEXTS = [
    "Deleting a document lowers the document frequencies of its terms at once. Deleted documents are gone.",
    "数据库支持增量更新。删除文档后，相关词的文档频率立即更新。",
    "C++ and node.js, Ｄｅｌｅｔｅ the ﬁle, file files filed; e-mail the e mail admin@example.com",
    "the of the of retrieval retrieval retrieved the index indexes of the",
    "",
    "   ",
]
QUERIES = ["deleted documents", "删除文档", "文档频率", "file delete", "retrieval the", "e-mail", "index of the",
           "nothing here"]


def test_highlights_are_identical_to_before_the_cache_cold_and_warm():
    an = ragdb.Analyzer()
    cache = TokenCache()
    for _ in range(2):  # the second round finds every text in the cache
        for text in TEXTS:
            for q in QUERIES:
                terms = set(an.terms(q))
                for phrases in ([], [phrase_of(an, q)], [phrase_of(an, q), phrase_of(an, "the")]):
                    want = highlight_before_the_cache(an, text, terms, phrases)
                    assert highlight(an, text, terms, phrases) == want
                    assert highlight(an, text, terms, phrases, cache=cache) == want


words = st.sampled_from(["retrieval", "retrieved", "index", "indexes", "检索", "增强", "文档", "删除", "the", "of",
                         "C++", "node.js", "Ｄｅｌｅｔｅ", "ﬁle", "file", "e-mail", "mail", ".", ","])


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.lists(words, min_size=0, max_size=40).map(" ".join), query=st.lists(words, min_size=1, max_size=3),
       phrase=st.booleans(), size=st.integers(10, 200))
def test_cached_snippets_equal_the_uncached_ones(text, query, phrase, size):
    an = ragdb.Analyzer()
    q = " ".join(query)
    terms = set(an.terms(q))
    phrases = [phrase_of(an, q)] if phrase else []
    cache = TokenCache()
    want = highlight_before_the_cache(an, text, terms, phrases)
    assert highlight(an, text, terms, phrases, cache=cache) == want
    assert highlight(an, text, terms, phrases, cache=cache) == want  # from the cache
    assert snippet(an, text, terms, phrases, size, cache=cache) == snippet(an, text, terms, phrases, size)


def test_the_cache_keeps_recent_texts_within_its_character_budget():
    an = ragdb.Analyzer()
    cache = TokenCache(max_chars=400)
    texts = [f"text number {i} " + "word " * 15 for i in range(10)]  # 90-ish characters each
    got = [cache.get(an, t) for t in texts]
    assert cache.get(an, texts[-1]) is got[-1]  # recent: kept
    assert cache.get(an, texts[0]) is not got[0]  # the oldest went first
    assert cache.get(an, texts[0]) is cache.get(an, texts[0])
    big = "long " * 200  # over a quarter of the budget: tokenized, not kept
    assert cache.get(an, big) is not cache.get(an, big)
    other = ragdb.Analyzer(stem=None)
    assert cache.get(other, texts[-1]) is not got[-1]  # another analyzer: its own tokens
    assert "number" in cache.get(other, texts[-1]).terms


def test_repeated_highlighted_searches_give_the_same_hits():
    with ragdb.open(":memory:") as db:
        db.add_many({"text": t, "source": f"s{i}"} for i, t in enumerate(TEXTS[:4]))
        for q in QUERIES + ['"deleted documents"', "delet*", "indx~"]:
            first = db.search(q, highlight=True, snippet_chars=40)
            again = db.search(q, highlight=True, snippet_chars=40)
            assert [(h.chunk_id, h.highlights, h.snippet) for h in first] == \
                [(h.chunk_id, h.highlights, h.snippet) for h in again]
