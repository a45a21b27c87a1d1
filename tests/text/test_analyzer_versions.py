"""Analyzer version 2 (technical words), and version 1 kept exactly for the databases built with it."""

import json
from pathlib import Path

import pytest

import ragdb
from ragdb.text.analysis import ANALYZER_VERSION, Token, describe_config
from ragdb.errors import AnalyzerMismatch, InvalidInput

V1 = {"name": "ragdb", "version": 1, "stem": "english", "stopwords": "english+chinese", "cjk": "bigram"}
V2 = dict(V1, version=2)
PINS = json.loads((Path(__file__).resolve().parents[1] / "analyzer_v1_pins.json").read_text(encoding="utf-8"))


# --------------------------------------------------------------------------- version 1, pinned


def test_version_1_terms_are_those_of_the_first_analyzer():
    """The terms and counts of English, Chinese, mixed and technical texts, as the analyzer
    of ragdb before version 2 made them (tests/analyzer_v1_pins.json was written by it)."""
    an = ragdb.Analyzer.from_config(V1)
    assert an.version == 1 and an.config() == V1
    for text, terms, counts in zip(PINS["texts"], PINS["terms"], PINS["counts"]):
        assert an.terms(text) == terms
        assert list(an.term_counts(text).items()) == [tuple(c) for c in counts]
        assert an.term_counts_many([text, text]) == [dict(map(tuple, counts))] * 2


def test_version_1_database_scores_are_those_of_the_first_analyzer(tmp_path):
    """A database built with version 1 (and reopened) scores exactly as before version 2 existed."""
    path = tmp_path / "v1.db"
    with ragdb.open(path, analyzer=V1) as db:
        for i, text in enumerate(PINS["texts"]):
            db.add(text, source=f"d{i}", chunker="none")
    with ragdb.open(path) as db:
        assert db.analyzer.config() == V1 and db.settings["analyzer"] == V1
        for scorer, pinned in (("bm25", PINS["scores"]), ("tfidf", PINS["tfidf"])):
            for query, hits in pinned.items():
                assert [(h.source, h.score) for h in db.search(query, k=10, scorer=scorer)] == \
                    [tuple(h) for h in hits], (scorer, query)


# --------------------------------------------------------------------------- version 2 rules

RULES = [
    ("C++ standard", ["c++", "standard"]),
    ("C# and F# on .NET", ["c#", "f#", ".net", "net"]),
    ("ASP.NET", ["asp.net", "asp", "net"]),
    ("g++ and notepad++", ["g++", "notepad++"]),
    ("node.js", ["node.js", "node", "js"]),
    ("e-mail", ["email", "e", "mail"]),
    ("email", ["email"]),
    ("e-mails", ["email", "e", "mail"]),
    ("x86_64", ["x86_64", "x86", "64"]),
    ("std::vector", ["std::vector", "std", "vector"]),
    ("CMAKE_CXX_STANDARD", ["cmake_cxx_standard", "cmake", "cxx", "standard"]),
    ("Python 3.11", ["python", "3.11", "3", "11"]),
    ("v2.0.1", ["v2.0.1", "v2", "0", "1"]),
    ("vitamin D and T cells", ["vitamin", "d", "t", "cell"]),
    ("the C language and R", ["c", "languag", "r"]),
    ("U.S.A. e.g. i.e.", ["usa"]),
    ("state-of-the-art", ["state", "art"]),
    ("x-ray", ["xray", "x", "ray"]),
    ("0.5-9.6", ["0.5", "0", "5", "9.6", "9", "6"]),
    ("3-5", ["3", "5"]),
    ("don't, it's, I'd and we'll", []),
    ("Alzheimer's", ["alzheim"]),
    ("__init__ foo__bar", ["init", "foo__bar", "foo", "bar"]),
    ("-minus +plus \"quoted\"", ["minus", "plus", "quot"]),
    ("end. (word) and node.js.", ["end", "word", "node.js", "node", "js"]),
    ("使用C++编程", ["c++", "使", "用", "使用", "编", "程", "编程"]),
    ("ＣＭＡＫＥ＿ＣＸＸ＿ＳＴＡＮＤＡＲＤ", ["cmake_cxx_standard", "cmake", "cxx", "standard"]),
]


