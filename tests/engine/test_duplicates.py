"""One hit per passage (issue 30, item 7): copies of a section (a page as Markdown, as HTML,
again in an all-in-one page) collapse into the best one, which names the others; ``k``
means ``k`` distinct passages; ``collapse=False`` returns every copy; both backends alike."""

from __future__ import annotations

import pytest

import ragdb
from ragdb.index.hits import collapse_duplicates, passage_shingles as _shingles, same_passage, shared_shingles, shingle_values
from ragdb.serve.shapes import hit_json
from ragdb.types import Duplicate

def passage_shingles(text: str) -> frozenset[int]:
    return frozenset(shingle_values(_shingles(text)).tolist())


READ = ("The fs.readFile method reads the entire contents of a file asynchronously. When the "
        "encoding option is given the contents are decoded into a string; without it a Buffer "
        "is returned. The callback receives an error first and the data second.")
STAT = ("The fs.stat method returns information about a path: its size, its modification time "
        "and whether it is a file or a directory. Symbolic links are followed; use fs.lstat to "
        "read the link itself.")
WRITE = ("The fs.writeFile method replaces the contents of a file, creating the file when it does "
         "not exist. The data may be a string or a Buffer, and the encoding option applies to "
         "strings only.")
SECTIONS = {"read": READ, "stat": STAT, "write": WRITE}


def copies(name: str, text: str) -> list[dict]:
    """A section as the three copies a documentation tree holds: Markdown, HTML, all-in-one."""
    md = "## " + name + "\n\n" + text.replace("fs.", "`fs.").replace(" method", "` method") + \
        "\n\nSee [the guide](https://nodejs.org/api/fs.html#guide)."
    html = name + "\n" + text + "\nSee the guide."
    return [{"source": f"api/{name}.md", "text": md},
            {"source": f"api/{name}.html", "text": html},
            {"source": f"api/all.html#{name}", "text": "Node.js file system " + text + " copy"}]


def records() -> list[dict]:
    out = [r for name, text in SECTIONS.items() for r in copies(name, text)]
    out.append({"source": "streams.md", "text": "Streams read a file piece by piece: fs.createReadStream "
                                                 "returns a readable stream; the encoding option sets the "
                                                 "string encoding of its chunks."})
    return out


def test_shingles_see_through_markup_and_case():
    a = passage_shingles("## fs.readFile\n\nThe `fs.readFile` method **reads** [files](x.html#a).")
    b = passage_shingles("<h2>fs.readFile</h2><p>the fs.readFile method reads files.</p>")
    assert a == b
    assert passage_shingles("") == frozenset()
    assert passage_shingles("一个中文段落") == passage_shingles("一个 中文 段落")


def test_shared_shingles_counts_every_pair():
    sets = [_shingles(t) for t in (READ, STAT, READ + " More words here.", WRITE, READ)]
    values = [set(shingle_values(s).tolist()) for s in sets]
    got = shared_shingles(sets)
    for i, a in enumerate(values):
        for j, b in enumerate(values):
            assert got[i, j] == (len(a & b) if i != j else 0)


def test_same_passage_thresholds():
    assert same_passage(8, 10, 10)          # Jaccard 8/12
    assert not same_passage(7, 10, 10)      # Jaccard 7/13 < 0.6, sets too small for containment
    assert same_passage(18, 20, 100)        # 18 of a 20-shingle passage inside a longer one
    assert not same_passage(9, 10, 100)     # a 10-shingle passage is too short to be contained
    assert not same_passage(0, 0, 0)


def test_search_keeps_one_hit_per_passage(tmp_path):
    with ragdb.open(str(tmp_path / "kb.db")) as db:
        db.add_many(records())
        hits = db.search("fs.readFile encoding option", k=3)
        texts = [h.text for h in hits]
        assert len(hits) == 3
        # three distinct passages: no two hits hold the same section
        for i, a in enumerate(hits):
            for b in hits[i + 1:]:
                assert passage_shingles(a.text) != passage_shingles(b.text)
        top = hits[0]
        assert "readFile" in top.text
        assert len(top.duplicates) == 2
        assert {d.source for d in top.duplicates} | {top.source} == {"api/read.md", "api/read.html",
                                                                      "api/all.html#read"}
        assert all(isinstance(d, Duplicate) and d.score <= top.score for d in top.duplicates)
        every = db.search("fs.readFile encoding option", k=3, collapse=False)
        assert [h.duplicates for h in every] == [(), (), ()]
        assert all("reads the entire contents" in h.text for h in every)  # the same section 3 times
        assert texts != [h.text for h in every]


