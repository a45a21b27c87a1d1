"""The long reliability run: concurrency, SIGKILL crashes, disk full / read-only, hostile input.

One command, from the repository root:

    .venv/bin/python benchmarks/reliability.py            # the long run, ~10 min on 2 cores
    .venv/bin/python benchmarks/reliability.py --quick    # the CI sizes (a trial; writes nothing)

The long run uses 60 s of concurrent load with 6 reader processes and 6
threads, 300 kills, and 3x the torture cases with 50 MB single-line files; it
rewrites the *Long run* section of RELIABILITY.md (``--no-write``: only print).
Exit status 1 when any expectation fails (the failures are printed). The
scenarios are the ones ``tests/test_reliability.py`` runs at CI sizes; they
live in ``tests/reliability_worker.py``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import reliability_worker as rw  # noqa: E402

LONG = {
    "concurrency": {"seconds": 60.0, "readers": 6, "threads": 6, "seed": 101, "check_every": 3.0},
    "crashes": {"kills": 300, "seed": 107, "max_delay": 1.0, "cli_checks": 10},
    "torture": {"seed": 111, "scale": 3.0, "big_mb": 50, "token_mb": 1, "deep": 100_000,
                "case_timeout": 60.0, "heavy_timeout": 900.0},
}
QUICK = {
    "concurrency": {"seconds": 5.0, "readers": 3, "threads": 3, "seed": 1, "check_every": 2.0},
    "crashes": {"kills": 22, "seed": 7, "max_delay": 0.4, "cli_checks": 2},
    "torture": {"seed": 11, "scale": 1.0, "big_mb": 5, "token_mb": 1, "deep": 50_000,
                "case_timeout": 30.0, "heavy_timeout": 120.0},
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="CI sizes (implies --no-write)")
    ap.add_argument("--no-write", action="store_true", help="print the figures, do not touch RELIABILITY.md")
    ap.add_argument("--only", choices=rw.SCENARIOS, action="append",
                    help="run only this scenario (repeatable; implies --no-write)")
    ap.add_argument("--kills", type=int, help="override the number of kills")
    ap.add_argument("--seconds", type=float, help="override the seconds of concurrent load")
    ap.add_argument("--workdir", help="keep the databases here (default: a temporary folder)")
    args = ap.parse_args(argv)
    sizes = {k: dict(v) for k, v in (QUICK if args.quick else LONG).items()}
    if args.kills:
        sizes["crashes"]["kills"] = args.kills
    if args.seconds:
        sizes["concurrency"]["seconds"] = args.seconds
    only = args.only or list(rw.SCENARIOS)
    write = not (args.quick or args.no_write or args.only or args.kills or args.seconds)
    figures: dict = {}
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ragdb-reliability-") as tmp:
        work = Path(args.workdir or tmp)
        for name in only:
            t = time.monotonic()
            print(f"== {name} ...", flush=True)
            if name == "concurrency":
                figures[name] = rw.run_concurrency(work / name, **sizes[name])
            elif name == "crashes":
                figures[name] = rw.run_crashes(work / name, **sizes[name])
            elif name == "faults":
                figures[name] = rw.run_faults(work / name)
            else:
                figures[name] = rw.run_torture(work / name, **sizes[name])
            print(f"   {time.monotonic() - t:.1f} s", flush=True)
    figures["machine"] = rw.machine()
    figures["total_s"] = round(time.monotonic() - t0, 1)
    failed = rw.failures(figures)
    print(json.dumps({k: v for k, v in figures.items() if k != "torture"}, indent=1, default=str)[:20000])
    if "torture" in figures:
        t = figures["torture"]
        print(json.dumps({k: t[k] for k in ("cases", "wall_s", "per_class", "findings", "check",
                                            "baseline_unchanged")}, indent=1, default=str))
    if write:
        rw.write_report("long", figures)
        print(f"wrote the Long run section of {rw.REPORT}")
    for f in failed:
        print(f"FAILED: {f}")
    print("all expectations hold" if not failed else f"{len(failed)} expectations failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
