"""Section ``scale``: the realistic corpus (``ragbench.realistic``) at 10,000, 100,000 and
``--scale`` chunks (``--scale 1m``: the 1M stage of issue 17).

At every size: build, query p50/p95 (both languages, each apart), peak RSS of the build
and of the queries, index size, nDCG@10 of the judged SciFact and CMRC queries, ragdb's
ranking against the exhaustive BM25 reference (``ragbench.reference``), and add/delete
of one document, for ragdb, tantivy, SQLite FTS5 and bm25s where they fit; then the
ratios to tantivy and FTS5, the growth from size to size, and issue 17's bars.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import orjson

from ..common import REPO, UPDATE_OPS, WARMUP_QUERIES, log, percentile
from ..corpora import Corpus, drop_indexes, pick_victims
from ..harness import REPEAT_QUERY_MS, SYSTEMS, Context, median_of_runs, section, update_rounds
from ..peers import SCALE_SYSTEMS, UPDATE_SCALE_SYSTEMS
from ..realistic import PARAMS, SEED, cached_corpus
from ..reference import cache_key as reference_key
from ..reference import compare, heaps_beta
from ..report import bar, cell, fmt, ratio, xfmt

SMALL = 10_000
MID = 100_000
CORPUS_CACHE = REPO / "benchmarks" / ".cache" / "corpora"
REFERENCE_CACHE = REPO / "benchmarks" / ".cache" / "reference"
# A query stage of a slow system runs only its first queries: FTS5 at most
# FTS5_MAX_QUERIES, and any system as many as its mean latency at the previous
# size, scaled by the size, lets it run in QUERY_BUDGET_S (never fewer than MIN_QUERIES).
FTS5_MAX_QUERIES = 300
QUERY_BUDGET_S = 90.0
MIN_QUERIES = 50
MEMORY_SHARE = 0.6  # a build estimated to need more of the available memory is not run
BUILD_BUDGET_S = 900.0  # nor one estimated to take longer
STAGE_LIMIT_MIN = 30.0  # issue 17: the whole 1M stage within 30 minutes
BIG = 1_000_000  # from this size on: the stage's time limit, fewer query rounds
BIG_QUERY_ROUNDS = 3
# At a size of BIG or more, a system no bar needs (bm25s) is built only if its build and
# queries (estimated from the previous size: 1.5x its build scaled) still leave RESERVE_S
# before the stage's limit for what follows the builds (queries, the reference, add/delete:
# ~8 min at 1M with today's ragdb).
OPTIONAL = ("bm25s",)
RESERVE_S = 8 * 60.0


def parse_scale(text: str) -> int:
    """``--scale``: a number of chunks, with an optional ``k`` or ``m`` (``1m``, ``100k``)."""
    m = re.fullmatch(r"\s*([0-9][0-9_,.]*)\s*([kKmM]?)\s*", text)
    if not m:
        raise ValueError(f"not a size: {text!r} (e.g. 100000, 100k, 1m)")
    value = float(m.group(1).replace("_", "").replace(",", ""))
    value *= {"": 1, "k": 1_000, "m": 1_000_000}[m.group(2).lower()]
    if value < 1:
        raise ValueError(f"size must be positive: {text!r}")
    return int(value)


def tag(n: int) -> str:
    """10000 -> 10k, 1000000 -> 1M."""
    if n >= 1_000_000 and n % 100_000 == 0:
        return f"{n / 1_000_000:g}M"
    if n >= 1_000 and n % 1_000 == 0:
        return f"{n // 1_000}k"
    return f"{n:,}"


def scale_sizes(n: int) -> list[int]:
    sizes = {min(SMALL, n), n}
    if n > MID:
        sizes.add(MID)
    return sorted(sizes)


# ---------------------------------------------------------------- the corpora and queries


def judged_queries(ctx: Context) -> tuple[Path, dict[str, dict[str, int]], dict[str, str]]:
    """The judged queries of SciFact (train) and CMRC (trial) interleaved evenly (so every
    prefix mixes both), their qrels, and each query's language."""
    folder = ctx.workdir / "data" / "realistic"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "queries.jsonl"
    keyed = []
    qrels: dict[str, dict[str, int]] = {}
    qlang: dict[str, str] = {}
    for key in ("scifact", "cmrc"):
        c = ctx.corpora[key]
        lines = c.queries_path.read_bytes().splitlines()
        for i, line in enumerate(lines):
            qid, _text = orjson.loads(line)
            if qid in qlang:
                raise RuntimeError(f"query id {qid} in both corpora")
            qlang[qid] = "en" if key == "scifact" else "zh"
            qrels[qid] = c.qrels.get(qid, {})
            keyed.append(((i + 0.5) / len(lines), key, line))
    keyed.sort(key=lambda x: (x[0], x[1]))
    path.write_bytes(b"".join(line + b"\n" for _f, _k, line in keyed))
    return path, qrels, qlang


