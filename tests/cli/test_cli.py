"""The ``ragdb`` command: every command through CliRunner, a few as real subprocesses."""

from __future__ import annotations

import inspect
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

import ragdb
from ragdb.cli.commands import answering as cli_mod
from cli_helpers import out_json, run
from ragdb.cli import cli

ROOT = Path(__file__).resolve().parents[2]
BINARY = bytes(range(256)) * 8 + b"\x00\xff" * 100
GBK_TEXT = ("检索增强生成是一种先检索再生成的方法。知识库需要定期更新，删除过期的文档，"
            "并且保证每一次回答都有可靠的出处。这份说明用中文写成，文件的编码是国标扩展码。") * 3
# filter= is a search keyword (a SearchOptions restriction) since search takes **keywords
SEARCH_HAS_FILTERS = "filter" in inspect.signature(ragdb.Database.search).parameters or \
    "filter" in inspect.signature(ragdb.Restrictions).parameters
needs_filters = pytest.mark.skipif(not SEARCH_HAS_FILTERS, reason="Database.search has no filter parameter yet")


def make_pdf(path: Path) -> None:
    from fpdf import FPDF

    pdf = FPDF()
    pdf.add_page()
    pdf.set_font("Helvetica", size=12)
    pdf.multi_cell(0, 8, "Quarterly report. The turbine maintenance interval is eighteen months.")
    pdf.add_page()
    pdf.multi_cell(0, 8, "Second page: the warranty covers corrosion of the compressor blades.")
    pdf.output(str(path))


@pytest.fixture
def files(tmp_path):
    """A folder of real files of every kind, plus an unreadable binary one."""
    root = tmp_path / "docs"
    root.mkdir()
    make_pdf(root / "report.pdf")
    (root / "guide.md").write_text(
        "---\ntitle: Operator guide\ntags: [ops, safety]\nyear: 2024\n---\n"
        "# Startup\n\nOpen the valve slowly before starting the pump.\n\n"
        "# Shutdown\n\nClose the valve after the pump has stopped.\n", encoding="utf-8")
    (root / "page.html").write_text(
        "<!doctype html><html><head><title>Release notes</title><style>p{color:red}</style></head>"
        "<body><h1>Version 2</h1><p>The dashboard now shows humidity readings.</p>"
        "<script>var hidden = 'javascript secret';</script></body></html>", encoding="utf-8")
    (root / "notes-gbk.txt").write_bytes(GBK_TEXT.encode("gbk"))
    (root / "blob.bin").write_bytes(BINARY)
    return root


@pytest.fixture
def kb(tmp_path, runner, files):
    """A database with the sample files added (the binary one skipped)."""
    db = tmp_path / "kb.db"
    run(runner, "-d", db, "add", files)
    return db


# ----------------------------------------------------------------------------- help and the CLI reference


REFERENCE_SECTION = re.compile(r"<!-- cli-reference:start -->(.*)<!-- cli-reference:end -->", re.S)


def all_commands() -> dict:
    """Every command of the group, loaded (the group imports a command's module on first use)."""
    ctx = __import__("click").Context(cli)
    return {name: cli.get_command(ctx, name) for name in cli.list_commands(ctx)}


def test_every_command_has_help_and_is_in_the_cli_reference(runner):
    section = REFERENCE_SECTION.search((ROOT / "docs" / "cli.md").read_text(encoding="utf-8")).group(1)
    assert cli.help and cli.help.strip()
    names = sorted(all_commands())
    # docs/cli.md names exactly the commands the CLI has: none undocumented,
    # none documented that does not exist (e.g. one renamed or removed).
    named = set(re.findall(r"`ragdb ([a-z][\w-]*)", section))
    assert named == set(names), (f"commands missing from docs/cli.md: {sorted(set(names) - named)}; "
                                 f"docs/cli.md names commands that do not exist: {sorted(named - set(names))}")
    for name in ["init", "add", "sync", "delete", "show", "list", "search", "stats", "check", "optimize",
                 "migrate", "export", "import", "eval", "ask", "prompt"]:
        assert name in names
    for name, cmd in all_commands().items():
        assert cmd.help and cmd.help.strip(), name
        assert (cmd.short_help or cmd.get_short_help_str()).strip(), name
        for param in cmd.params:
            if isinstance(param, __import__("click").Option):
                assert param.help, f"{name} {param.opts}"
        assert re.search(rf"`ragdb {re.escape(name)}\b", section), f"'ragdb {name}' missing from docs/cli.md"
        result = run(runner, name, "--help")
        assert "Usage: ragdb " + name in result.output
    documented = set(re.findall(r"^### `ragdb (\w+)", section, re.M))
    assert documented == set(names)


