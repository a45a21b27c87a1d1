"""Section ``operators`` (issue 15): the query language's cost at ``--scale`` chunks.

One ragdb database of SciFact replicated to ``--scale`` documents; for each of the first
SciFact train queries, variants run in turn (so a slow spell of the shared machine hits
all alike), each timed on its own after warm-up:

* ``words`` / ``"phrase"``: two words adjacent in the query that also stand adjacent in
  some corpus document (a phrase a user would quote), unquoted and quoted;
* ``query`` / ``query -x``: the query, and the query excluding a word held by about 5%
  of the documents (chosen once from the corpus);
* ``query`` / ``prefix*``: the query with its longest word cut to a 5-letter prefix;
* ``query`` / ``fuzzy~``: the query with its longest word misspelled (two inner letters
  swapped) and marked ``~``; and ``did you mean``: the query plan of the misspelled query
  (``Database.query_plan``: the unknown word's suggestions);
* ``highlight``: the query with ``highlight=True`` (snippets and spans of 10 hits).
"""

from __future__ import annotations

import gc
import re
import shutil
import time
from collections import Counter
from pathlib import Path
from typing import Any

from ..common import WARMUP_QUERIES, iter_docs, lat_summary, log, ms_since, read_pairs
from ..corpora import replicate_corpus
from ..harness import Context, section, worker_stage
from ..report import bar, fmt, na_bars, ratio, xfmt

_WORD = re.compile(r"[A-Za-z]{3,}")
VARIANTS = ("query", "words", "phrase", "exclude", "prefix", "fuzzy", "did_you_mean", "highlight")


def _misspell(word: str) -> str:
    mid = len(word) // 2
    return word[:mid - 1] + word[mid] + word[mid - 1] + word[mid + 1:]


@worker_stage("operators_build")
def _stage_build(spec: dict) -> dict:
    import ragdb

    folder = Path(spec["index_dir"])
    folder.mkdir(parents=True, exist_ok=True)
    gc.collect()
    t0 = time.perf_counter()
    with ragdb.open(str(folder / "ragdb.db")) as db:
        db.add_many(({"text": text, "source": doc_id} for doc_id, text in iter_docs(Path(spec["docs"]))),
                    chunker="none")
        return {"build_s": time.perf_counter() - t0, "chunks": db.stats().chunks}


@worker_stage("operators_query")
def _stage_query(spec: dict) -> dict:
    import ragdb

    docs = [text.lower() for _id, text in iter_docs(Path(spec["base_docs"]))]
    queries = [text for _qid, text in read_pairs(Path(spec["queries"]))]
    an = ragdb.Analyzer()
    stop = set(an.dropped(" ".join({w for q in queries for w in _WORD.findall(q)})))
    df: Counter[str] = Counter()
    for text in docs:
        df.update(set(_WORD.findall(text)))
    target = len(docs) * 0.05
    excluded = min((w for w, n in df.items() if len(w) > 4), key=lambda w: (abs(df[w] - target), w))
    joined = "\n".join(docs)
    cases = []
    for text in queries:
        words = [w for w in _WORD.findall(text) if (w.lower(), "English stopword") not in stop and an.terms(w)]
        pair = next((f"{a} {b}" for a, b in zip(words, words[1:]) if f"{a} {b}" in text
                     and re.search(rf"(?<![\w-]){re.escape(f'{a} {b}'.lower())}(?![\w-])", joined)), None)
        longest = max(words, key=len, default=None)
        if pair is None or longest is None or len(longest) < 7:
            continue
        cases.append({
            "query": text.replace('"', " "), "words": pair, "phrase": f'"{pair}"',
            "exclude": f"{text.replace(chr(34), ' ')} -{excluded}",
            "prefix": text.replace('"', " ").replace(longest, longest[:5] + "*", 1),
            "fuzzy": text.replace('"', " ").replace(longest, _misspell(longest) + "~", 1),
            "did_you_mean": text.replace('"', " ").replace(longest, _misspell(longest), 1),
            "highlight": text.replace('"', " ")})
    lat: dict[str, list[float]] = {v: [] for v in VARIANTS}
    hits: dict[str, int] = dict.fromkeys(VARIANTS, 0)
    suggested = 0
    with ragdb.open(str(Path(spec["index_dir"]) / "ragdb.db")) as db:

        def run(variant: str, case: dict[str, str]) -> float:
            t0 = time.perf_counter()
            if variant == "did_you_mean":
                plan = db.query_plan(case[variant])
                found = len(plan.suggestions)
            elif variant == "highlight":
                found = len(db.search(case[variant], k=10, highlight=True))
            else:
                found = len(db.search(case[variant], k=10))
            elapsed = ms_since(t0)
            hits[variant] += found
            return elapsed

        for case in cases[:WARMUP_QUERIES]:
            for v in VARIANTS:
                run(v, case)
        gc.collect()
        hits = dict.fromkeys(VARIANTS, 0)
        for case in cases:
            for v in VARIANTS:
                lat[v].append(run(v, case))
        suggested = hits["did_you_mean"]
    return {"cases": len(cases), "excluded": excluded, "excluded_df": df[excluded], "base_docs": len(docs),
            "variants": {v: {**lat_summary(lat[v]), "hits": hits[v]} for v in VARIANTS},
            "suggested": suggested, "example": cases[0] if cases else None}


