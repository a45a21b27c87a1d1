"""Section ``cli`` (issue 29, "CLI start"): how long a ``ragdb`` command takes to start, against
``python -c "import sqlite3, json"`` in the same run (the floor any Python CLI pays); worker stage
``cli_build`` builds the SciFact database that ``ragdb search`` opens, and a small CMRC one.

Each round runs, one after the other, the floor, ``ragdb --help``, ``ragdb --version``, one
``ragdb search`` (one SciFact query, k=10, the default output) and one search of the CMRC
database as fresh processes of this Python with the run's snapshot of ragdb first on ``sys.path``;
the report gives each one's median wall time and its ratio to the floor's median.

The CMRC database (256 paragraphs) is a small knowledge base as most start: below the flush
threshold, so every chunk and term is still unflushed (the tail and ``new_terms``), which is what
``ragdb add`` of a few files leaves and every later ``ragdb search`` opens. A search that costs more
there (a change that reads every unflushed term first measured 133 ms instead of 35 for its first
search) shows in this row; the SciFact database is flushed. Runnable alone::

    .venv/bin/python benchmarks/run.py --sections cli --merge
"""

from __future__ import annotations

import compileall
import os
import subprocess
import sys
import time
from pathlib import Path

from ..common import iter_docs, log, median, read_pairs
from ..harness import Context, section, worker_stage
from ..report import bar, fmt

ROUNDS = 15
QUICK_ROUNDS = 5
BAR_HELP = 3.0    # ragdb --help ≤ 3× the floor
BAR_SEARCH = 5.0  # one ragdb search on SciFact ≤ 5× the floor


@worker_stage("cli_build")
def _stage_cli_build(spec: dict) -> dict:
    """A database ``ragdb search`` opens (one chunk a document, the default analyzer): SciFact's,
    flushed, or the small CMRC one, whose chunks are all still unflushed."""
    import ragdb

    path = Path(spec["index_dir"]) / "cli.db"
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        path.unlink()
    with ragdb.open(str(path)) as db:
        db.add_many(({"text": t, "source": d} for d, t in iter_docs(Path(spec["docs"]))), chunker="none")
        stats = db.stats()
    return {"path": str(path), "chunks": stats.chunks, "pending": stats.pending_chunks}


def _timed(argv: list[str], env: dict[str, str], cwd: Path) -> float:
    """One command's wall time. ``cwd``: a folder without ragdb in it (``python -c`` puts the
    current folder first on ``sys.path``: run from a checkout, the commands imported its ragdb,
    not the run's snapshot, and without bytecode where PYTHONDONTWRITEBYTECODE is set)."""
    t0 = time.perf_counter()
    proc = subprocess.run(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          timeout=120)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:4])}...: exit {proc.returncode}: {proc.stderr.strip()[-300:]}")
    return elapsed


@section("cli")
def section_cli(ctx: Context) -> str:
    head = ["## CLI start: `ragdb --help` and one `ragdb search` against Python's own start (issue 29)", ""]
    names = [f"`ragdb --help` ≤ {BAR_HELP:g}× `python -c \"import sqlite3, json\"`",
             f"one `ragdb search` on SciFact ≤ {BAR_SEARCH:g}× `python -c \"import sqlite3, json\"`"]
    if not ctx.ragdb_ok:
        for name in names:
            bar(ctx, name, None, "ragdb not available")
        return "\n".join(head + ["ragdb not available: not measured.", ""])
    corpus = ctx.corpora["scifact"]
    built = ctx.run_worker("cli_build", "ragdb", corpus, index_dir=str(ctx.workdir / "cli"))
    if "error" in built:
        for name in names:
            bar(ctx, name, None, "build failed")
        return "\n".join(head + [f"build failed: {built['error']}", ""])
    query = read_pairs(Path(corpus.queries_path))[0][1]
    small_corpus = ctx.corpora.get("cmrc")
    small = (ctx.run_worker("cli_build", "ragdb", small_corpus, index_dir=str(ctx.workdir / "cli-small"))
             if small_corpus is not None else {"error": "no CMRC corpus"})
    env = {**os.environ, "PYTHONPATH": str(ctx.src)}
    env.pop("RAGDB_DATABASE", None)
    ragdb_cmd = [sys.executable, "-c", "from ragdb.cli.main import main; main()"]
    commands = {
        "floor": [sys.executable, "-c", "import sqlite3, json"],
        "help": [*ragdb_cmd, "--help"],
        "version": [*ragdb_cmd, "--version"],
        "search": [*ragdb_cmd, "-d", built["path"], "search", query, "-k", "10"],
    }
    if "error" not in small:  # (there is one when small_corpus is None)
        assert small_corpus is not None
        small_query = read_pairs(Path(small_corpus.queries_path))[0][1]
        commands["search_small"] = [*ragdb_cmd, "-d", small["path"], "search", small_query, "-k", "10"]
    rounds = QUICK_ROUNDS if ctx.args.quick else ROUNDS
    times: dict[str, list[float]] = {name: [] for name in commands}
    # The snapshot is copied without __pycache__, and PYTHONDONTWRITEBYTECODE (set on some
    # machines) keeps Python from writing it: every start would then compile ragdb's sources
    # (measured: some 170 ms of a 450 ms search), which no installed ragdb does (pip compiles
    # them at install). Compiled once here, with the Python the commands run.
    compileall.compile_dir(str(ctx.src / "ragdb"), quiet=1)
    cwd = ctx.workdir / "cli"
    for argv in commands.values():  # warm the page cache and the bytecode caches once
        _timed(argv, env, cwd)
    for _ in range(rounds):
        for name, argv in commands.items():
            times[name].append(_timed(argv, env, cwd))
    med = {name: median(values) for name, values in times.items()}
    ratios = {name: med[name] / med["floor"] for name in commands}
    log("cli start: " + ", ".join(f"{n} {1000 * med[n]:.0f} ms ({ratios[n]:.2f}×)" for n in commands))
    ctx.results["cli"] = {"median_ms": {n: 1000 * med[n] for n in commands}, "ratio": ratios,
                          "rounds": rounds, "chunks": built["chunks"], "small": small}
    bar(ctx, names[0], ratios["help"] <= BAR_HELP, f"{ratios['help']:.2f}×")
    bar(ctx, names[1], ratios["search"] <= BAR_SEARCH, f"{ratios['search']:.2f}×")
    if "search_small" in commands:
        about_small = (f" The last row searches a small CMRC knowledge base ({small['chunks']:,} chunks, "
                       f"{small['pending']:,} of them not yet flushed: as `ragdb add` of a few files leaves one); "
                       "no bar, it shows what a first search costs before any flush.")
    else:
        about_small = f" The small CMRC knowledge base was not measured ({small.get('error')})."
    lines = head + [
        f"Medians of {rounds} interleaved rounds, each command a fresh process (SciFact: {built['chunks']:,} "
        "chunks; the search prints the default output of 10 hits)." + about_small, "",
        "| command | median ms | × floor |", "|---|---|---|",
    ]
    labels = {"floor": '`python -c "import sqlite3, json"`', "help": "`ragdb --help`",
              "version": "`ragdb --version`", "search": "`ragdb search QUERY -k 10`",
              "search_small": "`ragdb search QUERY -k 10`, small unflushed CMRC knowledge base"}
    for name in commands:
        lines.append(f"| {labels[name]} | {fmt(1000 * med[name], '.0f')} | {ratios[name]:.2f}× |")
    lines.append("")
    return "\n".join(lines)
