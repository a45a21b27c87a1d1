"""The ``ragdb`` command reads a query or question as the user wrote it (issue 30): flags are
words, a query may start with ``-``, the query language's filters and exclusions are shown,
standard input never silently replaces a document, and metadata values are typed."""

from __future__ import annotations

import orjson
import pytest

import ragdb
from cli_helpers import out_json, run

FPIC = "Set POSITION_INDEPENDENT_CODE to add -fPIC when compiling; see policy CMP0018."
OTHER = "npm install -g installs a package globally. node -r preloads a module."


@pytest.fixture
def kb(tmp_path, runner):
    db = tmp_path / "kb.db"
    run(runner, "-d", db, "add", "-", "--source", "cmake.md", "--metadata", "lang=en", input=FPIC)
    run(runner, "-d", db, "add", "-", "--source", "npm.md", "--metadata", "lang=en", input=OTHER)
    return db


@pytest.mark.parametrize("query", ["-fPIC in CMake", "-fPIC", "what does -fPIC do"])
def test_a_query_may_start_with_a_flag(kb, runner, query):
    result = run(runner, "-d", kb, "search", query, "-k", "1", "--json")
    assert [h["source"] for h in out_json(result)] == ["cmake.md"]


def test_a_query_after_double_dash_and_a_hint_for_the_commands_own_options(kb, runner):
    assert [h["source"] for h in out_json(run(runner, "-d", kb, "search", "--json", "--", "-g"))] == ["npm.md"]
    bad = run(runner, "-d", kb, "search", "-kernel", ok=False)
    assert bad.exit_code == 2 and "goes after '--'" in bad.output


def test_prompt_reads_a_flag_as_a_word(kb, runner):
    result = run(runner, "-d", kb, "prompt", "--json", "--min-confidence", "0", "-k", "1",
                 "What does -fPIC do in CMake?")
    assert [s["source"] for s in out_json(result)["sources"]] == ["cmake.md"]
    excluded = run(runner, "-d", kb, "prompt", "--json", "--min-confidence", "0", "--query-language",
                   "cmake -fpic", ok=False)
    assert out_json(excluded)["sources"] == [] and excluded.exit_code == 3


def test_explain_and_no_hits_name_the_query_languages_filters_and_exclusions(kb, runner):
    result = run(runner, "-d", kb, "search", "--explain", "policy lang:de -cmake")
    assert "filters from the query: \"lang:de\"" in result.stdout and "excluded: \"cmake\"" in result.stdout
    assert "lang:de" in result.stderr and "-cmake" in result.stderr and "--plain" in result.stderr
    assert "dropped by the analyzer" not in result.stderr
    # a loader's own key is text, not a filter that removes every hit
    assert [h["source"] for h in out_json(run(runner, "-d", kb, "search", "--json", "preloads encoding:utf-8"))] \
        == ["npm.md"]


def test_did_you_mean_names_a_word_not_a_stem(tmp_path, runner):
    db = tmp_path / "kb.db"
    run(runner, "-d", db, "add", "-", "--source", "env.md", input="Set the environment before the build.")
    result = run(runner, "-d", db, "search", "enviroment")
    assert "did you mean: environment (for enviroment)" in result.stderr


def test_a_question_in_another_script_names_the_remedy(kb, runner):
    result = run(runner, "-d", kb, "search", "什么是位置无关代码")
    assert "ragdb embed --cross-lingual" in result.stderr
    refused = run(runner, "-d", kb, "prompt", "什么是位置无关代码", ok=False)
    assert refused.exit_code == 3 and "ragdb embed --cross-lingual" in refused.stderr


