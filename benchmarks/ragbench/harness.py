"""The harness: registries, the worker subprocess, the run's Context, stages in rounds.

Every measurement runs in a worker subprocess (``Context.run_worker``) that
imports this module -- from its cached bytecode, not as ``__main__`` -- loads
the plugins (:data:`PLUGINS`: the peers and the sections, which register their
systems and worker stages), runs one stage (:func:`worker`) and prints its
result as one JSON line. So the peak RSS a stage reports is its system's own.

Registries (the hooks for new code):

* ``@system("name")`` on an adapter class (see ``peers.py``) -> :data:`SYSTEMS`;
* ``@section("name")`` on ``fn(ctx) -> markdown`` -> :data:`SECTIONS`, run in
  registration order (the import order in ``sections/__init__.py``);
* ``@worker_stage("name")`` on ``fn(spec) -> dict`` -> :data:`WORKER_STAGES`,
  run in a worker by ``ctx.run_worker("name", system, corpus, **extra)``.
"""

from __future__ import annotations

import gc
import importlib
import json
import subprocess
import sys
import time
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from .common import K, REPO, UPDATE_OPS, WARMUP_QUERIES, iter_docs, log, median, peak_rss_mb, percentile, read_pairs
from .corpora import Corpus

if TYPE_CHECKING:
    import argparse

RESULT_MARK = "@@RAGDB_BENCH_RESULT@@ "
WORKER_TIMEOUT_S = 1800
QUERY_ROUNDS = 5  # query stages in a full run (at least)

# Timings are repeated in rounds, each round running every system once in
# turn, and each system reports the median over rounds: on a shared, noisy
# machine a slow minute then hits all systems alike instead of whichever one
# happened to run in it. Query stages are repeated only for systems whose
# first p50 is under REPEAT_QUERY_MS (FTS5's scans take seconds a round and
# are an order of magnitude away from every bar).
REPEAT_QUERY_MS = 20.0
_MEDIAN_KEYS = ("build_s", "p50_ms", "p95_ms", "mean_ms", "open_s", "peak_rss_mb", "size_bytes")


# ==========================================================================
# Registries
# ==========================================================================

SYSTEMS: dict[str, type] = {}
SECTIONS: list[tuple[str, Callable[[Context], str]]] = []
WORKER_STAGES: dict[str, Callable[[dict], dict]] = {}

#: Modules of this package that register systems, sections and worker stages when imported.
PLUGINS = ("peers", "sections")


def system(name: str) -> Callable[[type], type]:
    """Register a benchmarked system under ``name`` (hook for new systems)."""

    def deco(cls: type) -> type:
        cls.name = name
        SYSTEMS[name] = cls
        return cls

    return deco


def section(name: str) -> Callable[[Callable[[Context], str]], Callable[[Context], str]]:
    """Register a report section: ``fn(ctx) -> markdown``, run in registration order.

    Hook for later sections: define a function, decorate it, use
    ``ctx.run_worker`` and ``report.bar``.
    """

    def deco(fn: Callable[[Context], str]) -> Callable[[Context], str]:
        SECTIONS.append((name, fn))
        return fn

    return deco


def worker_stage(name: str) -> Callable[[Callable[[dict], dict]], Callable[[dict], dict]]:
    """Register a worker stage ``fn(spec) -> dict`` (run by ``worker`` in its own process)."""

    def deco(fn: Callable[[dict], dict]) -> Callable[[dict], dict]:
        WORKER_STAGES[name] = fn
        return fn

    return deco


def load_plugins() -> None:
    """Import the peers and the sections, filling the registries (idempotent)."""
    for name in PLUGINS:
        importlib.import_module(f"{__package__}.{name}")


# ==========================================================================
# Worker: one stage of one system on one corpus, in its own process
# ==========================================================================


def time_queries(adapter, handle, queries: list[tuple[str, str]], k: int, latencies: bool = False) -> dict:
    for _qid, text in queries[:WARMUP_QUERIES]:
        adapter.search(handle, text, k)
    run: dict[str, list[str]] = {}
    lat: list[float] = []
    gc.collect()
    for qid, text in queries:
        t0 = time.perf_counter()
        ids = adapter.search(handle, text, k)
        lat.append((time.perf_counter() - t0) * 1000.0)
        run[qid] = ids
    out = {"p50_ms": percentile(lat, 50), "p95_ms": percentile(lat, 95), "mean_ms": sum(lat) / len(lat),
           "queries": len(lat), "run": run}
    if latencies:  # each query's, in the queries' order
        out["lat"] = lat
    return out