def test_group_help_lists_commands(runner):
    result = run(runner, "--help")
    for name in all_commands():
        assert name in result.output
    assert f"version {ragdb.__version__} (scoring kernel: " in run(runner, "--version").output


# ----------------------------------------------------------------------------- init


def test_init(tmp_path, runner):
    db = tmp_path / "new.db"
    result = run(runner, "-d", db, "init", "--analyzer", "simple", "--chunker", "window:size=50,overlap=10",
                 "--keep-versions", "--json")
    data = out_json(result)
    assert data["created"] and data["keep_versions"] and data["chunker"] == "window:size=50,overlap=10"
    with ragdb.open(db) as d:
        assert d.settings["keep_versions"] is True
    result = run(runner, "-d", db, "init")
    assert "opened existing" in result.output
    bad = run(runner, "-d", db, "init", "--analyzer", "jieba", ok=False)
    assert bad.exit_code == 1 and "analyzer" in bad.output and "Traceback" not in bad.output
    bad = run(runner, "-d", db, "init", "--chunker", "zigzag", ok=False)
    assert bad.exit_code == 1 and "zigzag" in bad.output


def test_no_database_is_a_usage_error(runner, monkeypatch):
    monkeypatch.delenv("RAGDB_DATABASE", raising=False)
    result = run(runner, "stats", ok=False)
    assert result.exit_code == 2 and "RAGDB_DATABASE" in result.output


def test_database_from_env_and_command_option(runner, kb, tmp_path):
    result = run(runner, "stats", "--json", env={"RAGDB_DATABASE": str(kb)})
    assert out_json(result)["documents"] == 4
    # the command's -d wins over the environment
    result = run(runner, "stats", "-d", kb, "--json", env={"RAGDB_DATABASE": str(tmp_path / "other.db")})
    assert out_json(result)["documents"] == 4


# ----------------------------------------------------------------------------- add


def test_add_real_files(tmp_path, runner, files):
    db = tmp_path / "kb.db"
    result = run(runner, "-d", db, "add", files, "--json")
    data = out_json(result)
    names = sorted(Path(s).name for s in data["added"])
    assert names == ["guide.md", "notes-gbk.txt", "page.html", "report.pdf"]
    # issue 14: a binary file in a folder is skipped with a reason, not a failure
    assert data["failed"] == [] and data["skip_counts"] == {"binary": 1}
    assert [(Path(k["path"]).name, k["reason"]) for k in data["skipped"]] == [("blob.bin", "binary")]
    with ragdb.open(db) as d:
        assert d.check() == []
        src = {Path(doc.source).name: doc for doc in d.documents()}
        assert src["guide.md"].metadata["tags"] == ["ops", "safety"]
        assert src["guide.md"].metadata["title"] == "Operator guide"
        assert src["report.pdf"].chunk_count >= 1
        assert Path(d.search("turbine maintenance interval")[0].source).name == "report.pdf"
        assert Path(d.search("corrosion compressor")[0].source).name == "report.pdf"
        assert Path(d.search("humidity dashboard")[0].source).name == "page.html"
        assert d.search("javascript secret") == []
        assert Path(d.search("知识库定期更新")[0].source).name == "notes-gbk.txt"
        gbk = d.get(src["notes-gbk.txt"].id)
        assert "检索增强生成" in gbk.text
        assert d.search("valve pump")[0].metadata["section"] == "Startup"
    # the human output sums the skipped files up by reason (-v lists them) and exits 0
    again = run(runner, "-d", db, "add", files)
    assert "4 unchanged" in again.stdout and "skipped 1 file: 1 binary" in again.stdout
    assert "blob.bin" not in again.output
    listed = run(runner, "-d", db, "add", files, "-v")
    assert f"skip {files / 'blob.bin'} (binary)" in listed.stdout