def realistic(ctx: Context, n: int, queries: Path, qrels: dict[str, dict[str, int]]) -> tuple[Corpus, dict]:
    t0 = time.perf_counter()
    docs, meta = cached_corpus(CORPUS_CACHE, n, ctx.args.data, PARAMS, SEED)
    log(f"realistic corpus of {meta['n']:,} chunks: {'cached' if meta['cached'] else 'generated'} "
        f"in {time.perf_counter() - t0:.1f}s ({docs})")
    n_queries = len(queries.read_bytes().splitlines())
    c = Corpus(f"realistic-{meta['n']}", f"Realistic corpus, {meta['n']:,} chunks", "mixed", docs, queries,
               meta["n"], n_queries, qrels)
    c.victims = pick_victims(docs, meta["n"], ctx.args.rounds)
    return c, meta


# ---------------------------------------------------------------- measuring one size


def _skip_reason(name: str, size: int, prev: dict[str, Any] | None, deadline: float | None) -> str | None:
    """Why ``name`` is not built at ``size``: its build, scaled from the previous size, would
    not fit in memory or in time (``deadline``: the stage's limit, ``time.perf_counter``)."""
    if prev is None or not isinstance(prev.get("build_peak_rss_mb"), (int, float)):
        return None
    grow = size / prev["n"]
    rss = prev["build_peak_rss_mb"] * grow
    secs = (prev.get("build_s") or 0) * grow
    if deadline is not None and name in OPTIONAL:
        left = deadline - time.perf_counter()
        if 1.5 * secs + RESERVE_S > left:
            return (f"would not leave the stage within {STAGE_LIMIT_MIN:.0f} min: its {tag(prev['n'])} build "
                    f"scaled is ~{secs / 60:.1f} min (~{1.5 * secs / 60:.1f} min with its queries), "
                    f"{left / 60:.1f} min were left and the rest of the {tag(size)} measurements need "
                    f"~{RESERVE_S / 60:.0f}")
    try:
        import psutil

        avail = psutil.virtual_memory().available / 2**20
    except ImportError:
        avail = float("inf")
    if rss > MEMORY_SHARE * avail:
        return (f"does not fit: its build at {tag(prev['n'])} peaked at {prev['build_peak_rss_mb']:,.0f} MiB, "
                f"so ~{rss / 1024:,.1f} GiB at {tag(size)}, over {MEMORY_SHARE:.0%} of the "
                f"{avail / 1024:,.1f} GiB available")
    if secs > BUILD_BUDGET_S:
        return f"would take ~{secs / 60:.0f} min to build (its {tag(prev['n'])} build scaled), over the stage's budget"
    return None


def _query_cap(name: str, size: int, n_queries: int, prev: dict[str, Any] | None) -> int | None:
    cap = FTS5_MAX_QUERIES if name == "fts5" else n_queries
    per_query = (prev or {}).get("mean_ms") or (prev or {}).get("p50_ms")
    if prev and isinstance(per_query, (int, float)) and per_query > 0:
        per_query_s = per_query / 1000.0 * size / prev["n"]
        cap = min(cap, max(MIN_QUERIES, int(QUERY_BUDGET_S / per_query_s)))
    return cap if cap < n_queries else None


def _common_caps(caps: dict[str, int | None]) -> dict[str, int | None]:
    """Every system but FTS5 (its own fixed cap) runs the same first queries: the smallest of
    their caps, so that the ratios between them are over one set of queries (a system capped
    alone by its own latency would be compared on an easier or harder subset)."""
    shared = [c for name, c in caps.items() if name != "fts5" and c is not None]
    if not shared:
        return caps
    return {name: (c if name == "fts5" else min(shared)) for name, c in caps.items()}


def _lat_stats(lat: list[float], langs: list[str]) -> dict[str, float]:
    out = {}
    for group in ("en", "zh"):
        xs = [x for x, g in zip(lat, langs) if g == group]
        if xs:
            out[f"p50_{group}_ms"], out[f"p95_{group}_ms"] = percentile(xs, 50), percentile(xs, 95)
    return out


