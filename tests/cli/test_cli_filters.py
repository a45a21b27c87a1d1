"""ragdb list/delete --filter and show SOURCE: the CLI over documents(filter=), delete(filter=), get(source=)."""

from __future__ import annotations

import orjson
import pytest

import ragdb
from cli_helpers import out_json, run


@pytest.fixture
def kb(tmp_path):
    path = tmp_path / "kb.db"
    with ragdb.open(path) as db:
        db.add_many([
            {"text": "pump maintenance schedule", "source": "ops/pump.md", "metadata": {"team": "ops", "year": 2024}},
            {"text": "valve inspection notes", "source": "ops/valve.md", "metadata": {"team": "ops", "year": 2023}},
            {"text": "quarterly revenue figures", "source": "fin/q3.md", "metadata": {"team": "finance"}},
        ])
    return path


def sources(runner, kb, *args):
    return sorted(d["source"] for d in out_json(run(runner, "-d", kb, "list", *args, "--json")))


def test_list_with_filter(runner, kb):
    assert sources(runner, kb, "--filter", "team=ops") == ["ops/pump.md", "ops/valve.md"]
    assert sources(runner, kb, "--filter", "team=ops", "--filter", "year=2024") == ["ops/pump.md"]
    assert sources(runner, kb, "--filter", "team=finance", "--filter", "team=ops") == [
        "fin/q3.md", "ops/pump.md", "ops/valve.md"]  # a repeated key is "any of"
    assert sources(runner, kb, "--source", "ops/*", "--filter", "year=2023") == ["ops/valve.md"]
    assert sources(runner, kb, "--filter", "team=nobody") == []


def test_delete_with_filter(runner, kb):
    assert out_json(run(runner, "-d", kb, "delete", "--filter", "team=ops", "--filter", "year=2023",
                        "--json")) == {"deleted": 1}
    assert sources(runner, kb) == ["fin/q3.md", "ops/pump.md"]
    assert out_json(run(runner, "-d", kb, "delete", "--source", "fin/*", "--filter", "team=ops",
                        "--json")) == {"deleted": 0}  # both must match
    assert out_json(run(runner, "-d", kb, "delete", "--filter", "team=ops", "--json")) == {"deleted": 1}
    assert sources(runner, kb) == ["fin/q3.md"]
    assert out_json(run(runner, "-d", kb, "check", "--json"))["ok"]


def test_delete_usage_errors(runner, kb):
    assert run(runner, "-d", kb, "delete", ok=False).exit_code == 2
    assert run(runner, "-d", kb, "delete", "--id", "1", "--filter", "team=ops", ok=False).exit_code == 2
    bad = run(runner, "-d", kb, "delete", "--filter", "team", ok=False)
    assert bad.exit_code == 2 and "KEY=VALUE" in bad.output
    assert sources(runner, kb) == ["fin/q3.md", "ops/pump.md", "ops/valve.md"]  # nothing deleted


def test_show_by_source(runner, kb):
    doc = out_json(run(runner, "-d", kb, "show", "ops/valve.md", "--json"))
    assert doc["source"] == "ops/valve.md" and doc["text"] == "valve inspection notes"
    missing = run(runner, "-d", kb, "show", "ops/none.md", ok=False)
    assert missing.exit_code == 1 and "ops/none.md" in missing.stderr


# ----------------------------------------------------------------------------- --where, --offset, facets


def test_where_takes_operators_and_ands_with_filter(runner, kb):
    assert sources(runner, kb, "--where", '{"year": {"$gte": 2024}}') == ["ops/pump.md"]
    assert sources(runner, kb, "--where", '{"year": {"$exists": false}}') == ["fin/q3.md"]
    assert sources(runner, kb, "--where", '{"$or": [{"team": "finance"}, {"year": {"$lt": 2024}}]}') == [
        "fin/q3.md", "ops/valve.md"]
    assert sources(runner, kb, "--where", '{"$contains": "notes"}') == ["ops/valve.md"]
    # with --filter both must hold
    assert sources(runner, kb, "--filter", "team=ops", "--where", '{"year": {"$ne": 2024}}') == ["ops/valve.md"]
    assert sources(runner, kb, "--filter", "team=finance", "--where", '{"year": 2024}') == []
    hits = out_json(run(runner, "-d", kb, "search", "pump valve revenue", "--where", '{"team": {"$in": ["ops"]}}',
                        "--json"))
    assert sorted(h["source"] for h in hits) == ["ops/pump.md", "ops/valve.md"]