def worker(spec: dict) -> dict:
    """Run one stage; returns a JSON-able dict (printed by the caller)."""
    adapter = SYSTEMS[spec["system"]]
    stage = spec["stage"]
    folder = Path(spec["index_dir"])
    lang = spec["lang"]
    out: dict[str, Any] = {}

    if stage == "probe":  # is ragdb importable and working?
        import ragdb

        with ragdb.open(":memory:") as db:
            db.add("the quick brown fox", source="a", chunker="none")
            db.add("lazy dogs sleep", source="b", chunker="none")
            hits = db.search("fox", k=5)
            assert hits and hits[0].source == "a", hits
        out["version"] = getattr(ragdb, "__version__", "?")
        out["file"] = ragdb.__file__
        return out

    if stage in WORKER_STAGES:  # stages of the later sections (filters, sync, vectors, TF-IDF norms, ...)
        out.update(WORKER_STAGES[stage](spec))
        out["peak_rss_mb"] = peak_rss_mb()
        return out

    if stage == "build":
        folder.mkdir(parents=True, exist_ok=True)
        docs: Any = iter_docs(Path(spec["docs"]))
        if adapter.needs_list:
            docs = list(docs)
        gc.collect()
        t0 = time.perf_counter()
        info = adapter.build(docs, folder, lang)
        out["build_s"] = time.perf_counter() - t0
        out.update(info or {})
        out["size_bytes"] = adapter.size(folder)
    elif stage == "query":
        queries = read_pairs(Path(spec["queries"]))
        if spec.get("max_queries"):  # the first ones only (a slow system on a big corpus)
            queries = queries[:spec["max_queries"]]
        t0 = time.perf_counter()
        handle = adapter.open(folder, lang)
        out["open_s"] = time.perf_counter() - t0
        out.update(time_queries(adapter, handle, queries, spec.get("k", K), bool(spec.get("latencies"))))
        adapter.close(handle)
    elif stage == "all":  # non-persistent systems: build and query in one process
        docs = list(iter_docs(Path(spec["docs"])))
        queries = read_pairs(Path(spec["queries"]))
        gc.collect()
        t0 = time.perf_counter()
        handle = adapter.build(docs, folder, lang)
        out["build_s"] = time.perf_counter() - t0
        del docs
        out.update(time_queries(adapter, handle, queries, spec.get("k", K)))
    elif stage == "update":
        n = spec["n_docs"]
        sample = []  # texts for the new documents: the corpus's first ones
        for _doc_id, text in iter_docs(Path(spec["docs"])):
            sample.append(text)
            if len(sample) > UPDATE_OPS:
                break
        handle = adapter.open(folder, lang)
        r = spec.get("round", 0)  # each round adds new ids and deletes other victims
        base = n + r * (UPDATE_OPS + 1)
        # Warm-up (untimed): one add and its delete.
        adapter.add(handle, f"bench-new-warmup-{r}", base, sample[0])
        adapter.delete(handle, f"bench-new-warmup-{r}", base)
        adds, deletes = [], []
        for i in range(UPDATE_OPS):
            t0 = time.perf_counter()
            adapter.add(handle, f"bench-new-{r}-{i}", base + 1 + i, sample[(i + 1) % len(sample)])
            adds.append((time.perf_counter() - t0) * 1000.0)
        victims = spec["victims"]  # [(doc_id, ordinal)] of existing documents
        for doc_id, ordinal in victims:
            t0 = time.perf_counter()
            adapter.delete(handle, doc_id, ordinal)
            deletes.append((time.perf_counter() - t0) * 1000.0)
        adapter.close(handle)
        out.update(add_ms=median(adds), add_max_ms=max(adds), delete_ms=median(deletes),
                   delete_max_ms=max(deletes), ops=len(adds), adds_ms=adds, deletes_ms=deletes)
        out["size_bytes_after"] = adapter.size(folder)
    else:
        raise SystemExit(f"unknown stage {stage!r}")
    out["peak_rss_mb"] = peak_rss_mb()
    return out


