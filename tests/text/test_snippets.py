"""Highlights and snippets of hits (SearchOptions(highlight=True), the CLI, the HTTP API)."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import ragdb
from ragdb.errors import InvalidInput
from ragdb.text.snippets import best_window, highlight

from cli_helpers import out_json, run

EXAMPLES = int(os.environ.get("RAGDB_HYPOTHESIS_EXAMPLES", "60"))

TEXT = ("Deleting a document lowers the document frequencies of its terms at once. "
        "Other notes follow here, about unrelated matters such as storage, backups and the weather. " * 3
        + "How are deleted documents handled? They are removed from every posting list.")


def marked(text: str, spans) -> str:
    out, last = "", 0
    for a, b in spans:
        out += text[last:a] + "[" + text[a:b] + "]"
        last = b
    return out + text[last:]


def test_no_highlight_by_default():
    with ragdb.open(":memory:") as db:
        db.add(TEXT, source="a")
        (hit,) = db.search("deleted documents")
        assert hit.highlights == () and hit.snippet is None
        with pytest.raises(InvalidInput, match="snippet_chars must be an integer between 1 and"):
            db.search("x", highlight=True, snippet_chars=0)
        with pytest.raises(InvalidInput, match="highlight must be True or False"):
            db.search("x", highlight="yes")


def test_words_phrases_and_the_best_window():
    with ragdb.open(":memory:") as db:
        db.add(TEXT, source="a", chunker="none")
        (hit,) = db.search("deleted documents", highlight=True, snippet_chars=120)
        words = {hit.text[a:b].lower() for a, b in hit.highlights}
        assert words == {"deleting", "document", "deleted", "documents"}  # stems find every form
        snip = hit.snippet
        assert snip.text == hit.text[snip.start:snip.end] and len(snip.text) <= 120
        assert [snip.text[a:b] for a, b in snip.highlights] == \
            [hit.text[a:b] for a, b in hit.highlights if a >= snip.start and b <= snip.end]
        # the phrase query's window is the one holding the phrase, marked whole
        (hit,) = db.search('"deleted documents"', highlight=True, snippet_chars=120)
        snip = hit.snippet
        assert "[deleted documents]" in marked(snip.text, snip.highlights)
        assert snip.start > 0 and snip.text.startswith(("How", "weather")) or " How " in snip.text


def test_cjk_highlights_merge_into_runs():
    with ragdb.open(":memory:") as db:
        db.add("数据库支持增量更新。删除文档后，相关词的文档频率立即更新。", source="zh")
        (hit,) = db.search("删除文档", highlight=True)
        assert "[删除文档]" in marked(hit.text, hit.highlights)
        (hit,) = db.search('"文档频率"', highlight=True)
        assert "[文档频率]" in marked(hit.text, hit.highlights)


def test_prefix_and_fuzzy_highlight_their_expansions():
    with ragdb.open(":memory:") as db:
        db.add("Deletion and deleting, or delete: the index never forgets.", source="a")
        (hit,) = db.search("delet*", highlight=True)
        assert marked(hit.text, hit.highlights).startswith("[Deletion] and [deleting], or [delete]:")
        (hit,) = db.search("indx~", highlight=True)
        assert "the [index] never" in marked(hit.text, hit.highlights)


def test_vector_hits_get_a_snippet_without_matches_when_no_word_matches():
    with ragdb.open(":memory:", embedder="hash:64") as db:
        db.add("alpha beta gamma " * 40, source="a")
        (hit,) = db.search("alpha delta", scorer="vector", highlight=True, snippet_chars=50)
        assert hit.snippet is not None and len(hit.snippet.text) <= 50 and hit.highlights


def test_best_window_without_matches_starts_at_the_beginning():
    assert best_window("one two three four five six", [], 12) == (0, 7)  # cut back to a word end
    assert best_window("short", [], 100) == (0, 5)


words = st.sampled_from(["retrieval", "retrieved", "index", "indexes", "检索", "增强", "文档", "删除", "the", "of",
                         "C++", "node.js", "Ｄｅｌｅｔｅ", "ﬁle", "file"])


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.lists(words, min_size=1, max_size=30).map(" ".join), query=st.lists(words, min_size=1, max_size=3),
       phrase=st.booleans(), size=st.integers(10, 200))
def test_highlights_are_exactly_the_matches(text, query, phrase, size):
    """Every highlight is a span whose text analyzes to a query term (or holds the phrase), every
    token of a query term is covered, and the snippet is a window of the text with the spans inside it."""
    an = ragdb.Analyzer()
    q = " ".join(query)
    terms = set(an.terms(q))
    phrases = [[(t.term, t.position - min(x.position for x in an.tokens(q))) for t in an.tokens(q)]] if phrase \
        else []
    spans = highlight(an, text, terms if not phrase else set(), phrases)
    tokens = an.tokens(text)
    for start, end, _keys in spans:
        assert 0 <= start < end <= len(text)
        inside = [t for t in tokens if t.start >= start and t.end <= end]
        assert inside and set(an.terms(text[start:end])) & (terms | {t for s in phrases for t, _ in s})
    if not phrase:
        for t in tokens:
            if t.term in terms:
                assert any(s <= t.start and t.end <= e for s, e, _k in spans)
    for (_s1, e1, _), (s2, _e2, _) in zip(spans, spans[1:]):
        assert e1 < s2  # merged: apart and in order
    start, end = best_window(text, spans, size)
    assert 0 <= start <= end <= len(text) and end - start <= size


def test_cli_marks_matches_and_json_carries_spans(runner, tmp_path):
    kb = tmp_path / "kb.db"
    with ragdb.open(kb) as db:
        db.add(TEXT, source="notes.md", chunker="none")
    out = run(runner, "-d", kb, "search", '"deleted documents"', "--snippet-chars", "100").stdout
    assert "[deleted documents]" in out and out.count("…") >= 1
    (hit,) = out_json(run(runner, "-d", kb, "search", '"deleted documents"', "--json"))
    snip = hit["snippet"]
    assert snip["text"] == hit["text"][snip["start"]:snip["end"]]
    assert [hit["text"][a:b] for a, b in hit["highlights"]][-1] == "deleted documents"


def _best_window_by_union(text, matches, size):
    """best_window's definition, each window's distinct terms a union of its matches' keys
    (what it computed before it slid one count along): the oracle of the test below."""
    from ragdb.text.snippets import _word_end, _word_start

    n = len(text)
    if n <= size:
        return 0, n
    if not matches:
        return 0, _word_end(text, size, 0)
    best = (-1, -1, 0)
    best_span = (matches[0][0], matches[0][1])
    j = 0
    for i in range(len(matches)):
        j = max(j, i)
        while j + 1 < len(matches) and matches[j + 1][1] - matches[i][0] <= size:
            j += 1
        window = matches[i:j + 1]
        score = (len(frozenset().union(*(k for _s, _e, k in window))), len(window), -matches[i][0])
        if score > best:
            best, best_span = score, (matches[i][0], matches[j][1])
    lo, hi = best_span
    if hi - lo > size:  # longer than the window: it starts where they start
        return lo, _word_end(text, min(n, lo + size), lo)
    room = size - (hi - lo)
    start = max(0, lo - room // 2)
    end = min(n, start + size)
    start = max(0, end - size)
    return _word_start(text, start, lo), _word_end(text, end, hi)


@settings(max_examples=400, deadline=None)
@given(gaps=st.lists(st.tuples(st.integers(0, 40), st.integers(1, 30),
                               st.sets(st.sampled_from("abcde"), min_size=1, max_size=3)), max_size=25),
       size=st.integers(1, 200), tail=st.integers(0, 60), spaces=st.integers(1, 9))
def test_the_best_window_is_the_one_of_its_definition(gaps, size, tail, spaces):
    """Matches in text order, apart or touching, longer than the window or not, with one key or
    several (a phrase's): the window of the definition, whose distinct keys are a union."""
    matches, at = [], 0
    for gap, length, keys in gaps:
        matches.append((at + gap, at + gap + length, frozenset(keys)))
        at += gap + length
    text = "".join(" " if i % spaces == 0 else "x" for i in range(at + tail))
    assert best_window(text, matches, size) == _best_window_by_union(text, matches, size)


def test_a_match_longer_than_the_snippet_shows_its_start_highlighted():
    """The window of a match longer than the snippet was centred on it, so it started inside
    the match (mid-word) and kept no highlight: only whole matches inside were kept."""
    import ragdb

    with ragdb.open(":memory:") as db:
        db.add("前言部分。" * 3 + "检索增强生成是一种把检索和生成结合起来的方法" + "。后记" * 3, source="a.md")
        db.add("Intro text here. The node.js runtime node.js runtime node.js runtime is used widely.", source="b.md")
        for query, size in [("检索增强生成是一种把检索和生成结合起来的方法", 10), ('"node.js runtime node.js runtime"', 12)]:
            hit = db.search(query, highlight=True, snippet_chars=size)[0]
            (lo, _hi), = hit.highlights
            snip = hit.snippet
            assert snip.start == lo and snip.end - snip.start <= size
            assert snip.highlights == ((0, snip.end - snip.start),)  # the shown part of the match
            assert snip.text == hit.text[snip.start:snip.end]
