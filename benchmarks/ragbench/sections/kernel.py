"""Section ``kernel`` (issue 29): ragdb's compiled scoring kernel next to its numpy fallback and
tantivy, in the same run, on SciFact and the realistic corpus at 10k and 100k chunks (10k and
``--scale`` with ``--quick``): query p50/p95, the ratios, whether both kernels rank every query
alike; and, at the largest size, queries/s of 2 threads against 1 (each thread its own
``ragdb.open`` handle), for both kernels. Worker stages ``kernel_probe`` and ``query_threads``."""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path
from typing import Any

from ..common import K, WARMUP_QUERIES, log, median, read_pairs
from ..corpora import Corpus, drop_indexes
from ..harness import Context, query_rounds, section, worker_stage
from ..report import bar, cell, fmt, ratio, xfmt
from .scale import judged_queries, realistic, tag

SYSTEMS_HERE = ["ragdb", "ragdb-numpy", "tantivy", "tantivy-text"]
REUSING = {"ragdb-numpy": "ragdb", "tantivy-text": "tantivy"}  # a row on another system's index
THREAD_SECONDS = 4.0  # each timed window of the threads stage
THREAD_REPEATS = 3    # windows per thread count, alternating 1, 2, 1, 2, ...: the median


def _use(name: str) -> str:
    try:
        from ragdb.index import kernel
    except ImportError:  # a ragdb from before the compiled kernel
        return "numpy"
    if name in kernel.available():
        kernel.use(name)
    return kernel.name()


@worker_stage("kernel_probe")
def _stage_probe(spec: dict) -> dict:
    try:
        from ragdb.index import kernel
    except ImportError:
        return {"kernel": "numpy", "available": ["numpy"]}
    return {"kernel": kernel.name(), "available": list(kernel.available())}


@worker_stage("query_threads")
def _stage_threads(spec: dict) -> dict:
    """Queries/s of 1 and of 2 threads searching one ragdb database, each with its own handle,
    in alternating windows of THREAD_SECONDS."""
    import ragdb

    ran = _use(spec["kernel"])
    path = Path(spec["index_dir"]) / "ragdb.db"
    queries = [t for _q, t in read_pairs(Path(spec["queries"]))]
    handles = [ragdb.open(str(path)) for _ in range(2)]
    for db in handles:
        for text in queries[:WARMUP_QUERIES]:
            db.search(text, k=10)
    rates: dict[int, list[float]] = {1: [], 2: []}
    for _ in range(THREAD_REPEATS):
        for threads in (1, 2):
            counts = [0] * threads
            stop = time.perf_counter() + THREAD_SECONDS
            start = threading.Barrier(threads)

            def loop(i: int, start: threading.Barrier = start, stop: float = stop, counts: list[int] = counts) -> None:
                db = handles[i]
                q = i * 7919
                start.wait()
                while time.perf_counter() < stop:
                    db.search(queries[q % len(queries)], k=10)
                    q += 1
                    counts[i] += 1

            t0 = time.perf_counter()
            workers = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
            for w in workers:
                w.start()
            for w in workers:
                w.join()
            rates[threads].append(sum(counts) / (time.perf_counter() - t0))
    for db in handles:
        db.close()
    one, two = median(rates[1]), median(rates[2])
    return {"kernel": ran, "qps_1": one, "qps_2": two, "speedup": two / one if one else None,
            "windows": THREAD_REPEATS, "window_s": THREAD_SECONDS}


@worker_stage("kernel_paired")
def _stage_paired(spec: dict) -> dict:
    """Each query searched with both kernels back to back (which goes first alternates), on one
    handle: on a busy machine the two figures of a pair share its moment, so their ratio is
    steadier than separate stages' p50s."""
    import ragdb

    if _use("compiled") != "compiled":
        return {"error": "the compiled kernel is not installed"}
    path = Path(spec["index_dir"]) / "ragdb.db"
    queries = [t for _q, t in read_pairs(Path(spec["queries"]))]
    lat: dict[str, list[float]] = {"compiled": [], "numpy": []}
    with ragdb.open(str(path)) as db:
        for text in queries[:WARMUP_QUERIES]:
            for name in ("compiled", "numpy"):
                _use(name)
                db.search(text, k=spec.get("k", 100))
        for i, text in enumerate(queries):
            for name in (("compiled", "numpy") if i % 2 else ("numpy", "compiled")):
                _use(name)
                t0 = time.perf_counter()
                db.search(text, k=spec.get("k", 100))
                lat[name].append((time.perf_counter() - t0) * 1000.0)
    return {"p50_compiled_ms": median(lat["compiled"]), "p50_numpy_ms": median(lat["numpy"]),
            "ratio": median([b / a for a, b in zip(lat["compiled"], lat["numpy"]) if a > 0]), "queries": len(queries)}