@pytest.mark.parametrize("text, terms", RULES)
def test_version_2_rules(text, terms):
    an = ragdb.Analyzer()
    assert an.version == ANALYZER_VERSION == 2
    assert an.terms(text) == terms
    assert sorted(an.term_counts(text).elements()) == sorted(terms)


def test_the_issue_words_are_searchable():
    """The words of issue 15, each finding its document first (and only its document
    where no other holds a part of it)."""
    docs = {
        "cpp": "C++ templates are compiled.",
        "c": "The C language has pointers.",
        "csharp": "C# has properties.",
        "fsharp": "F# is functional.",
        "dotnet": "The .NET runtime runs managed code.",
        "node": "node.js runs JavaScript on the server.",
        "mail": "Send an e-mail to the list.",
        "arch": "Wheels are built for x86_64 only.",
        "vector": "Use std::vector for dynamic arrays.",
        "cmake": "Set CMAKE_CXX_STANDARD to 17.",
        "python": "Python 3.11 is faster.",
        "release": "Release v2.0.1 fixes bugs.",
        "vitamin": "Vitamin D is made in the skin.",
        "r": "R is a language for statistics.",
    }
    with ragdb.open(":memory:") as db:
        for source, text in docs.items():
            db.add(text, source=source, chunker="none")
        for query, source in [("C++", "cpp"), ("C", "c"), ("C#", "csharp"), ("F#", "fsharp"), (".NET", "dotnet"),
                              ("node.js", "node"), ("e-mail", "mail"), ("email", "mail"), ("x86_64", "arch"),
                              ("std::vector", "vector"), ("CMAKE_CXX_STANDARD", "cmake"), ("cxx standard", "cmake"),
                              ("3.11", "python"), ("v2.0.1", "release"), ("vitamin D", "vitamin"), ("R", "r")]:
            hits = db.search(query)
            assert hits and hits[0].source == source, (query, [h.source for h in hits])
        assert [h.source for h in db.search("C++")] == ["cpp"]  # not the C or C# documents
        assert [h.source for h in db.search("C#")] == ["csharp"]


def test_a_compound_does_not_lengthen_a_text():
    """Its whole form overlaps its first part: "node.js" is as long as "node js" for BM25."""
    an = ragdb.Analyzer()
    counts = an.term_counts("node.js and std::vector with e-mail")
    assert counts.overlaps == 3  # node.js, std::vector, email
    assert sum(counts.values()) - counts.overlaps == sum(an.term_counts("node js and std vector with e mail").values())
    assert an.term_counts("a::b").overlaps == 0  # its first part is a stopword: the whole form stands alone
    with ragdb.open(":memory:") as db:
        db.add("node.js tutorial", source="compound", chunker="none")
        db.add("node js tutorial", source="words", chunker="none")
        db.add("other text here", source="other", chunker="none")
        # (the two are one passage to a search that collapses copies: this compares their scores)
        scores = {h.source: h.score for h in db.search("tutorial", collapse=False)}
        assert scores["compound"] == scores["words"]


def test_configuration_and_versions(tmp_path):
    assert ragdb.Analyzer().config() == V2
    assert ragdb.Analyzer.from_spec("default").config() == V2
    assert ragdb.Analyzer.from_spec("simple").config()["version"] == 2
    assert ragdb.Analyzer.from_config(V1).version == 1
    assert describe_config(V1) == "default (English stemming, English and Chinese stopwords, CJK bigrams, version 1)"
    assert describe_config(V2) == "default (English stemming, English and Chinese stopwords, CJK bigrams)"
    with pytest.raises(InvalidInput, match="analyzer version 3 was written by a newer ragdb"):
        ragdb.Analyzer.from_config(dict(V1, version=3))
    with pytest.raises(InvalidInput, match="unknown analyzer configuration"):
        ragdb.Analyzer.from_config(dict(V1, version="2"))
    with pytest.raises(InvalidInput, match="version=0"):
        ragdb.Analyzer(version=0)
    path = tmp_path / "new.db"
    with ragdb.open(path) as db:
        assert db.settings["analyzer"] == V2
    with ragdb.open(path, analyzer="default") as db:
        assert db.analyzer.version == 2


