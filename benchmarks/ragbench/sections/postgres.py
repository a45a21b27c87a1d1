"""Section ``postgres`` (issue 18): ragdb on PostgreSQL against ragdb on SQLite, in the same run.

SciFact and SciFact replicated to ``--scale`` documents: build, query p50/p95, add/delete
one document, index size, for ``ragdb`` (SQLite) and ``ragdb-pg`` (PostgreSQL), with the
ratios PostgreSQL / SQLite; the postings' blob storage (the schema keeps PostgreSQL's
default, EXTENDED with pglz, against EXTERNAL, uncompressed, and lz4); throughput of 1, 4 and 8
client processes querying while one process writes, on both backends; and where
PostgreSQL's time goes (statements per operation, time inside them). No bar: the issue sets
none for PostgreSQL yet.

The server: $RAGDB_BENCH_PG when set, else a throwaway cluster that scripts/pg-test-cluster
starts for the section with durable settings (``--durable``: fsync and synchronous_commit on,
as a production server; SQLite runs WAL with synchronous=NORMAL, which does not fsync each
commit) and stops at its end. Every index is a schema of its own, dropped afterwards.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

from ..common import REPO, UPDATE_OPS, log, median, percentile, read_pairs
from ..corpora import replicate_corpus
from ..harness import SYSTEMS, Context, query_rounds, section, update_rounds, worker_stage
from ..report import cell, fmt, ratio

SYSTEMS_PG = ["ragdb", "ragdb-pg", "ragdb-pg-external", "ragdb-pg-lz4"]
UPDATED = ["ragdb", "ragdb-pg"]
CLIENTS = (1, 4, 8)


def _server(ctx: Context) -> str | None:
    """The bench server's URL: $RAGDB_BENCH_PG, or a cluster started now (its folder is
    remembered for :func:`_stop`)."""
    if os.environ.get("RAGDB_BENCH_PG"):
        return None
    script = REPO / "scripts" / "pg-test-cluster"
    done = subprocess.run(["bash", str(script), "start", "--durable", "--no-replica"], capture_output=True,
                          text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError("scripts/pg-test-cluster: " + " ".join((done.stderr or done.stdout).split())[-300:])
    env = dict(line[len("export "):].split("=", 1) for line in done.stdout.splitlines() if line.startswith("export "))
    os.environ["RAGDB_BENCH_PG"] = env["RAGDB_TEST_PG"].strip("'")
    return env["RAGDB_PG_CLUSTER_DIR"].strip("'")


def _stop(cluster: str | None) -> None:
    if cluster:
        subprocess.run(["bash", str(REPO / "scripts" / "pg-test-cluster"), "stop", cluster], capture_output=True,
                       timeout=300)
        os.environ.pop("RAGDB_BENCH_PG", None)


def _server_facts() -> list[str]:
    import psycopg

    with psycopg.connect(os.environ["RAGDB_BENCH_PG"]) as conn:
        version = conn.execute("SHOW server_version").fetchone()[0]
        settings = {k: conn.execute(f"SHOW {k}").fetchone()[0]  # constant names
                    for k in ("fsync", "synchronous_commit", "shared_buffers", "wal_level")}
    return [f"PostgreSQL {version} on this machine (loopback TCP, scram-sha-256), "
            + ", ".join(f"{k}={v}" for k, v in settings.items())]


@section("postgres")
def section_postgres(ctx: Context) -> str:
    try:
        cluster = _server(ctx)
    except (RuntimeError, OSError, subprocess.TimeoutExpired, KeyError) as e:
        log(f"== postgres: no server: {e}")
        return f"## PostgreSQL\n\nNot run: no PostgreSQL server ({cell(str(e), 300)}).\n"
    made: list[Path] = []  # index folders of the PostgreSQL systems: their schemas are dropped at the end
    try:
        return _run(ctx, made)
    finally:
        for folder in made:
            try:
                SYSTEMS["ragdb-pg"].drop(folder)
            except Exception:  # the schema may never have been made, or the server is gone
                pass
        _stop(cluster)


def _run(ctx: Context, made: list[Path]) -> str:
    n = ctx.args.scale
    base = ctx.corpora["scifact"]
    big = replicate_corpus(ctx, base, n, f"scifact-{n}", 100 if ctx.args.quick else 300)
    made += [ctx.index_dir(c, name) for c in (base, big) for name in SYSTEMS_PG[1:]]
    ctx.results["postgres"] = {}
    facts = _server_facts()
    log(f"== postgres: {facts[0]}")
    tables: list[str] = []
    measured: dict[str, dict[str, dict]] = {}
    for label, corpus in (("SciFact", base), (f"SciFact ×{n // base.n_docs} ({n:,} documents)", big)):
        rows: dict[str, dict] = {}
        for name in SYSTEMS_PG:
            b = ctx.run_worker("build", name, corpus)
            rows[name] = {"build_s": b.get("build_s"), "size_bytes": b.get("size_bytes"), "error": b.get("error")}
        ok = [name for name in SYSTEMS_PG if not rows[name].get("error")]
        for name, q in query_rounds(ctx, ok, corpus).items():
            q.pop("run", None)
            rows[name].update(p50_ms=q.get("p50_ms"), p95_ms=q.get("p95_ms"), error=q.get("error"))
        for name, u in update_rounds(ctx, [x for x in UPDATED if x in ok], corpus).items():
            rows[name].update(add_ms=u.get("add_ms"), delete_ms=u.get("delete_ms"), error=u.get("error"))
        measured[corpus.key] = rows
        tables.append(_table(label, rows))
    thr = _throughput(ctx, base)
    prof = ctx.run_worker("pg_profile", "ragdb-pg", base)
    ctx.results["postgres"].update(measured=measured, profile=prof, server=facts,
                                   throughput={name: {str(c): r for c, r in by.items()} for name, by in thr.items()})
    lines = ["## PostgreSQL", "",
             "ragdb on PostgreSQL (`ragdb.open(\"postgresql://...\")`, issue 18) against ragdb on SQLite, "
             "measured in this run, the same calls through the same adapter (one document = one chunk). "
             f"{facts[0]}; each index a schema of its own. Query latency: the first {base.n_queries} "
             "SciFact train queries, k=100, after 20 warm-up queries (medians of the rounds); add/delete: one "
             f"document, each its own transaction, median of {UPDATE_OPS}. No ratio bar is set for "
             "PostgreSQL (the issue sets none yet).", ""]
    lines += tables
    lines += _throughput_table(thr)
    lines += _profile_lines(prof, measured.get(base.key, {}))
    return "\n".join(lines) + "\n"


def _table(label: str, rows: dict[str, dict]) -> str:
    out = [f"### {label}", "",
           "| system | build s | query p50 ms | p95 ms | add ms | delete ms | index MiB |", "|" + "---|" * 7]
    for name, r in rows.items():
        if r.get("error") and r.get("build_s") is None:
            out.append(f"| {SYSTEMS[name].label} | error: {cell(r['error'])} |" + " |" * 5)
            continue
        out.append(f"| {SYSTEMS[name].label} | {fmt(r.get('build_s'), '.1f')} | {fmt(r.get('p50_ms'), '.2f')} "
                   f"| {fmt(r.get('p95_ms'), '.2f')} | {fmt(r.get('add_ms'), '.2f')} | {fmt(r.get('delete_ms'), '.2f')} "
                   f"| {fmt((r.get('size_bytes') or 0) / 2**20, '.1f')} |")
    s, p = rows.get("ragdb", {}), rows.get("ragdb-pg", {})
    out += ["", "| PostgreSQL / SQLite | ratio |", "|---|---|"]
    for what, key in (("build", "build_s"), ("query p50", "p50_ms"), ("query p95", "p95_ms"), ("add", "add_ms"),
                      ("delete", "delete_ms"), ("index size", "size_bytes")):
        x = ratio(p.get(key), s.get(key))
        out.append(f"| {what} | {fmt(x, '.2f')}{'×' if x is not None else ''} |")
    for variant, name in (("EXTERNAL (uncompressed)", "ragdb-pg-external"), ("lz4", "ragdb-pg-lz4")):
        for what, key in (("query p50", "p50_ms"), ("index size", "size_bytes")):
            x = ratio(rows.get(name, {}).get(key), p.get(key))
            out.append(f"| postings {variant} / the schema's (pglz): {what} | {fmt(x, '.2f')}"
                       f"{'×' if x is not None else ''} |")
    return "\n".join(out) + "\n"


# -- throughput: clients querying while one process writes --------------------------------------

def _throughput(ctx: Context, corpus: Any) -> dict[str, dict[int, dict]]:
    seconds = 4.0 if ctx.args.quick else 10.0
    out: dict[str, dict[int, dict]] = {}
    for name in UPDATED:
        out[name] = {}
        for clients in CLIENTS:
            out[name][clients] = ctx.run_worker("pg_throughput", name, corpus, clients=clients, seconds=seconds)
    return out


def _reader(system: str, folder: str, queries: list[str], offset: int, seconds: float, ready: Any, go: Any,
            results: Any) -> None:
    adapter = SYSTEMS[system]
    try:
        handle = adapter.open(Path(folder), "en")
        for text in queries[:5]:
            adapter.search(handle, text, 100)
        ready.put(1)
        go.wait()
        lat = []
        end = time.monotonic() + seconds
        i = offset
        while time.monotonic() < end:
            t0 = time.perf_counter()
            adapter.search(handle, queries[i % len(queries)], 100)
            lat.append((time.perf_counter() - t0) * 1000.0)
            i += 1
        adapter.close(handle)
        results.put(("reader", len(lat), percentile(lat, 50) if lat else None, percentile(lat, 95) if lat else None))
    except BaseException as e:
        ready.put(1)
        results.put(("error", f"{type(e).__name__}: {e}"))


def _writer(system: str, folder: str, texts: list[str], seconds: float, ready: Any, go: Any, results: Any) -> None:
    adapter = SYSTEMS[system]
    try:
        handle = adapter.open(Path(folder), "en")
        ready.put(1)
        go.wait()
        ops = 0
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            doc_id = f"throughput-{os.getpid()}-{ops}"
            adapter.add(handle, doc_id, 0, texts[ops % len(texts)])
            adapter.delete(handle, doc_id, 0)
            ops += 2
        adapter.close(handle)
        results.put(("writer", ops))
    except BaseException as e:
        ready.put(1)
        results.put(("error", f"{type(e).__name__}: {e}"))


@worker_stage("pg_throughput")
def stage_throughput(spec: dict) -> dict:
    """``clients`` processes search (k=100) in a loop while one process adds and deletes
    documents (one transaction each), for ``seconds``: queries/s of all clients together,
    their latency, and writes/s."""
    import multiprocessing

    queries = [t for _, t in read_pairs(Path(spec["queries"]))]
    texts = [t for _, t in read_pairs(Path(spec["docs"]))[:50]]
    mp = multiprocessing.get_context("fork")  # nothing is open in this process yet
    ready, results, go = mp.Queue(), mp.Queue(), mp.Event()
    clients, seconds = int(spec["clients"]), float(spec["seconds"])
    procs = [mp.Process(target=_reader, args=(spec["system"], spec["index_dir"], queries, 37 * i, seconds, ready, go,
                                                results)) for i in range(clients)]
    procs.append(mp.Process(target=_writer, args=(spec["system"], spec["index_dir"], texts, seconds, ready, go,
                                                  results)))
    for p in procs:
        p.start()
    for _ in procs:
        ready.get(timeout=300)
    go.set()
    got = [results.get(timeout=seconds + 300) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    errors = [g[1] for g in got if g[0] == "error"]
    if errors:
        return {"error": errors[0]}
    readers = [g for g in got if g[0] == "reader"]
    writes = sum(g[1] for g in got if g[0] == "writer")
    return {"qps": sum(r[1] for r in readers) / seconds, "p50_ms": median([r[2] for r in readers if r[2] is not None]),
            "p95_ms": max(r[3] for r in readers if r[3] is not None), "writes_per_s": writes / seconds,
            "clients": clients, "seconds": seconds}


def _throughput_table(thr: dict[str, dict[int, dict]]) -> list[str]:
    out = ["### Throughput: clients querying while one process writes", "",
           "Each client is a process with its own connection searching (k=100) in a loop, while one more "
           "process adds and deletes one document at a time (each its own transaction); queries/s of all "
           "clients together, the median of their per-client p50s and the worst p95, and the writer's "
           "operations/s. The machine has few cores, which the clients, the writer and (for PostgreSQL) the "
           "server's backends share: more clients than cores measure contention, not scaling.", "",
           "| backend | clients | queries/s | p50 ms | p95 ms | writes/s | queries/s PG / SQLite |", "|" + "---|" * 7]
    for name, label in (("ragdb", "SQLite"), ("ragdb-pg", "PostgreSQL")):
        for clients in CLIENTS:
            r = thr.get(name, {}).get(clients, {})
            if r.get("error"):
                out.append(f"| {label} | {clients} | error: {cell(r['error'])} |" + " |" * 4)
                continue
            x = ratio(thr.get("ragdb-pg", {}).get(clients, {}).get("qps"), thr.get("ragdb", {}).get(clients, {}).get("qps"))
            out.append(f"| {label} | {clients} | {fmt(r.get('qps'), '.0f')} | {fmt(r.get('p50_ms'), '.2f')} "
                       f"| {fmt(r.get('p95_ms'), '.2f')} | {fmt(r.get('writes_per_s'), '.1f')} "
                       f"| {fmt(x, '.2f') + '×' if name == 'ragdb-pg' and x is not None else ''} |")
    return out + [""]


# -- where PostgreSQL's time goes -------------------------------------------------------------------

@worker_stage("pg_profile")
def stage_profile(spec: dict) -> dict:
    """Every statement psycopg sends, timed (client to server and back, the server's work
    included) and counted, over queries, adds and deletes of one document."""
    import psycopg

    timed = {"n": 0, "s": 0.0, "commit": 0.0}
    real_execute, real_many = psycopg.Connection.execute, psycopg.Cursor.executemany

    def execute(self, *a, **kw):  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        try:
            return real_execute(self, *a, **kw)
        finally:
            spent = time.perf_counter() - t0
            timed["s"] += spent
            timed["n"] += 1
            if a and a[0] == "COMMIT":
                timed["commit"] += spent

    def executemany(self, *a, **kw):  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        try:
            return real_many(self, *a, **kw)
        finally:
            timed["s"] += time.perf_counter() - t0
            timed["n"] += 1

    psycopg.Connection.execute = execute  # type: ignore[method-assign]
    psycopg.Cursor.executemany = executemany  # type: ignore[method-assign]
    adapter = SYSTEMS[spec["system"]]
    folder = Path(spec["index_dir"])
    queries = [t for _, t in read_pairs(Path(spec["queries"]))][:200]
    texts = [t for _, t in read_pairs(Path(spec["docs"]))[:UPDATE_OPS]]
    handle = adapter.open(folder, "en")
    for text in queries[:20]:
        adapter.search(handle, text, 100)
    out: dict[str, Any] = {}

    def measure(label: str, fn: Any, items: list[Any]) -> None:
        timed["n"], timed["s"], timed["commit"] = 0, 0.0, 0.0
        t0 = time.perf_counter()
        for i, item in enumerate(items):
            fn(i, item)
        total = time.perf_counter() - t0
        n = len(items)
        out[label] = {"ms": total * 1000 / n, "sql_ms": timed["s"] * 1000 / n, "statements": timed["n"] / n,
                      "commit_ms": timed["commit"] * 1000 / n}

    measure("query", lambda i, q: adapter.search(handle, q, 100), queries)
    measure("add", lambda i, t: adapter.add(handle, f"profile-{i}", 0, t), texts)
    measure("delete", lambda i, t: adapter.delete(handle, f"profile-{i}", 0), texts)
    adapter.close(handle)
    return out


def _profile_lines(prof: dict, rows: dict[str, dict]) -> list[str]:
    out = ["### Where PostgreSQL's time goes (SciFact)", ""]
    if prof.get("error"):
        return out + [f"Not measured: {cell(prof['error'])}", ""]
    out += ["Each statement psycopg sent was timed from the call to its result (the round trip over "
            "loopback TCP and the server's work) and counted; COMMIT waits for the WAL to reach disk "
            "(synchronous_commit on; SQLite's WAL with synchronous=NORMAL does not sync each commit). The "
            "rest is ragdb's Python (analysis, scoring, building hits) and psycopg's adaptation. Means per "
            "operation.", "",
            "| operation | ms | in statements ms | of which COMMIT ms | statements | rest ms |",
            "|---|---|---|---|---|---|"]
    for op in ("query", "add", "delete"):
        r = prof.get(op, {})
        rest = None if r.get("ms") is None else r["ms"] - r["sql_ms"]
        out.append(f"| {op} | {fmt(r.get('ms'), '.2f')} | {fmt(r.get('sql_ms'), '.2f')} | "
                   f"{fmt(r.get('commit_ms'), '.2f')} | {fmt(r.get('statements'), '.1f')} | {fmt(rest, '.2f')} |")
    return out + [""]
