"""Sections ``serve`` (issue 16) and ``serve_backends`` (issue 31): load tests of ``ragdb serve``;
worker stage ``serve_load``.

The worker builds a ragdb database of SciFact (one chunk per document), starts
``ragdb serve --workers 2`` on a free loopback port (a subprocess importing the run's
snapshot), and runs 16 concurrent clients (threads, each with its own keep-alive
``httpx.Client``) for 30 s (10 s with ``--quick``): each request is a search (80%: a
judged query, k=10, anonymous) or a write (20%: ``POST /documents`` of a new source with
a writer token). Then, with the load stopped: every write must be readable through the
server (``GET /documents/ID``, the text as written) and in the file (``db.get``), and
the server's hits for 200 judged queries must equal ``db.search``'s on the same file.
Runnable alone::

    .venv/bin/python benchmarks/run.py --sections serve --merge

``serve_backends`` (issue 31's bar: 16 clients for 30 s with one writer, 0 errors, p99
reported, on SQLite and PostgreSQL) runs the same stage in its other mode, on both
backends: 16 reading clients (judged queries, k=10, anonymous; every third with a
metadata filter) and one more client that only writes (``POST /documents`` of a new
source, one after the other), then the same checks. PostgreSQL: $RAGDB_BENCH_PG, else a
throwaway cluster of scripts/pg-test-cluster (as the ``postgres`` section); the database is
a schema of its own, dropped afterwards. ``benchmarks/serve_load.py`` runs it alone and
merges it into BENCHMARKS.md (``run.py --sections serve_backends --merge``).
"""

from __future__ import annotations

import math
import os
import random
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import orjson

from ..common import log, percentile, read_pairs
from ..harness import Context, section, worker_stage
from ..report import bar, cell, fmt, ratio