def test_add_sources_are_paths_as_given(tmp_path, runner, files, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run(runner, "-d", "kb.db", "add", "docs/guide.md", "./docs", "--glob", "*.html", "--source-prefix", "kb/")
    with ragdb.open(tmp_path / "kb.db") as d:
        assert sorted(doc.source for doc in d.documents()) == ["kb/docs/guide.md", "kb/docs/page.html"]


def test_add_strict_writes_nothing(tmp_path, runner, files):
    db = tmp_path / "kb.db"
    (files / "broken.pdf").write_bytes(b"%PDF-1.4 this is not really a PDF")
    result = run(runner, "-d", db, "add", files, "--strict", ok=False)
    assert result.exit_code == 1
    assert "broken.pdf" in result.stderr and "PDF" in result.stderr
    assert "Traceback" not in result.output
    with ragdb.open(db) as d:
        assert d.documents() == [] and d.check() == []


def test_add_only_failures_exits_1(tmp_path, runner, files):
    result = run(runner, "-d", tmp_path / "kb.db", "add", files / "blob.bin", ok=False)
    assert result.exit_code == 1 and "blob.bin" in result.stderr


def test_add_missing_path(tmp_path, runner):
    result = run(runner, "-d", tmp_path / "kb.db", "add", tmp_path / "nope.md", ok=False)
    assert result.exit_code == 1 and "nope.md" in result.stderr and "no such file" in result.stderr
    assert not (tmp_path / "kb.db").exists()


def test_add_stdin_with_metadata_and_version(tmp_path, runner):
    db = tmp_path / "kb.db"
    run(runner, "-d", db, "add", "-", "--kind", "md", "--source", "piped/notes.md", "--version", "2",
        "--metadata", "team=ops", "--metadata", "lang=en",
        input="# Heading\n\nThe backup runs nightly at two.\n")
    with ragdb.open(db) as d:
        (doc,) = d.documents()
        assert doc.source == "piped/notes.md" and doc.version == "2"
        assert doc.metadata["team"] == "ops" and doc.metadata["lang"] == "en"
        assert doc.metadata["loader"] == "markdown"
    bad = run(runner, "-d", db, "add", "-", "--metadata", "novalue", input="x", ok=False)
    assert bad.exit_code == 2 and "KEY=VALUE" in bad.output
    empty = run(runner, "-d", db, "add", "-", input="", ok=False)
    assert empty.exit_code == 1 and "-:" in empty.stderr
    # an empty --source is the caller's mistake, said as one (it named an internal function)
    nameless = run(runner, "-d", db, "add", "-", "--source", "", input="text", ok=False)
    assert nameless.exit_code == 1 and "source must be a non-empty string" in nameless.stderr
    assert "load_bytes" not in nameless.stderr
    with ragdb.open(db) as d:
        assert [doc.source for doc in d.documents()] == ["piped/notes.md"]


# ----------------------------------------------------------------------------- sync


def test_sync(tmp_path, runner, files, monkeypatch):
    monkeypatch.chdir(files)  # sources are named relative to the working folder
    db = tmp_path / "kb.db"
    first = out_json(run(runner, "-d", db, "sync", files, "--json"))
    assert sorted(first["added"]) == ["guide.md", "notes-gbk.txt", "page.html", "report.pdf"]
    assert first["failed"] == [] and first["skip_counts"] == {"binary": 1}
    (files / "guide.md").write_text("# Startup\n\nThe valve now opens automatically.\n", encoding="utf-8")
    (files / "page.html").unlink()
    (files / "new.txt").write_text("A new file about lubrication schedules.\n", encoding="utf-8")
    (files / "blob.bin").unlink()
    dry = run(runner, "-d", db, "sync", files, "--dry-run")
    assert dry.stdout.splitlines()[:3] == ["A new.txt", "M guide.md", "D page.html"]
    assert "would add 1, would replace 1, would delete 1, unchanged 2" in dry.stdout
    with ragdb.open(db) as d:
        assert sorted(doc.source for doc in d.documents()) == ["guide.md", "notes-gbk.txt", "page.html",
                                                                "report.pdf"]
    done = run(runner, "-d", db, "sync", files)
    assert "add 1, replace 1, delete 1, unchanged 2, failed 0" in done.stdout
    again = out_json(run(runner, "-d", db, "sync", files, "--json"))
    assert again["added"] == again["changed"] == again["deleted"] == [] and again["unchanged"] == 4
    with ragdb.open(db) as d:
        assert sorted(doc.source for doc in d.documents()) == ["guide.md", "new.txt", "notes-gbk.txt",
                                                                "report.pdf"]
        assert d.search("automatically")[0].source == "guide.md"
        assert d.check() == []


def test_sync_dry_run_does_not_create_the_database(tmp_path, runner, files, monkeypatch):
    monkeypatch.chdir(files)
    db = tmp_path / "kb.db"
    result = run(runner, "-d", db, "sync", files, "--dry-run", "--source-prefix", "docs/")
    assert "A docs/guide.md" in result.stdout
    assert not db.exists()


def test_sync_strict(tmp_path, runner, files):
    db = tmp_path / "kb.db"
    (files / "broken.pdf").write_bytes(b"%PDF-1.4 this is not really a PDF")
    result = run(runner, "-d", db, "sync", files, "--strict", ok=False)
    assert result.exit_code == 1 and "broken.pdf" in result.stderr
    with ragdb.open(db) as d:
        assert d.documents() == []


def test_sync_missing_folder_is_an_error(tmp_path, runner):
    result = run(runner, "-d", tmp_path / "kb.db", "sync", tmp_path / "nope", ok=False)
    assert result.exit_code == 1 and "nope" in result.stderr and "not a folder" in result.stderr


# ----------------------------------------------------------------------------- delete / show / list


def test_list_show_delete(runner, kb):
    listed = out_json(run(runner, "-d", kb, "list", "--json"))
    assert len(listed) == 4
    md = next(d for d in listed if d["source"].endswith("guide.md"))
    table = run(runner, "-d", kb, "list", "--source", "*.md")
    assert "guide.md" in table.stdout and "report.pdf" not in table.stdout
    shown = run(runner, "-d", kb, "show", md["id"])
    assert "Operator guide" in shown.stdout and "Open the valve slowly" in shown.stdout
    by_source = out_json(run(runner, "-d", kb, "show", md["source"], "--json"))
    assert by_source["id"] == md["id"] and "valve" in by_source["text"]
    missing = run(runner, "-d", kb, "show", "999", ok=False)
    assert missing.exit_code == 1 and "999" in missing.stderr
    assert run(runner, "-d", kb, "delete", ok=False).exit_code == 2
    assert run(runner, "-d", kb, "delete", "--id", "1", "--source", "x", ok=False).exit_code == 2
    assert out_json(run(runner, "-d", kb, "delete", "--id", md["id"], "--json")) == {"deleted": 1}
    gone = run(runner, "-d", kb, "delete", "--id", md["id"], ok=False)
    assert gone.exit_code == 1 and str(md["id"]) in gone.stderr
    assert "deleted 2 documents" in run(runner, "-d", kb, "delete", "--source", "*.[hp]*").stdout
    assert len(out_json(run(runner, "-d", kb, "list", "--json"))) == 1
    assert run(runner, "-d", kb, "check").exit_code == 0


# ----------------------------------------------------------------------------- search


def test_search(runner, kb):
    hits = out_json(run(runner, "-d", kb, "search", "valve pump turbine", "-k", "2", "--json"))
    assert len(hits) == 2 and [h["rank"] for h in hits] == [1, 2]
    assert {Path(h["source"]).name for h in hits} == {"guide.md", "report.pdf"}
    assert hits[0]["score"] >= hits[1]["score"]
    assert len(out_json(run(runner, "-d", kb, "search", "valve pump turbine", "-k", "1", "--json"))) == 1
    explained = out_json(run(runner, "-d", kb, "search", "valve pump", "--explain", "--json"))
    top = explained[0]
    assert set(top["explain"]) == {"valv", "pump"} or set(top["explain"]) == {"valve", "pump"}
    assert sum(top["explain"].values()) == pytest.approx(top["score"])
    table = run(runner, "-d", kb, "search", "valve pump", "--explain")
    assert "guide.md" in table.stdout and "pump" in table.stdout
    tfidf = out_json(run(runner, "-d", kb, "search", "valve", "--scorer", "tfidf", "--json"))
    assert 0 < tfidf[0]["score"] <= 1.0
    assert out_json(run(runner, "-d", kb, "search", "valve", "--min-score", "1000", "--json")) == []
    assert "no hits" in run(runner, "-d", kb, "search", "zyzzyva").stdout
    assert run(runner, "-d", kb, "search", "x", "--scorer", "nope", ok=False).exit_code == 2
    assert run(runner, "-d", kb, "search", "x", "-k", "0", ok=False).exit_code == 2


@needs_filters
def test_search_filters(tmp_path, runner):
    db = tmp_path / "kb.db"
    run(runner, "-d", db, "init", "--keep-versions")
    with ragdb.open(db) as d:
        d.add("Pump maintenance for the red line.", source="a/red.md", version="1", metadata={"year": 2023,
              "tags": ["ops"]}, timestamp="2023-03-01T00:00:00Z")
        d.add("Pump maintenance for the blue line.", source="b/blue.md", metadata={"year": 2024, "tags": ["it"]},
              timestamp="2024-03-01T00:00:00Z", acl=["team-b"])
        d.add("Pump maintenance for the red line, revised.", source="a/red.md", version="2",
              metadata={"year": 2024, "tags": ["ops"]}, timestamp="2024-06-01T00:00:00Z")

    def sources(*args, who=("--all-principals",)):  # the full view unless who= says otherwise
        return [h["source"] for h in out_json(run(runner, "-d", db, "search", "pump maintenance", "--json",
                                                  *who, *args))]

    assert sorted(sources()) == ["a/red.md", "b/blue.md"]  # --all-principals: every document
    assert sources(who=()) == ["a/red.md"]  # no principal: the anonymous caller sees public documents only
    # team-b's labelled documents and the public ones (unlabeled: public_unlabeled is on by default)
    assert sorted(sources("--principal", "team-b", who=())) == ["a/red.md", "b/blue.md"]
    assert sources("--principal", "team-x", who=()) == ["a/red.md"]
    both = run(runner, "-d", db, "search", "pump", "--principal", "team-b", "--all-principals", ok=False)
    assert both.exit_code == 2  # a usage error
    assert sources("--filter", "source=b/*") == ["b/blue.md"]
    assert sources("--filter", "year=2023") == []  # the 2023 version of red is not the latest
    assert sorted(sources("--filter", "year=2024")) == ["a/red.md", "b/blue.md"]  # typed metadata
    assert sources("--filter", "tags=it") == ["b/blue.md"]
    assert sorted(sources("--filter", "tags=it", "--filter", "tags=ops")) == ["a/red.md", "b/blue.md"]
    assert sources("--since", "2024-05-01") == ["a/red.md"]
    assert sources("--until", "2024-04-01") == ["b/blue.md"]
    assert sources("--all-versions", "--filter", "version=1") == ["a/red.md"]
    assert [h["version"] for h in out_json(run(runner, "-d", db, "search", "pump", "--json", "--as-of",
                                               "2023-06-01", "--all-principals"))] == ["1"]
    bad = run(runner, "-d", db, "search", "pump", "--filter", "year", ok=False)
    assert bad.exit_code == 2
    bad = run(runner, "-d", db, "search", "pump", "--since", "yesterday", ok=False)
    assert bad.exit_code == 2 and "yesterday" in bad.stderr  # checked before the database is opened: usage


# ----------------------------------------------------------------------------- maintenance


def test_stats_check_optimize(runner, kb):
    s = out_json(run(runner, "-d", kb, "stats", "--json"))
    assert s["documents"] == 4 and s["chunks"] >= 4
    assert "documents" in run(runner, "-d", kb, "stats").stdout
    assert out_json(run(runner, "-d", kb, "check", "--json")) == {"ok": True, "problems": []}
    assert "ok" in run(runner, "-d", kb, "check").stdout
    run(runner, "-d", kb, "delete", "--source", "*.pdf")
    opt = out_json(run(runner, "-d", kb, "optimize", "--json"))
    assert set(opt) == {"size_before", "size_after"}
    assert "optimized" in run(runner, "-d", kb, "optimize", "--no-vacuum").stdout
    assert out_json(run(runner, "-d", kb, "stats", "--json"))["pending_chunks"] == 0


def test_check_reports_problems(runner, kb, monkeypatch):
    monkeypatch.setattr(ragdb.Database, "check", lambda self: ["3 terms have a wrong document frequency"])
    result = run(runner, "-d", kb, "check", ok=False)
    assert result.exit_code == 1 and "wrong document frequency" in result.stdout


def test_migrate(runner, kb, tmp_path):
    listed = out_json(run(runner, "-d", kb, "migrate", "--list", "--json"))
    from ragdb.storage import migration_files
    assert [m["name"] for m in listed["applied"]] == [p.stem for p in migration_files()]
    assert listed["pending"] == []
    assert "0001_initial" in run(runner, "-d", kb, "migrate", "--list").stdout
    assert "up to date" in run(runner, "-d", kb, "migrate").stdout
    missing = run(runner, "-d", tmp_path / "none.db", "migrate", ok=False)
    assert missing.exit_code == 1


def test_migrate_lists_and_applies_pending(tmp_path, runner):
    import sqlite3

    import sqlite_utils

    from ragdb.storage import build_migrations, migration_files

    names = [p.stem for p in migration_files()]
    if len(names) < 2:
        pytest.skip("needs two migrations")
    path = tmp_path / "old.db"  # an old schema: only the first migration applied
    conn = sqlite3.connect(path)
    build_migrations(stop_after=names[0]).apply(sqlite_utils.Database(conn))
    conn.commit()
    conn.close()
    listed = out_json(run(runner, "-d", path, "migrate", "--list", "--json"))
    assert [m["name"] for m in listed["applied"]] == names[:1] and listed["pending"] == names[1:]
    done = out_json(run(runner, "-d", path, "migrate", "--json"))
    assert done == {"applied_now": names[1:], "pending": []}


# ----------------------------------------------------------------------------- export / import


def test_export_import_roundtrip(tmp_path, runner, kb):
    out = tmp_path / "kb.jsonl"
    assert "exported 4 documents" in run(runner, "-d", kb, "export", out).stdout
    records = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    assert len(records) == 4 and all(r["latest"] for r in records)
    copy = tmp_path / "copy.db"
    assert "imported 4 documents" in run(runner, "-d", copy, "import", out).stdout
    for q in ["valve pump", "turbine", "humidity", "知识库", "corrosion blades"]:
        a = [(h["source"], h["start"], h["end"], h["score"], h["metadata"]) for h in
             out_json(run(runner, "-d", kb, "search", q, "--json"))]
        b = [(h["source"], h["start"], h["end"], h["score"], h["metadata"]) for h in
             out_json(run(runner, "-d", copy, "search", q, "--json"))]
        assert a == b and a
    # stdout / stdin
    piped = run(runner, "-d", kb, "export", "-").stdout_bytes
    assert piped == out.read_bytes()
    third = tmp_path / "third.db"
    assert out_json(run(runner, "-d", third, "import", "-", "--json", input=piped))["documents"] == 4
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"source": "a", "text": "ok"}\n{"source": 3}\n')
    result = run(runner, "-d", tmp_path / "fresh.db", "import", bad, ok=False)
    assert result.exit_code == 1 and "bad.jsonl:2" in result.stderr
    with ragdb.open(tmp_path / "fresh.db") as d:
        assert d.documents() == []
    nofile = run(runner, "-d", kb, "export", tmp_path / "no" / "dir" / "x.jsonl", ok=False)
    assert nofile.exit_code == 1 and "x.jsonl" in nofile.stderr