def worker_main(spec_json: str) -> int:
    """Entry point of a worker process: run the stage in ``spec_json``, print its result."""
    spec = json.loads(spec_json)
    sys.path.insert(0, spec.get("src") or str(REPO))
    load_plugins()
    result = worker(spec)
    sys.stdout.write(RESULT_MARK + orjson.dumps(result).decode() + "\n")
    sys.stdout.flush()
    return 0


# ==========================================================================
# Parent: the run's context and the worker subprocess
# ==========================================================================


def load_evaluation(src: Path):
    """ragdb.answers.evaluation from ``src``; if the ragdb package itself does not import
    (its core being unfinished), load the module without running ragdb/__init__.py."""
    sys.path.insert(0, str(src))
    try:
        return importlib.import_module("ragdb.answers.evaluation")
    except Exception:  # noqa: BLE001 - any failure of ragdb/__init__
        for name in [m for m in sys.modules if m == "ragdb" or m.startswith("ragdb.")]:
            del sys.modules[name]
        pkg = types.ModuleType("ragdb")
        pkg.__path__ = [str(src / "ragdb")]  # type: ignore[attr-defined]
        sys.modules["ragdb"] = pkg
        return importlib.import_module("ragdb.answers.evaluation")


@dataclass
class Context:
    args: argparse.Namespace
    workdir: Path
    src: Path  # snapshot of ragdb/ and migrations/ that every worker imports
    evaluation: Any
    ragdb_ok: bool = False
    ragdb_error: str = ""
    results: dict[str, Any] = field(default_factory=dict)
    bars: list[tuple[str, bool | None, str]] = field(default_factory=list)
    #: patterns (re.fullmatch) of bar names a section no longer reports (replaced by others):
    #: a merged report drops their rows
    retired_bars: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: the commit of the sources snapshotted at the start (what the figures are of), when known
    commit: str = ""
    corpora: dict[str, Corpus] = field(default_factory=dict)

    def systems(self, names: list[str]) -> list[str]:
        chosen = [s for s in names if s in self.args.systems]
        if not self.ragdb_ok:
            chosen = [s for s in chosen if not s.startswith("ragdb")]
        return chosen

    def index_dir(self, corpus: Corpus, system_name: str) -> Path:
        owner = SYSTEMS[system_name].index_of or system_name
        return self.workdir / "index" / corpus.key / owner

    def run_worker(self, stage: str, system_name: str, corpus: Corpus, **extra: Any) -> dict:
        if stage == "query":
            warm_page_cache(self.index_dir(corpus, system_name))
        spec = {
            "stage": stage,
            "system": system_name,
            "lang": corpus.lang,
            "docs": str(corpus.docs_path),
            "queries": str(corpus.queries_path),
            "index_dir": str(self.index_dir(corpus, system_name)),
            "n_docs": corpus.n_docs,
            "victims": corpus.victims,
            "k": K,
            "src": str(self.src),
            **extra,
        }
        # The worker imports this package's modules (from their cached bytecode)
        # instead of running a script as __main__, which is compiled on every start:
        # compiling 2,000 lines of harness added ~5 MiB to every system's peak RSS.
        here = str(Path(__file__).resolve().parent.parent)  # benchmarks/, which holds the ragbench package
        code = (f"import sys; sys.path.insert(0, {here!r}); from {__package__} import harness; "
                "sys.exit(harness.worker_main(sys.argv[1]))")
        cmd = [sys.executable, "-c", code, json.dumps(spec)]
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=WORKER_TIMEOUT_S, cwd=str(REPO))
        except subprocess.TimeoutExpired:
            log(f"{corpus.key}/{system_name} {stage}: TIMEOUT after {WORKER_TIMEOUT_S}s")
            return {"error": f"timed out after {WORKER_TIMEOUT_S}s"}
        wall = time.perf_counter() - t0
        for line in reversed(proc.stdout.splitlines()):
            if line.startswith(RESULT_MARK):
                result = orjson.loads(line[len(RESULT_MARK):])
                log(f"{corpus.key}/{system_name} {stage}: {_brief(result)} ({wall:.1f}s)")
                return result
        lines = [ln for ln in (proc.stderr or proc.stdout or "").splitlines() if ln.strip()]
        msg = lines[-1].strip()[:300] if lines else f"exit status {proc.returncode}"
        log(f"{corpus.key}/{system_name} {stage}: FAILED: {msg}\n" + "\n".join(lines[-15:]))
        return {"error": msg}


