"""Constants and small helpers shared by the parent and the workers.

Only the standard library and orjson at import time, so a worker's peak RSS is
its system's and not the harness's.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import orjson

REPO = Path(__file__).resolve().parents[2]  # benchmarks/ragbench/common.py -> the repository root
DEFAULT_DATA = REPO.parent / "shared" / "data"  # == <repo>/../shared/data
K = 100  # hits retrieved per query
WARMUP_QUERIES = 20
UPDATE_OPS = 20  # timed adds and deletes, each its own commit


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def peak_rss_mb() -> float:
    """Peak resident set size of this process (VmHWM), in MiB, plus the largest
    peak of its finished child processes (ragdb's bulk loads analyze text in
    worker processes; their memory counts too)."""
    import resource

    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024.0
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0 + children
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0 + children


def percentile(values: list[float], p: float) -> float:
    """The ``p``-th percentile with linear interpolation (numpy's default)."""
    if not values:
        return float("nan")
    xs = sorted(values)
    pos = (len(xs) - 1) * p / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def median(values: list[float]) -> float:
    return percentile(values, 50)


def ms_since(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000.0


def lat_summary(lat: list[float]) -> dict:
    return {"p50_ms": percentile(lat, 50), "p95_ms": percentile(lat, 95), "mean_ms": sum(lat) / len(lat) if lat else None,
            "n": len(lat)}


def path_size(path: Path) -> int:
    """Bytes of a file, or of all files under a folder."""
    if path.is_file():
        return path.stat().st_size
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:
                pass
    return total


def iter_docs(path: Path) -> Iterator[tuple[str, str]]:
    """Stream ``(doc_id, text)`` from a prepared docs file (one JSON pair a line)."""
    with open(path, "rb") as fh:
        for line in fh:
            doc_id, text = orjson.loads(line)
            yield doc_id, text


def read_pairs(path: Path) -> list[tuple[str, str]]:
    return list(iter_docs(path))