# ----------------------------------------------------------------------------- eval


def test_eval(tmp_path, runner):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("\n".join(json.dumps(r) for r in [
        {"_id": "d1", "title": "Pumps", "text": "Centrifugal pumps move water with an impeller."},
        {"_id": "d2", "title": "Valves", "text": "Gate valves stop the flow of water."},
        {"_id": "d3", "title": "", "text": "Turbines turn steam into rotation."},
    ]) + "\n")
    queries = tmp_path / "queries.jsonl"
    queries.write_text('{"_id": "q1", "text": "impeller pump"}\n{"_id": "q2", "text": "steam turbine"}\n'
                       '{"_id": "q3", "text": "gate flow"}\n')
    qrels = tmp_path / "qrels.tsv"
    qrels.write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td3\t1\nq3\td2\t1\nq3\td1\t1\n")
    data = out_json(run(runner, "eval", "--corpus", corpus, "--queries", queries, "--qrels", qrels, "-k", "2",
                        "--json"))
    from ragdb.answers.evaluation import evaluate_database, load_beir
    docs, qs, rels = load_beir((corpus, queries, qrels))
    with ragdb.open(":memory:", chunker="none") as d:
        d.add_many({"text": f"{t}\n\n{x}" if t else x, "source": i} for i, t, x in docs)
        expected = evaluate_database(d, qs, rels, k=2)
    assert data["ndcg@10"] == pytest.approx(expected["ndcg@10"])
    assert data["recall@2"] == pytest.approx(expected["recall@2"])
    assert data["mrr@10"] == pytest.approx(expected["mrr@10"]) and data["mrr@10"] == 1.0
    assert data["queries"] == 3
    table = run(runner, "eval", "--corpus", corpus, "--queries", queries, "--qrels", qrels)
    assert "nDCG@10" in table.stdout and "Recall@10" in table.stdout and "MRR@10" in table.stdout
    qrels.write_text("q1\td1\n")
    bad = run(runner, "eval", "--corpus", corpus, "--queries", queries, "--qrels", qrels, ok=False)
    assert bad.exit_code == 1 and "qrels.tsv:1" in bad.stderr
    assert run(runner, "eval", "--corpus", corpus, ok=False).exit_code == 2