def test_where_errors_name_the_flag_or_the_key(runner, kb):
    for bad in ('{"year"', "[1]", "3", "nope"):
        r = run(runner, "-d", kb, "list", "--where", bad, ok=False)
        assert r.exit_code == 2 and "--where" in r.stderr, bad
    r = run(runner, "-d", kb, "search", "pump", "--where", '{"year": {"$gt": "soon"}}', ok=False)
    assert r.exit_code == 1 and "filter 'year': $gt needs a number or an ISO date, got 'soon'" in r.stderr
    r = run(runner, "-d", kb, "delete", "--where", '{"$nope": 1}', ok=False)
    assert r.exit_code == 1 and "unknown operator '$nope'" in r.stderr
    assert run(runner, "-d", kb, "delete", "--id", "1", "--where", '{"a": 1}', ok=False).exit_code == 2
    assert sources(runner, kb) == ["fin/q3.md", "ops/pump.md", "ops/valve.md"]  # nothing deleted


def test_delete_with_where(runner, kb):
    assert out_json(run(runner, "-d", kb, "delete", "--where", '{"year": {"$lt": 2024}}', "--json")) == {"deleted": 1}
    assert out_json(run(runner, "-d", kb, "delete", "--source", "fin/*", "--where", '{"year": {"$exists": true}}',
                        "--json")) == {"deleted": 0}
    assert sources(runner, kb) == ["fin/q3.md", "ops/pump.md"]


def test_search_offset_pages(runner, kb):
    def page(*args):
        return [(h["rank"], h["source"]) for h in out_json(run(runner, "-d", kb, "search", "pump valve revenue notes",
                                                                *args, "--json"))]

    full = page("-k", "3")
    assert [r for r, _ in full] == [1, 2, 3]
    assert page("-k", "1", "--offset", "1") == full[1:2]
    assert page("-k", "2", "--offset", "1") == full[1:]
    assert page("-k", "5", "--offset", "3") == []
    assert run(runner, "-d", kb, "search", "pump", "--offset", "-1", ok=False).exit_code == 2
    bad = run(runner, "-d", kb, "search", "pump", "-k", "10", "--offset", "9995", ok=False)
    assert bad.exit_code == 2 and "offset + k must be at most 10000" in bad.stderr


def test_facets_command(runner, kb):
    with ragdb.open(kb) as db:
        db.add("pump spares", source="ops/spares.md", metadata={"team": "ops", "year": 2024}, acl=["ops"])
    got = out_json(run(runner, "-d", kb, "facets", "team", "--json"))  # anonymous: the labelled one is hidden
    assert got == {"field": "team", "by": "chunks", "total": 3, "missing": 0, "omitted": 0,
                   "values": [{"value": "ops", "count": 2}, {"value": "finance", "count": 1}]}
    got = out_json(run(runner, "-d", kb, "facets", "year", "pump", "--principal", "ops", "--json"))
    assert got["values"] == [{"value": 2024, "count": 2}] and (got["total"], got["missing"]) == (2, 0)
    got = out_json(run(runner, "-d", kb, "facets", "team", "--all-principals", "--by", "documents",
                       "--where", '{"year": {"$gte": 2024}}', "--limit", "1", "--json"))
    assert got["values"] == [{"value": "ops", "count": 2}] and got["by"] == "documents"
    assert run(runner, "-d", kb, "facets", "year", "--csv").stdout.splitlines() == ["value,count", "2023,1", "2024,1"]
    assert [orjson.loads(line) for line in run(runner, "-d", kb, "facets", "year", "--nl").stdout.splitlines()] == [
        {"value": 2023, "count": 1}, {"value": 2024, "count": 1}]
    table = run(runner, "-d", kb, "facets", "team").stdout
    assert "ops" in table and "3 chunks matched, 0 without team" in table
    assert "no values; 0 chunks matched" in run(runner, "-d", kb, "facets", "team", "nothing").stdout
    assert run(runner, "-d", kb, "facets", "team", "--by", "rows", ok=False).exit_code == 2
    bad = run(runner, "-d", kb, "facets", "timestamp", ok=False)
    assert bad.exit_code == 1 and "facets" in bad.stderr


def test_prompt_takes_where(runner, kb):
    got = out_json(run(runner, "-d", kb, "prompt", "pump valve revenue figures", "--min-confidence", "0",
                       "--where", '{"year": {"$exists": false}}', "--json"))
    assert [s["source"] for s in got["sources"]] == ["fin/q3.md"]
