"""Output formats of the listing commands: --json, --nl, --csv, --tsv (one at most),
--no-headers, and the tables drawn with tabulate (CJK kept aligned)."""

from __future__ import annotations

import csv
import io
import itertools
import json
import re
import unicodedata

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ragdb
from cli_helpers import out_json, run

FORMATS = ("--json", "--nl", "--csv", "--tsv")


@pytest.fixture
def kb(tmp_path):
    path = tmp_path / "kb.db"
    with ragdb.open(path, chunker="none") as db:
        db.add("The pump primes itself after a valve change.", source="docs/pump.md", version="1.10",
               metadata={"team": "ops", "tags": ["a", "b"], "n": 3})
        db.add("Close the valve, then open the drain.", source="docs/valve.md",
               metadata={"note": 'says "hi", then\nleaves'})
        db.add("阀门关闭以后打开排水阀 valve", source="文档/阀门.md", version="2")
    return path


def rows(text: str, tsv: bool = False) -> list[list[str]]:
    return list(csv.reader(io.StringIO(text, newline=""), dialect="excel-tab" if tsv else "excel"))


def nl(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines()]


def records(header: list[str], body: list[list[str]]) -> list[dict[str, str]]:
    return [dict(zip(header, r, strict=True)) for r in body]


# ----------------------------------------------------------------------------- every format, same records


@pytest.mark.parametrize("command", [["list"], ["list", "--all-versions"], ["search", "valve", "-k", "5"]])
def test_nl_csv_tsv_hold_the_json_records(runner, kb, command):
    as_json = out_json(run(runner, "-d", kb, *command, "--json"))
    assert isinstance(as_json, list) and len(as_json) == 3
    assert nl(run(runner, "-d", kb, *command, "--nl").stdout) == as_json
    for flag in ("--csv", "--tsv"):
        header, *body = rows(run(runner, "-d", kb, *command, flag).stdout, tsv=flag == "--tsv")
        assert set(header) == set().union(*as_json) and len(body) == len(as_json)
        for record, expected in zip(records(header, body), as_json, strict=True):
            for key, value in expected.items():
                cell = record[key]
                if value is None:
                    assert cell == ""
                elif isinstance(value, str):
                    assert cell == value
                else:  # numbers, booleans, nested values: JSON text
                    assert json.loads(cell) == value, key


def test_csv_nested_values_are_json_text(runner, kb):
    header, *body = rows(run(runner, "-d", kb, "list", "--csv").stdout)
    assert header[:4] == ["id", "source", "version", "timestamp"]
    by_source = {r["source"]: r for r in records(header, body)}
    pump = by_source["docs/pump.md"]
    assert json.loads(pump["metadata"])["tags"] == ["a", "b"] and json.loads(pump["metadata"])["team"] == "ops"
    assert pump["version"] == "1.10" and pump["acl"] == "[]" and pump["latest"] == "true"
    assert json.loads(by_source["docs/valve.md"]["metadata"])["note"] == 'says "hi", then\nleaves'
    assert by_source["docs/valve.md"]["version"] == ""


def test_no_headers(runner, kb):
    with_header = rows(run(runner, "-d", kb, "list", "--tsv").stdout, tsv=True)
    without = rows(run(runner, "-d", kb, "list", "--tsv", "--no-headers").stdout, tsv=True)
    assert without == with_header[1:] and len(without) == 3
    assert run(runner, "-d", kb, "list", "--no-headers", ok=False).exit_code == 2
    assert run(runner, "-d", kb, "list", "--nl", "--no-headers", ok=False).exit_code == 2


def test_empty_listing_has_just_the_header(runner, kb):
    header, *body = rows(run(runner, "-d", kb, "search", "nothingmatchesthis", "--csv").stdout)
    assert body == [] and header[:3] == ["rank", "score", "source"]
    assert run(runner, "-d", kb, "search", "nothingmatchesthis", "--nl").stdout == ""
    assert out_json(run(runner, "-d", kb, "list", "--source", "none/*", "--json")) == []


@pytest.mark.parametrize("command", [["list"], ["search", "valve"], ["stats"], ["config"], ["migrate", "--list"],
                                     ["plugins"]])
