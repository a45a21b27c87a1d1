"""The ``ragdb`` command with vectors: embed, vector/hybrid search, --model on writes, stats.

Uses the deterministic ``hash`` embedder (fast, offline), plus one loopback
OpenAI-compatible endpoint for ``--model openai:...``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from werkzeug import Request, Response

from cli_helpers import out_json, run
from ragdb.models.embeddings import HashEmbedder

DOCS = {
    "pump.md": "---\nteam: ops\n---\n# Pump\n\nOpen the valve slowly before starting the pump.\n",
    "turbine.txt": "Turbine maintenance happens every eighteen months; inspect the blades.\n",
    "valve.md": "---\nteam: safety\n---\n# Valve\n\nA stuck valve must be reported before the pump starts.\n",
    "humidity.txt": "The dashboard now shows humidity readings for every room.\n",
}


@pytest.fixture
def folder(tmp_path):
    root = tmp_path / "docs"
    root.mkdir()
    for name, text in DOCS.items():
        (root / name).write_text(text, encoding="utf-8")
    return root


@pytest.fixture
def kb(tmp_path, runner, folder):
    """A database with the documents added and nothing embedded."""
    db = tmp_path / "kb.db"
    run(runner, "-d", db, "add", folder)
    return db


@pytest.fixture
def embedded(runner, kb):
    run(runner, "-d", kb, "embed", "--model", "hash")
    return kb


def stats(runner, db):
    return out_json(run(runner, "-d", db, "stats", "--json"))


# ----------------------------------------------------------------------------- embed


def test_embed_fills_pending_chunks(runner, kb):
    before = stats(runner, kb)
    assert before["vectors"] == 0 and before["embedding_model"] is None
    assert before["vectors_pending"] == before["stored_chunks"] > 0

    result = run(runner, "-d", kb, "embed", "--model", "hash")
    n = before["stored_chunks"]
    assert f"embedded {n} chunks with hash-64 (64 dimensions)" in result.stdout
    after = stats(runner, kb)
    assert (after["vectors"], after["vectors_pending"]) == (n, 0)
    assert (after["embedding_model"], after["embedding_dimensions"]) == ("hash-64", 64)

    # the recorded model is the default; nothing is left to do
    again = out_json(run(runner, "-d", kb, "embed", "--json"))
    assert again == {"database": str(kb), "model": "hash-64", "dimensions": 64, "embedded": 0, "rebuild": False,
                     "vectors": n, "pending": 0}
    assert out_json(run(runner, "-d", kb, "check", "--json"))["ok"]


def test_embed_without_a_recorded_model_chooses_one_from_the_text(runner, kb):
    result = run(runner, "-d", kb, "embed", "--rebuild", ok=False)
    assert result.exit_code == 2 and "--rebuild needs --model" in result.stderr
    result = run(runner, "-d", kb, "embed", "--model", "nonsense", ok=False)
    assert result.exit_code == 2 and "unknown embedder" in result.stderr
    result = run(runner, "-d", kb, "embed")
    assert "no embedding model recorded: using wordllama" in result.stderr and "--model SPEC overrides" in result.stderr
    assert "with wordllama-l2-supercat-256" in result.stdout


def test_embed_without_a_model_errors(runner, kb):
    result = run(runner, "-d", kb, "embed", "--rebuild", ok=False)
    assert result.exit_code == 2 and "--rebuild needs --model" in result.stderr
    result = run(runner, "-d", kb, "embed", "--model", "nonsense", ok=False)
    assert result.exit_code == 2 and "unknown embedder" in result.stderr


def test_model_mismatch_is_one_line_exit_1(runner, embedded):
    result = run(runner, "-d", embedded, "embed", "--model", "hash:32", ok=False)
    assert result.exit_code == 1
    err = result.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in result.output
    assert "hash-64" in err and "hash-32" in err and "ragdb embed --model hash:32 --rebuild" in err
    # the same refusal for a query embedder and for writes (before anything is written)
    result = run(runner, "-d", embedded, "search", "pump", "--scorer", "vector", "--model", "hash:32", ok=False)
    assert result.exit_code == 1 and "hash-64" in result.stderr and "--rebuild" in result.stderr
    docs = stats(runner, embedded)["documents"]
    result = run(runner, "-d", embedded, "add", "-", "--source", "new", "--model", "hash:32",
                 input="pump notes", ok=False)
    assert result.exit_code == 1 and "hash-32" in result.stderr
    assert stats(runner, embedded)["documents"] == docs


def test_rebuild_switches_model(runner, embedded):
    n = stats(runner, embedded)["stored_chunks"]
    result = run(runner, "-d", embedded, "embed", "--model", "hash:32", "--rebuild")
    assert f"re-embedded {n} chunks with hash-32 (32 dimensions)" in result.stdout
    s = stats(runner, embedded)
    assert (s["embedding_model"], s["embedding_dimensions"], s["vectors"], s["vectors_pending"]) == \
        ("hash-32", 32, n, 0)
    hits = out_json(run(runner, "-d", embedded, "search", "pump valve", "--scorer", "vector", "--json"))
    assert hits
    assert out_json(run(runner, "-d", embedded, "check", "--json"))["ok"]


def test_embed_progress_only_on_a_terminal(runner, kb, monkeypatch):
    from ragdb.cli import output as cli_mod

    calls = []
    real = cli_mod._progress

    def spy(label, length):
        calls.append((label, length, cli_mod._stderr_is_tty()))
        return real(label, length)

    monkeypatch.setattr(cli_mod, "_progress", spy)
    run(runner, "-d", kb, "embed", "--model", "hash")
    assert calls == [("embedding", stats(runner, kb)["stored_chunks"], False)]
    monkeypatch.setattr(cli_mod, "_stderr_is_tty", lambda: True)
    result = run(runner, "-d", kb, "embed", "--model", "hash:16", "--rebuild", "--batch-size", "1")
    assert "embedding" in result.stderr  # the bar's label (click hides the bar itself off a real terminal)


def test_stats_table_shows_vectors(runner, kb):
    text = run(runner, "-d", kb, "stats").stdout
    assert "embedding model" in text and "none (ragdb embed --model wordllama)" in text
    run(runner, "-d", kb, "embed", "--model", "hash", "--batch-size", "1")
    text = run(runner, "-d", kb, "stats").stdout
    lines = {line.split("  ")[0]: line.split("  ", 1)[1].strip() for line in text.splitlines()}
    assert lines["vectors"] == str(stats(runner, kb)["stored_chunks"])
    assert lines["vectors pending"] == "0"
    assert lines["embedding model"] == "hash-64 (64 dimensions)"


# ----------------------------------------------------------------------------- search, prompt, ask, eval


def test_vector_and_hybrid_search(runner, embedded):
    for args in (["--scorer", "vector"], ["--scorer", "hybrid"], ["--scorer", "hybrid", "--fusion", "rrf"],
                 ["--scorer", "hybrid", "--alpha", "0.8"], ["--scorer", "hybrid", "--fusion", "rrf", "--rrf-k", "10"],
                 ["--scorer", "vector", "--model", "hash"], ["--scorer", "vector", "--embed-model", "hash-64"]):
        hits = out_json(run(runner, "-d", embedded, "search", "pump valve", "--json", *args))
        assert hits, args
        assert {h["source"].rsplit("/", 1)[-1] for h in hits} >= {"pump.md", "valve.md"}, args
        assert [h["score"] for h in hits] == sorted((h["score"] for h in hits), reverse=True)
    # RRF with k=60: a chunk first in both lists scores 2/61
    top = out_json(run(runner, "-d", embedded, "search", "pump valve", "--scorer", "hybrid", "--fusion", "rrf",
                       "--json"))[0]
    assert top["score"] == pytest.approx(2 / 61)
    text = run(runner, "-d", embedded, "search", "pump valve", "--scorer", "hybrid", "--explain").stdout
    assert "vector:cosine" in text and "lexical:bm25" in text


def test_vector_search_respects_filters(runner, embedded):
    for scorer in ("vector", "hybrid"):
        hits = out_json(run(runner, "-d", embedded, "search", "pump valve", "--scorer", scorer,
                            "--filter", "team=safety", "--json"))
        assert hits and {h["metadata"]["team"] for h in hits} == {"safety"}, scorer
        hits = out_json(run(runner, "-d", embedded, "search", "pump valve", "--scorer", scorer,
                            "--filter", "source=*turbine*", "--json"))
        assert all(h["source"].endswith("turbine.txt") for h in hits), scorer


def test_vector_search_without_vectors_is_an_error(runner, kb):
    result = run(runner, "-d", kb, "search", "pump", "--scorer", "vector", ok=False)
    assert result.exit_code == 1 and "ragdb embed" in result.stderr and "Traceback" not in result.output


def test_scorer_option_usage_errors(runner, embedded):
    for args, message in ((["--alpha", "0.5"], "--scorer hybrid only"),
                          (["--model", "hash"], "--scorer vector or hybrid only"),
                          (["--scorer", "vector", "--fusion", "rrf"], "--scorer hybrid only"),
                          (["--scorer", "hybrid", "--fusion", "rrf", "--alpha", "0.5"], "--fusion weighted or --fusion adaptive only"),
                          (["--scorer", "hybrid", "--rrf-k", "5"], "--fusion rrf only"),
                          (["--scorer", "hybrid", "--alpha", "2"], "--alpha")):
        result = run(runner, "-d", embedded, "search", "pump", *args, ok=False)
        assert result.exit_code == 2 and message in result.stderr, (args, result.stderr)


def test_prompt_and_ask_take_the_scorer_options(runner, embedded):
    data = out_json(run(runner, "-d", embedded, "prompt", "When does the pump start?", "--scorer", "hybrid",
                        "--fusion", "rrf", "--json"))
    assert data["sources"] and not data["refused"]
    data = out_json(run(runner, "-d", embedded, "prompt", "pump valve", "--scorer", "vector", "--model", "hash",
                        "--filter", "team=ops", "--json"))
    assert [s["metadata"]["team"] for s in data["sources"]] == ["ops"]
    # ask: --model is the chat model, the query embedder is --embed-model; cosines are <= 1, so with
    # --min-score 1.5 nothing passes and ask refuses (exit status 3) without calling the chat model
    # (a port nothing listens on: an attempt would fail with exit status 1)
    result = run(runner, "-d", embedded, "ask", "pump valve", "--scorer", "vector", "--embed-model", "hash",
                 "--min-score", "1.5", "--base-url", "http://127.0.0.1:9/v1", "--json", ok=False)
    assert result.exit_code == 3, result.output
    data = out_json(result)
    assert data["refused"] and data["sources"] == [] and data["model_called"] is False


def test_eval_with_vector_scorers(runner, tmp_path):
    corpus, queries, qrels = tmp_path / "corpus.jsonl", tmp_path / "queries.jsonl", tmp_path / "qrels.tsv"
    corpus.write_text("".join(json.dumps({"_id": f"d{i}", "title": "", "text": text}) + "\n"
                              for i, text in enumerate(DOCS.values())), encoding="utf-8")
    queries.write_text(json.dumps({"_id": "q1", "text": "turbine blades"}) + "\n"
                       + json.dumps({"_id": "q2", "text": "humidity readings"}) + "\n", encoding="utf-8")
    qrels.write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td3\t1\n", encoding="utf-8")
    files = ["--corpus", corpus, "--queries", queries, "--qrels", qrels]
    result = run(runner, "eval", *files, "--scorer", "vector", ok=False)
    assert result.exit_code == 2 and "--model" in result.stderr
    for scorer in ("vector", "hybrid"):
        data = out_json(run(runner, "eval", *files, "--scorer", scorer, "--model", "hash", "--json"))
        assert data["scorer"] == scorer and data["model"] == "hash-64" and data["queries"] == 2
        assert data["ndcg@10"] == pytest.approx(1.0)


# ----------------------------------------------------------------------------- --model on add / sync / import


def test_add_with_model_embeds_and_without_stays_pending(runner, tmp_path, folder):
    db = tmp_path / "kb.db"
    result = run(runner, "-d", db, "add", folder, "--model", "hash")
    n = stats(runner, db)["stored_chunks"]
    assert f"embedded {n} chunks with hash-64" in result.stdout
    assert stats(runner, db)["vectors_pending"] == 0

    # without --model: nothing said, nothing embedded, even though a model is recorded
    result = run(runner, "-d", db, "add", "-", "--source", "extra.txt", input="The pump has a spare valve.")
    assert "embed" not in result.output and result.stderr == ""
    assert stats(runner, db)["vectors_pending"] == 1
    result = run(runner, "-d", db, "search", "spare valve", "--scorer", "vector", "--json")
    assert "1 chunk has no vector yet" in result.stderr
    assert "extra.txt" not in {h["source"] for h in orjson.loads(result.stdout)}
    run(runner, "-d", db, "embed")
    hits = out_json(run(runner, "-d", db, "search", "spare valve", "--scorer", "vector", "--json"))
    assert hits[0]["source"] == "extra.txt"

    data = out_json(run(runner, "-d", db, "add", "-", "--source", "more.txt", "--model", "hash", "--json",
                        input="Another note about humidity."))
    assert data["model"] == "hash-64" and data["embedded"] == 1


def test_sync_and_import_with_model(runner, tmp_path, folder):
    db = tmp_path / "kb.db"
    result = run(runner, "-d", db, "sync", folder, "--dry-run", "--model", "hash")
    assert "embedded" not in result.stdout and not db.exists()
    data = out_json(run(runner, "-d", db, "sync", folder, "--model", "hash", "--json"))
    assert data["embedded"] == stats(runner, db)["stored_chunks"] and data["model"] == "hash-64"
    (folder / "new.txt").write_text("A fresh note about turbine blades.", encoding="utf-8")
    result = run(runner, "-d", db, "sync", folder, "--model", "hash")
    assert "embedded 1 chunk with hash-64" in result.stdout

    dump = tmp_path / "dump.jsonl"
    run(runner, "-d", db, "export", dump)
    copy = tmp_path / "copy.db"
    data = out_json(run(runner, "-d", copy, "import", dump, "--model", "hash:16", "--json"))
    s = stats(runner, copy)
    assert data["embedded"] == s["vectors"] == s["stored_chunks"] and s["embedding_model"] == "hash-16"
    other = tmp_path / "other.db"
    run(runner, "-d", other, "import", dump)
    assert stats(runner, other)["vectors"] == 0


def _long_note(root, paras):
    (root / "long.md").write_text("\n\n".join(paras), encoding="utf-8")


def test_embed_flag_uses_the_recorded_model_and_unchanged_chunks_keep_their_vectors(runner, tmp_path):
    root = tmp_path / "notes"
    root.mkdir()
    # ~500-character paragraphs: one chunk each with the default chunker
    paras = [f"Paragraph {i} " + " ".join(f"word{i}x{j}" for j in range(60)) for i in range(15)]
    _long_note(root, paras)
    db = tmp_path / "kb.db"
    result = run(runner, "-d", db, "add", root, "--embed", ok=False)
    assert result.exit_code == 2 and "records no embedding model yet" in result.output
    assert "--model" in result.output and stats(runner, db)["documents"] == 0
    data = out_json(run(runner, "-d", db, "add", root, "--embed", "--model", "hash", "--json"))
    assert (data["model"], data["embedded"], data["reused"]) == ("hash-64", 15, 0)

    paras[7] = paras[7].replace("word7x3 ", "word7x3 edited ")
    _long_note(root, paras)
    data = out_json(run(runner, "-d", db, "add", root, "--embed", "--json"))  # the recorded model
    assert (data["model"], data["embedded"], data["reused"]) == ("hash-64", 1, 14)
    assert stats(runner, db)["vectors"] == 15

    # without --embed the unchanged chunks still keep their vectors; the edited one waits
    paras[3] = paras[3].replace("word3x3 ", "word3x3 edited ")
    _long_note(root, paras)
    result = run(runner, "-d", db, "add", root)
    assert "embed" not in result.output
    s = stats(runner, db)
    assert (s["vectors"], s["vectors_pending"]) == (14, 1)
    result = run(runner, "-d", db, "add", root, "--embed")  # unchanged file: embeds what was pending
    assert "embedded 1 chunk with hash-64" in result.stdout and "reused" not in result.stdout

    synced = tmp_path / "synced.db"
    run(runner, "-d", synced, "sync", root, "--model", "hash")
    paras[9] = paras[9].replace("word9x3 ", "word9x3 edited ")
    _long_note(root, paras)
    result = run(runner, "-d", synced, "sync", root, "--embed")
    assert "embedded 1 chunk with hash-64; 14 reused a stored vector (same text)" in result.stdout
    assert run(runner, "-d", synced, "sync", root, "--embed", "--dry-run").stdout.count("embedded") == 0

    dump = tmp_path / "dump.jsonl"
    run(runner, "-d", db, "export", dump)
    result = run(runner, "-d", tmp_path / "copy.db", "import", dump, "--embed", ok=False)
    assert result.exit_code == 2 and "records no embedding model yet" in result.output


# ----------------------------------------------------------------------------- an OpenAI-compatible endpoint


def _embedding_handler(requests):
    def handle(request: Request) -> Response:
        body = request.get_json()
        requests.append(body)
        vecs = HashEmbedder(8).embed(body["input"])
        data = [{"object": "embedding", "index": i, "embedding": v.tolist()} for i, v in enumerate(vecs)]
        return Response(json.dumps({"object": "list", "data": data, "model": body["model"]}),
                        content_type="application/json")
    return handle


def test_openai_compatible_endpoint(runner, kb, httpserver):
    requests = []
    httpserver.expect_request("/v1/embeddings", method="POST").respond_with_handler(_embedding_handler(requests))
    env = {"RAGDB_EMBED_BASE_URL": httpserver.url_for("/v1"), "RAGDB_EMBED_API_KEY": None, "OPENAI_API_KEY": None}
    n = stats(runner, kb)["stored_chunks"]
    result = run(runner, "-d", kb, "embed", "--model", "openai:test-model", env=env)
    assert f"embedded {n} chunks with openai:test-model (8 dimensions)" in result.stdout
    assert requests and all(r["model"] == "test-model" for r in requests)
    sent = [t for r in requests for t in r["input"]]
    assert any("Turbine maintenance" in t for t in sent)

    # the recorded model embeds the query through the same endpoint
    hits = out_json(run(runner, "-d", kb, "search", "turbine blades", "--scorer", "hybrid", "--json", env=env))
    assert hits[0]["source"].endswith("turbine.txt")
    assert requests[-1]["input"] == ["turbine blades"]


def test_embedding_failure_keeps_the_text_pending(runner, tmp_path, httpserver):
    httpserver.expect_request("/v1/embeddings", method="POST").respond_with_data("bad model", status=400)
    env = {"RAGDB_EMBED_BASE_URL": httpserver.url_for("/v1"), "RAGDB_EMBED_API_KEY": None, "OPENAI_API_KEY": None}
    db = tmp_path / "kb.db"
    result = run(runner, "-d", db, "add", "-", "--source", "s.txt", "--model", "openai:test-model",
                 input="turbine blades", env=env, ok=False)
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "added 1 document" in result.stdout and "HTTP 400" in result.stderr and "pending" in result.stderr
    s = stats(runner, db)
    assert (s["documents"], s["vectors"], s["vectors_pending"]) == (1, 0, 1)
    assert out_json(run(runner, "-d", db, "search", "turbine", "--json"))[0]["source"] == "s.txt"


# ----------------------------------------------------------------------------- a real process


def test_embed_subprocess(tmp_path, runner, folder):
    db = tmp_path / "kb.db"
    run(runner, "-d", db, "add", folder)
    env = {**os.environ, "RAGDB_DATABASE": ""}
    p = subprocess.run([sys.executable, "-m", "ragdb.cli", "-d", str(db), "embed", "--model", "hash"],
                       capture_output=True, env=env, timeout=60, cwd=Path(__file__).parent)
    assert p.returncode == 0, p.stderr
    assert b"with hash-64" in p.stdout and b"\r" not in p.stderr and b"#" not in p.stderr  # no bar when piped
    p = subprocess.run([sys.executable, "-m", "ragdb.cli", "-d", str(db), "embed", "--model", "hash:32"],
                       capture_output=True, env=env, timeout=60)
    assert p.returncode == 1 and b"Traceback" not in p.stderr
    assert len(p.stderr.decode().strip().splitlines()) == 1 and b"--rebuild" in p.stderr