# ----------------------------------------------------------------------------- prompt / ask


def test_prompt(runner, kb):
    result = run(runner, "-d", kb, "prompt", "How do I start the pump?", "--budget", "500")
    assert "<<<SOURCE 1>>>" in result.stdout and "Open the valve slowly" in result.stdout
    data = out_json(run(runner, "-d", kb, "prompt", "How do I start the pump?", "--json"))
    assert not data["refused"] and data["messages"][-1]["role"] == "user"
    assert data["sources"][0]["source"].endswith("guide.md")
    refused = run(runner, "-d", kb, "prompt", "zyzzyva quux?", ok=False)
    assert refused.exit_code == 3 and "refused: no chunk matches the question" in refused.stderr
    zh = out_json(run(runner, "-d", kb, "prompt", "知识库多久更新？", "--json"))
    assert zh["language"] == "zh"


SECRET = "sk-test-SECRET-4242"


@pytest.fixture
def llm_env(monkeypatch):
    monkeypatch.setenv("RAGDB_LLM_API_KEY", SECRET)
    monkeypatch.delenv("RAGDB_LLM_BASE_URL", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)


def test_ask(runner, kb, httpserver, llm_env):
    reply = {"choices": [{"message": {"role": "assistant", "content": "Open the valve slowly first [1]."}}]}
    httpserver.expect_request("/v1/chat/completions", method="POST").respond_with_json(reply)
    base = httpserver.url_for("/v1")
    result = run(runner, "-d", kb, "ask", "How do I start the pump?", "--base-url", base, "--model", "m1")
    assert result.stdout.startswith("Open the valve slowly first [1].")
    assert "Sources:" in result.stdout and "*[1]" in result.stdout and "guide.md" in result.stdout
    assert SECRET not in result.output
    (request, _), = httpserver.log
    assert request.headers["Authorization"] == f"Bearer {SECRET}"
    body = request.get_json()
    assert body["model"] == "m1" and "Open the valve slowly" in body["messages"][-1]["content"]
    data = out_json(run(runner, "-d", kb, "ask", "How do I start the pump?", "--base-url", base, "--json"))
    assert data["citations"]["cited"] == [1] and data["sources"][0]["source"].endswith("guide.md")


