"""Section ``filters`` (issue 4): query latency under metadata, time and permission filters
keeping 1%/10%/50% of a ``--scale`` database, against the unfiltered query; worker stages
``filter_build`` and ``filter_query``."""

from __future__ import annotations

import datetime as _dt
import gc
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..common import WARMUP_QUERIES, iter_docs, lat_summary, log, ms_since, read_pairs
from ..corpora import replicate_corpus
from ..harness import Context, section, selected_sections, worker_stage
from ..peers import RagdbAdapter
from ..report import bar, cell, fmt, na_bars, ratio, xfmt


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
            first[label] = ms_since(t0)
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
                    lat[(label, k)].append(ms_since(t0))
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
            row[f"k{k}"] = {**lat_summary(lat[(label, k)]), **counts[(label, k)]}
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
        na_bars(ctx, bar_names, "ragdb not available")
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
    if "tfidf" in selected_sections(ctx) and "error" not in b:
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
        na_bars(ctx, bar_names, f"not measured: error `{cell(err, 120)}` (see the section)")
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
            f"| {fmt(c['k10']['p95_ms'], '.2f')} | {xfmt(r10)} | {fmt(c['k100']['p50_ms'], '.2f')} "
            f"| {fmt(c['k100']['p95_ms'], '.2f')} | {xfmt(r100)} | {fmt(c.get('first_ms'), '.1f')} "
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
        + (f"; {xfmt(ratio(b.get('build_s'), scale_b))} the scale section's plain ragdb build "
           f"({scale_b:.1f} s)." if scale_b and same_n else "."),
        "",
    ]
    one = cfgs.get("`filter={\"bucket\": 0}`", {})
    for name, k in zip(bar_names[:2], (10, 100)):
        x = ratio(one.get(f"k{k}", {}).get("p50_ms"), base_row[f"k{k}"]["p50_ms"])
        bar(ctx, name, None if x is None else x <= 2.0, xfmt(x))
    viol = sum(c[f"k{k}"]["violations"] for c in q["configs"] for k in (10, 100))
    short = sum(c[f"k{k}"]["short"] for c in q["configs"] for k in (10, 100))
    outside = sum(c[f"k{k}"]["outside"] for c in q["configs"] for k in (10, 100))
    searches = sum(c[f"k{k}"]["n"] for c in q["configs"] for k in (10, 100))
    bar(ctx, bar_names[2], viol == 0, f"{viol} violations in {short} short results of {searches} searches")
    bar(ctx, bar_names[3], outside == 0, f"{outside} hits outside")
    return "\n".join(lines)