def test_a_version_1_database_refuses_the_default_analyzer_naming_reindex(tmp_path):
    path = tmp_path / "v1.db"
    with ragdb.open(path, analyzer=V1) as db:
        db.add("C++ text", source="a")
    with pytest.raises(AnalyzerMismatch, match=r"version 1\) analyzer .*'ragdb reindex' \(Database.reindex\(\)\)"):
        ragdb.open(path, analyzer="default")
    with pytest.raises(AnalyzerMismatch, match="'ragdb reindex --analyzer simple'"):
        ragdb.open(path, analyzer="simple")
    with ragdb.open(path) as db:  # without analyzer= it opens with its own
        assert db.analyzer.version == 1 and db.search("C++") == []


# --------------------------------------------------------------------------- tokens and dropped words


def test_token_offsets_and_positions():
    an = ragdb.Analyzer()
    assert an.tokens("state of the art") == [Token("state", 0, 5, 0), Token("art", 13, 16, 3)]
    assert an.tokens("node.js rocks") == [Token("node.js", 0, 7, 0), Token("node", 0, 4, 0), Token("js", 5, 7, 1),
                                          Token("rock", 8, 13, 2)]
    assert an.tokens("e-mail me") == [Token("email", 0, 6, 0), Token("e", 0, 1, 0), Token("mail", 2, 6, 1)]
    assert an.tokens("don't stop") == [Token("stop", 6, 10, 1)]
    # offsets are into the original text, through NFKC (full-width forms, ligatures) and case folding
    text = "ＡＢＣ ﬁsh Straße"
    tokens = an.tokens(text)
    assert [(t.term, text[t.start:t.end], t.position) for t in tokens] == \
        [("abc", "ＡＢＣ", 0), ("fish", "ﬁsh", 1), ("strass", "Straße", 2)]
    # CJK: a character a position, a bigram at its first character's
    # (什么 and its characters are Chinese stopwords; 是什 is not)
    assert an.tokens("向量是什么") == [Token("向", 0, 1, 0), Token("向量", 0, 2, 0), Token("量", 1, 2, 1),
                                   Token("量是", 1, 3, 1), Token("是", 2, 3, 2), Token("是什", 2, 4, 2)]
    # version 1 gives its own terms, a dropped one-letter word keeping its position
    v1 = ragdb.Analyzer.from_config(V1)
    assert v1.tokens("C++ x standard") == [Token("standard", 6, 14, 2)]


def test_dropped_words_and_why():
    an = ragdb.Analyzer()
    assert an.dropped("what is the?") == [("what", "English stopword"), ("is", "English stopword"),
                                          ("the", "English stopword")]
    assert an.dropped("什么 ？ C++ e.g.") == [("什么", "Chinese stopword"), ("？", "no letters or digits"),
                                            ("e.g", "English stopword")]
    assert an.dropped("don't") == [("don't", "English stopword")]
    assert an.dropped("C++ standard") == []
    v1 = ragdb.Analyzer.from_config(V1)
    assert v1.dropped("the C++ of x") == [("the", "English stopword"), ("C++", "one letter: too short"),
                                         ("of", "English stopword"), ("x", "one letter: too short")]


def test_search_of_only_dropped_words_finds_nothing_without_raising():
    with ragdb.open(":memory:") as db:
        db.add("the of and", source="a")
        for query in ("the of", "", "   ", "?!", "什么"):
            assert db.search(query) == []
            assert db.search(query, scorer="tfidf", explain=True) == []