def test_ask_streams_on_a_terminal(runner, kb, httpserver, llm_env, monkeypatch):
    events = [{"choices": [{"delta": {"content": piece}}]} for piece in ["Close ", "the valve ", "[1]."]]
    body = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
    httpserver.expect_request("/v1/chat/completions", method="POST").respond_with_data(
        body, content_type="text/event-stream")
    monkeypatch.setattr(cli_mod, "_stream_to_terminal", lambda: True)
    result = run(runner, "-d", kb, "ask", "How do I shut down the pump?", "--base-url", httpserver.url_for("/v1"))
    assert result.stdout.startswith("Close the valve [1].\n")
    assert "Sources:" in result.stdout
    (request, _), = httpserver.log
    assert request.get_json()["stream"] is True


def test_ask_refuses_without_calling_the_model(runner, kb, httpserver, llm_env):
    result = run(runner, "-d", kb, "ask", "zyzzyva quux?", "--base-url", httpserver.url_for("/v1"), ok=False)
    assert result.exit_code == 3 and result.stdout.strip() == "I don't know based on the provided context."
    assert "refused without calling the model" in result.stderr
    assert httpserver.log == []
    result = run(runner, "-d", kb, "ask", "How do I start the pump?", "--min-score", "1000",
                 "--base-url", httpserver.url_for("/v1"), "--json", ok=False)
    assert result.exit_code == 3
    assert out_json(result)["refused"] is True and httpserver.log == []


