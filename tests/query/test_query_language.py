"""The query language: parsing, and every operator against a brute-force reference."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import ragdb
from ragdb.query import language as q
from ragdb.errors import InvalidInput
from ragdb.index.matching import edits1

EXAMPLES = int(os.environ.get("RAGDB_HYPOTHESIS_EXAMPLES", "60"))


# -- parsing -----------------------------------------------------------------------------------

def words(parsed: q.ParsedQuery, negated: bool = False) -> list[tuple[str, str]]:
    return [(type(w).__name__, w.text) for w, _f, _b in parsed.words(negated=negated)]


@pytest.mark.parametrize("text", [
    "how are deleted documents handled", "What is RAG (retrieval augmented generation)?",
    "what's the C++ or C# standard?", "can I use e-mail, node.js and std::vector", "not this, not that",
    "and or not", "什么是检索增强生成", "检索增强生成（RAG）是什么？", "version 3.11.7 of x86_64", "--force flag",
    "note: the index", "50% of 3*4", "ratio 3:1 and a~b", "",
])
def test_natural_language_is_plain(text):
    parsed = q.parse(text)
    assert parsed.error is None and parsed.plain, parsed.root


@pytest.mark.parametrize("text, error", [
    ('unbalanced "quote', "never closed"), ("(open", "never closed"), ("close)", "without an opening"),
    ("a - b", "lone '-'"), ("x AND", "end of the query"), ("NOT", "end of the query"), ("()", "empty parentheses"),
    ('""', "empty phrase"), ("a*b c^0", "outside"), ("x~2", "within one edit"),
    ("(" * 40 + "x" + ")" * 40, "nested deeper than 32"), ("NOT " * 40 + "x", "nested deeper than 32"), ("NOT NOT x", "double negation"),
    ("-(" * 40 + "x" + ")" * 40, "nested deeper than 32"),
])
def test_unparsable_queries_fall_back_to_plain_words(text, error):
    parsed = q.parse(text)
    assert parsed.error is not None and error in parsed.error
    assert parsed.root == q.plain(text).root  # searched as the plain words


def test_operators():
    p = q.parse('"deleted documents" -draft +index NOT old x^2 delet* docment~ (a OR b)^3')
    clauses = p.root.clauses
    assert [c.occur for c in clauses] == ["must", "must_not", "must", "must_not", "should", "should", "should",
                                          "should"]
    assert clauses[0].node == q.Phrase("deleted documents")
    assert clauses[4].node == q.Word("x", boost=2.0)
    assert clauses[5].node == q.Word("delet", prefix=True)
    assert clauses[6].node == q.Word("docment", fuzzy=1)
    group = clauses[7].node
    assert isinstance(group, q.Group) and group.boost == 3.0
    assert words(p) == [("Phrase", "deleted documents"), ("Word", "index"), ("Word", "x"), ("Word", "delet"),
                        ("Word", "docment"), ("Word", "a"), ("Word", "b")]
    assert words(p, negated=True) == [("Word", "draft"), ("Word", "old")]
    assert not p.plain


def test_and_binds_tighter_than_or():
    p = q.parse("a OR b AND c")
    (only,) = p.root.clauses
    assert only.occur == "should"
    a, bc = only.node.clauses
    assert a == q.Clause("should", q.Word("a"))
    assert bc.occur == "should" and [c.occur for c in bc.node.clauses] == ["must", "must"]
    p = q.parse("cats AND NOT dogs birds")
    first, second = p.root.clauses
    assert first.occur == "must" and [c.occur for c in first.node.clauses] == ["must", "must_not"]
    assert second == q.Clause("should", q.Word("birds"))


def test_fields_only_when_known():
    p = q.parse("title:rag section:\"quick start\" lang:en std::vector")
    nodes = [c.node for c in p.root.clauses]
    assert nodes[0] == q.Word("rag", "title") and nodes[1] == q.Phrase("quick start", "section")
    assert nodes[2] == q.Word("lang:en") and nodes[3] == q.Word("std::vector")
    p = q.parse("lang:en title:(a b)", is_field=lambda name: name in ("lang", "title"))
    assert p.root.clauses[0].node == q.Word("en", "lang")
    assert p.root.clauses[1].node.field == "title"


def test_quotes_of_other_scripts_and_full_width_forms():
    # typographic quotes are punctuation of natural questions, not phrase quotes
    assert q.parse("什么是“乡里制”？").plain and q.parse("「碧草如茵」景致形成的原因是什么？").plain
    assert q.parse('"检索增强" 生成').root.clauses[0].node == q.Phrase("检索增强")
    assert q.parse("＂deleted documents＂").root.clauses[0].node == q.Phrase("deleted documents")  # NFKC
    assert q.parse("－draft").root.clauses[0].occur == "must_not"


@pytest.mark.parametrize("text", ["Differentiated E2f-1, -2, -3 TKO cells", "+1 nucleosomes", "the +5 position",
                                  "-40 degrees", "Histone 2A (H2A)-histone 2B (H2B) dimer"])
def test_signed_numbers_are_words(text):
    assert q.parse(text).plain


def test_plain_syntax_and_bad_syntax_name():
    assert q.parse('"a b" -c', syntax="plain").plain
    with pytest.raises(InvalidInput, match="syntax must be one of"):
        q.parse("x", syntax="lucene")
    with pytest.raises(InvalidInput, match="syntax must be one of"):
        ragdb.SearchOptions(syntax="lucene")
    with pytest.raises(InvalidInput, match="fuzzy must be 0 or 1"):
        ragdb.SearchOptions(fuzzy=2)


@given(st.text(max_size=60))
def test_parse_never_raises(text):
    parsed = q.parse(text)
    assert isinstance(parsed.root, q.Group)
    if parsed.error is not None:
        assert parsed.root == q.plain(text).root


def test_edits1():
    found = set(edits1("docment"))
    assert {"document", "docmnt", "odcment", "docmenta", "docment"} <= found
    assert edits1("检索") == ["检索"]


# -- searching -----------------------------------------------------------------------------------

@pytest.fixture
def small():
    db = ragdb.open(":memory:", chunker="none")
    docs = {"a": "deleted documents are removed from the index", "b": "documents about deletion and deleting",
            "c": "the index holds documents", "d": "deleted items", "e": "document storage in databases"}
    for s, t in docs.items():
        db.add(t, source=s, metadata={"lang": "en" if s < "c" else "de", "n": ord(s)})
    yield db
    db.close()


def sources(hits):
    return [h.source for h in hits]


@pytest.mark.parametrize("query, expected", [
    ("deleted documents", ["b", "a", "d", "c", "e"]),
    ("deleted NOT documents", ["d"]),
    ("deleted -documents", ["d"]),
    ("+deleted documents", ["b", "a", "d"]),
    ("deleted AND documents", ["b", "a"]),
    ("(deleted OR storage) +documents", ["e", "b", "a", "c"]),
    ("documents -(deleted OR storage)", ["c"]),
    ("lang:en documents", ["b", "a"]),
    ("-lang:en documents", ["c", "e"]),
    ("n:100 documents", ["d"] * 0 + []),
    ("n:99 documents", ["c"]),
    ("source:a documents", ["a"]),
    ("delet*", ["b", "d", "a"]),
    ("-deleted -documents", []),
])
def test_operator_results(small, query, expected):
    assert sources(small.search(query)) == expected


def test_plain_syntax_searches_the_words(small):
    assert sources(small.search("deleted -documents", syntax="plain")) == sources(small.search("deleted documents"))


def test_boosts_scale_a_terms_contribution(small):
    plain = {h.source: h.explain for h in small.search("index documents", explain=True)}
    boosted = {h.source: h.explain for h in small.search("index^3 documents", explain=True)}
    for source, parts in boosted.items():
        assert parts["index"] == pytest.approx(3 * plain[source]["index"]) if "index" in parts else True
        assert parts["document"] == pytest.approx(plain[source]["document"])
    assert sources(small.search("index^3 documents"))[:2] == ["c", "a"]


def test_prefix_and_fuzzy_are_one_unit(small):
    plan = small.query_plan("delet* docment~")
    assert plan.terms == ("delet*", "docment~") and plan.expansions == {"delet*": ("delet",), "docment~": ("document",)}
    assert sources(small.search("docment~")) == sources(small.search("documents"))
    assert sources(small.search("docment", fuzzy=1)) == sources(small.search("documents"))
    assert small.search("docment") == []


def test_plan_reports_unknown_words_and_suggestions(small):
    plan = small.query_plan("docment indx deleted")
    assert plan.unknown == ("docment", "indx")
    assert plan.suggestions == {"docment": ("document",), "indx": ("index",)}
    assert plan.terms == ("docment", "indx", "delet")
    plan = small.query_plan('"a b', syntax="query")
    assert plan.error is not None and "never closed" in plan.error


def test_suggestions_and_expansions_never_come_from_hidden_documents(tmp_path):
    with ragdb.open(tmp_path / "kb.db", chunker="none") as db:
        db.add("public notes about storage", source="pub")
        db.add("the secret zanzibar treaty", source="hidden", acl=["board"])
        assert db.query_plan("zanzibr").suggestions == {}
        assert db.query_plan("zanzibr", principals=["board"]).suggestions == {"zanzibr": ("zanzibar",)}
        assert db.query_plan("zanz*").expansions == {"zanz*": ()}
        assert db.query_plan("zanz*", principals=ragdb.ALL).expansions == {"zanz*": ("zanzibar",)}
        assert db.search("zanz*") == [] and db.search("zanzibr~") == []
        assert db.query_plan("zanzibar").unknown == ("zanzibar",)
        assert sources(db.search("zanzibr~", principals=["board"])) == ["hidden"]


# -- every operator against brute force -----------------------------------------------------------

VOCAB = ["retrieval", "index", "delete", "document", "query", "vector", "检索", "增强", "文档", "删除"]


def query_tree(depth: int = 2) -> st.SearchStrategy[str]:
    word = st.sampled_from(VOCAB)
    phrase = st.lists(st.sampled_from(VOCAB + ["the", "of"]), min_size=2, max_size=3).map(lambda ws: f'"{" ".join(ws)}"')
    leaf = st.one_of(word, word.map(lambda w: "+" + w), word.map(lambda w: "-" + w), phrase,
                     phrase.map(lambda p: "-" + p))
    if depth == 0:
        return leaf
    sub = query_tree(depth - 1)
    return st.one_of(
        leaf,
        st.tuples(sub, sub).map(lambda ab: f"{ab[0]} AND {ab[1]}"),
        st.tuples(sub, sub).map(lambda ab: f"{ab[0]} OR {ab[1]}"),
        sub.map(lambda x: f"NOT ({x})" if not x.startswith(("-", "+", "NOT")) else x),
        st.lists(sub, min_size=1, max_size=3).map(lambda xs: "(" + " ".join(xs) + ")"),
        st.lists(sub, min_size=2, max_size=3).map(" ".join),
    )


def brute_phrase(phrase: str, text: str, analyzer) -> bool:
    """The phrase's (term, position) pairs found at one offset among the text's tokens, by
    trying every offset."""
    want = [(t.term, t.position) for t in analyzer.tokens(phrase)]
    have = {(t.term, t.position) for t in analyzer.tokens(text)}
    if not want:
        return True
    base = min(p for _t, p in want)
    last = max((p for _t, p in have), default=-1)
    return any(all((t, start + p - base) in have for t, p in want) for start in range(last + 1))


def neutral(node: q.Node, analyzer) -> bool:
    if isinstance(node, q.Group):
        return all(neutral(c.node, analyzer) for c in node.clauses)
    return not analyzer.terms(node.text)


def brute_matches(node: q.Node, occur: str, text: str, analyzer) -> bool:
    """Reference semantics (ragdb.index.matching's docstring), evaluated on a chunk's text."""
    terms = set(analyzer.terms(text))
    if isinstance(node, q.Word):
        wanted = set(analyzer.terms(node.text))
        return bool(wanted & terms) if occur == "should" else wanted <= terms
    if isinstance(node, q.Phrase):
        return brute_phrase(node.text, text, analyzer)
    clauses = [c for c in node.clauses if not neutral(c.node, analyzer)]  # words the analyzer drops: ignored
    for c in clauses:
        if c.occur == "must" and not brute_matches(c.node, "must", text, analyzer):
            return False
        if c.occur == "must_not" and brute_matches(c.node, "must_not", text, analyzer):
            return False
    if any(c.occur == "must" for c in clauses):
        return True
    should = [c for c in clauses if c.occur == "should"]
    return not should or any(brute_matches(c.node, "should", text, analyzer) for c in should)


docs_ = st.lists(st.lists(st.sampled_from(VOCAB + ["filler", "words", "the", "of"]), min_size=1, max_size=8).map(
    lambda ws: " ".join(ws) if len(ws) % 3 else "".join(ws)), min_size=1, max_size=14)  # CJK runs glued too


@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(docs=docs_, query=query_tree(), deletes=st.lists(st.integers(0, 13), max_size=4), k=st.integers(1, 5),
       verify_read=st.sampled_from([1, 2, 256]))
def test_operators_equal_brute_force(docs, query, deletes, k, verify_read, each_kernel):
    """Hits of a query = the hits of a plain search of its positive words, kept where the
    reference semantics match: same chunks, same order, same scores; the first k of them at
    any k (operators apply before the cut), before and after deletes; whatever the number of
    texts a phrase check reads at once (``verify_read``: it lets go of them after each read)."""
    from unittest import mock

    with ragdb.open(":memory:", chunker="none") as db, \
            mock.patch("ragdb.engine.search.VERIFY_READ", verify_read):
        for i, text in enumerate(docs):
            db.add(text, source=f"d{i:02d}")
        parsed = q.parse(query)
        assert parsed.error is None, (query, parsed.error)
        for step in range(2):
            positive = " ".join(w.text for w, _f, _b in parsed.words())
            plain = db.search(positive, k=100, syntax="plain") if positive else []
            # every chunk's text, copies of one passage too (collapsed, a copy that leads the plain
            # search of other words may be only another hit's duplicate here)
            texts = {h.source: h.text for h in db.search(" ".join(VOCAB), k=100, syntax="plain", collapse=False)}
            expected = [(h.source, h.score) for h in plain
                        if brute_matches(parsed.root, "should", texts[h.source], db.analyzer)]
            got = [(h.source, h.score) for h in db.search(query, k=100)]
            assert got == expected, (query, step)
            assert [(h.source, h.score) for h in db.search(query, k=k)] == expected[:k]
            for d in deletes:
                db.delete(source=f"d{d:02d}")
            if step == 0:
                db.add("retrieval index document filler", source="new")


@pytest.mark.parametrize("scorer", ["vector", "hybrid"])
def test_operators_constrain_vector_and_hybrid_hits(scorer):
    with ragdb.open(":memory:", embedder="hash:64", chunker="none") as db:
        for i, text in enumerate(["deleted documents here", "documents deleted there", "nothing relevant at all",
                                  "deleted items only", "documents only"]):
            db.add(text, source=f"s{i}")
        assert sources(db.search('"deleted documents"', scorer=scorer)) == ["s0"]
        assert "s0" not in sources(db.search("deleted -documents", scorer=scorer))
        assert set(sources(db.search("deleted -documents", scorer=scorer))) <= {"s3"}
        assert set(sources(db.search("+documents", scorer=scorer))) <= {"s0", "s1", "s4"}


# Plain words skip the tokenizer (parse's fast path); the parser must make the same of them.
_PIECES = st.sampled_from(["rag", "C++", "e-mail", "-2", "+1", "AND", "OR", "NOT", "not", "and", "ANDROID",
                           "检索", "增强", "(", ")", '"', "＂", "*", "~", "^2", ":", "title:", "x:y", "-", "+",
                           "--force", "f(x)", "ＲＡＧ", "Ａnd", "—", "“quoted”", "std::vector", "a.b"])
_SPACES = st.sampled_from(["", " ", "  ", "\t", "\n", "\u3000", "\xa0"])


@given(st.lists(st.tuples(_PIECES, _SPACES), max_size=8))
@settings(max_examples=600, deadline=None)
def test_plain_words_parse_as_the_parser_would(pieces):
    import unicodedata

    text = "".join(a + b for a, b in pieces)
    normal = unicodedata.normalize("NFKC", text)
    fast = q.parse(text)
    assert fast == q._parse(text, normal, None)
    assert fast.plain == (q._parse(text, normal, None).plain)
    if q.searched_as_plain(text):  # searches skip the parser for these
        assert fast.plain, text


# -- a question is read as the user wrote it (issue 30) ----------------------------------------

@pytest.mark.parametrize("text, word", [
    ("what does -fPIC do", "-fPIC"), ("-Wall", "-Wall"), ("-DCMAKE_BUILD_TYPE=Release", "-DCMAKE_BUILD_TYPE=Release"),
    ("npm install -g", "-g"), ("node -r", "-r"), ("gcc -O2", "-O2"), ("g++ -std=c++17", "-std=c++17"),
    ("git -C path", "-C"), ("cmake -Python", "-Python"),
])
def test_command_line_flags_are_words(text, word):
    parsed = q.parse(text)
    assert parsed.error is None and parsed.plain
    assert words(parsed, negated=True) == []
    assert ("Word", word) in words(parsed)


@pytest.mark.parametrize("text, excluded", [
    ("python -snake", ["snake"]), ("a -draft*", ["draft"]), ('a -"x y"', ["x y"]), ("a -(b c)", ["b", "c"]),
    ("a -title:x", ["x"]), ("检索 -草稿", ["草稿"]), ("tar -xvf", ["xvf"]),
])
def test_lower_case_words_phrases_groups_and_fields_are_excluded(text, excluded):
    assert [w for _k, w in words(q.parse(text), negated=True)] == excluded


def test_a_flag_finds_its_chunk(small):
    small.add("compile with -fPIC for position independent code (policy CMP0018)", source="f")
    assert sources(small.search("what does -fPIC do")) == ["f"]
    assert small.query_plan("what does -fPIC do").excluded == ()
    assert sources(small.search("documents -deleted")) == ["c", "e"]  # an ordinary exclusion still works


def test_questions_are_plain_words_unless_asked(small):
    options = ragdb.SearchOptions()
    assert options.syntax is None and options.as_question().syntax == "plain"
    assert ragdb.SearchOptions(syntax="query").as_question().syntax == "query"
    # "-deleted" in a question is a word: the chunks about deletion are its evidence
    p = small.build_prompt("what about documents -deleted", min_confidence=0)
    assert "a" in [h.source for h in p.sources]
    p = small.build_prompt("what about documents -deleted", min_confidence=0, syntax="query")
    assert "a" not in [h.source for h in p.sources]


def test_loader_metadata_keys_are_not_fields(tmp_path):
    f = tmp_path / "fs.md"
    f.write_text("# fs\n\nfs.readFile reads a whole file; pass the encoding utf8 for a string.\n", encoding="utf-8")
    with ragdb.open(tmp_path / "kb.db") as db:
        from ragdb.files.sync import add_paths
        add_paths(db, [str(f)])
        doc = db.get(source=db.documents()[0].source)
        assert set(doc.metadata) - {"title"} <= q.AUTOMATIC_KEYS | {"front_matter"}, doc.metadata
        for key in sorted(doc.metadata.keys() & q.AUTOMATIC_KEYS):
            query = f"fs.readFile {key}:{doc.metadata[key]}"
            assert len(db.search(query)) == 1, query
            assert db.query_plan(query).filters == ()
        db.add("other", source="u", metadata={"team": "docs"})
        assert db.query_plan("x team:docs").filters == ("team:docs",)


def test_plan_names_filters_and_exclusions(small):
    plan = small.query_plan('documents lang:en -draft -source:c -"x y" delet*')
    assert plan.filters == ("lang:en",)
    assert plan.excluded == ("draft", "source:c", "x y")


def test_suggestions_are_words_a_document_holds():
    with ragdb.open(":memory:") as db:
        db.add("Set the environment variables before the build.", source="a")
        plan = db.query_plan("enviroment")
        assert plan.suggestions == {"enviro": ("environment",)}  # not the stem "environ"


def test_a_question_in_a_script_the_knowledge_base_lacks_says_so():
    with ragdb.open(":memory:") as db:
        db.add("Environment variables configure the build.", source="a")
        plan = db.query_plan("什么是环境变量")
        assert len(plan.notes) == 1 and "ragdb embed --cross-lingual" in plan.notes[0]
        assert db.query_plan("environment").notes == ()
        assert db.query_plan("enviroment").notes == ()  # a typo is not another script: the KB has Latin text
    with ragdb.open(":memory:") as db:
        db.add("环境变量用于配置构建。", source="z")
        assert "ragdb embed --cross-lingual" in db.query_plan("what are environment variables").notes[0]
        assert db.query_plan("环境变量").notes == ()


def test_a_phrase_search_leaves_no_matcher_behind():
    """A search's matcher (its masks, the texts it read) is freed when the search returns, not
    whenever the cyclic garbage collector runs: nothing it holds refers back to it."""
    import gc

    from ragdb.index.matching import Matcher

    with ragdb.open(":memory:", chunker="none") as db:
        for i in range(30):
            db.add(f"the quick brown fox number {i} jumps over the lazy dog", source=f"s{i}")
        gc.collect()
        gc.disable()
        try:
            for _ in range(5):
                assert db.search('"brown fox" -cat', k=5)
            assert not [o for o in gc.get_objects() if isinstance(o, Matcher)]
        finally:
            gc.enable()


@pytest.fixture
def langs():
    with ragdb.open(":memory:", chunker="none") as db:
        db.add("pump manual", source="docs/en.md", metadata={"lang": "en"})
        db.add("pump manual", source="docs/zh.md", metadata={"lang": "zh"})
        db.add("pump handbuch", source="drafts/de.md", metadata={"lang": "de"})
        yield db


@pytest.mark.parametrize("query,expected", [
    ("pump lang:en", ["docs/en.md"]),
    ("pump (lang:en)", ["docs/en.md"]),  # a group of one filter: was optional, so it filtered nothing
    ("pump (lang:en OR lang:zh)", ["docs/en.md", "docs/zh.md"]),  # was every document
    ("pump lang:en OR lang:zh", ["docs/en.md", "docs/zh.md"]),
    ("pump +(lang:en OR lang:zh)", ["docs/en.md", "docs/zh.md"]),  # was none: both required
    ("pump AND (lang:en OR lang:zh)", ["docs/en.md", "docs/zh.md"]),
    ("pump NOT (lang:en OR lang:zh)", ["drafts/de.md"]),  # excluded nothing
    ("pump -(lang:en OR lang:zh)", ["drafts/de.md"]),
    ("pump -lang:en -lang:zh", ["drafts/de.md"]),
    ("pump lang:en lang:zh", []),  # filters side by side: both
    ("pump (lang:en lang:zh)", []),
    ("pump (handbuch OR lang:en)", ["docs/en.md", "docs/zh.md", "drafts/de.md"]),  # an alternative: filters nothing
    ("(manual lang:en) OR (handbuch lang:de)", ["docs/en.md", "drafts/de.md"]),  # was every document
    ("(manual lang:zh) OR (pump lang:de)", ["docs/zh.md", "drafts/de.md"]),
    ("pump source:docs/*", ["docs/en.md", "docs/zh.md"]),  # a trailing * was taken off the glob: nothing matched
    ("pump -source:drafts/*", ["docs/en.md", "docs/zh.md"]),  # and excluded nothing
    ("pump source:docs/*.md", ["docs/en.md", "docs/zh.md"]),
    ('pump source:"docs/*"', ["docs/en.md", "docs/zh.md"]),
    ("pump source:(docs/e* OR drafts/*)", ["docs/en.md", "drafts/de.md"]),
    ("pump source:d* -source:docs/z*", ["docs/en.md", "drafts/de.md"]),  # a one-letter glob
])
def test_metadata_and_source_filters_in_groups_alternatives_and_globs(langs, query, expected):
    assert sorted(h.source for h in langs.search(query, collapse=False)) == expected
    assert sorted(h.source for h in langs.search(query, collapse=False, scorer="tfidf")) == expected
    assert langs.facets("source", query).total == len(expected)


def test_a_short_prefix_is_a_plain_word_and_the_rest_stays_the_query_language(small):
    """``C*`` (shorter than MIN_PREFIX_CHARS) made the whole query plain words, its phrase and
    exclusion dropped; it is a plain word now."""
    parsed = q.parse('"deleted documents" -draft C*')
    assert parsed.error is None
    assert words(parsed) == [("Phrase", "deleted documents"), ("Word", "C*")]
    assert words(parsed, negated=True) == [("Word", "draft")]
    assert sources(small.search('"deleted documents" -draft C*')) == ["a"]
    plan = small.query_plan('"deleted documents" -draft C*')
    assert plan.error is None and plan.excluded == ("draft",) and plan.phrases == ("deleted documents",)


def test_fuzzy_words_look_up_a_bounded_number_of_spellings(small, monkeypatch):
    """Each fuzzy word looked up every spelling one edit away from each of its terms: a word
    of 64,000 letters took 33 s, 300 long fuzzy words 4 s. The query's fuzzy words look up
    MAX_FUZZY_CANDIDATES in all; past it a word is searched as written, and the plan says so."""
    import random
    import string

    from ragdb.index import inverted

    looked: list[int] = []
    real = inverted.Index.lookup_terms

    def counting(self, terms):
        terms = list(terms)
        looked.append(len(terms))
        return real(self, terms)

    monkeypatch.setattr(inverted.Index, "lookup_terms", counting)
    rng = random.Random(5)
    long_word = "".join(rng.choice(string.ascii_lowercase) for _ in range(64_000))
    many = " ".join("".join(rng.choice(string.ascii_lowercase) for _ in range(60)) + "~" for _ in range(300))
    for query, fuzzy in ((long_word + "~ deleted", 0), (long_word + " deleted", 1), (many + " deleted", 0)):
        looked.clear()
        assert "a" in sources(small.search(query, fuzzy=fuzzy))  # the other words still search
        assert sum(looked) <= q.MAX_FUZZY_CANDIDATES + 1_000
        plan = small.query_plan(query, fuzzy=fuzzy)
        assert any("spellings one edit away at most" in why for _w, why in plan.dropped)
    assert small.query_plan("docment~ deleted~").expansions == {"docment~": ("document",), "deleted~": ("delet",)}


def test_a_fuzzy_word_written_many_times_expands_once(small, monkeypatch):
    from ragdb.index import matching

    calls: list[str] = []
    real = matching._expand

    def counting(word, *args):
        calls.append(word.text)
        return real(word, *args)

    monkeypatch.setattr(matching, "_expand", counting)
    query = "docment~ " * 2_000 + "delet*"
    plan = small.query_plan(query)
    assert calls == ["docment", "delet"] and plan.dropped == ()
    assert sources(small.search(query)) == sources(small.search("docment~ delet*"))
    assert [h.score for h in small.search(query)] == [h.score for h in small.search("docment~ delet*")]


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(docs=st.lists(st.tuples(st.lists(st.sampled_from(VOCAB), min_size=1, max_size=6),
                               st.lists(st.sampled_from(VOCAB), min_size=1, max_size=4)), min_size=1, max_size=10),
       words=st.lists(st.sampled_from(VOCAB), min_size=2, max_size=4, unique=True))
def test_an_operator_query_scores_like_the_plain_search_with_titles(docs, words):
    """With titles (field units), the units of a query with operators were summed in another
    order than a plain search's: scores differed in the last bit ('cache +缓存 memory')."""
    with ragdb.open(":memory:", chunker="none") as db:
        for i, (text, title) in enumerate(docs):
            db.add(" ".join(text), source=f"d{i:02d}", title=" ".join(title))
        plain = {h.source: h.score for h in db.search(" ".join(words), k=100, collapse=False)}
        required = " ".join(["+" + words[0], *words[1:]])
        for h in db.search(required, k=100, collapse=False):
            assert h.score == plain[h.source], (required, h.source)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(docs=st.lists(st.tuples(st.lists(st.sampled_from(VOCAB), min_size=1, max_size=6),
                               st.lists(st.sampled_from(VOCAB), max_size=4)), min_size=1, max_size=10),
       words=st.lists(st.sampled_from(VOCAB), min_size=1, max_size=6), scorer=st.sampled_from(["bm25", "tfidf"]))
def test_an_exclusion_of_an_unknown_word_leaves_the_scores_as_they_are(docs, words, scorer):
    """'apple apple banana -zzzz' scores as 'apple apple banana' does, words written twice and
    titles included. TF-IDF weighed a word written twice once in a query with operators (twice,
    as the query vector's term frequency, in a plain search)."""
    with ragdb.open(":memory:", chunker="none") as db:
        for i, (text, title) in enumerate(docs):
            db.add(" ".join(text), source=f"d{i:02d}", title=" ".join(title) or None)
        query = " ".join(words)
        plain = [(h.source, h.score) for h in db.search(query, k=100, collapse=False, scorer=scorer)]
        assert [(h.source, h.score) for h in db.search(query + " -zzqqxx", k=100, collapse=False, scorer=scorer)] \
            == plain, query


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(docs=st.lists(st.tuples(st.lists(st.sampled_from(VOCAB), min_size=1, max_size=6),
                               st.lists(st.sampled_from(VOCAB), max_size=4)), min_size=1, max_size=10),
       words=st.lists(st.sampled_from([*VOCAB, "zanzibar", "数据库"]), min_size=1, max_size=6))
def test_the_plans_terms_are_alike_with_operators_or_without(docs, words):
    """A plain query's plan listed its text's terms only, in query order; the same query with
    an operator listed the field units it scores as well (title:word), after the known terms
    and before the unknown ones. One rule now: the text's terms (unknown ones included) in
    query order, then the fields'."""
    with ragdb.open(":memory:", chunker="none") as db:
        for i, (text, title) in enumerate(docs):
            db.add(" ".join(text), source=f"d{i:02d}", title=" ".join(title) or None)
        query = " ".join(words)
        plain = db.query_plan(query, syntax="plain")
        assert db.query_plan(query + " -zzqqxx").terms == (*[t for t in plain.terms if ":" not in t], "zzqqxx",
                                                           *[t for t in plain.terms if ":" in t])
        scored = {k for h in db.search(query, k=100, collapse=False, explain=True) for k in h.explain}
        assert scored <= set(plain.terms)
        assert set(plain.weights) <= set(plain.terms)  # (a title's units weigh 0.25)


def test_a_filters_value_is_as_typed():
    """``source:notes.md~`` (an editor's backup file) filtered on 'notes.md~' and
    ``lang:en~1`` (and ``lang:(en~1)``) on 'en~' (the fuzzy suffix was read, then written back
    without its distance); ``C*~`` was the word 'c' where ``cat*~`` is an error."""
    with ragdb.open(":memory:", chunker="none") as db:
        db.add("pump valve", source="notes.md")
        db.add("pump seal", source="notes.md~")
        db.add("pump ring", source="other.md", metadata={"lang": "en~1"})
        assert [h.source for h in db.search("pump source:notes.md~")] == ["notes.md~"]
        assert [h.source for h in db.search("pump lang:en~1")] == ["other.md"]
        assert db.query_plan("pump lang:en~1^3").filters == ("lang:en~1",)
        assert db.query_plan("pump source:notes*").filters == ("source:notes*",)
        assert sorted(h.source for h in db.search("pump source:notes*")) == ["notes.md", "notes.md~"]
        db.add("pump bolt", source="inf.md", metadata={"name": "inf", "n": 1})
        for query in ("pump name:inf", "pump name:inf -n:1e999", "pump name:inf -n:nan", "pump name:inf -n:-infinity"):
            assert [h.source for h in db.search(query)] == ["inf.md"], query  # (text, not a number to refuse)
        # an integer past 64 bits is its text (an id, an account number): it raised InvalidInput
        # ("out of the 64-bit integer range"), and as a float it would be another number
        big = str(2 ** 70 + 1)
        db.add("pump gasket", source="big.md", metadata={"code": big, "near": float(2 ** 70)})
        for query in (f"pump code:{big}", f"pump code:-{big}", f"pump near:{big}", f"pump -near:{big}"):
            assert [h.source for h in db.search(query, k=10)] == {
                f"pump code:{big}": ["big.md"], f"pump code:-{big}": [], f"pump near:{big}": []}.get(
                query, [h.source for h in db.search("pump", k=10)]), query
        # a number as typed: not 1_000 nor ١٠٠٠, which Python's int() reads as 1000
        db.add("pump flange", source="thousand.md", metadata={"code": 1000})
        assert [h.source for h in db.search("pump code:1000")] == ["thousand.md"]
        assert db.search("pump code:1_000") == [] and db.search("pump code:١٠٠٠") == []
        for query in ("C*~ valve", "cat*~ valve"):
            assert db.query_plan(query).error == f"{query.split()[0]!r}: a word is a prefix or fuzzy, not both"
        # in a field's group, each word is the field's value as typed too
        assert [h.source for h in db.search("pump lang:(en~1)")] == ["other.md"]
        assert [h.source for h in db.search("pump lang:(zh OR en~1)")] == ["other.md"]
        assert db.query_plan("pump lang:(en~1^3 OR zh)").filters == ("lang:en~1", "lang:zh")
        assert sorted(h.source for h in db.search("pump source:(notes* OR nothing)")) == ["notes.md", "notes.md~"]
        assert db.query_plan("pump lang:(en~2 cat*~)").error is None  # values, not words to refuse


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(docs=st.lists(st.tuples(st.lists(st.sampled_from(VOCAB), min_size=1, max_size=6),
                               st.sampled_from(["en", "zh", None]), st.booleans()), min_size=1, max_size=10),
       words=st.lists(st.sampled_from([*VOCAB, "zanzibar", "retr*", "docment~", "检*"]), min_size=1, max_size=4),
       scorer=st.sampled_from(["bm25", "tfidf"]))
def test_a_filter_in_the_query_searches_as_filter_does(docs, words, scorer):
    """'pump seal lang:en' scored and reported 'seal' as known when only a Chinese document
    held it, where filter={'lang': 'en'} left it unknown: TF-IDF scores, confidences and the
    plan differed, and a prefix's expansions were ranked over every document."""
    with ragdb.open(":memory:", chunker="none") as db:
        for i, (text, lang, labelled) in enumerate(docs):
            db.add(" ".join(text), source=f"d{i:02d}", metadata={"lang": lang} if lang else {},
                   acl=["team"] if labelled else None)
        db.add("filler", source="z", metadata={"lang": "zh"})  # ('lang' is a field: a visible document has it)
        query = " ".join(words)
        for principals in (None, ["team"]):
            for written, condition in ((" lang:en", {"lang": "en"}), (" -lang:zh", {"lang": {"$ne": "zh"}}),
                                       (" -source:d0*", {"$not": {"source": "d0*"}})):
                def seen(q, who, **kw):
                    return [(h.source, h.score, h.confidence)
                            for h in db.search(q, k=100, collapse=False, scorer=scorer, principals=who, **kw)]

                want = seen(query + " -zzqqxx", principals, filter=condition)
                assert seen(query + written, principals) == want, written
                assert seen(f"({query}{written})", principals) == want, written  # (a required group's filter)
                a = db.query_plan(query + written, principals=principals)
                b = db.query_plan(query + " -zzqqxx", filter=condition, principals=principals)
                assert (a.terms, a.unknown, a.expansions, a.suggestions) == \
                    (tuple(t for t in b.terms if t != "zzqqxx"), tuple(t for t in b.unknown if t != "zzqqxx"),
                     b.expansions, b.suggestions), written


def test_a_filter_in_the_query_steers_a_prefixs_expansions():
    """A prefix takes its most frequent expansions among the chunks the search may see: with
    'lang:en' in the query, those of English documents, as with filter={'lang': 'en'}."""
    with ragdb.open(":memory:", chunker="none") as db:
        for i in range(70):
            db.add(f"zzword{i:02d} zzword{i:02d} filler", source=f"zh{i:02d}", metadata={"lang": "zh"})
        db.add("zzrare filler", source="en", metadata={"lang": "en"})
        assert [h.source for h in db.search("zz*", filter={"lang": "en"})] == ["en"]
        assert [h.source for h in db.search("zz* lang:en")] == ["en"]
        assert db.query_plan("zz* lang:en").expansions == {"zz*": ("zzrare",)}


def test_alternatives_on_one_key_filter_as_one(monkeypatch):
    """``n:0 OR n:1 OR ...`` (and ``source:(a* OR b)``) are one filter of all the values, read
    once: 2,000 of them built and read 2,000 masks (0.76 s where filter= took 0.03)."""
    import ragdb.engine.search as search_module

    with ragdb.open(":memory:", chunker="none") as db:
        db.add_many([{"text": f"pump {i}", "source": f"s{i:03d}", "metadata": {"n": i % 40}} for i in range(200)]
                    + [{"text": "pump flag", "source": "t", "metadata": {"n": True}}])
        values = list(range(0, 40, 3))
        query = "pump (" + " OR ".join(f"n:{v}" for v in values) + " OR n:1.0 OR n:true)"
        want = [(h.source, h.score) for h in db.search("pump -zzqq", k=300, filter={"n": {"$in": [*values, 1, True]}})]
        assert [(h.source, h.score) for h in db.search(query, k=300)] == want and len(want) > 60
        assert sorted(h.source for h in db.search("pump source:(s00* OR t)", k=300)) == \
            [*(f"s{i:03d}" for i in range(10)), "t"]
        built = []
        real = search_module.filters.build
        monkeypatch.setattr(search_module.filters, "build", lambda *a, **kw: built.append(1) or real(*a, **kw))
        db.search("pump (n:1 OR n:2)")
        two = len(built)
        built.clear()
        db.search("pump (" + " OR ".join(f"n:{v}" for v in range(40)) + ")")
        assert len(built) == two


def test_an_operator_query_has_the_plain_searchs_confidence():
    """The maximum a confidence is taken against counted an unknown word once per occurrence
    in a query with operators (once in a plain search), and left out a word only a title held
    (a plain search counts it as a word no text holds)."""
    with ragdb.open(":memory:", chunker="none") as db:
        db.add("valve check weekly", source="a.md", title="Motor notes")
        db.add("seal flow", source="b.md")

        def confidences(query, syntax):
            return [(h.source, h.confidence) for h in db.search(query, syntax=syntax)]

        for plain, operators in (("valve zanzibar", "valve zanzibar zanzibar -draft"),
                                 ("motor valve", "motor valve -draft"), ("motor valve", "motor +valve"),
                                 ("valve", "valve -draft")):
            assert confidences(operators, "query") == confidences(plain, "plain"), operators
        assert confidences("valve qq* qq* -draft", "query") == confidences("valve qq*", "query")
