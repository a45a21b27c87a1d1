#!/usr/bin/env python
"""ragdb benchmark: retrieval quality, speed, memory and disk next to peers.

One command, from the repository root::

    .venv/bin/python benchmarks/run.py [--quick] [--scale N]

It indexes SciFact (train queries) and the CMRC 2018 trial set (BEIR layout,
read from ``../shared/data`` relative to the repository root, or ``--data``)
with ragdb and with its peers -- bm25s, tantivy, SQLite FTS5 and rank_bm25 --
then replicates SciFact to ``--scale`` documents (default 100,000), and writes
``BENCHMARKS.md`` at the repository root (``--out`` to change).

Every measurement of one system runs in its own subprocess (the script
re-invokes itself with ``--_worker``), so the peak RSS reported is that
system's own: ``build`` (index the corpus, persist, close), ``query`` (open the
persisted index, warm up, time each query with ``time.perf_counter``) and
``update`` (add one document / delete one document, each its own commit,
median of 20). rank_bm25 cannot persist, so it builds and queries in one
process. Quality (nDCG@10, Recall@100, MRR@10) is computed in the parent with
:mod:`ragdb.evaluation`.

``--quick`` runs a reduced version for development (at most 300 queries per
corpus, scale 20,000). New sections (filter selectivity, hybrid/vector modes)
plug in with the ``@section`` decorator and new systems with ``@system``;
nothing else needs to change.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gc
import importlib
import importlib.metadata
import json
import os
import platform
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import orjson

REPO = Path(__file__).resolve().parent.parent
DEFAULT_DATA = REPO.parent / "shared" / "data"  # == <repo>/../shared/data
RESULT_MARK = "@@RAGDB_BENCH_RESULT@@ "
K = 100  # hits retrieved per query
WARMUP_QUERIES = 20
UPDATE_OPS = 20  # timed adds and deletes, each its own commit
WORKER_TIMEOUT_S = 1800

# A benchmark corpus: folder under the data directory, BEIR split, language.
CORPORA = {
    "scifact": {"folder": "scifact", "split": "train", "lang": "en", "title": "SciFact (train queries)"},
    "cmrc": {"folder": "cmrc2018-trial", "split": None, "lang": "zh", "title": "CMRC 2018 trial"},
}


# ==========================================================================
# Small helpers shared by parent and workers (stdlib + orjson only, so a
# worker's RSS is its system's)
# ==========================================================================


def peak_rss_mb() -> float:
    """Peak resident set size of this process (VmHWM), in MiB."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def percentile(values: list[float], p: float) -> float:
    """The ``p``-th percentile with linear interpolation (numpy's default)."""
    if not values:
        return float("nan")
    xs = sorted(values)
    pos = (len(xs) - 1) * p / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def median(values: list[float]) -> float:
    return percentile(values, 50)


def path_size(path: Path) -> int:
    """Bytes of a file, or of all files under a folder."""
    if path.is_file():
        return path.stat().st_size
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:
                pass
    return total


def iter_docs(path: Path) -> Iterator[tuple[str, str]]:
    """Stream ``(doc_id, text)`` from a prepared docs file (one JSON pair a line)."""
    with open(path, "rb") as fh:
        for line in fh:
            doc_id, text = orjson.loads(line)
            yield doc_id, text


def read_pairs(path: Path) -> list[tuple[str, str]]:
    return list(iter_docs(path))


# CJK tokens for the peers on CMRC: character unigrams + bigrams of CJK runs,
# lowercased words otherwise (the same idea as ragdb's default analyzer).
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f"
_CJK_TOKEN_RE = re.compile(rf"[{_CJK}]+|[^\W_{_CJK}]+")
_CJK_CHAR_RE = re.compile(rf"[{_CJK}]")


def cjk_tokens(text: str) -> list[str]:
    out: list[str] = []
    for m in _CJK_TOKEN_RE.finditer(text.lower()):
        run = m.group()
        if _CJK_CHAR_RE.match(run):
            out.extend(run)
            out.extend(run[i : i + 2] for i in range(len(run) - 1))
        else:
            out.append(run)
    return out


# ==========================================================================
# Systems. Each adapter: build(docs, folder, lang) -> build info;
# open(folder, lang) -> handle; search(handle, text, k) -> [doc ids];
# add(handle, doc_id, ordinal, text); delete(handle, doc_id, ordinal);
# close(handle); size(folder) -> bytes. ``persistent=False`` means build and
# query happen in one process; ``incremental=False`` means updates need a
# rebuild. ``index_of`` lets a row reuse another system's index.
# ==========================================================================

SYSTEMS: dict[str, type] = {}


def system(name: str) -> Callable[[type], type]:
    """Register a benchmarked system under ``name`` (hook for new systems)."""

    def deco(cls: type) -> type:
        cls.name = name
        SYSTEMS[name] = cls
        return cls

    return deco


class Adapter:
    name = "?"
    label = "?"
    persistent = True
    incremental = True
    index_of: str | None = None  # reuse another system's index (query only)
    needs_list = False  # build needs the whole corpus in memory

    @staticmethod
    def size(folder: Path) -> int:
        return path_size(folder)


@system("ragdb")
class RagdbAdapter(Adapter):
    label = "ragdb (bm25)"
    scorer = "bm25"

    @staticmethod
    def _path(folder: Path) -> Path:
        return folder / "ragdb.db"

    @classmethod
    def build(cls, docs, folder: Path, lang: str) -> dict:
        import ragdb

        with ragdb.open(str(cls._path(folder))) as db:
            db.add_many(({"text": text, "source": doc_id} for doc_id, text in docs), chunker="none")
        return {}

    @classmethod
    def open(cls, folder: Path, lang: str):
        import ragdb

        return ragdb.open(str(cls._path(folder)))

    @classmethod
    def search(cls, db, text: str, k: int) -> list[str]:
        seen: dict[str, None] = {}
        for hit in db.search(text, k=k, scorer=cls.scorer):
            seen.setdefault(hit.source, None)
        return list(seen)

    @staticmethod
    def add(db, doc_id: str, ordinal: int, text: str) -> None:
        db.add(text, source=doc_id, chunker="none")

    @staticmethod
    def delete(db, doc_id: str, ordinal: int) -> None:
        db.delete(source=doc_id)

    @staticmethod
    def close(db) -> None:
        db.close()

    @classmethod
    def size(cls, folder: Path) -> int:
        p = cls._path(folder)
        return sum(path_size(x) for x in (p, Path(f"{p}-wal")) if x.exists())