def test_ask_errors_are_one_line_without_the_key(runner, kb, httpserver, llm_env):
    httpserver.expect_request("/v1/chat/completions").respond_with_data(
        f"bad key {SECRET}", status=401)
    result = run(runner, "-d", kb, "ask", "How do I start the pump?", "--base-url", httpserver.url_for("/v1"),
                 ok=False)
    assert result.exit_code == 1 and "401" in result.stderr
    assert SECRET not in result.output and len(result.stderr.strip().splitlines()) == 1
    # there is no option to pass a key on the command line
    assert run(runner, "-d", kb, "ask", "q", "--api-key", "x", ok=False).exit_code == 2


# ----------------------------------------------------------------------------- errors


def test_not_a_database(tmp_path, runner):
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not sqlite at all" * 100)
    result = run(runner, "-d", junk, "stats", ok=False)
    assert result.exit_code == 1 and "junk.db" in result.stderr
    assert "Traceback" not in result.output and len(result.stderr.strip().splitlines()) == 1


def test_unexpected_errors_are_one_line(runner, kb, monkeypatch):
    def boom(self, *a, **k):
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(ragdb.Database, "stats", boom)
    result = run(runner, "-d", kb, "stats", ok=False)
    assert result.exit_code == 1 and "internal error" in result.stderr and "Traceback" not in result.output


# ----------------------------------------------------------------------------- real subprocesses


def ragdb_proc(*args, input=None, cwd=None, env=None):
    full_env = {**os.environ, "RAGDB_DATABASE": "", **(env or {})}
    return subprocess.run([sys.executable, "-m", "ragdb.cli", *map(str, args)], input=input, capture_output=True,
                          cwd=cwd, env=full_env, timeout=60)


