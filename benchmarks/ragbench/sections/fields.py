"""Section ``fields`` (issue 15): the weights of a chunk's title and heading path in scoring.

Three corpora, each built once with its titles and headings as fields (ragdb.text.fields), then
searched under every pair of weights of a grid (the weights change no term, so no rebuild):

* SciFact train and CMRC 2018 trial: one chunk a document, ``title + blank line + text`` as
  the text (as every system of the quality section indexes them) and the title as the
  title field too;
* npm's documentation (``benchmarks/data/npm-docs.jsonl``: the 83 Markdown pages of npm
  10.9.9's ``docs/content``, Artistic License 2.0, © npm, Inc. and contributors) loaded by
  ragdb's Markdown loader (front matter title, ``###`` headings as the heading path) and
  chunked by the default chunker, with 65 questions written for this benchmark
  (``npm-queries.jsonl``), each judged by the page(s) answering it; a hit counts for its page.

The weights chosen: the pair with the best mean nDCG@10 over the three among those where
neither SciFact nor CMRC is below weights 0 (plain-question quality must not drop); the
benchmark says whether that is ``ragdb.text.fields.DEFAULT_WEIGHTS``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import orjson

from ..common import REPO, log
from ..corpora import CORPORA
from ..harness import Context, section, worker_stage
from ..report import bar, fmt

TITLE_WEIGHTS = (0.0, 0.25, 0.5, 1.0, 2.0)
SECTION_WEIGHTS = (0.0, 0.25, 0.5, 1.0)
NPM_DOCS = REPO / "benchmarks" / "data" / "npm-docs.jsonl"
NPM_QUERIES = REPO / "benchmarks" / "data" / "npm-queries.jsonl"


@worker_stage("fields_eval")
def _stage_fields_eval(spec: dict) -> dict:
    import ragdb
    from ragdb.answers import evaluation
    from ragdb.files.loaders import load_bytes

    name = spec["target"]
    t0 = time.perf_counter()
    db = ragdb.open(":memory:", chunker="none" if name != "npm" else None)
    if name == "npm":
        docs = []
        for line in NPM_DOCS.read_bytes().splitlines():
            item = orjson.loads(line)
            docs.extend(load_bytes(item["markdown"].encode("utf-8"), source=item["path"], kind="md"))
        db.add_many(docs)
        queries, qrels = {}, {}
        for line in NPM_QUERIES.read_bytes().splitlines():
            q = orjson.loads(line)
            queries[q["_id"]] = q["text"]
            qrels[q["_id"]] = dict.fromkeys(q["relevant"], 1)
    else:
        c = CORPORA[name]
        corpus, queries, qrels = evaluation.load_beir(Path(spec["data"]) / c["folder"], split=c["split"])
        db.add_many({"text": f"{title}\n\n{text}" if title else text, "source": doc_id, "title": title or None}
                    for doc_id, title, text in corpus)
        if spec.get("max_queries"):
            keep = [qid for qid in queries if qid in qrels][:spec["max_queries"]]
            queries = {q: queries[q] for q in keep}
            qrels = {q: qrels[q] for q in keep}
    build_s = time.perf_counter() - t0
    chunks = db.stats().chunks
    rows = []
    for wt in spec["title"]:
        for ws in spec["section"]:
            db.set_field_weights({"title": wt, "section": ws})
            m = evaluation.evaluate_database(db, queries, qrels, k=100)
            rows.append({"title": wt, "section": ws, "ndcg10": m["ndcg@10"], "recall100": m["recall@100"],
                         "mrr10": m["mrr@10"], "queries": m["queries"]})
    db.close()
    return {"rows": rows, "build_s": build_s, "chunks": chunks}


def choose(results: dict[str, dict]) -> tuple[float, float] | None:
    """The grid's choice (see the module docstring)."""
    grid = {(r["title"], r["section"]): {} for r in results["scifact"]["rows"]}
    for name, res in results.items():
        for r in res["rows"]:
            grid[(r["title"], r["section"])][name] = r["ndcg10"]
    base = grid[(0.0, 0.0)]
    fine = [w for w, m in grid.items() if m["scifact"] >= base["scifact"] and m["cmrc"] >= base["cmrc"]]
    if not fine:
        return None
    return max(fine, key=lambda w: (sum(grid[w].values()) / len(grid[w]), -w[0] - w[1]))