def test_stdin_without_source_is_another_document_and_replacements_are_reported(tmp_path, runner):
    db = tmp_path / "kb.db"
    first = out_json(run(runner, "-d", db, "add", "-", "--json", input="first text"))
    second = out_json(run(runner, "-d", db, "add", "-", "--json", input="second text"))
    assert first["added"] != second["added"] and second["replaced"] == []
    with ragdb.open(db) as d:
        assert len(d.documents()) == 2
    run(runner, "-d", db, "add", "-", "--source", "n.md", input="one")
    again = run(runner, "-d", db, "add", "-", "--source", "n.md", input="two")
    assert "added 1 document (1 replacing a stored version)" in again.stdout
    data = out_json(run(runner, "-d", db, "add", "-", "--source", "n.md", "--json", input="three"))
    assert data["replaced"] == ["n.md"]


def test_metadata_values_are_typed(tmp_path, runner):
    db = tmp_path / "kb.db"
    run(runner, "-d", db, "add", "-", "--source", "a", "--metadata", "year=2024", "--metadata", "draft=true",
        "--metadata", "score=0.5", "--metadata", 'code="2024"', "--metadata", "team=ops",
        "--metadata", "zip=007", input="text about refunds")
    with ragdb.open(db) as d:
        meta = d.documents()[0].metadata
        assert meta["year"] == 2024 and meta["draft"] is True and meta["score"] == 0.5
        assert meta["code"] == "2024" and meta["team"] == "ops" and meta["zip"] == "007"
    hits = run(runner, "-d", db, "search", "refunds", "--json", "--where", orjson.dumps({"year": {"$gte": 2024}}).decode())
    assert [h["source"] for h in out_json(hits)] == ["a"]


def test_an_integer_past_64_bits_is_kept_as_the_text_given(tmp_path, runner):
    """It was read as a float that is another number (1180591620717411303425 stored as
    1.1805916207174113e+21, silently); the library stores no integer that large."""
    db = tmp_path / "kb.db"
    big, near = str(2 ** 70 + 1), str(2 ** 70 + 7)
    run(runner, "-d", db, "add", "-", "--source", "a", "--metadata", f"id={big}", "--metadata", "n=-9223372036854775808",
        "--metadata", "x=1e3", input="text about refunds")
    with ragdb.open(db) as d:
        meta = d.documents()[0].metadata
        assert meta["id"] == big and meta["n"] == -2 ** 63 and meta["x"] == 1000.0
    # nor does a filter on a nearby integer match the float it would have been read as
    assert out_json(run(runner, "-d", db, "list", "--filter", f"id={near}", "--json")) == []
    assert [d["source"] for d in out_json(run(runner, "-d", db, "list", "--filter", f"id={big}", "--json"))] == ["a"]


def test_an_integer_past_64_bits_in_json_input_is_refused_not_read_as_a_float(tmp_path, runner):
    """``--where`` and an imported JSONL read such an integer as a float that is another number:
    the import stored ``{"n": 1.1805916207174113e+21}`` and the filter matched it. Now both
    are the library's refusal, naming the key, and nothing is stored."""
    db = tmp_path / "kb.db"
    run(runner, "-d", db, "add", "-", "--source", "a", "--metadata", "n=5", input="text about refunds")
    for number in (2 ** 70 + 1, -2 ** 63 - 1):
        where = run(runner, "-d", db, "search", "refunds", "--where", f'{{"n": {{"$lt": {number}}}}}', ok=False)
        assert where.exit_code == 1 and f"filter 'n': $lt: {number} is out of the 64-bit integer range" in where.output
        records = tmp_path / "records.jsonl"
        records.write_text(f'{{"text": "huge", "source": "b", "metadata": {{"m": [1, {number}]}}}}\n')
        imported = run(runner, "-d", db, "import", records, ok=False)
        assert imported.exit_code == 1, imported.output
        assert f"metadata 'm' holds {number}, outside the 64-bit integer range" in imported.output
        added = run(runner, "-d", db, "add", records, ok=False)  # the JSONL loader: a failed file
        assert f"metadata 'm' holds {number}, outside the 64-bit integer range" in added.output
    with ragdb.open(db) as d:
        assert [doc.source for doc in d.documents()] == ["a"] and d.check() == []