def test_subprocess_exit_codes(tmp_path, files):
    db = tmp_path / "kb.db"
    p = ragdb_proc("-d", db, "add", files)
    assert p.returncode == 0, p.stderr
    assert b"added 4 documents" in p.stdout and b"skipped 1 file: 1 binary" in p.stdout
    assert b"\r" not in p.stderr and b"#" not in p.stderr  # no progress bar when piped
    p = ragdb_proc("search", "turbine maintenance", "--json", env={"RAGDB_DATABASE": str(db)})
    assert p.returncode == 0 and orjson.loads(p.stdout)[0]["source"].endswith("report.pdf")
    p = ragdb_proc("-d", tmp_path / "missing.db", "search", "x")
    assert p.returncode == 1 and p.stderr.decode().startswith("Error: ") and b"Traceback" not in p.stderr
    assert len(p.stderr.decode().strip().splitlines()) == 1 and b"missing.db" in p.stderr
    p = ragdb_proc("-d", db, "search", "x", "--no-such-option")
    assert p.returncode == 2 and b"Traceback" not in p.stderr
    p = ragdb_proc("-d", db, "add", files / "blob.bin", "--strict")  # named: read, and it is binary
    assert p.returncode == 1 and b"blob.bin" in p.stderr and b"Traceback" not in p.stderr
    p = ragdb_proc("-d", db, "sync", files, "--dry-run")
    assert p.returncode == 0 and b"would add" in p.stdout
    p = ragdb_proc("-d", db, "check")
    assert p.returncode == 0 and b"ok" in p.stdout


def test_installed_console_script(tmp_path):
    script = Path(sys.executable).with_name("ragdb")
    if not script.exists():
        pytest.skip("console script not installed in this environment")
    p = subprocess.run([str(script), "-d", str(tmp_path / "kb.db"), "add", "-", "--source", "s"],
                       input=b"hello console script", capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr
    p = subprocess.run([str(script), "-d", str(tmp_path / "kb.db"), "list", "--json"], capture_output=True,
                       timeout=60)
    assert [d["source"] for d in orjson.loads(p.stdout)] == ["s"]


def test_readonly_is_refused_by_every_command_that_writes(tmp_path, runner):
    """sync, init, collections create/drop and migrate opened the file themselves and wrote
    under --readonly (sync added and deleted, init changed a setting). They refuse it now,
    and the file is unchanged; a dry run and migrate --list still run."""
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "a.md").write_text("alpha words\n")
    db = tmp_path / "kb.db"
    run(runner, "-d", db, "add", folder)
    (folder / "b.md").write_text("beta words\n")
    with ragdb.open(db) as handle:
        run(runner, "-d", db, "collections", "create", "extra")
        before = (sorted(d.source for d in handle.documents()), handle.settings,
                  [c.name for c in handle.collections()])
    for args in (["sync", folder], ["init", "--keep-versions"], ["collections", "create", "more"],
                 ["collections", "drop", "extra", "--yes"], ["migrate"]):
        result = run(runner, "-d", db, "--readonly", *args, ok=False)
        assert result.exit_code == 1 and "--readonly: 'ragdb " in result.output, (args, result.output)
    with ragdb.open(db) as handle:
        assert (sorted(d.source for d in handle.documents()), handle.settings,
                [c.name for c in handle.collections()]) == before
    assert "would add 1" in run(runner, "-d", db, "--readonly", "sync", folder, "--dry-run").output
    run(runner, "-d", db, "--readonly", "migrate", "--list")
    run(runner, "-d", db, "--readonly", "-c", "newc", "sync", folder, "--dry-run", ok=False)  # made it
    with ragdb.open(db) as handle:
        assert [c.name for c in handle.collections()] == before[2]


def test_dropping_an_empty_collection_says_no_documents(tmp_path, runner):
    db = tmp_path / "kb.db"
    run(runner, "-d", db, "collections", "create", "empty")
    assert run(runner, "-d", db, "collections", "drop", "empty", "--yes").output.strip() == \
        "dropped collection 'empty' (no documents)"


def test_an_empty_collection_option_is_refused_not_taken_as_the_default(tmp_path, runner):
    db = tmp_path / "kb.db"
    run(runner, "-d", db, "add", "-", input="default collection text")
    for args in (["-c", "", "search", "text"], ["search", "-c", " ", "text"], ["-c", "", "add", "-"]):
        result = run(runner, "-d", db, *args, input="more text", ok=False)
        assert result.exit_code == 2 and "a collection name must not be empty" in result.output, args
    with ragdb.open(db) as handle:
        assert len(handle.documents()) == 1  # the refused add wrote nothing