CLIENTS = 16
SECONDS = 30
QUICK_SECONDS = 10
WORKERS = 2
WRITE_SHARE = 0.2
SEARCH_K = 10
CHECK_QUERIES = 200
SEED = 16
TOKEN = "bench-writer-token-0123456789abcdef"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@worker_stage("serve_load")
def _stage_serve(spec: dict) -> dict:
    folder = Path(spec["folder"])
    folder.mkdir(parents=True, exist_ok=True)
    backend = spec.get("backend", "sqlite")
    if backend == "postgresql":  # a schema of its own on the bench server, dropped at the end
        from ..peers import pg_admin, pg_schema, pg_url

        kb: str | Path = pg_url(folder)
        schema = pg_schema(str(kb))
        pg_admin(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        pg_admin(f"CREATE SCHEMA {schema}")
    else:
        kb = folder / "kb.db"
    try:
        return _serve(spec, kb, folder)
    finally:
        if backend == "postgresql":
            pg_admin(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def _serve(spec: dict, kb: str | Path, folder: Path) -> dict:
    """Build the database at ``kb`` (a file or a PostgreSQL URL), serve it, load it, check it."""
    import httpx

    import ragdb

    docs = read_pairs(Path(spec["docs"]))
    queries = [text for _qid, text in read_pairs(Path(spec["queries"]))]
    t0 = time.perf_counter()
    with ragdb.open(kb) as db:
        db.add_many(({"text": t, "source": d, "metadata": {"lang": "en" if i % 3 else "de"}}
                     for i, (d, t) in enumerate(docs)), chunker="none")
    build_s = time.perf_counter() - t0
    tokens = folder / "tokens.json"
    # a publisher: public documents under load/ only (since issue 31 a token writes within its scope;
    # its principals alone would let it write only documents labelled "bench", which anonymous
    # searches do not see)
    tokens.write_bytes(orjson.dumps({TOKEN: {"principals": ["bench"],
                                             "write": {"public": True, "labels": [], "sources": ["load/"]}}}))
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if k != "RAGDB_API_TOKEN"}
    env["PYTHONPATH"] = spec["src"]
    err_path = folder / "serve.err"
    with open(err_path, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "ragdb.cli", "serve", "-d", str(kb), "--port", str(port),
                                 "--workers", str(spec["workers"]), "--tokens", str(tokens)],
                                env=env, stdout=subprocess.DEVNULL, stderr=err)
    out: dict[str, Any] = {"documents": len(docs), "build_s": build_s, "clients": spec["clients"],
                           "seconds": spec["seconds"], "workers": spec["workers"],
                           "mode": spec.get("mode", "share")}
    t_start = time.perf_counter()
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"ragdb serve exited: {err_path.read_text()[-500:]}")
            try:
                if httpx.get(url + "/healthz", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("ragdb serve did not start in 120 s")
            time.sleep(0.1)
        out["start_s"] = time.perf_counter() - t_start
        out.update(_load(url, queries, docs, spec))
        t0 = time.perf_counter()
        out.update(_verify(url, kb, queries, out.pop("written")))
        out["verify_s"] = time.perf_counter() - t0
    finally:
        t0 = time.perf_counter()
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
        out["stop_s"] = time.perf_counter() - t0
    out["server_traceback"] = "Traceback" in err_path.read_text()
    return out


def _load(url: str, queries: list[str], docs: list[tuple[str, str]], spec: dict) -> dict[str, Any]:
    """``clients`` threads for ``seconds`` (mode ``share``: each request a write with probability
    :data:`WRITE_SHARE`; mode ``writer``: the clients only search, every third with a filter,
    and one more thread only writes): latencies per kind, errors, and what was written."""
    import httpx

    stop_at = time.perf_counter() + spec["seconds"]
    latencies: dict[str, list[float]] = {"search": [], "write": []}
    errors: list[str] = []
    written: list[tuple[str, int, str]] = []  # (source, id, text)
    lock = threading.Lock()
    one_writer = spec.get("mode", "share") == "writer"
    threads_n = spec["clients"] + (1 if one_writer else 0)
    start = threading.Barrier(threads_n + 1)

    def client(n: int) -> None:
        rng = random.Random(SEED * 1000 + n)
        mine: dict[str, list[float]] = {"search": [], "write": []}
        my_errors: list[str] = []
        my_writes: list[tuple[str, int, str]] = []
        with httpx.Client(base_url=url, timeout=60) as http:
            start.wait()
            i = 0
            while time.perf_counter() < stop_at:
                write = n == spec["clients"] if one_writer else rng.random() < WRITE_SHARE
                if write:
                    source = f"load/{n}/{i}.md"
                    text = f"Load test note {n}-{i}. " + rng.choice(docs)[1][:1500]
                    request: dict[str, Any] = {"method": "POST", "url": "/documents",
                                               "json": {"text": text, "source": source},
                                               "headers": {"Authorization": f"Bearer {TOKEN}"}}
                else:
                    body: dict[str, Any] = {"query": rng.choice(queries), "k": SEARCH_K}
                    if one_writer and i % 3 == 0:
                        body["filter"] = {"lang": "en"}
                    request = {"method": "POST", "url": "/search", "json": body}
                t0 = time.perf_counter()
                try:
                    r = http.request(**request)
                    ms = (time.perf_counter() - t0) * 1000.0
                    if r.status_code != (201 if write else 200):
                        my_errors.append(f"{r.status_code} {r.text[:200]}")
                    elif write:
                        my_writes.append((source, int(r.json()["id"]), text))
                except httpx.HTTPError as e:
                    ms = (time.perf_counter() - t0) * 1000.0
                    my_errors.append(f"{type(e).__name__}: {e}")
                mine["write" if write else "search"].append(ms)
                i += 1
        with lock:
            for kind, values in mine.items():
                latencies[kind] += values
            errors.extend(my_errors)
            written.extend(my_writes)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(threads_n)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    every = latencies["search"] + latencies["write"]
    out: dict[str, Any] = {"wall_s": wall, "errors": len(errors), "error_samples": errors[:5], "written": written}
    for kind, values in (("search", latencies["search"]), ("write", latencies["write"]), ("all", every)):
        out[kind] = {"requests": len(values), "p50_ms": percentile(values, 50), "p99_ms": percentile(values, 99),
                     "per_s": len(values) / wall if wall > 0 else None}
    return out


def _verify(url: str, kb: str | Path, queries: list[str], written: list[tuple[str, int, str]]) -> dict[str, Any]:
    """After the load: every write readable through the server and in the file; the server's
    hits equal the library's."""
    import httpx

    import ragdb

    missing: list[str] = []
    with httpx.Client(base_url=url, timeout=60, headers={"Authorization": f"Bearer {TOKEN}"}) as http, \
            ragdb.open(kb) as db:
        for source, doc_id, text in written:
            r = http.get(f"/documents/{doc_id}")
            if r.status_code != 200 or r.json().get("text") != text or r.json().get("source") != source:
                missing.append(f"server {source}: {r.status_code}")
                continue
            try:
                doc = db.get(source=source)
            except ragdb.RagdbError as e:
                missing.append(f"library {source}: {e}")
                continue
            if (doc.id, doc.text) != (doc_id, text):
                missing.append(f"library {source}: id {doc.id} text differs")
        sample = random.Random(SEED).sample(queries, min(CHECK_QUERIES, len(queries)))
        same_ids = exact = 0
        max_diff = 0.0
        diffs: list[str] = []
        for q in sample:
            got = httpx.post(url + "/search", json={"query": q, "k": SEARCH_K}).json()["hits"]  # a new connection
            want = db.search(q, SEARCH_K)
            if [h["chunk_id"] for h in got] == [h.chunk_id for h in want]:
                same_ids += 1
                d = max((abs(h["score"] - w.score) for h, w in zip(got, want)), default=0.0)
                max_diff = max(max_diff, d)
                exact += d == 0.0
            else:
                diffs.append(q[:80])
        stored = db.count(principals=ragdb.ALL)
    return {"writes": len(written), "writes_missing": len(missing), "missing_samples": missing[:5],
            "check_queries": len(sample), "same_hits": same_ids, "exact_scores": exact,
            "max_score_diff": max_diff, "differing_queries": diffs[:5], "stored_after": stored}


@section("serve")
def section_serve(ctx: Context) -> str:
    head = ["## HTTP API under load: `ragdb serve --workers 2` (issue 16)", ""]
    names = ["ragdb serve load test: 0 errors (16 clients, 30 s, 2 workers)",
             "ragdb serve: every write visible afterwards, hits equal the library's"]
    if not ctx.ragdb_ok:
        for name in names:
            bar(ctx, name, None, "ragdb not available")
        return "\n".join(head + ["ragdb not available: not measured.", ""])
    corpus = ctx.corpora["scifact"]
    seconds = QUICK_SECONDS if ctx.args.quick else SECONDS
    log(f"== serve: {CLIENTS} clients for {seconds} s on {WORKERS} workers")
    r = ctx.run_worker("serve_load", "ragdb", corpus, folder=str(ctx.workdir / "serve"), clients=CLIENTS,
                       seconds=seconds, workers=WORKERS)
    ctx.results["serve"] = {k: v for k, v in r.items() if k not in ("error_samples", "missing_samples")}
    if "error" in r:
        for name in names:
            bar(ctx, name, False, f"worker failed: {cell(r['error'])}")
        return "\n".join(head + [f"worker failed: {cell(r['error'])}", ""])
    ok_errors = r["errors"] == 0 and not r["server_traceback"]
    ok_visible = r["writes_missing"] == 0 and r["same_hits"] == r["check_queries"] and r["max_score_diff"] <= 1e-9
    bar(ctx, names[0], ok_errors, f"{r['errors']} errors in {r['all']['requests']:,} requests"
        + ("; the server logged a traceback" if r["server_traceback"] else ""))
    bar(ctx, names[1], ok_visible, f"{r['writes'] - r['writes_missing']:,} of {r['writes']:,} writes visible; "
        f"{r['same_hits']} of {r['check_queries']} queries with the library's hits")

    def row(kind: str, label: str) -> str:
        s = r[kind]
        return (f"| {label} | {s['requests']:,} | {fmt(s['p50_ms'], '.1f')} | {fmt(s['p99_ms'], '.1f')} "
                f"| {fmt(s['per_s'], '.0f')} |")

    cores = os.cpu_count() or 0
    lines = head + [
        f"`ragdb serve -d kb.db --workers {WORKERS} --tokens tokens.json` on 127.0.0.1 over SciFact "
        f"({r['documents']:,} documents, one chunk each), {CLIENTS} concurrent clients for {r['seconds']} s (threads "
        f"in one process, each with its own keep-alive connection, on the same {cores}-core machine as the "
        f"server): {100 * (1 - WRITE_SHARE):.0f}% searches (a judged query, k={SEARCH_K}, anonymous), "
        f"{100 * WRITE_SHARE:.0f}% writes (`POST /documents` of a new source, ~1,500 characters, with a token "
        "that may write; each its own transaction, from either worker process). Latency is each request's "
        "round trip as the client sees it, queueing included.",
        "",
        "| requests | count | p50 ms | p99 ms | throughput (req/s) |",
        "|---|---|---|---|---|",
        row("search", "search"), row("write", "write"), row("all", "all"),
        "",
        f"- Errors (a status other than 200/201, or a transport error): **{r['errors']}**"
        + (f" (e.g. {cell('; '.join(r['error_samples']))})" if r["error_samples"] else "") + ".",
        f"- After the load: {r['writes'] - r['writes_missing']:,} of {r['writes']:,} writes read back as written, "
        "through the server (`GET /documents/ID`) and from the file (`db.get`)"
        + (f" (missing: {cell('; '.join(r['missing_samples']))})" if r["missing_samples"] else "")
        + f"; the database holds {r['stored_after']:,} documents. {r['same_hits']} of {r['check_queries']} "
        f"judged queries got the library's hits (`db.search` on the same file: chunk ids in order), "
        f"{r['exact_scores']} with bit-identical scores (largest score difference "
        f"{r['max_score_diff']:.1e}).",
        f"- Building the database took {r['build_s']:.1f} s; the run's wall time {r['wall_s']:.1f} s.",
        "",
    ]
    if math.isnan(r["all"]["p50_ms"]):
        lines.insert(-1, "- No request completed.")
    return "\n".join(lines)


BACKENDS = (("sqlite", "SQLite"), ("postgresql", "PostgreSQL"))


@section("serve_backends")
def section_serve_backends(ctx: Context) -> str:
    """Issue 31's bar: 16 reading clients and one writer for 30 s on each backend."""
    from .postgres import _server, _server_facts, _stop

    head = [f"## `ragdb serve` under load on SQLite and PostgreSQL: {CLIENTS} clients and one writer (issue 31)", ""]
    seconds = QUICK_SECONDS if ctx.args.quick else SECONDS
    names = {key: f"ragdb serve, {CLIENTS} clients + 1 writer for {seconds} s on {label}: 0 errors, p99 reported"
             for key, label in BACKENDS}
    if not ctx.ragdb_ok:
        for name in names.values():
            bar(ctx, name, None, "ragdb not available")
        return "\n".join(head + ["ragdb not available: not measured.", ""])
    corpus = ctx.corpora["scifact"]
    results: dict[str, dict[str, Any]] = {}
    pg_facts = ""
    for key, label in BACKENDS:
        log(f"== serve_backends: {label}, {CLIENTS} clients + 1 writer for {seconds} s on {WORKERS} workers")
        cluster = None
        if key == "postgresql":
            try:
                cluster = _server(ctx)
                pg_facts = _server_facts()[0]
            except Exception as e:  # no server, no binaries, no permission: reported, not fatal
                results[key] = {"error": f"no PostgreSQL server: {e}"}
                _stop(cluster)
                continue
        try:
            results[key] = ctx.run_worker("serve_load", "ragdb", corpus, folder=str(ctx.workdir / f"serve-{key}"),
                                          clients=CLIENTS, seconds=seconds, workers=WORKERS, backend=key,
                                          mode="writer")
        finally:
            _stop(cluster)
    ctx.results["serve_backends"] = {k: {x: v for x, v in r.items() if x not in ("error_samples", "missing_samples")}
                                     for k, r in results.items()}
    rows = []
    notes = []
    for key, label in BACKENDS:
        r = results[key]
        if "error" in r:
            bar(ctx, names[key], None if key == "postgresql" and "no PostgreSQL" in r["error"] else False,
                f"not measured: {cell(r['error'])}")
            rows.append(f"| {label} | error: {cell(r['error'])} |" + " |" * 8)
            continue
        ok = r["errors"] == 0 and not r["server_traceback"] and r["writes_missing"] == 0 \
            and r["same_hits"] == r["check_queries"]
        bar(ctx, names[key], ok, f"{r['errors']} errors in {r['all']['requests']:,} requests; search p99 "
            f"{fmt(r['search']['p99_ms'], '.1f')} ms, write p99 {fmt(r['write']['p99_ms'], '.1f')} ms"
            + ("; the server logged a traceback" if r["server_traceback"] else ""))
        s, w = r["search"], r["write"]
        rows.append(f"| {label} | {r['all']['requests']:,} | **{r['errors']}** | {fmt(r['all']['per_s'], '.0f')} "
                    f"| {fmt(s['p50_ms'], '.1f')} | {fmt(s['p99_ms'], '.1f')} | {w['requests']:,} "
                    f"| {fmt(w['p50_ms'], '.1f')} | {fmt(w['p99_ms'], '.1f')} |")
        notes.append(
            f"- {label}: {r['writes'] - r['writes_missing']:,} of {r['writes']:,} writes read back as written "
            "(through the server and from the database)"
            + (f" (missing: {cell('; '.join(r['missing_samples']))})" if r["missing_samples"] else "")
            + f"; {r['same_hits']} of {r['check_queries']} judged queries got the library's hits "
            f"({r['exact_scores']} with bit-identical scores); building took {r['build_s']:.1f} s, the load "
            f"{r['wall_s']:.1f} s"
            + (f"; errors, e.g.: {cell('; '.join(r['error_samples']))}" if r["error_samples"] else "")
            + ("; **the server logged a traceback**" if r["server_traceback"] else "") + ".")
    ratio_line = ""
    sq, pg = results.get("sqlite", {}), results.get("postgresql", {})
    if "all" in sq and "all" in pg:
        x = ratio(pg["all"]["per_s"], sq["all"]["per_s"])
        y = ratio(pg["search"]["p99_ms"], sq["search"]["p99_ms"])
        ratio_line = (f"- PostgreSQL / SQLite: throughput {fmt(x, '.2f')}×, search p99 {fmt(y, '.2f')}×. On this "
                      "machine the database server, the two server workers and the 17 client threads share the "
                      "same few cores (and other jobs ran on it): read the ratios, not the lone figures.")
    cores = os.cpu_count() or 0
    lines = head + [
        f"`ragdb serve -d DB --workers {WORKERS} --tokens tokens.json` on 127.0.0.1 over SciFact "
        f"({corpus.n_docs:,} documents, one chunk each, a `lang` metadata field), {CLIENTS} clients searching "
        f"and one more client writing, for {seconds} s, on each backend in turn (threads in one process, each "
        f"with its own keep-alive connection, on the same {cores}-core machine as the server): the clients "
        f"`POST /search` a judged query (k={SEARCH_K}, anonymous; every third with the filter "
        "`{\"lang\": \"en\"}`) one after the other; the writer `POST /documents` a new source (~1,500 "
        "characters, each its own transaction) one after the other, with a token that may write public "
        "documents under `load/`. "
        "Latency is each request's round trip as its client sees it, queueing included. Errors: a status other "
        "than 200/201, or a transport error. SQLite: a file in WAL mode; PostgreSQL: "
        + (pg_facts + ", the database a schema of its own." if pg_facts else "not available in this run."),
        "",
        "| backend | requests | errors | req/s | search p50 ms | search p99 ms | writes | write p50 ms "
        "| write p99 ms |",
        "|" + "---|" * 9,
        *rows,
        "",
        *notes,
        *([ratio_line] if ratio_line else []),
        "",
    ]
    return "\n".join(lines)