def test_k_counts_distinct_passages_and_pages_follow(tmp_path):
    with ragdb.open(str(tmp_path / "kb.db")) as db:
        db.add_many(records())
        hits = db.search("fs file encoding method", k=4)
        assert len(hits) == 4  # the three sections and the streams page: 10 chunks, 4 passages
        # copies are named among the hits ranked: all ten when the ranking is read that far
        assert sum(1 + len(h.duplicates) for h in db.search("fs file encoding method", k=10)) == 10
        page = db.search("fs file encoding method", k=2, offset=2)
        assert [h.chunk_id for h in page] == [h.chunk_id for h in hits[2:]]
        assert len(db.search("fs file encoding method", k=10)) == 4


def test_collapse_option_is_checked():
    with ragdb.open(":memory:") as db, pytest.raises(ragdb.errors.InvalidInput, match="collapse"):
        db.search("x", collapse="no")


def test_distinct_passages_sharing_words_stay_apart():
    base = [{"source": f"s{i}", "text": text} for i, text in enumerate(SECTIONS.values())]
    with ragdb.open(":memory:") as db:
        db.add_many(base)
        assert all(not h.duplicates for h in db.search("fs method file encoding", k=3))


def test_near_copies_that_write_other_numbers_are_two_passages(tmp_path):
    """A refund policy and its change ("14 days" / "30 days"), two prices, two doses: near
    copies by their words, so the second was only in Hit.duplicates, and a prompt never showed
    the model that the documents disagree. A copy in another format or with fullwidth digits
    still collapses; so does a later passage quoting part of an earlier one. A later passage
    that adds a number to an earlier one's text is another passage."""
    from ragdb.index.hits import numbers_within, passage_numbers

    policy = ("Refunds are paid within {} days of the return being received by our warehouse team, "
              "to the card used for the order.")
    with ragdb.open(tmp_path / "kb.db") as db:
        db.add_many([{"source": "policy-2024.md", "text": policy.format(14)},
                     {"source": "policy-2025.md", "text": policy.format(30)},
                     {"source": "policy-2024.html", "text": "<p>" + policy.format(14) + "</p>"},
                     {"source": "policy-fw.md", "text": policy.format("１４")}])
        hits = db.search("refunds paid within days", k=5)
        kept = {h.source: sorted(d.source for d in h.duplicates) for h in hits}
        assert kept == {"policy-2024.md": ["policy-2024.html", "policy-fw.md"], "policy-2025.md": []}, kept
        prompt = db.build_prompt("how long do refunds take", k=5).user
        assert "14 days" in prompt and "30 days" in prompt
        # a passage that adds a number to the policy's text ranks first here: the copies it folds
        # write no number it does not, so the prompt still shows every one
        db.add(policy.format(14) + " From March 2025 refunds are paid within 30 days instead.", source="changes.md")
        hits = db.search("refunds paid within days", k=5)
        assert hits[0].source == "changes.md"
        for hit in hits:
            lead = passage_numbers(hit.text)
            for copy in hit.duplicates:
                assert numbers_within(passage_numbers(db.get(copy.doc_id).text), lead), (hit.source, copy.source)


@pytest.mark.parametrize("first, second, one", [
    ("a dose of 0.5 mg", "a dose of 5 mg", False),          # digit runs: 0.5 held 5
    ("a dose of 2.5 mg", "a dose of 5 mg", False),
    ("members pay 5 and visitors 10", "members pay 10 and visitors 5", False),  # swapped
    ("paid within 14 days", "paid within 14 days, then 30 more", False),  # the later adds a number
    ("paid within 14 days, then 30 more", "paid within 14 days", True),   # the later quotes a part
    ("十四天内退款", "三十天内退款", False),                   # Chinese numerals
    ("within ١٤ days", "within 14 days", True),              # one number in two scripts
    ("area 5 m² of ① room", "area 5 m2 of 1 room", True),    # NFKC, as the shingles read it
    ("see ［the notes］（p3.html） 5", "see [the notes](p4.html) 5", True),  # markup, fullwidth too
    ("version 007 of 2024-05-01", "version 7 of 2024-5-1", True),
])
def test_numbers_of_a_later_near_copy_must_be_among_the_earlier_ones(first, second, one):
    from ragdb.index.hits import numbers_within, passage_numbers

    assert numbers_within(passage_numbers(second), passage_numbers(first)) is one