def warm_page_cache(folder: Path) -> None:
    """Read every file under ``folder`` (a system's index) once, here in the parent, so that
    the OS holds it when the system's query stage starts, as it would for a server that has
    been answering for a while. Every system gets the same before each query stage. This
    machine's page cache holds ~3.3 GB, one 1M-chunk index: without this, which index was
    cached depended on the order of the stages (ragdb's queries ran right after FTS5's
    2.8 GB build; a cold read of ragdb's 1.9 GB file made its 1M p50 ~1.6x its warm figure,
    measured apart). Reading does not add to the worker's RSS (nothing is mapped there)."""
    if not folder.exists():
        return
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            with open(path, "rb", buffering=0) as fh:
                while fh.read(1 << 24):
                    pass


def _brief(result: dict) -> str:
    keys = ("build_s", "p50_ms", "add_ms", "delete_ms", "peak_rss_mb")
    return ", ".join(f"{k}={result[k]:.3g}" for k in keys if isinstance(result.get(k), (int, float)))


def selected_sections(ctx: Context) -> set[str]:
    return {s.strip() for s in ctx.args.sections.split(",") if s.strip()}


# ==========================================================================
# Stages in rounds (see REPEAT_QUERY_MS)
# ==========================================================================


def median_of_runs(runs: list[dict], keys: Sequence[str] = _MEDIAN_KEYS) -> dict:
    """The first run's result with each timing (``keys``) replaced by the median over ``runs``."""
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return runs[0] if runs else {"error": "not run"}
    out = dict(ok[0])
    for key in keys:
        values = [r[key] for r in ok if isinstance(r.get(key), (int, float))]
        if values:
            out[key] = median(values)
    out["rounds"] = len(ok)
    return out


def query_rounds(ctx: Context, names: list[str], corpus: Corpus) -> dict[str, dict]:
    """Query stages in rounds (see REPEAT_QUERY_MS); name -> median result."""
    runs: dict[str, list[dict]] = {name: [ctx.run_worker("query", name, corpus)] for name in names}
    for _ in range(ctx.args.query_rounds - 1):
        for name in names:
            first = runs[name][0]
            if "error" not in first and (first.get("p50_ms") or 0) < REPEAT_QUERY_MS:
                r = ctx.run_worker("query", name, corpus)
                r.pop("run", None)
                runs[name].append(r)
    return {name: median_of_runs(r) for name, r in runs.items()}


def update_rounds(ctx: Context, names: list[str], corpus: Corpus) -> dict[str, dict]:
    """Update stages in rounds over the systems in turn, each round adding new ids and
    deleting its own slice of victims; name -> add_ms / delete_ms: the median of every
    operation of every round pooled (issue 29: "the pooled medians of the rounds"), and
    add_round_ms / delete_round_ms: each round's median."""
    runs: dict[str, list[dict]] = {name: [] for name in names}
    for r in range(ctx.args.rounds):
        victims = corpus.victims[r * UPDATE_OPS:(r + 1) * UPDATE_OPS]
        if not victims:
            break
        for name in names:
            if runs[name] and "error" in runs[name][0]:
                continue
            runs[name].append(ctx.run_worker("update", name, corpus, round=r, victims=victims))
    out = {}
    for name, rs in runs.items():
        ok = [x for x in rs if "error" not in x]
        if not ok:
            out[name] = rs[0] if rs else {"error": "not run"}
            continue
        res = dict(ok[-1])
        for key, each in (("add_ms", "adds_ms"), ("delete_ms", "deletes_ms")):
            res[key.replace("_ms", "_round_ms")] = [x[key] for x in ok]
            res[key] = median([t for x in ok for t in (x.get(each) or [x[key]])])
        res.pop("adds_ms", None)
        res.pop("deletes_ms", None)
        res["add_max_ms"] = max(x["add_max_ms"] for x in ok)
        res["delete_max_ms"] = max(x["delete_max_ms"] for x in ok)
        res["rounds"] = len(ok)
        out[name] = res
    return out
