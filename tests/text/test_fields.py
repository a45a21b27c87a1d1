"""Fields: a chunk's title and heading path, indexed beside its text and weighted in scoring."""

from __future__ import annotations

import os
import sqlite3

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import ragdb
from ragdb.errors import InvalidInput
from ragdb.text.fields import DEFAULT_WEIGHTS, effective_title
from ragdb.types import Span

from cli_helpers import out_json, run

EXAMPLES = int(os.environ.get("RAGDB_HYPOTHESIS_EXAMPLES", "60"))


def scored(hits):
    return [(h.source, round(h.score, 12)) for h in hits]


@pytest.mark.parametrize("title, source, expected", [
    ("Install Guide", "x", "Install Guide"), (None, "docs/install-guide.md", "install-guide"),
    ("  ", "a\\b\\notes.txt", "notes"), (None, "12345", None), (None, "sha256:0123abcd", None),
    (None, "notes/rag.md#3", None),
])
def test_effective_title(title, source, expected):
    assert effective_title(title, source) == expected


def test_titles_and_headings_score_beside_the_text():
    with ragdb.open(":memory:", chunker="none") as db:
        assert db.settings["fields"] == DEFAULT_WEIGHTS
        db.add("Run make to build it, then install the files.", source="docs/build.md", title="Building")
        db.add("Copy the binary to your PATH.", source="docs/setup.md", title="Install guide")
        db.add("The registry url can be changed.", source="docs/config.md",
               spans=[Span(0, 10, {"section": "Configuration > Install a registry"})])
        hits = db.search("install", explain=True)
        assert {h.source for h in hits} == {"docs/build.md", "docs/setup.md", "docs/config.md"}
        by = {h.source: h for h in hits}
        assert set(by["docs/setup.md"].explain) == {"title:instal"}  # found by its title alone
        assert set(by["docs/build.md"].explain) == {"instal"}
        assert set(by["docs/config.md"].explain) == {"section:instal"}
        assert by["docs/setup.md"].title == "Install guide" and by["docs/config.md"].title == "config"
        assert by["docs/config.md"].section == "Configuration > Install a registry"
        assert by["docs/build.md"].section is None
        # a field alone
        assert [h.source for h in db.search("title:install")] == ["docs/setup.md"]
        assert [h.source for h in db.search("section:install")] == ["docs/config.md"]
        assert [h.source for h in db.search("install -title:install")] == ["docs/build.md", "docs/config.md"] or \
            sorted(h.source for h in db.search("install -title:install")) == ["docs/build.md", "docs/config.md"]
        # a phrase in a field is checked on the field's text
        assert [h.source for h in db.search('section:"install a registry"')] == ["docs/config.md"]
        assert db.search('section:"registry install"') == []
        assert db.search('title:"guide install"') == []
        # the text's statistics know nothing of the fields
        s = db.stats()
        texts = ("Run make to build it, then install the files.", "Copy the binary to your PATH.",
                 "The registry url can be changed.")
        assert s.avg_chunk_length == pytest.approx(sum(len(db.analyzer.terms(t)) for t in texts) / 3)
        assert s.vocabulary == len({t for text in texts for t in db.analyzer.terms(text)})
        assert db.check() == []


def test_weights_zero_and_tfidf_score_the_text_alone():
    docs = [("Retrieval augmented generation explained", "docs/rag.md", "RAG primer"),
            ("Generation of text from retrieved passages", "docs/gen.md", "Retrieval"),
            ("Unrelated notes on storage", "docs/store.md", "Storage")]
    with ragdb.open(":memory:", chunker="none") as titled, ragdb.open(":memory:", chunker="none") as bare:
        for text, source, title in docs:
            titled.add(text, source=source, title=title)
            bare.add(text, source=source.replace("/", "_").replace(".md", ""))
        for q in ("retrieval generation", "storage notes"):
            a = [round(h.score, 12) for h in titled.search(q, scorer="tfidf")]
            b = [round(h.score, 12) for h in bare.search(q, scorer="tfidf")]
            assert a == b  # a chunk's TF-IDF vector is its text's
        assert titled.search("retrieval")[0].source == "docs/gen.md"  # its title says it
        titled.set_field_weights({"title": 0, "section": 0})
        assert titled.settings["fields"] == {"title": 0.0, "section": 0.0}
        for q in ("retrieval generation", "storage notes", '"retrieval augmented" -storage'):
            assert [round(h.score, 12) for h in titled.search(q)] == [round(h.score, 12) for h in bare.search(q)]
        with pytest.raises(InvalidInput, match="unknown field 'body'"):
            titled.set_field_weights({"body": 1})
        with pytest.raises(InvalidInput, match="weight of 'title'"):
            titled.set_field_weights({"title": -1})


def test_confidence_is_the_texts_support():
    with ragdb.open(":memory:", chunker="none") as db:
        db.add("vitamin d and bone density", source="a.md", title="Vitamin D")
        db.add("bone density in older adults", source="b.md", title="Bones")
        with_fields = {h.source: h.confidence for h in db.search("vitamin bone")}
        db.set_field_weights({"title": 0})
        without = {h.source: h.confidence for h in db.search("vitamin bone")}
        assert with_fields == pytest.approx(without)


texts = st.lists(st.sampled_from(["retrieval", "index", "检索", "增强", "query", "vector", "install", "guide"]),
                 min_size=1, max_size=10).map(" ".join)
titles = st.none() | texts
ops = st.lists(st.tuples(st.sampled_from(["add", "add", "delete", "flush"]), st.integers(0, 5), texts, titles, titles),
               max_size=20)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=ops)
