"""Section ``filters`` (issues 4 and 15): query latency under metadata, time and permission
filters keeping 1%/10%/50% of a ``--scale`` database, and under 1% range filters (``$gte``/``$lt``
on a number and on an ISO date), against the unfiltered query; worker stages ``filter_build``
and ``filter_query``."""

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
FILTER_DAYS = 100  # metadata["day"]: ISO date FILTER_T0 + (i % 100) days: one day holds 1%
GOLDEN = 0.6180339887498949  # metadata["rank"] = (i * GOLDEN) % 1: spread evenly over [0, 1)
RANGE_LABEL = "`{\"rank\": {\"$gte\": x, \"$lt\": x + 0.01}}`"
DATE_LABEL = "`{\"day\": {\"$gte\": d, \"$lt\": d + 1 day}}`"
MOVING_LABEL = RANGE_LABEL + ", x new each query"


def _filter_timestamp(i: int) -> str:
    return (FILTER_T0 + _dt.timedelta(minutes=i)).isoformat()


def _rank(i: Any) -> Any:
    return (i * GOLDEN) % 1.0


def _day(i: int) -> str:
    return (FILTER_T0 + _dt.timedelta(days=i % FILTER_DAYS)).date().isoformat()


def _day_epoch(day: int) -> float:
    return (FILTER_T0 + _dt.timedelta(days=day)).timestamp()


def _rank_window(x: float, width: float = 0.01) -> tuple[Callable[..., Any], dict]:
    return (lambda b, g, e, r, d: (r >= x) & (r < x + width),
            {"filter": {"rank": {"$gte": x, "$lt": x + width}}})


def _filter_configs(n: int) -> list[tuple[str, Any, Any]]:
    """(label, predicate on (bucket, group, epoch, rank, day epoch) -- scalars or numpy arrays --,
    search kwargs); for a label whose restriction changes with each query, the predicate and
    kwargs are ``None`` and :func:`_moving` gives them. Every document has an access label, so
    each search but the principals row's reads with ``principals=ragdb.ALL`` (the anonymous
    default would see nothing: an "unfiltered" search would time an empty result)."""
    since_i = n - n // 10
    since_epoch = (FILTER_T0 + _dt.timedelta(minutes=since_i)).timestamp()
    rank_pred, rank_kw = _rank_window(0.5)
    day0, day1 = _day_epoch(50), _day_epoch(51)
    return [
        ("unfiltered", lambda b, g, e, r, d: b == b, {}),
        ("`filter={\"bucket\": 0}`", lambda b, g, e, r, d: b == 0, {"filter": {"bucket": 0}}),
        ("`filter={\"bucket\": [0..9]}`", lambda b, g, e, r, d: b < 10, {"filter": {"bucket": list(range(10))}}),
        ("`filter={\"bucket\": [0..49]}`", lambda b, g, e, r, d: b < 50, {"filter": {"bucket": list(range(50))}}),
        ("`since=` newest 10%", lambda b, g, e, r, d: e >= since_epoch - 1e-3, {"since": _filter_timestamp(since_i)}),
        ("`principals=[\"group0\"]`", lambda b, g, e, r, d: g == 0, {"principals": ["group0"]}),
        (RANGE_LABEL, rank_pred, rank_kw),
        (DATE_LABEL, lambda b, g, e, r, d: (d >= day0) & (d < day1),
         {"filter": {"day": {"$gte": _day(50), "$lt": _day(51)}}}),
        (MOVING_LABEL, None, None),
    ]


def _moving(q: int) -> tuple[Callable[..., Any], dict]:
    """The range of the moving row for query number ``q``: a new 1% window each query, so its
    chunk mask is built (by SQL on the range index) in every search, never taken from the cache."""
    return _rank_window(round((q * 0.137) % 0.99, 6))


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
                   "metadata": {"bucket": i % FILTER_BUCKETS, "group": i % FILTER_GROUPS, "rank": _rank(i),
                                "day": _day(i)},
                   "acl": [f"group{i % FILTER_GROUPS}"]}

    gc.collect()
    t0 = time.perf_counter()
    with ragdb.open(str(folder / "ragdb.db")) as db:
        db.add_many(records(), chunker="none")
        build_s = time.perf_counter() - t0
        chunks = db.stats().chunks
    return {"build_s": build_s, "chunks": chunks, "size_bytes": RagdbAdapter.size(folder)}