def _same_rankings(a: dict[str, list[str]] | None, b: dict[str, list[str]] | None) -> tuple[int, int] | None:
    """(queries ranked alike, queries compared) of two runs, or None when one is missing."""
    if not a or not b:
        return None
    common = [q for q in a if q in b]
    return sum(a[q] == b[q] for q in common), len(common)


@section("kernel")
def section_kernel(ctx: Context) -> str:
    names = ctx.systems(SYSTEMS_HERE)
    if "ragdb" not in names:
        return "## Scoring kernel: compiled and numpy (issue 29)\n\nNot run: ragdb is not available.\n"
    probe = ctx.run_worker("kernel_probe", "ragdb", ctx.corpora["scifact"])
    queries, qrels, _qlang = judged_queries(ctx)
    sizes = [10_000, min(ctx.args.scale, 100_000)] if ctx.args.quick else [10_000, 100_000]
    corpora: list[Corpus] = [dataclasses.replace(ctx.corpora["scifact"], key="kernel-scifact")]
    for n in sorted(set(sizes)):
        c, _meta = realistic(ctx, n, queries, qrels)
        corpora.append(dataclasses.replace(c, key=f"kernel-{c.key}"))
    rows: list[dict[str, Any]] = []
    threads: dict[str, dict] = {}
    for i, corpus in enumerate(corpora):
        log(f"== kernel: {corpus.title}")
        built = []
        builds: dict[str, dict] = {}
        for name in [n for n in names if n not in REUSING]:
            builds[name] = ctx.run_worker("build", name, corpus)
            if "error" not in builds[name]:
                built.append(name)
        built += [name for name, owner in REUSING.items() if owner in built and name in names]
        results = query_rounds(ctx, built, corpus)
        same = _same_rankings(results.get("ragdb", {}).get("run"), results.get("ragdb-numpy", {}).get("run"))
        paired = ctx.run_worker("kernel_paired", "ragdb", corpus) if "ragdb" in built else {}
        rows.append({"corpus": corpus.title, "n": corpus.n_docs, "same": same, "paired": paired,
                     **{name: {k: r.get(k) for k in ("p50_ms", "p95_ms", "rounds", "error")}
                        for name, r in results.items()}})
        if i == len(corpora) - 1 and "ragdb" in built:
            for kern in ("compiled", "numpy"):
                threads[kern] = ctx.run_worker("query_threads", "ragdb", corpus, kernel=kern)
        drop_indexes(ctx, corpus)
    ctx.results["kernel"] = {"probe": probe, "rows": rows, "threads": threads}
    return _report(ctx, probe, rows, threads, corpora[-1])


def _paired_cell(p: dict) -> str:
    if not p or "error" in p:
        return cell(p.get("error", "–")) if p else "–"
    return f"{xfmt(p.get('ratio'))} ({fmt(p.get('p50_numpy_ms'), '.2f')} / {fmt(p.get('p50_compiled_ms'), '.2f')} ms)"


