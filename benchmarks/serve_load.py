"""Load on a real ``ragdb serve``, SQLite and PostgreSQL (issue 31's bar: 16 clients for 30 s
with one writer, 0 errors, p99 reported), merged into BENCHMARKS.md.

    .venv/bin/python benchmarks/serve_load.py --data /work/shared/data     # 16 clients + 1 writer, 30 s each
    .venv/bin/python benchmarks/serve_load.py --pg postgresql://... --quick --out /tmp/load.md

It runs the benchmark's ``serve_backends`` section alone (``benchmarks/run.py --sections
serve_backends --merge``; the measurement is in ``ragbench/sections/serve.py``): over SciFact
(``--data``, BEIR layout), ``ragdb serve --workers 2`` on a fresh SQLite file, then on a fresh
schema of a PostgreSQL server, each loaded by 16 searching clients and one writing client for
30 s (10 s with ``--quick``). The section (a table of both backends: requests, errors, req/s,
search and write p50/p99) and its bars replace their old versions in the report (``--out``,
default BENCHMARKS.md), with this command and the commit named under the section.

PostgreSQL: ``--pg URL``, else $RAGDB_TEST_PG, else a throwaway cluster that
``scripts/pg-test-cluster start --durable`` starts and stops for the run. Exit status 1 when
a bar fails (an error, a write not read back, a server traceback).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import orjson

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import run  # noqa: E402  (benchmarks/run.py, next to this script)
from ragbench.common import DEFAULT_DATA, REPO  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pg", default=os.environ.get("RAGDB_TEST_PG"),
                    help="a PostgreSQL server URL (default $RAGDB_TEST_PG; neither: a throwaway cluster)")
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help=f"BEIR data folder (default {DEFAULT_DATA})")
    ap.add_argument("--out", type=Path, default=REPO / "BENCHMARKS.md", help="the report to merge into")
    ap.add_argument("--quick", action="store_true", help="10 s a backend instead of 30")
    args = ap.parse_args()
    if args.pg:
        os.environ["RAGDB_BENCH_PG"] = args.pg
    argv = ["--sections", "serve_backends", "--merge", "--systems", "ragdb", "--data", str(args.data),
            "--out", str(args.out)] + (["--quick"] if args.quick else [])
    # the command as the report names it: the server's URL (it may hold a password) is not written
    named = list(sys.argv[1:])
    for i, a in enumerate(named):
        if a.startswith("--pg="):
            named[i] = "--pg=URL"
        elif a == "--pg" and i + 1 < len(named):
            named[i + 1] = "URL"
    command = ".venv/bin/python benchmarks/serve_load.py" + "".join(f" {a}" for a in named)
    status = run.main(argv, command=command)
    results = orjson.loads((HERE / ".cache" / "last-results.json").read_bytes())
    failed = [name for name, ok, _detail in results["bars"] if ok is False]
    for name in failed:
        print(f"FAIL: {name}", file=sys.stderr)
    return status or (1 if failed else 0)


if __name__ == "__main__":
    sys.exit(main())