def test_output_flags_exclude_each_other(runner, kb, command):
    for a, b in itertools.combinations(FORMATS, 2):
        result = run(runner, "-d", kb, *command, a, b, ok=False)
        assert result.exit_code == 2, (command, a, b)
        assert f"{a} and {b} exclude each other" in result.stderr
    for flag in FORMATS:  # each alone works
        assert run(runner, "-d", kb, *command, flag).exit_code == 0


# ----------------------------------------------------------------------------- one-record and object commands


def test_stats_json_stays_an_object_and_is_one_record_elsewhere(runner, kb):
    data = out_json(run(runner, "-d", kb, "stats", "--json"))
    assert isinstance(data, dict) and data["documents"] == 3
    assert nl(run(runner, "-d", kb, "stats", "--nl").stdout) == [data]
    header, row = rows(run(runner, "-d", kb, "stats", "--csv").stdout)
    assert header == list(data)
    got = dict(zip(header, row, strict=True))
    assert got["documents"] == "3" and got["keep_versions"] == "false" and got["embedding_model"] == ""
    assert json.loads(got["analyzer"]) == data["analyzer"]


def test_config_listing_formats(runner, kb):
    settings_ = out_json(run(runner, "-d", kb, "config", "--json"))
    assert isinstance(settings_, dict) and "chunker" in settings_
    lines = nl(run(runner, "-d", kb, "config", "--nl").stdout)
    assert {r["setting"]: r["value"] for r in lines} == settings_
    header, *body = rows(run(runner, "-d", kb, "config", "--tsv").stdout, tsv=True)
    assert header == ["setting", "value"]
    got = dict(body)
    assert got["chunker"] == settings_["chunker"] and json.loads(got["analyzer"]) == settings_["analyzer"]
    # one setting, or a change, is not a listing: --json only
    assert out_json(run(runner, "-d", kb, "config", "chunker", "--json"))["value"] == settings_["chunker"]
    bad = run(runner, "-d", kb, "config", "chunker", "--csv", ok=False)
    assert bad.exit_code == 2 and "--csv" in bad.stderr


def test_migrate_list_formats(runner, kb):
    from ragdb.storage import migration_files

    names = [p.stem for p in migration_files()]
    listed = out_json(run(runner, "-d", kb, "migrate", "--list", "--json"))
    assert [m["name"] for m in listed["applied"]] == names  # the object it always printed
    lines = nl(run(runner, "-d", kb, "migrate", "--list", "--nl").stdout)
    assert [r["migration"] for r in lines] == names and {r["state"] for r in lines} == {"applied"}
    header, *body = rows(run(runner, "-d", kb, "migrate", "--list", "--csv").stdout)
    assert header == ["migration", "state", "applied_at"] and [r[0] for r in body] == names
    assert all(r[2] for r in body)
    assert run(runner, "-d", kb, "migrate", "--csv", ok=False).exit_code == 2


def test_eval_formats(tmp_path, runner):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("\n".join(json.dumps(r) for r in [
        {"_id": "d1", "title": "Pumps", "text": "Centrifugal pumps move water with an impeller."},
        {"_id": "d2", "title": "Valves", "text": "Gate valves stop the flow of water."},
    ]) + "\n")
    queries = tmp_path / "queries.jsonl"
    queries.write_text('{"_id": "q1", "text": "impeller pump"}\n{"_id": "q2", "text": "gate flow"}\n')
    qrels = tmp_path / "qrels.tsv"
    qrels.write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td2\t1\n")
    args = ["eval", "--corpus", corpus, "--queries", queries, "--qrels", qrels, "-k", "2"]
    data = out_json(run(runner, *args, "--json"))
    assert isinstance(data, dict) and data["mrr@10"] == 1.0
    assert nl(run(runner, *args, "--nl").stdout) == [data]
    header, row = rows(run(runner, *args, "--csv").stdout)
    assert header == list(data) and float(dict(zip(header, row, strict=True))["ndcg@10"]) == data["ndcg@10"]


# ----------------------------------------------------------------------------- tables