def test_collapse_is_a_prefix_property():
    """The passages kept from the first n hits are the first passages kept from any longer ranking."""
    with ragdb.open(":memory:") as db:
        db.add_many(records())
        ranking = db.search("fs file encoding method", k=10, collapse=False)
    whole = [h.chunk_id for h in collapse_duplicates(ranking)]
    for n in range(1, len(ranking) + 1):
        part = [h.chunk_id for h in collapse_duplicates(ranking[:n])]
        assert whole[:len(part)] == part


def test_prompt_and_json_carry_one_copy(tmp_path):
    with ragdb.open(str(tmp_path / "kb.db")) as db:
        db.add_many(records())
        p = db.build_prompt("What does the encoding option of fs.readFile do?", k=3, min_confidence=0)
        assert not p.refused and len(p.sources) >= 2
        assert len({passage_shingles(h.text) for h in p.sources}) == len(p.sources)
        assert p.user.count("reads the entire contents") == 1
        top = db.search("fs.readFile encoding option", k=1)[0]
    out = hit_json(top)
    assert out["duplicates"] == [{"source": d.source, "chunk_id": d.chunk_id, "doc_id": d.doc_id,
                                  "score": d.score} for d in top.duplicates]
    assert len(out["duplicates"]) == 2


@pytest.mark.parametrize("scorer", ["bm25", "tfidf"])
def test_postgres_collapses_like_sqlite(tmp_path, pg_url, scorer):
    results = []
    for path in (str(tmp_path / "kb.db"), pg_url):
        with ragdb.open(path) as db:
            db.add_many(records())
            hits = db.search("fs.readFile encoding option", k=3, scorer=scorer)
            results.append([(h.source, round(h.score, 9), tuple((d.source, round(d.score, 9)) for d in h.duplicates))
                            for h in hits])
    assert results[0] == results[1]
    assert len(results[0][0][2]) == 2


def test_versions_of_one_source_are_not_copies(tmp_path):
    with ragdb.open(str(tmp_path / "kb.db"), keep_versions=True) as db:
        db.add(READ, source="api/read.md", version="1")
        db.add(READ + " Changed in v2.", source="api/read.md", version="2")
        hits = db.search("fs.readFile encoding", versions="all")
        assert sorted((h.source, h.version) for h in hits) == [("api/read.md", "1"), ("api/read.md", "2")]
        assert all(not h.duplicates for h in hits)


def test_many_copies_of_every_passage_are_ranked_in_two_passes_not_four(monkeypatch):
    """With 19 copies of every passage, k=20 distinct passages need ~380 ranked hits. The depth
    of the second ranking follows the share of copies the first one saw, so two rankings do
    (growing 4x at a time took three, and ranked, built and shingled 7,168 hits for k=100 where
    ~2,300 were enough). Every passage comes once and names its 18 copies."""
    from ragdb.engine.search import Searcher

    depths: list[int] = []
    real = Searcher._ranked

    def spy(self, query, opts, depth):
        depths.append(depth)
        return real(self, query, opts, depth)

    monkeypatch.setattr(Searcher, "_ranked", spy)
    words = ["retrieval", "index", "answer", "evidence", "model", "search", "corpus", "query"]
    with ragdb.open(":memory:", chunker="none") as db:
        db.add_many([{"text": f"passage {p} about {words[p % 8]} and {words[(p * 3) % 8]} {p} number {p}",
                      "source": f"p{p}/copy{c}.md"} for p in range(40) for c in range(19)])
        hits = db.search("passage about retrieval index answer evidence", k=20)
    assert len(hits) == 20 and len({h.source.split("/")[0] for h in hits}) == 20
    assert all(len(h.duplicates) == 18 for h in hits)
    assert len(depths) == 2, depths