def _report(ctx: Context, probe: dict, rows: list[dict], threads: dict[str, dict], last: Corpus) -> str:
    out = ["## Scoring kernel: compiled and numpy (issue 29)", ""]
    out.append(f"The kernel the ragdb rows ran: **{probe.get('kernel', '?')}** (installed: "
               f"{', '.join(probe.get('available', [])) or '?'}); `ragdb (bm25, numpy kernel)` is the same "
               "index scored by the numpy fallback (`RAGDB_KERNEL=numpy`). All rows come from one run, "
               "systems taking turns in each round; the machine is shared (2 cores, other work running), "
               "so compare the ratios rather than the absolute figures.")
    out.append("")
    out.append("| corpus | chunks | ragdb p50 / p95 ms | numpy kernel p50 / p95 ms | tantivy p50 / p95 ms | "
               "ragdb / tantivy p50 | ragdb / tantivy p95 | tantivy + stored text p50 ms | "
               "ragdb / (tantivy + stored text) p50 | numpy / compiled p50 | paired: numpy / compiled | "
               "same rankings |")
    out.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
    all_same = True
    for r in rows:
        rg, npk, tv, tvt = r.get("ragdb", {}), r.get("ragdb-numpy", {}), r.get("tantivy", {}), r.get("tantivy-text", {})
        same = r.get("same")
        if same is None or same[0] != same[1]:
            all_same = False
        out.append(
            f"| {cell(r['corpus'])} | {r['n']:,} | {fmt(rg.get('p50_ms'), '.2f')} / {fmt(rg.get('p95_ms'), '.2f')} | "
            f"{fmt(npk.get('p50_ms'), '.2f')} / {fmt(npk.get('p95_ms'), '.2f')} | "
            f"{fmt(tv.get('p50_ms'), '.2f')} / {fmt(tv.get('p95_ms'), '.2f')} | "
            f"{xfmt(ratio(rg.get('p50_ms'), tv.get('p50_ms')))} | {xfmt(ratio(rg.get('p95_ms'), tv.get('p95_ms')))} | "
            f"{fmt(tvt.get('p50_ms'), '.2f')} | {xfmt(ratio(rg.get('p50_ms'), tvt.get('p50_ms')))} | "
            f"{xfmt(ratio(npk.get('p50_ms'), rg.get('p50_ms')))} | {_paired_cell(r.get('paired') or {})} | "
            f"{'–' if same is None else f'{same[0]:,} / {same[1]:,}'} |")
    out.append("")
    out.append("*paired*: every query searched with both kernels back to back in one process (which one goes "
               "first alternates), the median of the per-query ratios, with each kernel's p50 in that stage.")
    out.append("")
    out.append("*tantivy + stored text*: tantivy's same index and query, each hit's stored text read as well "
               "(`Searcher.doc`), which a RAG application needs for its prompt and ragdb's hits carry (ragdb "
               "also folds copies of one passage together, from the hits' text). The bars compare with "
               "tantivy's ids-only search; this column is context for them.")
    out.append("")
    if threads:
        out.append(f"Threads at {tag(last.n_docs)} ({cell(last.title)}): queries/s of one thread and of two, "
                   f"each thread its own `ragdb.open` handle, the median of {THREAD_REPEATS} alternating windows "
                   f"of {THREAD_SECONDS:.0f} s each (k=10, the judged queries in turn). The compiled kernel "
                   "releases the GIL while it scores and selects; the rest of a search (parsing, SQLite reads, "
                   "building hits) holds it.")
        out.append("")
        out.append("| kernel | 1 thread q/s | 2 threads q/s | 2 / 1 |")
        out.append("|---|---|---|---|")
        for kern, t in threads.items():
            out.append(f"| {cell(t.get('kernel', kern))} | {fmt(t.get('qps_1'), '.1f')} | {fmt(t.get('qps_2'), '.1f')} | "
                       f"{xfmt(t.get('speedup'))} |")
        out.append("")
    compiled = threads.get("compiled", {})
    bar(ctx, "kernel: compiled and numpy kernels rank every query alike (SciFact, 10k, 100k)", all_same,
        "; ".join(f"{r['corpus']}: {r['same'][0]}/{r['same'][1]}" if r.get("same") else f"{r['corpus']}: –"
                  for r in rows))
    first = rows[0] if rows else {}
    rg, tv = first.get("ragdb", {}), first.get("tantivy", {})
    for key, limit, what in (("p50_ms", 1.5, "p50"), ("p95_ms", 2.0, "p95")):  # issue 29's SciFact bars
        x = ratio(rg.get(key), tv.get(key))
        bar(ctx, f"query {what} ≤ {limit:g}× tantivy's on {first.get('corpus', 'SciFact')} (k={K})",
            None if x is None else x <= limit, xfmt(x) if x is not None else "not measured")
    speedup = compiled.get("speedup")
    # the threads bar is measured at the largest size run: a row of another size is an older run's
    ctx.retired_bars += [r"kernel: 2 threads ≥ 1\.7× one thread's queries/s at \S+"]
    bar(ctx, f"kernel: 2 threads ≥ 1.7× one thread's queries/s at {tag(last.n_docs)}",
        None if speedup is None or compiled.get("kernel") != "compiled" else speedup >= 1.7,
        f"{xfmt(speedup)} ({fmt(compiled.get('qps_1'), '.1f')} → {fmt(compiled.get('qps_2'), '.1f')} q/s)")
    return "\n".join(out) + "\n"