def _hit_key(hit: Any) -> tuple[int, int, float, float, float]:
    ts = _dt.datetime.fromisoformat(hit.timestamp.replace("Z", "+00:00")).timestamp() if hit.timestamp else 0.0
    day = hit.metadata.get("day")
    day_epoch = _dt.datetime.fromisoformat(day).replace(tzinfo=_dt.timezone.utc).timestamp() if day else -1.0
    return (int(hit.metadata.get("bucket", -1)), int(hit.metadata.get("group", -1)), ts,
            float(hit.metadata.get("rank", -1.0)), day_epoch)


@worker_stage("filter_query")
def _stage_filter_query(spec: dict) -> dict:
    """p50/p95 of each restriction next to the unfiltered query, queries interleaved
    (each query runs under every restriction in turn), at k=10 and k=100."""
    import numpy as np
    import ragdb

    def search(text: str, k: int, **kw: Any) -> list:
        return db.search(text, k=k, **({"principals": ragdb.ALL} | kw))

    try:
        from ragdb.database import MAX_K
    except ImportError:
        MAX_K = 10_000
    n = spec["n_docs"]
    queries = read_pairs(Path(spec["queries"]))
    configs = _filter_configs(n)
    idx = np.arange(n)
    columns = (idx % FILTER_BUCKETS, idx % FILTER_GROUPS,
               np.array([(FILTER_T0 + _dt.timedelta(minutes=int(i))).timestamp() for i in idx]),
               np.array([_rank(int(i)) for i in idx]), np.array([_day_epoch(int(i) % FILTER_DAYS) for i in idx]))
    res: dict[str, Any] = {"configs": [], "queries": len(queries)}
    truth: dict[str, tuple[Any, ...]] = {}

    def matching(text: str, pred: Callable[..., Any]) -> tuple[int, bool]:
        """Chunks matching the query under ``pred``, from an unfiltered search of up to MAX_K
        hits filtered here (exact when the search returned fewer than MAX_K hits)."""
        if text not in truth:
            keys = [_hit_key(h) for h in search(text, MAX_K)]
            arr = np.array(keys, dtype=float).reshape(-1, 5)
            truth[text] = (*(arr[:, j] for j in range(5)), len(keys) >= MAX_K)
        *cols, capped = truth[text]
        return int(np.count_nonzero(pred(*cols))), capped

    with ragdb.open(str(Path(spec["index_dir"]) / "ragdb.db")) as db:
        search(queries[0][1], 10)  # open the index (untimed)
        first: dict[str, float] = {}
        for label, _pred, kw in configs[1:]:  # first query under a restriction: its chunk mask is built
            t0 = time.perf_counter()
            search(queries[0][1], 10, **(kw if kw is not None else _moving(-1)[1]))
            first[label] = ms_since(t0)
        lat: dict[tuple[str, int], list[float]] = {(c[0], k): [] for c in configs for k in (10, 100)}
        counts = {(c[0], k): {"short": 0, "violations": 0, "outside": 0, "hits": 0}
                  for c in configs for k in (10, 100)}
        for k in (10, 100):
            for q, (_qid, text) in enumerate(queries[:WARMUP_QUERIES]):
                for _label, _pred, kw in configs:
                    search(text, k, **(kw if kw is not None else _moving(q - WARMUP_QUERIES)[1]))
            gc.collect()
            for q, (_qid, text) in enumerate(queries):
                for label, pred, kw in configs:
                    if kw is None:
                        pred, kw = _moving(q + k)  # never a window an earlier search cached
                    t0 = time.perf_counter()
                    hits = search(text, k, **kw)
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
        kept = int(np.count_nonzero((pred or _moving(0)[0])(*columns)))
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
               "no filtered hit outside its restriction ({tag})",
               "1% range filter ($gte/$lt on a number) query p50 ≤ 2× unfiltered p50 at {tag} (k=10)",
               "1% range filter ($gte/$lt on a number) query p50 ≤ 2× unfiltered p50 at {tag} (k=100)",
               "1% range filter, a new range each query (mask not cached), p50 ≤ 2× unfiltered p50 at {tag} (k=10)"]