def _query_rounds(ctx: Context, names: list[str], corpus: Corpus, caps: dict[str, int | None],
                  langs: list[str], rounds: int) -> dict[str, dict]:
    """Query stages in rounds over the systems in turn (those with a first p50 under
    REPEAT_QUERY_MS repeat); medians of p50/p95 overall and per language; the first run's hits."""
    runs: dict[str, list[dict]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names:
            if r and (not runs[name] or "error" in runs[name][0]
                      or (runs[name][0].get("p50_ms") or 0) >= REPEAT_QUERY_MS):
                continue
            res = ctx.run_worker("query", name, corpus, max_queries=caps.get(name), latencies=True)
            if "lat" in res:
                res.update(_lat_stats(res.pop("lat"), langs))
            if r:
                res.pop("run", None)
            runs[name].append(res)
    keys = ("p50_ms", "p95_ms", "mean_ms", "p50_en_ms", "p95_en_ms", "p50_zh_ms", "p95_zh_ms", "peak_rss_mb", "open_s")
    return {name: median_of_runs(rs, keys) for name, rs in runs.items()}


def _reference(ctx: Context, corpus: Corpus, fingerprint: str) -> dict:
    """The exhaustive BM25 reference and the corpus statistics (cached: they depend only on
    the corpus, the queries and ragdb's analysis and scoring code)."""
    key = reference_key(fingerprint, corpus.queries_path, ctx.src, 100)
    path = REFERENCE_CACHE / f"{corpus.key}-{key}.json"
    if path.exists():
        res = orjson.loads(path.read_bytes())
        res["cached"] = True
        log(f"{corpus.key}: exhaustive reference from the cache ({path.name})")
        return res
    res = ctx.run_worker("bm25_reference", "ragdb", corpus, workers=2)
    if "error" not in res:
        REFERENCE_CACHE.mkdir(parents=True, exist_ok=True)
        path.write_bytes(orjson.dumps(res))
    res["cached"] = False
    return res


def _quality(ctx: Context, run: dict[str, list[str]], qrels: dict[str, dict[str, int]], qlang: dict[str, str]
             ) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for group in ("en", "zh"):
        sub = {q: ids for q, ids in run.items() if qlang.get(q) == group}
        rels = {q: qrels[q] for q in sub if q in qrels}
        out[group] = ctx.evaluation.evaluate(sub, rels, k_values=(10,)).get("ndcg@10") if rels else None
    return out


def measure_size(ctx: Context, corpus: Corpus, meta: dict, qlang: dict[str, str],
                 prev: dict[str, dict] | None, deadline: float | None) -> dict[str, Any]:
    size = corpus.n_docs
    log(f"== scale: {corpus.title}")
    t0 = time.perf_counter()
    langs = [qlang[orjson.loads(line)[0]] for line in corpus.queries_path.read_bytes().splitlines()]
    rows: dict[str, dict] = {}
    notes: list[str] = []
    built = []
    for name in ctx.systems(SCALE_SYSTEMS):  # every index stays until all are queried (in rounds)
        why = _skip_reason(name, size, (prev or {}).get(name), deadline)
        if why:
            rows[name] = {"skipped": why}
            notes.append(f"{SYSTEMS[name].label} not run at {tag(size)}: {why}.")
            log(f"{corpus.key}/{name}: skipped: {why}")
            continue
        b = ctx.run_worker("build", name, corpus)
        rows[name] = {"build_s": b.get("build_s"), "size_bytes": b.get("size_bytes"),
                      "build_peak_rss_mb": b.get("peak_rss_mb"), "error": b.get("error"), "n": size}
        if "error" not in b:
            built.append(name)
    caps = _common_caps({name: _query_cap(name, size, corpus.n_queries, (prev or {}).get(name)) for name in built})
    rounds = min(ctx.args.query_rounds, BIG_QUERY_ROUNDS) if size >= BIG else ctx.args.query_rounds
    for name, q in _query_rounds(ctx, built, corpus, caps, langs, rounds).items():
        run = q.pop("run", None)
        rows[name].update({k: q.get(k) for k in ("p50_ms", "p95_ms", "mean_ms", "p50_en_ms", "p95_en_ms",
                                                  "p50_zh_ms", "p95_zh_ms", "open_s")},
                          query_peak_rss_mb=q.get("peak_rss_mb"), query_rounds=q.get("rounds", 1),
                          queries=q.get("queries"))
        if q.get("error"):
            rows[name]["error"] = q["error"]
        if run is not None:
            rows[name]["ndcg"] = _quality(ctx, run, corpus.qrels, qlang)
            if name == "ragdb":
                rows[name]["run"] = run
        if caps.get(name):
            why = (f"FTS5 runs at most {FTS5_MAX_QUERIES}" if caps[name] == FTS5_MAX_QUERIES and name == "fts5"
                   else f"as many as fit ~{QUERY_BUDGET_S:.0f} s at the slowest system's mean latency at the "
                        "previous size, scaled; every system but FTS5 runs these same queries")
            notes.append(f"{SYSTEMS[name].label} at {tag(size)}: the first {caps[name]} of the {corpus.n_queries} "
                         f"queries (interleaved, so both languages; {why}); its nDCG is over those.")
    exact: dict[str, Any] = {}
    if "ragdb" in built and rows["ragdb"].get("run"):
        ref = _reference(ctx, corpus, meta["sha256"])
        if "error" in ref:
            exact = {"error": ref["error"]}
        else:
            run = rows["ragdb"].pop("run")
            # the queries ragdb ran (all of them, unless its query stage was capped at this size):
            # a query it did not run is not a ranking that differs from the reference
            ran = {q: r for q, r in ref["run"].items() if q in run}
            if len(ran) < len(ref["run"]):
                notes.append(f"ragdb's ranking at {tag(size)} is compared with the reference on the "
                             f"{len(ran)} plain queries its capped query stage ran, of {len(ref['run'])}.")
            exact = compare(run, ran, ref.get("scores"))
            plain_run = {q: run[q] for q in ran}
            exact["ragdb_ndcg"] = _quality(ctx, plain_run, corpus.qrels, qlang)
            exact["reference_ndcg"] = _quality(ctx, ran, corpus.qrels, qlang)
            exact.update(plain=ref["plain"], total=ref["queries"], cached=ref["cached"],
                         analyze_s=ref.get("analyze_s"), score_s=ref.get("score_s"))
            exact["stats"] = ref["stats"]
    rows.get("ragdb", {}).pop("run", None)
    updatable = [n for n in built if n in UPDATE_SCALE_SYSTEMS and not rows[n].get("error")]
    for name, u in update_rounds(ctx, updatable, corpus).items():
        rows[name].update(add_ms=u.get("add_ms"), delete_ms=u.get("delete_ms"), add_max_ms=u.get("add_max_ms"),
                          delete_max_ms=u.get("delete_max_ms"))
        if u.get("error"):
            rows[name]["error"] = u["error"]
    drop_indexes(ctx, corpus)
    for row in rows.values():
        row["n"] = size
    return {"n": size, "rows": rows, "exact": exact, "notes": notes, "meta": meta,
            "seconds": time.perf_counter() - t0}


# ---------------------------------------------------------------- the section


@section("scale")
def section_scale(ctx: Context) -> str:
    started = time.perf_counter()
    sizes = scale_sizes(ctx.args.scale)
    queries, qrels, qlang = judged_queries(ctx)
    log(f"== scale: the realistic corpus at {', '.join(tag(s) for s in sizes)} chunks")
    base, base_exact = _base_corpora(ctx)
    results: dict[int, dict] = {}
    prev: dict[str, dict] | None = None
    deadline = started + STAGE_LIMIT_MIN * 60.0 if sizes[-1] >= BIG else None
    gen_s = 0.0
    for size in sizes:
        t0 = time.perf_counter()
        corpus, meta = realistic(ctx, size, queries, qrels)
        gen_s += time.perf_counter() - t0
        res = measure_size(ctx, corpus, meta, qlang, prev, deadline)
        results[size] = res
        prev = {name: row for name, row in res["rows"].items() if "skipped" not in row and not row.get("error")}
    wall_min = (time.perf_counter() - started) / 60.0
    ctx.results["scale"] = {"sizes": sizes, "results": {str(k): v for k, v in results.items()}, "base": base,
                            "base_exact": base_exact, "wall_min": wall_min, "generate_s": gen_s,
                            "params": PARAMS.__dict__, "seed": SEED}
    return _report(ctx, sizes, results, base, base_exact, qlang, wall_min, gen_s)


def _base_corpora(ctx: Context) -> tuple[dict[str, dict], dict[str, dict]]:
    """The evaluation corpora themselves (SciFact, CMRC): their term statistics, and
    ragdb's ranking of their judged queries against the exhaustive reference (issue 17:
    nDCG@10 on SciFact train and CMRC trial unchanged, pruning being exact)."""
    stats: dict[str, dict] = {}
    exact: dict[str, dict] = {}
    for key in ("scifact", "cmrc"):
        c = ctx.corpora[key]
        if not ctx.ragdb_ok:
            exact[key] = {"error": "ragdb not available"}
            continue
        ref = ctx.run_worker("bm25_reference", "ragdb", c, workers=1)
        stats[key] = ref.get("stats", {})
        b = ctx.run_worker("build", "ragdb", c)
        q = ctx.run_worker("query", "ragdb", c) if "error" not in b else b
        drop_indexes(ctx, c)
        if "error" in ref or "error" in q:
            exact[key] = {"error": ref.get("error") or q.get("error")}
            continue
        run = q["run"]
        res = compare(run, ref["run"], ref.get("scores"))
        plain = {qid: run.get(qid, []) for qid in ref["run"]}
        rels = {qid: c.qrels[qid] for qid in ref["run"] if qid in c.qrels}
        res["ragdb_ndcg"] = ctx.evaluation.evaluate(plain, rels, k_values=(10,)).get("ndcg@10")
        res["reference_ndcg"] = ctx.evaluation.evaluate(ref["run"], rels, k_values=(10,)).get("ndcg@10")
        res["all_ndcg"] = ctx.evaluation.evaluate(run, c.qrels, k_values=(10,)).get("ndcg@10")
        res.update(plain=ref["plain"], total=ref["queries"])
        exact[key] = res
    return stats, exact


# ---------------------------------------------------------------- the report


def _stats_rows(sizes: list[int], results: dict[int, dict], base: dict[str, dict]) -> list[str]:
    lines = ["| corpus | language | documents | terms | vocabulary | Heaps β (prefixes) | terms in one doc "
             "| tf per posting | length p5 / p50 / p95 | query-term df p50 / p90 | postings per query p50 / p95 |",
             "|" + "---|" * 11]

    def row(label: str, lang: str, s: dict) -> None:
        st = s.get(lang) or {}
        if not st.get("docs"):
            return
        pts = [(p[f"T_{lang}"], p[f"V_{lang}"]) for p in s.get("heaps", [])] + [(st["terms"], st["vocabulary"])]
        beta = heaps_beta(pts)
        lp = st.get("length_p5_p50_p95") or [None] * 3
        qd = st.get("query_term_df_p50_p90") or [None] * 2
        qp = st.get("query_postings_p50_p95") or [None] * 2
        lines.append(f"| {label} | {lang} | {st['docs']:,} | {st['terms']:,} | {st['vocabulary']:,} "
                     f"| {fmt(beta, '.2f')} | {fmt(st.get('hapax_share'), '.0%')} "
                     f"| {fmt(st.get('tf_per_posting'), '.2f')} | {' / '.join(fmt(x, '.0f') for x in lp)} "
                     f"| {' / '.join(fmt(x, ',.0f') for x in qd)} | {' / '.join(fmt(x, ',.0f') for x in qp)} |")

    for key, label in (("scifact", "SciFact"), ("cmrc", "CMRC 2018 trial")):
        row(label, "en" if key == "scifact" else "zh", base.get(key, {}))
    for size in sizes:
        st = results[size].get("exact", {}).get("stats")
        if st:
            for lang in ("en", "zh"):
                row(f"realistic {tag(size)}", lang, st)
    return lines


def _growth_beta(sizes: list[int], results: dict[int, dict]) -> list[str]:
    out = []
    for a, b in zip(sizes, sizes[1:]):
        sa, sb = results[a].get("exact", {}).get("stats"), results[b].get("exact", {}).get("stats")
        if not sa or not sb:
            continue
        parts = []
        for lang in ("en", "zh"):
            x, y = sa.get(lang, {}), sb.get(lang, {})
            beta = heaps_beta([(x.get("terms", 0), x.get("vocabulary", 0)), (y.get("terms", 0), y.get("vocabulary", 0))])
            parts.append(f"{lang} {fmt(beta, '.2f')}")
        out.append(f"{tag(a)} → {tag(b)}: {', '.join(parts)}")
    return out


def _report(ctx: Context, sizes: list[int], results: dict[int, dict], base: dict[str, dict],
            base_exact: dict[str, dict], qlang: dict[str, str], wall_min: float, gen_s: float) -> str:
    big = sizes[-1]
    n_en = sum(1 for g in qlang.values() if g == "en")
    n_zh = len(qlang) - n_en
    meta = results[big]["meta"]
    p = PARAMS
    lines = [f"## Scale: realistic corpus at {' / '.join(tag(s) for s in sizes)} chunks", "",
             f"The corpus (`ragbench/realistic.py`, described in benchmarks/README.md): every SciFact document "
             f"and CMRC 2018 trial paragraph unchanged, with its id, among generated documents, "
             f"{meta['n_zh'] / meta['n']:.1%} of them Chinese as in the base corpora. A generated document takes "
             f"runs of words (English; characters in Chinese) from its seed document (share {p.p_topic:g}) or from "
             f"anywhere in its language's base corpus (mean run {p.run_en:g} words, {p.run_zh:g} characters), repeats "
             f"earlier content words ({p.p_self:g} of its English words: burstiness), replaces {p.new_word:g} of "
             f"its English words by new words from a power-law tail (exponent {p.tail_s:g}: vocabulary growth), and "
             f"is as long as a base document times a log-normal jitter. Seed {SEED}; {tag(big)} is "
             f"{meta['bytes'] / 2**30:.2f} GiB (sha256 {meta['sha256'][:12]}); generating the corpora took "
             f"{gen_s:.0f} s this run (cached under benchmarks/.cache/corpora/).", "",
             f"Queries: the {n_en} judged SciFact train queries and the {n_zh} judged CMRC trial queries, "
             f"interleaved; qrels unchanged (the judged documents are in the corpus), so nDCG@10 is measured at "
             f"every size. Before each query stage the system's index files are read once (the OS page cache "
             f"here holds about one 1M-chunk index; each system queries from a warm cache). Latency per query "
             f"after {WARMUP_QUERIES} warm-up queries, p50/p95 over all and per language; query figures are medians of {ctx.args.query_rounds} rounds "
             f"({min(ctx.args.query_rounds, BIG_QUERY_ROUNDS)} at {tag(BIG)} chunks and more) over the systems in turn "
             f"(one round for a system whose p50 is over {REPEAT_QUERY_MS:g} ms); builds run once; add/delete "
             f"median of {UPDATE_OPS} each, {ctx.args.rounds} rounds. The peers index the text with CJK runs "
             f"expanded to character unigrams + bigrams (tantivy `en_stem`, FTS5 `porter unicode61`, bm25s "
             f"English + one-character CJK tokens); rank_bm25 is not run at scale (it scores every document in "
             f"Python for every query).", "",
             "Term statistics (ragdb's analyzer; measured in this run; Heaps β fitted over prefixes of each "
             "corpus from 1/64 to all of it; *terms in one doc*: share of the vocabulary with df 1):", ""]
    lines += _stats_rows(sizes, results, base)
    betas = _growth_beta(sizes, results)
    if betas:
        lines += ["", "Heaps β between sizes (vocabulary vs terms): " + "; ".join(betas) + "."]
    # the main table
    lines += ["", "| chunks | system | build s | query p50 ms | p95 ms | p50 en / zh ms | peak RSS build MiB "
              "| peak RSS query MiB | index MiB | add ms | delete ms | nDCG@10 SciFact | nDCG@10 CMRC |",
              "|" + "---|" * 13]
    for size in sizes:
        for name, row in results[size]["rows"].items():
            label = SYSTEMS[name].label
            if "skipped" in row:
                lines.append(f"| {tag(size)} | {label} | not run: {cell(row['skipped'], 200)} |" + " |" * 10)
                continue
            if row.get("error") and row.get("build_s") is None:
                lines.append(f"| {tag(size)} | {label} | error: {cell(row['error'])} |" + " |" * 10)
                continue
            inc = name in UPDATE_SCALE_SYSTEMS
            nd = row.get("ndcg") or {}
            capped = row.get("queries") and row["queries"] < len(qlang)
            q_note = f" ({row['queries']} q)" if capped else ""
            lines.append(
                f"| {tag(size)} | {label} | {fmt(row.get('build_s'), '.1f')} | {fmt(row.get('p50_ms'), '.2f')}{q_note} "
                f"| {fmt(row.get('p95_ms'), '.2f')} | {fmt(row.get('p50_en_ms'), '.2f')} / {fmt(row.get('p50_zh_ms'), '.2f')} "
                f"| {fmt(row.get('build_peak_rss_mb'), ',.0f')} | {fmt(row.get('query_peak_rss_mb'), ',.0f')} "
                f"| {fmt((row.get('size_bytes') or 0) / 2**20, ',.1f')} "
                f"| {fmt(row.get('add_ms'), '.2f') if inc else 'rebuild'} "
                f"| {fmt(row.get('delete_ms'), '.2f') if inc else 'rebuild'} "
                f"| {fmt(nd.get('en'), '.4f')} | {fmt(nd.get('zh'), '.4f')} |")
    errors = [(size, name, row["error"]) for size in sizes for name, row in results[size]["rows"].items()
              if row.get("error") and row.get("build_s") is not None]
    lines += [f"- {SYSTEMS[name].label} at {tag(size)}: error: `{cell(err, 300)}`" for size, name, err in errors]

    # ratios to tantivy and FTS5, per size
    def rows_at(size: int) -> dict[str, dict]:
        return results[size]["rows"]

    def r_of(size: int, name: str, key: str) -> Any:
        row = rows_at(size).get(name, {})
        return None if "skipped" in row else row.get(key)

    lines += ["", "| ratio | " + " | ".join(tag(s) for s in sizes) + " |", "|---|" + "---|" * len(sizes)]
    for label, key, peer in (("ragdb / tantivy query p50", "p50_ms", "tantivy"),
                             ("ragdb / tantivy query p50, English", "p50_en_ms", "tantivy"),
                             ("ragdb / tantivy query p50, Chinese", "p50_zh_ms", "tantivy"),
                             ("ragdb / tantivy query p95", "p95_ms", "tantivy"),
                             ("ragdb / tantivy build", "build_s", "tantivy"),
                             ("ragdb / tantivy index size", "size_bytes", "tantivy"),
                             ("ragdb / tantivy peak RSS build", "build_peak_rss_mb", "tantivy"),
                             ("ragdb / tantivy peak RSS query", "query_peak_rss_mb", "tantivy"),
                             ("ragdb / bm25s query p50", "p50_ms", "bm25s"),
                             ("ragdb / bm25s build", "build_s", "bm25s"),
                             ("ragdb / FTS5 add", "add_ms", "fts5"),
                             ("ragdb / FTS5 delete", "delete_ms", "fts5")):
        cells = [xfmt(ratio(r_of(s, "ragdb", key), r_of(s, peer, key))) for s in sizes]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")

    # growth from size to size
    names = list(results[big]["rows"])
    if len(sizes) > 1:
        lines += ["", "Growth (the larger size's figure over the smaller's):", "",
                  "| system | " + " | ".join(f"p50 {tag(a)}→{tag(b)}" for a, b in zip(sizes, sizes[1:]))
                  + " | " + " | ".join(f"add {tag(s)}" for s in sizes) + " | "
                  + " | ".join(f"delete {tag(s)}" for s in sizes) + " | add max/min | delete max/min |",
                  "|---|" + "---|" * (len(sizes) - 1 + 2 * len(sizes) + 2)]
        for name in names:
            g = [xfmt(ratio(r_of(b, name, "p50_ms"), r_of(a, name, "p50_ms"))) for a, b in zip(sizes, sizes[1:])]
            adds = [r_of(s, name, "add_ms") for s in sizes]
            dels = [r_of(s, name, "delete_ms") for s in sizes]
            inc = name in UPDATE_SCALE_SYSTEMS
            lines.append(f"| {SYSTEMS[name].label} | " + " | ".join(g) + " | "
                         + " | ".join(fmt(x, ".2f") if inc else "rebuild" for x in adds) + " | "
                         + " | ".join(fmt(x, ".2f") if inc else "rebuild" for x in dels) + " | "
                         + f"{xfmt(_spread(adds)) if inc else '–'} | {xfmt(_spread(dels)) if inc else '–'} |")

    # exactness
    lines += ["", "ragdb's ranking against the exhaustive BM25 reference (`ragbench/reference.py`: every document "
              "scored with ragdb's analyzer and BM25 functions as ragdb's exhaustive path does, so the scores are "
              "bit-identical; queries written in the query language left out). *Up to near-ties*: each of the 10 "
              "has the reference's score at its position within 1e-9 (relative), which a scorer adding the same "
              "terms in another order may need:", "",
              "| chunks | queries compared | top-10 identical | top-10 up to near-ties | top-100 identical "
              "| nDCG@10 SciFact ragdb / reference | nDCG@10 CMRC ragdb / reference | reference |",
              "|---|---|---|---|---|---|---|---|"]

    def exact_row(label: str, ex: dict, nd_en: str, nd_zh: str, how: str) -> None:
        lines.append(f"| {label} | {ex['queries']} of {ex['total']} | {ex['same_top10']} | {ex['same_top10_ties']} "
                     f"| {ex['same_all']} | {nd_en} | {nd_zh} | {how} |")
        if ex.get("differ"):
            lines.append(f"| | top-10 differs for {ex['n_differ']}, e.g. {', '.join(ex['differ'])} | | | | | | |")

    for key, label in (("scifact", "SciFact alone (5,183)"), ("cmrc", "CMRC alone (256)")):
        ex = base_exact.get(key) or {}
        if not ex or "error" in ex:
            lines.append(f"| {label} | {cell(ex.get('error', 'not measured'))} | | | | | | |")
            continue
        nd = f"{fmt(ex['ragdb_ndcg'], '.4f')} / {fmt(ex['reference_ndcg'], '.4f')}"
        exact_row(label, ex, nd if key == "scifact" else "", nd if key == "cmrc" else "",
                  f"nDCG@10 of all {ex['total']} queries {fmt(ex['all_ndcg'], '.4f')}")
    for size in sizes:
        ex = results[size].get("exact") or {}
        if not ex or "error" in ex:
            lines.append(f"| {tag(size)} | {cell(ex.get('error', 'not measured'))} | | | | | | |")
            continue
        rn, fn = ex["ragdb_ndcg"], ex["reference_ndcg"]
        how = ("cached" if ex.get("cached") else
               f"analysis {fmt(ex.get('analyze_s'), '.0f')} s, scoring {fmt(ex.get('score_s'), '.0f')} s")
        exact_row(tag(size), ex, f"{fmt(rn.get('en'), '.4f')} / {fmt(fn.get('en'), '.4f')}",
                  f"{fmt(rn.get('zh'), '.4f')} / {fmt(fn.get('zh'), '.4f')}", how)
    notes = [n for size in sizes for n in results[size]["notes"]]
    per_size = ", ".join(f"{tag(s)}: {results[s]['seconds'] / 60:.1f} min" for s in sizes)
    lines += ["", f"The stage took {wall_min:.1f} min ({per_size}; corpus generation {gen_s:.0f} s)."]
    lines += [f"- {n}" for n in notes]
    _bars(ctx, sizes, results, base_exact, wall_min)
    return "\n".join(lines) + "\n"


def _spread(values: list[Any]) -> float | None:
    xs = [x for x in values if isinstance(x, (int, float)) and x > 0]
    return max(xs) / min(xs) if len(xs) == len(values) and xs else None


def _bars(ctx: Context, sizes: list[int], results: dict[int, dict], base_exact: dict[str, dict],
          wall_min: float) -> None:
    big = sizes[-1]
    for key, name in (("scifact", "SciFact train"), ("cmrc", "CMRC trial")):
        ex = base_exact.get(key) or {}
        label = f"{name} ranking = exhaustive BM25's (top-10 of every plain query, up to near-ties)"
        if not ex or "error" in ex:
            bar(ctx, label, None, cell(ex.get("error", "not measured")))
        else:
            bar(ctx, label, ex["same_top10_ties"] == ex["queries"],
                f"{ex['same_top10_ties']}/{ex['queries']} equal ({ex['same_top10']} identical); nDCG@10 "
                f"{fmt(ex['ragdb_ndcg'], '.4f')} vs {fmt(ex['reference_ndcg'], '.4f')}")

    def r_of(size: int, name: str, key: str) -> Any:
        row = results[size]["rows"].get(name, {})
        return None if "skipped" in row else row.get(key)

    def cmp(label: str, x: float | None, limit: float) -> None:
        bar(ctx, label, None if x is None else x <= limit, "not measured" if x is None else f"{x:.2f}×")

    # the bars these replace (issue 29 set them anew)
    ctx.retired_bars += [r"query p50 ≤ 1\.5× tantivy's at \S+", r"query p50 ≤ 3× tantivy's at every size.*",
                         r"add ≤ 5× FTS5's at \S+", r"(add|delete) flat within 1\.5× from .*"]
    # issue 29's bars: query p50 ≤ 1.0× tantivy's at 1M (and past it), ≤ 1.5× below, in each
    # language; p95 ≤ 2× everywhere; build ≤ 2× at 100k and at the scale size; size, build RSS
    # and query RSS at the scale size; add ≤ 5× FTS5's (pooled medians) at every size; delete's
    # growth from the smallest size within 1.5× of FTS5's own growth, same run
    for size in sizes:
        limit = 1.0 if size >= BIG else 1.5
        for key, lang in (("p50_en_ms", "English"), ("p50_zh_ms", "Chinese")):
            cmp(f"query p50 ≤ {limit:g}× tantivy's at {tag(size)}, {lang}",
                ratio(r_of(size, "ragdb", key), r_of(size, "tantivy", key)), limit)
    worst95 = [(x, tag(s)) for s in sizes
               if (x := ratio(r_of(s, "ragdb", "p95_ms"), r_of(s, "tantivy", "p95_ms"))) is not None]
    if worst95:
        x, where = max(worst95)
        bar(ctx, f"query p95 ≤ 2× tantivy's at every size ({', '.join(tag(s) for s in sizes)})", x <= 2.0,
            f"worst {x:.2f}× ({where})")
    else:
        bar(ctx, "query p95 ≤ 2× tantivy's at every size", None, "not measured")
    t = tag(big)
    for size in sorted({s for s in sizes if s >= MID} | {big}):
        cmp(f"build ≤ 2× tantivy's at {tag(size)}",
            ratio(r_of(size, "ragdb", "build_s"), r_of(size, "tantivy", "build_s")), 2.0)
    cmp(f"index size ≤ 1.5× tantivy's at {t}",
        ratio(r_of(big, "ragdb", "size_bytes"), r_of(big, "tantivy", "size_bytes")), 1.5)
    cmp(f"build peak RSS ≤ 1.5× tantivy's at {t}",
        ratio(r_of(big, "ragdb", "build_peak_rss_mb"), r_of(big, "tantivy", "build_peak_rss_mb")), 1.5)
    cmp(f"query peak RSS ≤ tantivy's at {t}",
        ratio(r_of(big, "ragdb", "query_peak_rss_mb"), r_of(big, "tantivy", "query_peak_rss_mb")), 1.0)
    for size in sizes:
        cmp(f"add ≤ 5× FTS5's at {tag(size)} (median of every round's adds pooled)",
            ratio(r_of(size, "ragdb", "add_ms"), r_of(size, "fts5", "add_ms")), 5.0)
        cmp(f"delete ≤ 2× FTS5's at {tag(size)}",
            ratio(r_of(size, "ragdb", "delete_ms"), r_of(size, "fts5", "delete_ms")), 2.0)
    if len(sizes) > 1:
        first = sizes[0]
        growth = {name: ratio(r_of(big, name, "delete_ms"), r_of(first, name, "delete_ms")) for name in ("ragdb", "fts5")}
        rel = None if None in growth.values() else ratio(growth["ragdb"], growth["fts5"])
        bar(ctx, f"delete's growth from {tag(first)} to {t} within 1.5× of FTS5's own", None if rel is None else rel <= 1.5,
            "not measured" if rel is None else
            f"{rel:.2f}× (ragdb {growth['ragdb']:.2f}×, FTS5 {growth['fts5']:.2f}×)")
    for size in sizes:
        ex = results[size].get("exact") or {}
        label = f"ranking = exhaustive BM25's at {tag(size)} (top-10 of every plain query, up to near-ties)"
        if not ex or "error" in ex:
            bar(ctx, label, None, cell(ex.get("error", "not measured")))
            continue
        bar(ctx, label, ex["same_top10_ties"] == ex["queries"],
            f"{ex['same_top10_ties']}/{ex['queries']} equal ({ex['same_top10']} identical); nDCG@10 SciFact "
            f"{fmt(ex['ragdb_ndcg'].get('en'), '.4f')} vs {fmt(ex['reference_ndcg'].get('en'), '.4f')}, CMRC "
            f"{fmt(ex['ragdb_ndcg'].get('zh'), '.4f')} vs {fmt(ex['reference_ndcg'].get('zh'), '.4f')}")
    if big >= BIG:
        bar(ctx, f"the {t} stage within {STAGE_LIMIT_MIN:.0f} min", wall_min <= STAGE_LIMIT_MIN, f"{wall_min:.1f} min")