@section("fields")
def section_fields(ctx: Context) -> str:
    import ragdb.text.fields

    names = ["scifact", "cmrc", "npm"]
    log("== fields: title and heading weights on SciFact, CMRC and npm's docs")
    results: dict[str, dict] = {}
    for name in names:
        spec: dict[str, Any] = {"target": name, "data": str(ctx.args.data), "title": list(TITLE_WEIGHTS),
                                "section": list(SECTION_WEIGHTS)}
        if ctx.args.quick and name != "npm":
            spec["max_queries"] = 300
        results[name] = ctx.run_worker("fields_eval", "ragdb", ctx.corpora["scifact"], **spec)
    bar_names = ["default field weights: SciFact and CMRC nDCG@10 not below weights 0",
                 "default field weights are the grid's choice"]
    lines = ["## Fields: title and heading path weights (issue 15)", "",
             "Each corpus built once with titles (and, for npm's docs, Markdown headings) as fields, then "
             "searched (BM25, k=100) under every pair of weights: a query word scores its BM25 in the text plus, "
             "per field, the field's weight times its BM25 there without length normalisation (ragdb/text/fields.py). "
             "SciFact and CMRC index `title + text` as the text (as the quality section does) and the title as "
             "the title field too; npm's docs (83 Markdown pages of npm 10.9.9, 65 questions written for this "
             "benchmark, a hit counting for its page) go through ragdb's Markdown loader and default chunker. "
             f"Queries: {'the first 300 judged' if ctx.args.quick else 'all judged'} (SciFact, CMRC), 65 (npm).",
             ""]
    errors = {n: r["error"] for n, r in results.items() if "error" in r}
    if errors:
        for b in bar_names:
            bar(ctx, b, None, "not measured: error")
        return "\n".join(lines + [f"- {n}: error `{e}`" for n, e in errors.items()] + [""])
    lines += ["| title weight | heading weight | SciFact nDCG@10 | CMRC nDCG@10 | npm docs nDCG@10 | npm MRR@10 | mean |",
              "|---|---|---|---|---|---|---|"]
    by = {n: {(r["title"], r["section"]): r for r in res["rows"]} for n, res in results.items()}
    chosen = choose(results)
    default = (float(ragdb.text.fields.DEFAULT_WEIGHTS["title"]), float(ragdb.text.fields.DEFAULT_WEIGHTS["section"]))
    for w in by["scifact"]:
        vals = [by[n][w]["ndcg10"] for n in names]
        mark = " **(chosen)**" if w == chosen else ""
        mark += " (default)" if w == default else ""
        lines.append(f"| {w[0]:g}{mark} | {w[1]:g} | {vals[0]:.4f} | {vals[1]:.4f} | {vals[2]:.4f} "
                     f"| {by['npm'][w]['mrr10']:.4f} | {sum(vals) / 3:.4f} |")
    base = by["scifact"][(0.0, 0.0)]["ndcg10"], by["cmrc"][(0.0, 0.0)]["ndcg10"], by["npm"][(0.0, 0.0)]["ndcg10"]
    lines += ["", f"- Builds: SciFact {fmt(results['scifact']['build_s'], '.1f')} s "
                  f"({results['scifact']['chunks']:,} chunks), CMRC {fmt(results['cmrc']['build_s'], '.1f')} s, "
                  f"npm docs {fmt(results['npm']['build_s'], '.1f')} s ({results['npm']['chunks']:,} chunks)."]
    if chosen is not None:
        gains = [by[n][chosen]["ndcg10"] - b for n, b in zip(names, base)]
        lines.append(f"- Chosen: title {chosen[0]:g}, heading {chosen[1]:g}: nDCG@10 against weights 0 "
                     f"SciFact {gains[0]:+.4f}, CMRC {gains[1]:+.4f}, npm docs {gains[2]:+.4f}.")
    lines.append("")
    d = by["scifact"].get(default), by["cmrc"].get(default)
    ok = None if d[0] is None or d[1] is None else (d[0]["ndcg10"] >= base[0] and d[1]["ndcg10"] >= base[1])
    bar(ctx, bar_names[0], ok, "not on the grid" if ok is None else
        f"SciFact {d[0]['ndcg10']:.4f} vs {base[0]:.4f}, CMRC {d[1]['ndcg10']:.4f} vs {base[1]:.4f}")
    bar(ctx, bar_names[1], chosen == default, f"chosen {chosen}, default {default}")
    ctx.results["fields"] = {n: r["rows"] for n, r in results.items()}
    return "\n".join(lines)