@section("filters")
def section_filters(ctx: Context) -> str:
    n = ctx.args.scale
    tag = f"{n // 1000}k"
    bar_names = [b.format(tag=tag) for b in FILTER_BARS]
    head = [f"## Filters: selectivity on {n:,} chunks (issues 4 and 15)", ""]
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
        f"Setup: SciFact replicated to {n:,} documents (exact copies with new ids, one chunk each), built into a "
        f"separate ragdb database where document *i* has `metadata={{\"bucket\": i % {FILTER_BUCKETS}, "
        f"\"group\": i % {FILTER_GROUPS}, \"rank\": (i × 0.618…) mod 1, \"day\": \"<{FILTER_T0:%Y-%m-%d} + "
        f"(i % {FILTER_DAYS}) days>\"}}` (`day` an ISO date), `acl=[\"group<i % {FILTER_GROUPS}>\"]` and the "
        f"timestamp {FILTER_T0:%Y-%m-%d} + *i* minutes (so every restriction keeps documents spread over all the "
        f"replicas). One worker process opens it and runs the first {q.get('queries', max_q)} SciFact train "
        f"queries with BM25 under every restriction in turn (each query under all {len(q.get('configs', []))} "
        "before the next query, so drift on the noisy machine hits all alike), after "
        f"{WARMUP_QUERIES} warm-up queries, at k=10 and again at k=100. "
        "Every search reads with `principals=ragdb.ALL` (all documents carry labels) but the principals "
        "row's. Ratios are filtered p50 / unfiltered p50 over the same queries. The range rows keep 1%: `rank` in "
        "[0.5, 0.51), `day` one day of 100, and a window of `rank` that moves with every query, so its chunk "
        "mask is never in the cache: each of those searches builds it by SQL on the range index.",
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
    lines += [
        "",
        "- *first query with it*: the first search under that restriction after opening (k=10, a query already "
        "run unfiltered): ragdb computes the restriction's chunk mask with SQL and caches it; later queries reuse it.",
        "- *short results*: searches that returned fewer than k hits. Each was checked against an unfiltered "
        f"search of up to {10_000:,} hits filtered in the benchmark; a *violation* is a short result although "
        "more chunks matching the query pass the restriction. *hits outside*: returned hits whose metadata or "
        "timestamp fail the restriction.",
        f"- Build of this database (metadata, labels, timestamps): {fmt(b.get('build_s'), '.1f')} s, "
        f"{fmt((b.get('size_bytes') or 0) / 2**20, '.1f')} MiB.",
        "",
    ]
    one = cfgs.get("`filter={\"bucket\": 0}`", {})
    for name, k in zip(bar_names[:2], (10, 100)):
        x = ratio(one.get(f"k{k}", {}).get("p50_ms"), base_row[f"k{k}"]["p50_ms"])
        bar(ctx, name, None if x is None else x <= 2.0, xfmt(x))
    ranged = cfgs.get(RANGE_LABEL, {})
    for name, k in zip(bar_names[4:6], (10, 100)):
        x = ratio(ranged.get(f"k{k}", {}).get("p50_ms"), base_row[f"k{k}"]["p50_ms"])
        bar(ctx, name, None if x is None else x <= 2.0, xfmt(x))
    x = ratio(cfgs.get(MOVING_LABEL, {}).get("k10", {}).get("p50_ms"), base_row["k10"]["p50_ms"])
    bar(ctx, bar_names[6], None if x is None else x <= 2.0, xfmt(x))
    viol = sum(c[f"k{k}"]["violations"] for c in q["configs"] for k in (10, 100))
    short = sum(c[f"k{k}"]["short"] for c in q["configs"] for k in (10, 100))
    outside = sum(c[f"k{k}"]["outside"] for c in q["configs"] for k in (10, 100))
    searches = sum(c[f"k{k}"]["n"] for c in q["configs"] for k in (10, 100))
    bar(ctx, bar_names[2], viol == 0, f"{viol} violations in {short} short results of {searches} searches")
    bar(ctx, bar_names[3], outside == 0, f"{outside} hits outside")
    return "\n".join(lines)
