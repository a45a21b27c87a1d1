"""Load on a real ``ragdb serve``: N reading clients and one writer for S seconds (issue 31's bar:
16 clients for 30 s with one writer, 0 errors, p99 reported), on SQLite and, when
``RAGDB_TEST_PG`` (or ``--pg URL``) names a PostgreSQL server, on PostgreSQL too.

    .venv/bin/python benchmarks/serve_load.py                      # 16 clients, 30 s, SQLite (+ PostgreSQL)
    .venv/bin/python benchmarks/serve_load.py --clients 4 --seconds 5 --docs 200

Each reader is a thread with its own keep-alive connection, sending ``POST /search`` (a word
from a fixed list, every third one with a filter); the writer adds and replaces documents with
``POST /documents`` as the administrator. Reports requests, errors (any status but 200/201, or a
transport error), requests a second and the p50/p95/p99 latency of reads and writes.
"""

from __future__ import annotations

import argparse
import os
import random
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import ragdb  # noqa: E402

WORDS = ("cats", "mat", "dogs", "park", "physics", "ferrets", "burrows", "river", "planet", "garden", "light",
         "music", "stone", "winter", "market", "engine")


def _corpus(n: int) -> list[dict[str, object]]:
    rng = random.Random(31)
    return [{"text": " ".join(rng.choice(WORDS) for _ in range(60)), "source": f"docs/{i}.md",
             "metadata": {"lang": "en" if i % 3 else "de", "n": i}} for i in range(n)]


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def run(database: str, label: str, clients: int, seconds: float, workers: int, docs: int) -> dict[str, object]:
    with ragdb.open(database) as db:
        db.add_many(_corpus(docs))
    token = secrets.token_urlsafe(32)
    port = _free_port()
    env = {**os.environ, "RAGDB_API_TOKEN": token, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "ragdb.cli", "serve", "-d", database, "--port", str(port),
                             "--workers", str(workers)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit(f"{label}: the server did not start")
            time.sleep(0.1)
        reads: list[float] = []
        writes: list[float] = []
        errors: list[str] = []
        lock = threading.Lock()
        stop = time.monotonic() + seconds

        def reader(n: int) -> None:
            rng = random.Random(n)
            mine: list[float] = []
            with httpx.Client(base_url=url, timeout=30) as client:
                i = 0
                while time.monotonic() < stop:
                    body: dict[str, object] = {"query": f"{rng.choice(WORDS)} {rng.choice(WORDS)}", "k": 10}
                    if i % 3 == 0:
                        body["filter"] = {"lang": "en"}
                    t = time.perf_counter()
                    try:
                        r = client.post("/search", json=body)
                        ok = r.status_code == 200
                        why = f"search {r.status_code}: {r.text[:200]}"
                    except httpx.HTTPError as e:
                        ok, why = False, f"search {type(e).__name__}: {e}"
                    mine.append(time.perf_counter() - t)
                    if not ok:
                        with lock:
                            errors.append(why)
                    i += 1
            with lock:
                reads.extend(mine)

        def writer() -> None:
            rng = random.Random(0)
            with httpx.Client(base_url=url, timeout=60, headers={"Authorization": f"Bearer {token}"}) as client:
                i = 0
                while time.monotonic() < stop:
                    body = {"text": " ".join(rng.choice(WORDS) for _ in range(60)),
                            "source": f"live/{i % 50}.md", "metadata": {"lang": "en"}}
                    t = time.perf_counter()
                    try:
                        r = client.post("/documents", json=body)
                        ok = r.status_code == 201
                        why = f"add {r.status_code}: {r.text[:200]}"
                    except httpx.HTTPError as e:
                        ok, why = False, f"add {type(e).__name__}: {e}"
                    writes.append(time.perf_counter() - t)
                    if not ok:
                        with lock:
                            errors.append(why)
                    i += 1

        threads = [threading.Thread(target=reader, args=(n,)) for n in range(clients)]
        threads.append(threading.Thread(target=writer))
        started = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.monotonic() - started
    finally:
        proc.terminate()
        proc.wait(30)
    ms = lambda v: round(v * 1000, 1)  # noqa: E731
    return {"backend": label, "clients": clients, "seconds": round(elapsed, 1), "reads": len(reads),
            "writes": len(writes), "errors": len(errors), "first_errors": errors[:3],
            "req_per_s": round((len(reads) + len(writes)) / elapsed, 1),
            "read_p50_ms": ms(statistics.median(reads)) if reads else None,
            "read_p95_ms": ms(_percentile(reads, 95)), "read_p99_ms": ms(_percentile(reads, 99)),
            "write_p50_ms": ms(statistics.median(writes)) if writes else None,
            "write_p99_ms": ms(_percentile(writes, 99))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--docs", type=int, default=2000)
    ap.add_argument("--pg", default=os.environ.get("RAGDB_TEST_PG"), help="a PostgreSQL URL (default $RAGDB_TEST_PG)")
    args = ap.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as folder:
        results.append(run(str(Path(folder) / "kb.db"), "sqlite", args.clients, args.seconds, args.workers,
                           args.docs))
    if args.pg:
        schema = f"load_{secrets.token_hex(4)}"
        sep = "&" if "?" in args.pg else "?"
        url = f"{args.pg}{sep}options=-csearch_path%3D{schema}"
        import psycopg
        with psycopg.connect(args.pg, autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA "{schema}"')  # a fresh, throwaway schema (a generated name)
        try:
            results.append(run(url, "postgresql", args.clients, args.seconds, args.workers, args.docs))
        finally:
            with psycopg.connect(args.pg, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
    keys = ("backend", "clients", "seconds", "reads", "writes", "errors", "req_per_s", "read_p50_ms",
            "read_p95_ms", "read_p99_ms", "write_p50_ms", "write_p99_ms")
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for r in results:
        print("| " + " | ".join(str(r[k]) for k in keys) + " |")
    for r in results:
        if r["errors"]:
            print(f"{r['backend']}: first errors: {r['first_errors']}")
    sys.exit(1 if any(r["errors"] for r in results) else 0)


if __name__ == "__main__":
    main()