BARS = ["phrase query p50 ≤ 2× the same words unquoted at {tag}",
        "exclusion p50 ≤ 1.5× the query without it at {tag}",
        "prefix query p50 ≤ 2× the exact query at {tag}",
        "fuzzy query p50 ≤ 2× the exact query at {tag}",
        "did-you-mean (query plan of a misspelled query) p50 ≤ 2× the exact query at {tag}"]


@section("operators")
def section_operators(ctx: Context) -> str:
    n = ctx.args.scale
    tag = f"{n // 1000}k"
    names = [b.format(tag=tag) for b in BARS]
    head = [f"## Query language: cost of operators at {n:,} chunks (issue 15)", ""]
    if not ctx.ragdb_ok:
        na_bars(ctx, names, "ragdb not available")
        return "\n".join(head + ["ragdb not available: not measured.", ""])
    base = ctx.corpora["scifact"]
    max_q = 200 if ctx.args.quick else 600
    log(f"== operators: SciFact replicated to {n:,} documents")
    corpus = replicate_corpus(ctx, base, n, f"scifact-{n}", max_q)
    folder = ctx.workdir / "index" / f"operators-{n}"
    shutil.rmtree(folder, ignore_errors=True)
    b = ctx.run_worker("operators_build", "ragdb", corpus, index_dir=str(folder))
    q = ctx.run_worker("operators_query", "ragdb", corpus, index_dir=str(folder), base_docs=str(base.docs_path)) \
        if "error" not in b else {}
    shutil.rmtree(folder, ignore_errors=True)
    lines = head + [
        f"SciFact replicated to {n:,} documents (one chunk each), one worker, the first {max_q} SciFact train "
        "queries that have two adjacent words also adjacent in some document and a word of 7+ letters "
        f"({q.get('cases', 0)} cases), each variant in turn for each query after {WARMUP_QUERIES} warm-up cases, "
        "k=10 (section docstring in benchmarks/ragbench/sections/operators.py).", ""]
    err = b.get("error") or q.get("error")
    if err:
        na_bars(ctx, names, "not measured: error")
        return "\n".join(lines + [f"error: `{err}`", ""])
    v = q["variants"]
    lines += ["| variant | p50 ms | p95 ms | against | ratio (p50) | hits |", "|---|---|---|---|---|---|"]
    pairs = [("query", None), ("words", None), ("phrase", "words"), ("exclude", "query"), ("prefix", "query"),
             ("fuzzy", "query"), ("did_you_mean", "query"), ("highlight", "query")]
    ratios: dict[str, Any] = {}
    for name, against in pairs:
        r = ratio(v[name]["p50_ms"], v[against]["p50_ms"]) if against else None
        ratios[name] = r
        lines.append(f"| {name.replace('_', ' ')} | {fmt(v[name]['p50_ms'], '.2f')} | {fmt(v[name]['p95_ms'], '.2f')} "
                     f"| {against or ''} | {xfmt(r) if r else ''} | {v[name]['hits']:,} |")
    ex = q.get("example") or {}
    lines += ["", f"- Excluded word: `{q['excluded']}` (in {q['excluded_df']:,} of the {q['base_docs']:,} SciFact "
              f"documents, about 5%). Did you mean: {q['suggested']:,} suggestions over {q['cases']} misspelled "
              "queries.",
              f"- Example case: words `{ex.get('words')}`, prefix `{ex.get('prefix')}`, fuzzy `{ex.get('fuzzy')}`.",
              f"- Build: {fmt(b.get('build_s'), '.1f')} s, {b.get('chunks', 0):,} chunks.",
              f"- Every search here collapses copies (one hit per passage, the default since f8b6223), and "
              f"each SciFact document is here {n // max(1, q['base_docs'])} times or more: a search ranks and "
              "builds many more hits than the 10 distinct passages it returns, which the plain query's p50 "
              "shows (2.64 ms in the run of 2026-12-02, before collapsing). A variant with fewer than 10 "
              "distinct passages to find returns fewer hits. The highlight variant searches the same text as "
              "the query variant just before it, so it finds that search's hits built and shingled: its ratio "
              "is the highlighting, not the search.", ""]
    limits = [("phrase", 2.0), ("exclude", 1.5), ("prefix", 2.0), ("fuzzy", 2.0), ("did_you_mean", 2.0)]
    for bar_name, (name, limit) in zip(names, limits):
        r = ratios[name]
        bar(ctx, bar_name, None if r is None else r <= limit, xfmt(r))
    ctx.results["operators"] = {"n": n, "query": q, "build": b}
    return "\n".join(lines)