def display_width(text: str) -> int:
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 0 if unicodedata.combining(c) else 1
               for c in text)


def test_list_table_keeps_columns_aligned_with_cjk(runner, kb):
    lines = run(runner, "-d", kb, "list").stdout.splitlines()
    header, rule, *body = lines
    assert header.split() == ["id", "source", "version", "chunks", "timestamp"]
    runs = [(m.start(), m.end()) for m in re.finditer(r"-+", rule)]
    assert len(runs) == 5
    for line in body:  # columns after a CJK source start (left) and end (right) where the rule says
        stamp = re.search(r"\d{4}-\d\d-\d\dT\S+$", line)
        assert stamp and display_width(line[:stamp.start()]) == runs[4][0], (line, runs)
        chunks = re.search(r"(\d+)  +\d{4}-", line)
        assert chunks and display_width(line[:chunks.end(1)]) == runs[3][1], (line, runs)
        assert not line.endswith(" ")
    assert any("文档/阀门.md" in line for line in body)
    assert any(" 1.10 " in line for line in body)  # shown as given, not parsed as the number 1.1


def test_migrate_and_plugins_tables(runner, kb):
    table = run(runner, "-d", kb, "migrate", "--list").stdout.splitlines()
    assert table[0].split() == ["migration", "state", "applied", "at"] and set(table[1]) <= {"-", " "}
    assert "0001_initial" in table[2]


def test_stats_pairs_are_aligned(runner, kb):
    lines = run(runner, "-d", kb, "stats").stdout.splitlines()
    assert lines[0].startswith("database ") and any(line.startswith("avg chunk length ") for line in lines)
    starts = {re.match(r"(.*?\S)  +\S", line).end() - 1 for line in lines}
    assert len(starts) == 1, lines  # every value starts in one column, two spaces after the longest label


# ----------------------------------------------------------------------------- property: CSV round trip


_text = st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc")) | st.sampled_from([",", '"', "\n", "\t"]),
                min_size=1, max_size=20).filter(lambda s: s.strip() and "\r" not in s)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(source=_text.filter(lambda s: s == s.strip() and "\n" not in s and not any(c in s for c in "*?[]\\")),
       value=_text | st.integers(-(2**63), 2**63 - 1) | st.lists(_text, max_size=3) | st.booleans(),
       tsv=st.booleans())
def test_csv_round_trips_sources_and_metadata(tmp_path_factory, runner, source, value, tsv):
    path = tmp_path_factory.mktemp("csv") / "kb.db"
    with ragdb.open(path, chunker="none") as db:
        db.add("some text to find", source=source, metadata={"k": value})
    out = run(runner, "-d", path, "list", "--tsv" if tsv else "--csv").stdout
    header, row = rows(out, tsv=tsv)
    record = dict(zip(header, row, strict=True))
    assert record["source"] == source
    assert json.loads(record["metadata"])["k"] == value


def test_control_characters_never_reach_the_terminal_and_machine_formats_keep_them(tmp_path, runner):
    """A file named (or holding) an escape sequence sent it to the user's terminal through
    list, search and show; piped, click stripped what looked like styles from CSV, which then
    differed from the stored value. Readable output shows control characters as symbols
    (one for one); CSV/TSV keep the value as it is."""
    folder = tmp_path / "f8"
    folder.mkdir()
    name = "esc\x1b[31mred.md"
    (folder / name).write_text("red \x1b[31mtext\x1b[0m here\n")
    db = tmp_path / "kb.db"
    run(runner, "-d", db, "add", folder)
    for args in (["list"], ["search", "red"], ["show", "1"]):
        out = run(runner, "-d", db, *args).output
        assert "\x1b" not in out and "\u241b[31m" in out, (args, out)
    (folder / "bad\x1b[31m.md").write_text("---\ntimestamp: not-a-date\n---\nalpha\n")
    failed = run(runner, "-d", db, "add", folder)  # the failed file named on stderr
    assert "\x1b" not in failed.stderr and "bad\u241b[31m.md" in failed.stderr
    csv_out = run(runner, "-d", db, "list", "--csv").output
    assert f"f8/{name}" in csv_out or f"{folder}/{name}" in csv_out