def test_incremental_equals_rebuild_with_fields(ops):
    live: dict[str, tuple[str, str | None, str | None]] = {}
    with ragdb.open(":memory:", chunker="none") as db:
        for op, key, text, title, section in ops:
            source = f"doc{key}.md"
            if op == "add":
                spans = [Span(0, len(text), {"section": section})] if section else []
                db.add(text, source=source, title=title, spans=spans)
                live[source] = (text, title, section)
            elif op == "delete":
                db.delete(source=source)
                live.pop(source, None)
            else:
                db.optimize(vacuum=False)
        with ragdb.open(":memory:", chunker="none") as fresh:
            for source, (text, title, section) in sorted(live.items()):
                fresh.add(text, source=source, title=title,
                          spans=[Span(0, len(text), {"section": section})] if section else [])
            for q in ("retrieval guide", "install", "检索增强", "title:guide", 'section:"index query"'):
                assert scored(db.search(q, k=50)) == scored(fresh.search(q, k=50))
        assert db.check() == []


def test_a_database_made_before_fields_gets_them_from_reindex(tmp_path):
    path = tmp_path / "old.db"
    with ragdb.open(path, chunker="none"):
        pass
    conn = sqlite3.connect(path)  # as a database made before fields: no setting
    conn.execute("DELETE FROM settings WHERE key = 'fields'")
    conn.commit()
    conn.close()
    with ragdb.open(path, chunker="none") as db:
        db.add("copy the binary", source="docs/install.md", title="Install guide")
        assert "fields" not in db.settings
        assert db.search("install") == []  # no field terms: the text has no "install"
        assert db.search("title:install") == []
        with pytest.raises(InvalidInput, match="ragdb reindex"):
            db.set_field_weights({"title": 1})
        db.reindex()
        assert db.settings["fields"] == DEFAULT_WEIGHTS
        assert [h.source for h in db.search("install")] == ["docs/install.md"]
        with ragdb.open(":memory:", chunker="none") as fresh:
            fresh.add("copy the binary", source="docs/install.md", title="Install guide")
            assert scored(db.search("install binary")) == scored(fresh.search("install binary"))
        assert db.check() == []


def test_cli_config_fields(runner, tmp_path):
    kb = tmp_path / "kb.db"
    run(runner, "-d", kb, "init")
    assert out_json(run(runner, "-d", kb, "config", "fields", "--json")) == {"setting": "fields",
                                                                            "value": DEFAULT_WEIGHTS}
    changed = out_json(run(runner, "-d", kb, "config", "fields", "title=2", "--json"))
    assert changed["value"] == {"title": 2.0, "section": 0.0} and changed["changed"]
    bad = run(runner, "-d", kb, "config", "fields", "title=x", ok=False)
    assert bad.exit_code == 2 and "title=1,section=0.5" in bad.output
    assert "unknown field" in run(runner, "-d", kb, "config", "fields", "body=1", ok=False).output


def test_pdf_outline_gives_sections(tmp_path):
    fpdf = pytest.importorskip("fpdf")
    pdf = fpdf.FPDF()
    pdf.set_font("helvetica", size=12)
    for part, chapters in [("Part One", ["Install", "Configure"]), ("Part Two", ["Search"])]:
        pdf.add_page()
        pdf.start_section(part, level=0)
        pdf.cell(0, 10, f"{part} introduction")
        for ch in chapters:
            pdf.add_page()
            pdf.start_section(ch, level=1)
            pdf.cell(0, 10, f"{ch} chapter body")
    pdf.output(str(tmp_path / "book.pdf"))
    from ragdb.files.loaders import load_file

    (doc,) = load_file(tmp_path / "book.pdf")
    assert [sp.metadata.get("section") for sp in doc.spans] == [
        "Part One", "Part One > Install", "Part One > Configure", "Part Two", "Part Two > Search"]
    with ragdb.open(":memory:", chunker="window:size=4,overlap=0") as db:
        db.add_many([doc])
        assert {h.section for h in db.search("section:configure")} == {"Part One > Configure"}


def test_titles_and_headings_are_analyzed_outside_the_write_transaction(tmp_path, monkeypatch):
    """add_many analyzes every chunk's field terms (title, heading path) while preparing a
    batch, before its write transaction takes the lock, and the result equals analyzing
    them in the write (a database built one document at a time)."""
    import ragdb.text.fields as fields_module

    calls: list[bool] = []
    real = fields_module.chunk_field_counts
    with ragdb.open(tmp_path / "bulk.db", chunker="none") as db:
        store = db._engine.store  # the test looks at the transaction state; ragdb code may not

        def spy(*args, **kwargs):
            calls.append(store.in_transaction())
            return real(*args, **kwargs)

        monkeypatch.setattr(fields_module, "chunk_field_counts", spy)
        records = [{"text": f"# Pumps {i}\n\nThe pump starts slowly.", "source": f"pumps/{i}.md",
                    "title": f"Pump manual {i}"} for i in range(5)]
        db.add_many(records)
        assert calls and not any(calls)
        monkeypatch.setattr(fields_module, "chunk_field_counts", real)
        with ragdb.open(tmp_path / "one.db", chunker="none") as one:
            for r in records:
                one.add(r["text"], source=r["source"], title=r["title"])
            for q in ("pump manual", "title:manual", "pumps"):
                assert [(h.source, h.score) for h in db.search(q, k=10)] == \
                    [(h.source, h.score) for h in one.search(q, k=10)]