def test_a_shingle_cache_started_again_mid_search_collapses_alike(tmp_path, monkeypatch):
    """A search's shingles come from the handle's cache (``Searcher._passage_shingles``), which
    starts again when it would hold more than ``SHINGLES_KEPT``: a cache of almost nothing,
    started again within every search, collapses as a cache that keeps everything."""
    from ragdb.engine import search

    queries = ["fs.readFile encoding option", "file contents Buffer", "stat link", "streams encoding"]

    def answers(db) -> list:
        return [[(h.source, round(h.score, 9), [d.source for d in h.duplicates]) for h in db.search(q, k=5)]
                for q in queries]

    with ragdb.open(str(tmp_path / "kb.db")) as db:
        db.add_many(records())
        want = answers(db)
        assert any(h[2] for q in want for h in q)  # (copies were collapsed)
    monkeypatch.setattr(search, "SHINGLES_KEPT", 40)  # fewer shingles than two of these passages hold
    with ragdb.open(str(tmp_path / "kb.db")) as db:
        assert answers(db) == want
        assert answers(db) == want  # (the second time, from what the cache kept)


def test_a_full_shingle_cache_drops_the_passages_kept_longest(monkeypatch):
    """Over ``SHINGLES_KEPT`` the handle's shingle cache drops its oldest passages (first in,
    first out, a generation at a time), not all of them: a search run again right after finds
    every passage it shingled still kept, and the cache stays within its bound."""
    from ragdb.engine import search

    computed: list[str] = []
    real = search.passage_shingles

    def counting(text: str):
        computed.append(text)
        return real(text)

    monkeypatch.setattr(search, "passage_shingles", counting)
    monkeypatch.setattr(search, "SHINGLES_KEPT", 300)  # ~1.5 searches' passages (24 hits of 8 shingles)
    with ragdb.open(":memory:", chunker="none") as db:
        db.add_many([{"text": f"apple orchard harvest {i} crisp fruit season number {i} grows", "source": f"a{i}"}
                     for i in range(30)] +
                    [{"text": f"river canyon erosion {i} ancient stone layers number {i} flows", "source": f"r{i}"}
                     for i in range(30)])

        def shingled(query: str) -> int:
            computed.clear()
            hits = db.search(query, k=20)
            assert len(hits) == 20
            return len(computed)

        def within_bound() -> None:  # the count is of shingles (4 bytes each), and true
            kept = db._searcher._shingles
            held = kept.get_many(h.chunk_id for h in db.search("apple river", k=60, collapse=False))
            assert len(held) == len(kept) and sum(len(v) // 4 for _h, v in held.values()) == kept.units() <= 300

        assert shingled("apple orchard harvest") == 24  # (k + 4 hits ranked, each shingled once)
        within_bound()
        assert shingled("river canyon erosion") == 24   # the cache overflows: the apple passages go first
        within_bound()
        assert shingled("river canyon erosion") == 0    # every river passage still kept
        assert 0 < shingled("apple orchard harvest") <= 24  # (some apple passages were dropped)
        within_bound()


def test_the_shingle_cache_counts_a_chunk_ids_new_text_once():
    """The handle's shingle cache holds one entry a chunk id, checked against the hash of the
    text it was made of: a chunk id that comes back with another text (a rolled-back write's
    ids are handed out again) gets that text's shingles, which take the old ones' place."""
    import dataclasses

    with ragdb.open(":memory:", chunker="none") as db:
        db.add_many([{"text": f"granite quarry stone {i} cut and polished slabs number {i}", "source": f"g{i}"}
                     for i in range(6)])
        hits = db.search("granite quarry", k=6)
        searcher = db._searcher
        first = searcher._passage_shingles(hits)
        other = [dataclasses.replace(h, text=h.text + " with a different ending of several more words") for h in hits]
        second = searcher._passage_shingles(other)
        assert second == [_shingles(h.text) for h in other] and second != first
        kept = searcher._shingles
        assert len(kept) == len(hits)
        assert searcher._passage_shingles(other) == second  # (from the cache: the new texts')
        assert [v for _h, v in kept.get_many(h.chunk_id for h in hits).values()] == second