@system("ragdb-tfidf")
class RagdbTfidfAdapter(RagdbAdapter):
    label = "ragdb (tfidf)"
    scorer = "tfidf"
    index_of = "ragdb"


@system("fts5")
class Fts5Adapter(Adapter):
    label = "SQLite FTS5"

    @staticmethod
    def _connect(folder: Path) -> sqlite3.Connection:
        conn = sqlite3.connect(str(folder / "fts5.db"), isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        return conn

    @classmethod
    def build(cls, docs, folder: Path, lang: str) -> dict:
        tokenizer = "porter unicode61" if lang == "en" else "trigram"
        conn = cls._connect(folder)
        conn.execute(f"CREATE VIRTUAL TABLE docs USING fts5(doc_id UNINDEXED, body, tokenize='{tokenizer}')")
        conn.execute("BEGIN")
        conn.executemany(
            "INSERT INTO docs(rowid, doc_id, body) VALUES (?, ?, ?)",
            ((i + 1, doc_id, text) for i, (doc_id, text) in enumerate(docs)),
        )
        conn.execute("COMMIT")
        conn.close()
        return {"tokenizer": tokenizer}

    @classmethod
    def open(cls, folder: Path, lang: str):
        return {"conn": cls._connect(folder), "lang": lang}

    @staticmethod
    def match_expression(text: str, lang: str) -> str:
        """OR of quoted tokens: words for porter/unicode61, 3-grams for trigram."""
        if lang == "en":
            tokens = re.findall(r"\w+", text)
        else:
            tokens = [text[i : i + 3] for i in range(len(text) - 2)]
        return " OR ".join('"' + t.replace('"', '""') + '"' for t in tokens)

    @classmethod
    def search(cls, h, text: str, k: int) -> list[str]:
        expr = cls.match_expression(text, h["lang"])
        if not expr:
            return []
        rows = h["conn"].execute(
            "SELECT doc_id FROM docs WHERE docs MATCH ? ORDER BY bm25(docs) LIMIT ?", (expr, k)
        ).fetchall()
        return [r[0] for r in rows]

    @staticmethod
    def add(h, doc_id: str, ordinal: int, text: str) -> None:
        conn = h["conn"]
        conn.execute("BEGIN")
        conn.execute("INSERT INTO docs(rowid, doc_id, body) VALUES (?, ?, ?)", (ordinal + 1, doc_id, text))
        conn.execute("COMMIT")

    @staticmethod
    def delete(h, doc_id: str, ordinal: int) -> None:
        conn = h["conn"]
        conn.execute("BEGIN")
        conn.execute("DELETE FROM docs WHERE rowid = ?", (ordinal + 1,))
        conn.execute("COMMIT")

    @staticmethod
    def close(h) -> None:
        h["conn"].close()

    @staticmethod
    def size(folder: Path) -> int:
        p = folder / "fts5.db"
        return sum(path_size(x) for x in (p, Path(f"{p}-wal")) if x.exists())


@system("tantivy")
class TantivyAdapter(Adapter):
    label = "tantivy"
    NGRAM = "ngram12"

    @classmethod
    def _analyzer(cls, lang: str):
        import tantivy as tv

        if lang == "en":  # the same chain as tantivy's built-in "en_stem"
            b = tv.TextAnalyzerBuilder(tv.Tokenizer.simple())
            b = b.filter(tv.Filter.remove_long(40)).filter(tv.Filter.lowercase())
            return b.filter(tv.Filter.stemmer("english")).build()
        return tv.TextAnalyzerBuilder(tv.Tokenizer.ngram(1, 2)).filter(tv.Filter.lowercase()).build()

    @classmethod
    def _schema(cls, lang: str):
        import tantivy as tv

        sb = tv.SchemaBuilder()
        sb.add_integer_field("row", stored=True, indexed=True, fast=True)
        sb.add_text_field("body", stored=True, tokenizer_name="en_stem" if lang == "en" else cls.NGRAM)
        return sb.build()

    @classmethod
    def build(cls, docs, folder: Path, lang: str) -> dict:
        import tantivy as tv

        (folder / "index").mkdir(parents=True, exist_ok=True)
        index = tv.Index(cls._schema(lang), path=str(folder / "index"))
        if lang != "en":
            index.register_tokenizer(cls.NGRAM, cls._analyzer(lang))
        writer = index.writer()
        ids = []
        for i, (doc_id, text) in enumerate(docs):
            writer.add_document(tv.Document(row=i, body=text))
            ids.append(doc_id)
        writer.commit()
        writer.wait_merging_threads()
        (folder / "ids.json").write_bytes(orjson.dumps(ids))
        return {"tokenizer": "en_stem" if lang == "en" else "ngram(1,2)+lowercase"}

    @classmethod
    def open(cls, folder: Path, lang: str):
        import tantivy as tv

        index = tv.Index.open(str(folder / "index"))
        if lang != "en":
            index.register_tokenizer(cls.NGRAM, cls._analyzer(lang))
        index.reload()
        return {
            "tv": tv,
            "index": index,
            "schema": index.schema,
            "searcher": index.searcher(),
            "analyzer": cls._analyzer(lang),
            "ids": orjson.loads((folder / "ids.json").read_bytes()),
            "writer": None,
        }

    @staticmethod
    def search(h, text: str, k: int) -> list[str]:
        # A boolean OR of term queries over the analyzed tokens: no query
        # syntax to escape, and no phrase queries from the ngram tokenizer.
        tv = h["tv"]
        tokens = h["analyzer"].analyze(text)
        if not tokens:
            return []
        query = tv.Query.boolean_query(
            [(tv.Occur.Should, tv.Query.term_query(h["schema"], "body", t)) for t in tokens]
        )
        searcher = h["searcher"]
        hits = searcher.search(query, k, count=False).hits
        if not hits:
            return []
        rows = searcher.fast_field_values("row", [addr for _score, addr in hits])
        ids = h["ids"]
        return [ids[r] for r in rows]

    @staticmethod
    def _writer(h):
        if h["writer"] is None:
            h["writer"] = h["index"].writer()
        return h["writer"]

    @classmethod
    def add(cls, h, doc_id: str, ordinal: int, text: str) -> None:
        w = cls._writer(h)
        w.add_document(h["tv"].Document(row=ordinal, body=text))
        w.commit()

    @classmethod
    def delete(cls, h, doc_id: str, ordinal: int) -> None:
        w = cls._writer(h)
        w.delete_documents_by_term("row", ordinal)
        w.commit()

    @staticmethod
    def close(h) -> None:
        if h["writer"] is not None:
            h["writer"].wait_merging_threads()


def _bm25s_tokens(texts: list[str], lang: str, *, ids: bool):
    """bm25s tokenization: PyStemmer English + English stopwords, or CJK uni+bigrams."""
    if lang == "en":
        import bm25s
        import Stemmer

        return bm25s.tokenize(
            texts, stopwords="en", stemmer=Stemmer.Stemmer("english"), return_ids=ids, show_progress=False
        )
    return [cjk_tokens(t) for t in texts]


@system("bm25s")
class Bm25sAdapter(Adapter):
    label = "bm25s"
    incremental = False
    needs_list = True

    @staticmethod
    def build(docs, folder: Path, lang: str) -> dict:
        import bm25s

        pairs = list(docs)
        t0 = time.perf_counter()
        retriever = bm25s.BM25()
        retriever.index(_bm25s_tokens([t for _, t in pairs], lang, ids=True), show_progress=False)
        t1 = time.perf_counter()
        retriever.save(str(folder / "index"), show_progress=False)
        (folder / "ids.json").write_bytes(orjson.dumps([d for d, _ in pairs]))
        return {"index_s": t1 - t0, "save_s": time.perf_counter() - t1}

    @staticmethod
    def open(folder: Path, lang: str):
        import bm25s

        return {
            "retriever": bm25s.BM25.load(str(folder / "index")),
            "ids": orjson.loads((folder / "ids.json").read_bytes()),
            "lang": lang,
        }

    @staticmethod
    def search(h, text: str, k: int) -> list[str]:
        tokens = _bm25s_tokens([text], h["lang"], ids=False)
        ids = h["ids"]
        docs, scores = h["retriever"].retrieve(tokens, k=min(k, len(ids)), show_progress=False)
        # bm25s pads with zero-score documents: those did not match
        return [ids[int(d)] for d, s in zip(docs[0], scores[0]) if s > 0]

    @staticmethod
    def close(h) -> None:
        pass


@system("rank_bm25")
class RankBm25Adapter(Adapter):
    label = "rank_bm25 (BM25Okapi)"
    persistent = False
    incremental = False
    needs_list = True

    @staticmethod
    def build(docs, folder: Path, lang: str):
        from rank_bm25 import BM25Okapi

        pairs = list(docs)
        tokens = _bm25s_tokens([t for _, t in pairs], lang, ids=False)
        return {"bm25": BM25Okapi(tokens), "ids": [d for d, _ in pairs], "lang": lang}

    @staticmethod
    def search(h, text: str, k: int) -> list[str]:
        import numpy as np

        scores = h["bm25"].get_scores(_bm25s_tokens([text], h["lang"], ids=False)[0])
        k = min(k, len(scores))
        top = np.argpartition(-scores, k - 1)[:k]
        top = top[np.argsort(-scores[top], kind="stable")]
        return [h["ids"][i] for i in top if scores[i] > 0]

    @staticmethod
    def close(h) -> None:
        pass


# ==========================================================================
# Worker: one stage of one system on one corpus, in its own process
# ==========================================================================


def _time_queries(adapter, handle, queries: list[tuple[str, str]], k: int) -> dict:
    for _qid, text in queries[:WARMUP_QUERIES]:
        adapter.search(handle, text, k)
    run: dict[str, list[str]] = {}
    lat: list[float] = []
    gc.collect()
    for qid, text in queries:
        t0 = time.perf_counter()
        ids = adapter.search(handle, text, k)
        lat.append((time.perf_counter() - t0) * 1000.0)
        run[qid] = ids
    return {"p50_ms": percentile(lat, 50), "p95_ms": percentile(lat, 95), "mean_ms": sum(lat) / len(lat),
            "queries": len(lat), "run": run}


def worker(spec: dict) -> dict:
    """Run one stage; returns a JSON-able dict (printed by the caller)."""
    adapter = SYSTEMS[spec["system"]]
    stage = spec["stage"]
    folder = Path(spec["index_dir"])
    lang = spec["lang"]
    out: dict[str, Any] = {}

    if stage == "probe":  # is ragdb importable and working?
        import ragdb

        with ragdb.open(":memory:") as db:
            db.add("the quick brown fox", source="a", chunker="none")
            db.add("lazy dogs sleep", source="b", chunker="none")
            hits = db.search("fox", k=5)
            assert hits and hits[0].source == "a", hits
        out["version"] = getattr(ragdb, "__version__", "?")
        out["file"] = ragdb.__file__
        return out

    if stage == "build":
        folder.mkdir(parents=True, exist_ok=True)
        docs: Any = iter_docs(Path(spec["docs"]))
        if adapter.needs_list:
            docs = list(docs)
        gc.collect()
        t0 = time.perf_counter()
        info = adapter.build(docs, folder, lang)
        out["build_s"] = time.perf_counter() - t0
        out.update(info or {})
        out["size_bytes"] = adapter.size(folder)
    elif stage == "query":
        queries = read_pairs(Path(spec["queries"]))
        t0 = time.perf_counter()
        handle = adapter.open(folder, lang)
        out["open_s"] = time.perf_counter() - t0
        out.update(_time_queries(adapter, handle, queries, spec.get("k", K)))
        adapter.close(handle)
    elif stage == "all":  # non-persistent systems: build and query in one process
        docs = list(iter_docs(Path(spec["docs"])))
        queries = read_pairs(Path(spec["queries"]))
        gc.collect()
        t0 = time.perf_counter()
        handle = adapter.build(docs, folder, lang)
        out["build_s"] = time.perf_counter() - t0
        del docs
        out.update(_time_queries(adapter, handle, queries, spec.get("k", K)))
    elif stage == "update":
        n = spec["n_docs"]
        sample = []  # texts for the new documents: the corpus's first ones
        for doc_id, text in iter_docs(Path(spec["docs"])):
            sample.append(text)
            if len(sample) > UPDATE_OPS:
                break
        handle = adapter.open(folder, lang)
        # Warm-up (untimed): one add and its delete.
        adapter.add(handle, "bench-new-warmup", n, sample[0])
        adapter.delete(handle, "bench-new-warmup", n)
        adds, deletes = [], []
        for i in range(UPDATE_OPS):
            t0 = time.perf_counter()
            adapter.add(handle, f"bench-new-{i}", n + 1 + i, sample[(i + 1) % len(sample)])
            adds.append((time.perf_counter() - t0) * 1000.0)
        victims = spec["victims"]  # [(doc_id, ordinal)] of existing documents
        for doc_id, ordinal in victims:
            t0 = time.perf_counter()
            adapter.delete(handle, doc_id, ordinal)
            deletes.append((time.perf_counter() - t0) * 1000.0)
        adapter.close(handle)
        out.update(add_ms=median(adds), add_max_ms=max(adds), delete_ms=median(deletes),
                   delete_max_ms=max(deletes), ops=len(adds))
        out["size_bytes_after"] = adapter.size(folder)
    else:
        raise SystemExit(f"unknown stage {stage!r}")
    out["peak_rss_mb"] = peak_rss_mb()
    return out


def worker_main(spec_json: str) -> int:
    spec = json.loads(spec_json)
    sys.path.insert(0, spec.get("src") or str(REPO))
    result = worker(spec)
    sys.stdout.write(RESULT_MARK + orjson.dumps(result).decode() + "\n")
    sys.stdout.flush()
    return 0


# ==========================================================================
# Parent: data preparation, orchestration, report
# ==========================================================================


def _load_evaluation(src: Path):
    """ragdb.evaluation from ``src``; if the ragdb package itself does not import
    (its core being unfinished), load the module without running ragdb/__init__.py."""
    sys.path.insert(0, str(src))
    try:
        return importlib.import_module("ragdb.evaluation")
    except Exception:  # noqa: BLE001 - any failure of ragdb/__init__
        for name in [m for m in sys.modules if m == "ragdb" or m.startswith("ragdb.")]:
            del sys.modules[name]
        pkg = types.ModuleType("ragdb")
        pkg.__path__ = [str(src / "ragdb")]  # type: ignore[attr-defined]
        sys.modules["ragdb"] = pkg
        return importlib.import_module("ragdb.evaluation")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


@dataclass
class Corpus:
    key: str
    title: str
    lang: str
    docs_path: Path
    queries_path: Path
    n_docs: int
    n_queries: int
    qrels: dict[str, dict[str, int]] = field(default_factory=dict)
    victims: list[tuple[str, int]] = field(default_factory=list)


@dataclass
class Context:
    args: argparse.Namespace
    workdir: Path
    src: Path  # snapshot of ragdb/ and migrations/ that every worker imports
    evaluation: Any
    ragdb_ok: bool = False
    ragdb_error: str = ""
    results: dict[str, Any] = field(default_factory=dict)
    bars: list[tuple[str, bool | None, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    corpora: dict[str, Corpus] = field(default_factory=dict)

    def systems(self, names: list[str]) -> list[str]:
        chosen = [s for s in names if s in self.args.systems]
        if not self.ragdb_ok:
            chosen = [s for s in chosen if not s.startswith("ragdb")]
        return chosen

    def index_dir(self, corpus: Corpus, system_name: str) -> Path:
        owner = SYSTEMS[system_name].index_of or system_name
        return self.workdir / "index" / corpus.key / owner

    def run_worker(self, stage: str, system_name: str, corpus: Corpus, **extra: Any) -> dict:
        spec = {
            "stage": stage,
            "system": system_name,
            "lang": corpus.lang,
            "docs": str(corpus.docs_path),
            "queries": str(corpus.queries_path),
            "index_dir": str(self.index_dir(corpus, system_name)),
            "n_docs": corpus.n_docs,
            "victims": corpus.victims,
            "k": K,
            "src": str(self.src),
            **extra,
        }
        cmd = [sys.executable, str(Path(__file__).resolve()), "--_worker", json.dumps(spec)]
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=WORKER_TIMEOUT_S, cwd=str(REPO))
        except subprocess.TimeoutExpired:
            log(f"{corpus.key}/{system_name} {stage}: TIMEOUT after {WORKER_TIMEOUT_S}s")
            return {"error": f"timed out after {WORKER_TIMEOUT_S}s"}
        wall = time.perf_counter() - t0
        for line in reversed(proc.stdout.splitlines()):
            if line.startswith(RESULT_MARK):
                result = orjson.loads(line[len(RESULT_MARK):])
                log(f"{corpus.key}/{system_name} {stage}: {_brief(result)} ({wall:.1f}s)")
                return result
        lines = [ln for ln in (proc.stderr or proc.stdout or "").splitlines() if ln.strip()]
        msg = lines[-1].strip()[:300] if lines else f"exit status {proc.returncode}"
        log(f"{corpus.key}/{system_name} {stage}: FAILED: {msg}\n" + "\n".join(lines[-15:]))
        return {"error": msg}


def _brief(result: dict) -> str:
    keys = ("build_s", "p50_ms", "add_ms", "delete_ms", "peak_rss_mb")
    return ", ".join(f"{k}={result[k]:.3g}" for k in keys if isinstance(result.get(k), (int, float)))


def prepare_corpus(ctx: Context, key: str, max_queries: int | None) -> Corpus:
    spec = CORPORA[key]
    corpus, queries, qrels = ctx.evaluation.load_beir(ctx.args.data / spec["folder"], split=spec["split"])
    judged = [(qid, text) for qid, text in queries.items() if any(r > 0 for r in qrels.get(qid, {}).values())]
    if max_queries:
        judged = judged[:max_queries]
    folder = ctx.workdir / "data" / key
    folder.mkdir(parents=True, exist_ok=True)
    docs_path, queries_path = folder / "docs.jsonl", folder / "queries.jsonl"
    with open(docs_path, "wb") as fh:
        for doc_id, title, text in corpus:  # one chunk a document: title + blank line + text
            fh.write(orjson.dumps([doc_id, f"{title}\n\n{text}" if title else text]) + b"\n")
    with open(queries_path, "wb") as fh:
        for pair in judged:
            fh.write(orjson.dumps(list(pair)) + b"\n")
    kept = {qid for qid, _ in judged}
    c = Corpus(key, spec["title"], spec["lang"], docs_path, queries_path, len(corpus), len(judged),
               {q: r for q, r in qrels.items() if q in kept})
    c.victims = _victims(docs_path, len(corpus))
    return c


def _victims(docs_path: Path, n: int) -> list[tuple[str, int]]:
    """UPDATE_OPS existing documents spread over the corpus, to delete."""
    step = max(1, n // UPDATE_OPS)
    wanted = {min(n - 1, step // 2 + i * step) for i in range(UPDATE_OPS)}
    out = []
    for i, (doc_id, _text) in enumerate(iter_docs(docs_path)):
        if i in wanted:
            out.append((doc_id, i))
    return out


def replicate_corpus(ctx: Context, base: Corpus, n: int, key: str, max_queries: int) -> Corpus:
    """``base`` repeated until ``n`` documents; replica r > 0 gets ids ``<id>@r<r>``."""
    folder = ctx.workdir / "data" / key
    folder.mkdir(parents=True, exist_ok=True)
    docs_path = folder / "docs.jsonl"
    base_docs = read_pairs(base.docs_path)
    written = 0
    with open(docs_path, "wb") as fh:
        r = 0
        while written < n:
            for doc_id, text in base_docs:
                if written >= n:
                    break
                fh.write(orjson.dumps([doc_id if r == 0 else f"{doc_id}@r{r}", text]) + b"\n")
                written += 1
            r += 1
    queries_path = folder / "queries.jsonl"
    with open(base.queries_path, "rb") as src, open(queries_path, "wb") as dst:
        for i, line in enumerate(src):
            if i >= max_queries:
                break
            dst.write(line)
    c = Corpus(key, f"SciFact x{n / len(base_docs):.1f}", base.lang, docs_path, queries_path, n,
               min(max_queries, base.n_queries))
    c.victims = _victims(docs_path, n)
    return c


def drop_indexes(ctx: Context, corpus: Corpus) -> None:
    shutil.rmtree(ctx.workdir / "index" / corpus.key, ignore_errors=True)


# ---------------------------------------------------------------- sections

SECTIONS: list[tuple[str, Callable[[Context], str]]] = []


def section(name: str) -> Callable[[Callable[[Context], str]], Callable[[Context], str]]:
    """Register a report section: ``fn(ctx) -> markdown``, run in registration order.

    Hook for later sections (filter selectivity, hybrid/vector modes): define
    a function, decorate it, use ``ctx.run_worker`` and ``ctx.bars``.
    """

    def deco(fn: Callable[[Context], str]) -> Callable[[Context], str]:
        SECTIONS.append((name, fn))
        return fn

    return deco


def fmt(x: Any, spec: str = ".3f", none: str = "–") -> str:
    if isinstance(x, (int, float)) and x == x:
        return format(x, spec)
    return none


def cell(text: Any, limit: int = 160) -> str:
    """Text made safe for one markdown table cell."""
    return str(text).replace("|", "\\|").replace("\n", " ")[:limit]


def ratio(a: Any, b: Any) -> float | None:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b > 0:
        return a / b
    return None


def bar(ctx: Context, name: str, value: bool | None, detail: str) -> None:
    ctx.bars.append((name, value, detail))


MAIN_SYSTEMS = ["ragdb", "ragdb-tfidf", "bm25s", "tantivy", "fts5", "rank_bm25"]
PEERS = ["bm25s", "tantivy", "fts5", "rank_bm25"]


def measure_corpus(ctx: Context, corpus: Corpus) -> dict[str, dict]:
    rows: dict[str, dict] = {}
    for name in ctx.systems(MAIN_SYSTEMS):
        adapter = SYSTEMS[name]
        row: dict[str, Any] = {}
        if not adapter.persistent:
            row.update(ctx.run_worker("all", name, corpus))
            row["build_peak_rss_mb"] = row["query_peak_rss_mb"] = row.get("peak_rss_mb")
        else:
            if adapter.index_of is None:
                b = ctx.run_worker("build", name, corpus)
                row.update({f"build_{k}" if k == "peak_rss_mb" else k: v for k, v in b.items()})
                if "error" in b:
                    rows[name] = row
                    continue
            elif "error" in rows.get(adapter.index_of, {"error": "not built"}):
                rows[name] = {"error": f"{adapter.index_of} index not built"}
                continue
            q = ctx.run_worker("query", name, corpus)
            row.update({f"query_{k}" if k == "peak_rss_mb" else k: v for k, v in q.items() if k != "error"})
            if "error" in q:
                row["error"] = q["error"]
            if adapter.incremental and adapter.index_of is None and "error" not in row:
                u = ctx.run_worker("update", name, corpus)
                row.update({k: v for k, v in u.items() if k != "peak_rss_mb"})
        if "run" in row:
            row["metrics"] = ctx.evaluation.evaluate(row.pop("run"), corpus.qrels, k_values=(10, 100))
        rows[name] = row
    drop_indexes(ctx, corpus)
    return rows


def _quality_table(corpus: Corpus, rows: dict[str, dict]) -> str:
    head = ("| system | nDCG@10 | Recall@100 | MRR@10 | build s | query p50 ms | p95 ms | add ms | delete ms "
            "| peak RSS build MiB | peak RSS query MiB | index MiB |")
    lines = [head, "|" + "---|" * 12]
    for name, row in rows.items():
        adapter = SYSTEMS[name]
        m = row.get("metrics", {})
        if row.get("error") and not m:
            lines.append(f"| {adapter.label} | error: {cell(row['error'])} |" + " |" * 10)
            continue
        if adapter.index_of:
            build = add = delete = size = rss_b = "(same index)"
        else:
            build = fmt(row.get("build_s"), ".2f")
            size = fmt((row.get("size_bytes") or 0) / 2**20 if row.get("size_bytes") else None, ".1f",
                       "in memory only")
            rss_b = fmt(row.get("build_peak_rss_mb"), ".0f")
            if adapter.incremental:
                add, delete = fmt(row.get("add_ms"), ".2f"), fmt(row.get("delete_ms"), ".2f")
            else:
                add = delete = f"rebuild required ({fmt(row.get('build_s'), '.2f')} s)"
        rss_q = fmt(row.get("query_peak_rss_mb"), ".0f")
        if not adapter.persistent:
            rss_q = f"{rss_q} (build+query)"
        lines.append(
            f"| {adapter.label} | {fmt(m.get('ndcg@10'))} | {fmt(m.get('recall@100'))} | {fmt(m.get('mrr@10'))} "
            f"| {build} | {fmt(row.get('p50_ms'), '.2f')} | {fmt(row.get('p95_ms'), '.2f')} | {add} | {delete} "
            f"| {rss_b} | {rss_q} | {size} |"
        )
    return "\n".join(lines)


def _ratio_lines(ctx: Context, corpus: Corpus, rows: dict[str, dict]) -> list[str]:
    r = rows.get("ragdb", {})
    out = []

    def line(label: str, num: Any, den: Any, unit: str = "×") -> float | None:
        x = ratio(num, den)
        out.append(f"| {label} | {fmt(x, '.2f')}{unit if x is not None else ''} |")
        return x

    line("ragdb build / bm25s build", r.get("build_s"), rows.get("bm25s", {}).get("build_s"))
    line("ragdb query p50 / FTS5 p50", r.get("p50_ms"), rows.get("fts5", {}).get("p50_ms"))
    line("ragdb query p50 / tantivy p50", r.get("p50_ms"), rows.get("tantivy", {}).get("p50_ms"))
    line("ragdb add / FTS5 add", r.get("add_ms"), rows.get("fts5", {}).get("add_ms"))
    line("ragdb delete / FTS5 delete", r.get("delete_ms"), rows.get("fts5", {}).get("delete_ms"))
    line("ragdb peak RSS query / tantivy", r.get("query_peak_rss_mb"), rows.get("tantivy", {}).get("query_peak_rss_mb"))
    line("ragdb index size / FTS5", r.get("size_bytes"), rows.get("fts5", {}).get("size_bytes"))
    best = _best_peer(rows)
    nd = r.get("metrics", {}).get("ndcg@10")
    if best and nd is not None:
        out.append(f"| ragdb nDCG@10 − best peer ({SYSTEMS[best[0]].label}, {best[1]:.4f}) | {nd - best[1]:+.4f} |")
    return ["| ratio | value |", "|---|---|"] + out


def _best_peer(rows: dict[str, dict]) -> tuple[str, float] | None:
    scored = [(n, rows[n]["metrics"]["ndcg@10"]) for n in PEERS if n in rows and "metrics" in rows[n]]
    return max(scored, key=lambda x: x[1]) if scored else None


@section("quality")
def section_quality(ctx: Context) -> str:
    parts = ["## Quality, speed, memory and disk on the evaluation corpora", ""]
    for key in ("scifact", "cmrc"):
        corpus = ctx.corpora[key]
        log(f"== {corpus.title}: {corpus.n_docs} docs, {corpus.n_queries} queries")
        rows = measure_corpus(ctx, corpus)
        ctx.results[key] = rows
        parts += [f"### {corpus.title}: {corpus.n_docs:,} documents, {corpus.n_queries:,} judged queries", "",
                  _quality_table(corpus, rows), ""]
        if "ragdb" in rows:
            parts += _ratio_lines(ctx, corpus, rows) + [""]
        _quality_bars(ctx, corpus, rows)
    return "\n".join(parts)


def _quality_bars(ctx: Context, corpus: Corpus, rows: dict[str, dict]) -> None:
    r = rows.get("ragdb")
    name = corpus.title.split(" ")[0]
    best = _best_peer(rows)
    nd = (r or {}).get("metrics", {}).get("ndcg@10")
    if r is None or nd is None or best is None:
        bar(ctx, f"{name} nDCG@10 ≥ best peer's", None, "ragdb not measured")
    else:
        bar(ctx, f"{name} nDCG@10 ≥ best peer's", nd >= best[1],
            f"{nd:.4f} vs {best[1]:.4f} ({SYSTEMS[best[0]].label})")
    if corpus.key != "scifact":
        return
    r = r or {}

    def cmp(label: str, num: Any, den: Any, limit: float, strict: bool = False) -> None:
        x = ratio(num, den)
        if x is None:
            bar(ctx, label, None, "not measured")
        else:
            bar(ctx, label, x < limit if strict else x <= limit, f"{x:.2f}×")

    cmp("SciFact build ≤ 1.5× bm25s", r.get("build_s"), rows.get("bm25s", {}).get("build_s"), 1.5)
    cmp("SciFact query p50 < FTS5's", r.get("p50_ms"), rows.get("fts5", {}).get("p50_ms"), 1.0, strict=True)
    cmp("SciFact query p50 ≤ 3× tantivy's", r.get("p50_ms"), rows.get("tantivy", {}).get("p50_ms"), 3.0)
    cmp("SciFact add ≤ FTS5's", r.get("add_ms"), rows.get("fts5", {}).get("add_ms"), 1.0)
    cmp("SciFact delete ≤ FTS5's", r.get("delete_ms"), rows.get("fts5", {}).get("delete_ms"), 1.0)


SCALE_SYSTEMS = ["ragdb", "tantivy", "fts5", "bm25s"]
UPDATE_SCALE_SYSTEMS = ["ragdb", "fts5", "tantivy"]


@section("scale")
def section_scale(ctx: Context) -> str:
    n = ctx.args.scale
    base = ctx.corpora["scifact"]
    max_q = 100 if ctx.args.quick else 300
    small_n = min(10_000, n)
    log(f"== scale: SciFact replicated to {small_n:,} and {n:,} documents")
    small = replicate_corpus(ctx, base, small_n, f"scifact-{small_n}", max_q)
    big = replicate_corpus(ctx, base, n, f"scifact-{n}", max_q)
    rows_small: dict[str, dict] = {}
    for name in ctx.systems(UPDATE_SCALE_SYSTEMS):
        b = ctx.run_worker("build", name, small)
        u = ctx.run_worker("update", name, small) if "error" not in b else {}
        rows_small[name] = {**b, **{k: v for k, v in u.items() if k != "peak_rss_mb"}}
    drop_indexes(ctx, small)
    rows: dict[str, dict] = {}
    for name in ctx.systems(SCALE_SYSTEMS):
        b = ctx.run_worker("build", name, big)
        row = {"build_s": b.get("build_s"), "size_bytes": b.get("size_bytes"),
               "build_peak_rss_mb": b.get("peak_rss_mb"), "error": b.get("error")}
        if "error" not in b:
            q = ctx.run_worker("query", name, big)
            q.pop("run", None)
            row.update(p50_ms=q.get("p50_ms"), p95_ms=q.get("p95_ms"), query_peak_rss_mb=q.get("peak_rss_mb"),
                       error=q.get("error"))
            if name in UPDATE_SCALE_SYSTEMS and "error" not in q:
                u = ctx.run_worker("update", name, big)
                row.update(add_ms=u.get("add_ms"), delete_ms=u.get("delete_ms"), error=u.get("error"))
        rows[name] = row
        drop_indexes(ctx, big)
    ctx.results["scale"] = {"n": n, "small_n": small_n, "rows": rows, "rows_small": rows_small}

    lines = [f"## Scale: SciFact replicated to {n:,} documents", "",
             f"Exact replicas of the SciFact corpus with new ids (`<id>@r<replica>`), so every query has "
             f"{n // base.n_docs}–{-(-n // base.n_docs)} identical copies of each matching document; quality is not measured here. "
             f"Latency over the first {big.n_queries} SciFact train queries (after {WARMUP_QUERIES} warm-up "
             f"queries); peak RSS of a process that opens the built index and runs the queries.", "",
             "| system | build s | query p50 ms | p95 ms | peak RSS build MiB | peak RSS query MiB | index MiB "
             f"| add ms @{n // 1000}k | delete ms @{n // 1000}k |",
             "|" + "---|" * 9]
    for name, row in rows.items():
        if row.get("error") and row.get("build_s") is None:
            lines.append(f"| {SYSTEMS[name].label} | error: {cell(row['error'])} |" + " |" * 7)
            continue
        inc = name in UPDATE_SCALE_SYSTEMS
        lines.append(
            f"| {SYSTEMS[name].label} | {fmt(row.get('build_s'), '.1f')} | {fmt(row.get('p50_ms'), '.2f')} "
            f"| {fmt(row.get('p95_ms'), '.2f')} | {fmt(row.get('build_peak_rss_mb'), '.0f')} "
            f"| {fmt(row.get('query_peak_rss_mb'), '.0f')} | {fmt((row.get('size_bytes') or 0) / 2**20, '.1f')} "
            f"| {fmt(row.get('add_ms'), '.2f') if inc else 'rebuild required'} "
            f"| {fmt(row.get('delete_ms'), '.2f') if inc else 'rebuild required'} |"
        )
    failed = [(name, row["error"]) for name, row in rows.items() if row.get("error") and row.get("build_s") is not None]
    failed += [(name, row["error"]) for name, row in rows_small.items() if row.get("error")]
    if failed:
        lines += [""] + [f"- {SYSTEMS[name].label}: error: `{cell(err, 300)}`" for name, err in failed]
    lines += ["", f"Add / delete one document (median of {UPDATE_OPS}, each its own commit) "
              f"at {small_n:,} and {n:,} documents:", "",
              f"| system | add ms @{small_n // 1000}k | add ms @{n // 1000}k | growth | delete ms @{small_n // 1000}k "
              f"| delete ms @{n // 1000}k | growth |", "|" + "---|" * 7]
    for name in rows_small:
        s, b = rows_small[name], rows.get(name, {})
        ga, gd = ratio(b.get("add_ms"), s.get("add_ms")), ratio(b.get("delete_ms"), s.get("delete_ms"))
        lines.append(f"| {SYSTEMS[name].label} | {fmt(s.get('add_ms'), '.2f')} | {fmt(b.get('add_ms'), '.2f')} "
                     f"| {fmt(ga, '.2f')}× | {fmt(s.get('delete_ms'), '.2f')} | {fmt(b.get('delete_ms'), '.2f')} "
                     f"| {fmt(gd, '.2f')}× |")
    r = rows.get("ragdb", {})
    if "ragdb" in rows:
        lines += ["", "| ratio | value |", "|---|---|"]
        for label, a, b in (
            ("ragdb build / bm25s build", r.get("build_s"), rows.get("bm25s", {}).get("build_s")),
            ("ragdb build / tantivy build", r.get("build_s"), rows.get("tantivy", {}).get("build_s")),
            ("ragdb query p50 / FTS5 p50", r.get("p50_ms"), rows.get("fts5", {}).get("p50_ms")),
            ("ragdb query p50 / tantivy p50", r.get("p50_ms"), rows.get("tantivy", {}).get("p50_ms")),
            ("ragdb peak RSS query / tantivy", r.get("query_peak_rss_mb"),
             rows.get("tantivy", {}).get("query_peak_rss_mb")),
            ("ragdb add / FTS5 add", r.get("add_ms"), rows.get("fts5", {}).get("add_ms")),
            ("ragdb delete / FTS5 delete", r.get("delete_ms"), rows.get("fts5", {}).get("delete_ms")),
        ):
            x = ratio(a, b)
            lines.append(f"| {label} @{n // 1000}k | {fmt(x, '.2f')}{'×' if x is not None else ''} |")

    def cmp(label: str, x: float | None, limit: float) -> None:
        bar(ctx, label, None if x is None else x <= limit, "not measured" if x is None else f"{x:.2f}×")

    tag = f"{n // 1000}k"
    cmp(f"query p50 ≤ 3× tantivy's at {tag}", ratio(r.get("p50_ms"), rows.get("tantivy", {}).get("p50_ms")), 3.0)
    s = rows_small.get("ragdb", {})
    cmp(f"add at {tag} ≤ 1.5× add at {small_n // 1000}k", ratio(r.get("add_ms"), s.get("add_ms")), 1.5)
    cmp(f"delete at {tag} ≤ 1.5× delete at {small_n // 1000}k", ratio(r.get("delete_ms"), s.get("delete_ms")), 1.5)
    cmp(f"add at {tag} ≤ FTS5's", ratio(r.get("add_ms"), rows.get("fts5", {}).get("add_ms")), 1.0)
    cmp(f"delete at {tag} ≤ FTS5's", ratio(r.get("delete_ms"), rows.get("fts5", {}).get("delete_ms")), 1.0)
    cmp(f"peak RSS querying the {tag} db ≤ tantivy's",
        ratio(r.get("query_peak_rss_mb"), rows.get("tantivy", {}).get("query_peak_rss_mb")), 1.0)
    return "\n".join(lines) + "\n"


# Later sections register here with @section("filters") / @section("hybrid").


# ---------------------------------------------------------------- report


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def machine_facts() -> list[str]:
    cpu = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = "?"
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            kb = int(fh.readline().split()[1])
            mem = f"{kb / 2**20:.1f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=str(REPO), timeout=10).stdout.strip() or "?"
    except (OSError, subprocess.SubprocessError):
        commit = "?"
    try:
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "ragdb", "migrations"], capture_output=True,
                               text=True, cwd=str(REPO), timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        dirty = ""
    if dirty:
        commit += " plus uncommitted changes in ragdb/"
    pkgs = ", ".join(f"{d} {_version(d)}" for d in ("bm25s", "tantivy", "rank-bm25", "PyStemmer", "numpy",
                                                      "orjson"))
    return [
        f"- Machine: {os.cpu_count()} logical cores ({cpu}), {mem} RAM, {platform.system()} {platform.release()}",
        f"- Python {platform.python_version()}, SQLite {sqlite3.sqlite_version}; {pkgs}",
        f"- ragdb at commit {commit}",
    ]


def source_fingerprint(root: Path = REPO) -> str:
    """SHA-256 over ragdb's sources and migrations under ``root``."""
    import hashlib

    h = hashlib.sha256()
    for folder in (root / "ragdb", root / "migrations"):
        for path in sorted(folder.rglob("*")):
            if path.is_file() and path.suffix in (".py", ".sql"):
                h.update(str(path.relative_to(root)).encode())
                h.update(path.read_bytes())
    return h.hexdigest()


def write_report(ctx: Context, bodies: list[str], started: float, command: str) -> Path:
    now = _dt.datetime.now().astimezone()
    out: list[str] = [
        "# ragdb benchmarks",
        "",
        f"Generated by `benchmarks/run.py` on {now:%Y-%m-%d %H:%M %Z} in {(time.time() - started) / 60:.1f} min. "
        "Do not edit by hand: rerun the command.",
        "",
        "```",
        command,
        "```",
        "",
        *machine_facts(),
        "",
    ]
    if not ctx.ragdb_ok:
        out += [f"**ragdb: not available** ({ctx.ragdb_error}); only the peers were measured.", ""]
    out += ["## Bars", "", "| bar | result | measured |", "|---|---|---|"]
    for name, ok, detail in ctx.bars:
        out.append(f"| {name} | {'PASS' if ok else 'FAIL' if ok is False else 'n/a'} | {detail} |")
    out += [""]
    out += bodies
    out += [
        "## Method",
        "",
        "- Each corpus document is one chunk: `title + \"\\n\\n\" + text`; ragdb indexes it with "
        "`add_many(..., chunker=\"none\")` and `source=<corpus id>`, with its default analyzer.",
        f"- Every system retrieves the top {K} per query; quality from `ragdb.evaluation` (nDCG@10 with "
        "log2 discount and ideal DCG from the qrels, Recall@100, MRR@10; judged queries only).",
        "- Tokenization of the peers: SciFact — bm25s and rank_bm25 use `bm25s.tokenize` with PyStemmer "
        "English and English stopwords; tantivy the `en_stem` tokenizer (queries analyzed with the same "
        "chain, run as an OR of term queries); FTS5 `porter unicode61`, queries an OR of quoted words. "
        "CMRC — bm25s and rank_bm25 get CJK character unigrams + bigrams (lowercased words otherwise); "
        "tantivy an `ngram(1,2)` + lowercase tokenizer, queries an OR of term queries; FTS5 `trigram`, "
        "queries an OR of the query's quoted 3-character substrings.",
        "- Each system and stage runs in its own subprocess; peak RSS is that process's VmHWM "
        "(build: index the corpus and persist; query: open the persisted index and run the queries; "
        "rank_bm25 cannot persist, so its figure covers build and queries).",
        f"- Query latency: each query timed on its own with `time.perf_counter` after {WARMUP_QUERIES} "
        "warm-up queries (the first ones of the timed set, so caches are warm as in a running service), including query tokenization and mapping hits to document ids (ragdb also "
        "returns the chunk text; the peers return ids only).",
        f"- Add / delete: median of {UPDATE_OPS} operations, each its own transaction/commit, on the built "
        "index (FTS5: INSERT or DELETE by rowid + COMMIT in WAL mode with synchronous=NORMAL; tantivy: "
        "add_document or delete_documents_by_term + commit; ragdb: `add` / `delete(source=...)`). bm25s and "
        "rank_bm25 cannot update an index: the figure shown is the full rebuild time.",
        "- Build time: corpus streamed from a prepared file (bm25s and rank_bm25 need it in memory); "
        "bm25s build covers tokenize + index, not its save to disk; tantivy's writer uses its default "
        "threads and 128 MB heap. Index size: ragdb and FTS5 database file plus -wal; tantivy index folder "
        "plus the row→id list; bm25s saved index plus the id list.",
        "- The machine is shared and noisy (2 cores): read ratios, not lone times; reruns move latencies "
        "by ±20% or so.",
        *[f"- {n}" for n in ctx.notes],
        "",
    ]
    path = ctx.args.out
    path.write_text("\n".join(out), encoding="utf-8")
    return path


def probe_ragdb(ctx: Context) -> None:
    if not any(s.startswith("ragdb") for s in ctx.args.systems):
        ctx.ragdb_error = "not selected"
        return
    dummy = Corpus("probe", "probe", "en", Path(os.devnull), Path(os.devnull), 0, 0)
    res = ctx.run_worker("probe", "ragdb", dummy)
    ctx.ragdb_ok = "error" not in res
    ctx.ragdb_error = res.get("error", "")
    if ctx.ragdb_ok and not str(res.get("file", "")).startswith(str(ctx.src)):
        ctx.ragdb_ok, ctx.ragdb_error = False, f"workers imported ragdb from {res.get('file')}, not the snapshot"
    log(f"ragdb probe: {res}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--_worker"]:
        return worker_main(argv[1])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="reduced run: ≤300 queries a corpus, scale 20,000")
    p.add_argument("--scale", type=int, default=None, help="documents in the scale section (default 100000)")
    p.add_argument("--data", type=Path, default=DEFAULT_DATA, help=f"BEIR data folder (default {DEFAULT_DATA})")
    p.add_argument("--out", type=Path, default=REPO / "BENCHMARKS.md", help="report path")
    p.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated subset (development)")
    p.add_argument("--sections", default=",".join(n for n, _ in SECTIONS), help="comma-separated subset")
    p.add_argument("--keep", action="store_true", help="keep the work folder (benchmarks/.cache/)")
    args = p.parse_args(argv)
    args.scale = args.scale or (20_000 if args.quick else 100_000)
    args.systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = [s for s in args.systems if s not in SYSTEMS]
    if unknown:
        p.error(f"unknown systems {unknown}; choose from {list(SYSTEMS)}")
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    command = ".venv/bin/python benchmarks/run.py" + ("".join(f" {a}" for a in argv))

    started = time.time()
    cache = REPO / "benchmarks" / ".cache"
    cache.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="run-", dir=cache))
    # Other people edit ragdb while this runs: every worker imports one
    # snapshot of its sources, taken now, so all figures are of one version.
    src = workdir / "src"
    for name in ("ragdb", "migrations"):
        shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    fingerprint = source_fingerprint(src)
    ctx = Context(args=args, workdir=workdir, src=src, evaluation=_load_evaluation(src))
    ctx.notes.append(f"ragdb sources snapshotted at the start of the run (sha256 {fingerprint[:12]} over "
                     "ragdb/*.py and migrations/*.sql); every worker imported that snapshot.")
    try:
        probe_ragdb(ctx)
        log(f"ragdb available: {ctx.ragdb_ok} {ctx.ragdb_error}")
        max_q = 300 if args.quick else None
        for key in CORPORA:
            ctx.corpora[key] = prepare_corpus(ctx, key, max_q)
        bodies = []
        for name, fn in SECTIONS:
            if name in sections:
                bodies.append(fn(ctx))
        if source_fingerprint() != fingerprint:
            ctx.notes.append("ragdb's sources in the repository changed during the run; the figures are of "
                             "the snapshot taken at its start.")
            log("note: ragdb sources in the repository changed during the run (the snapshot was used)")
        path = write_report(ctx, bodies, started, command)
        (cache / "last-results.json").write_bytes(
            orjson.dumps({"results": ctx.results, "bars": ctx.bars}, option=orjson.OPT_INDENT_2,
                         default=str))
        log(f"wrote {path} in {(time.time() - started) / 60:.1f} min")
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
