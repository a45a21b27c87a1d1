"""The reliability scenarios behind ``tests/engine/test_reliability.py`` and
``benchmarks/reliability.py``: the worker processes, the four scenarios, their
sizes (:data:`SIZES`: ``"ci"`` for the test suite and ``reliability.py --ci``,
``"long"`` for the long run) and the expectations (:func:`failures`).
Nothing here writes outside the work folder it is given; the writer of
``RELIABILITY.md`` lives in ``benchmarks/reliability.py``.

Scenarios (each returns a dict of figures; nothing here asserts, the callers do):

* :func:`run_concurrency` -- reader processes loop ``search`` and check that
  every marker query shows one whole version of one document, a process whose
  threads share one :class:`ragdb.Database`, and two writer processes; they
  all open the *new* database file at the same moment.
* :func:`run_crashes` -- a worker adds, replaces, deletes, bulk-adds, syncs a
  folder and optimizes in a loop and is killed with SIGKILL at a random
  moment, many times; after each kill the database must open, pass
  ``check()``, show every document whole, and hold exactly the committed
  operations (the one interrupted operation wholly or not at all).
* :func:`run_faults` -- disk full (``PRAGMA max_page_count``) and read-only
  conditions: a clear error, and the database as it was.
* :func:`run_torture` -- a seeded generator of bad inputs fed through the
  library and the CLI in a child process, each case under a time limit.

Worker processes come from a ``forkserver`` that has imported ragdb once, so a
kill costs milliseconds instead of an interpreter start (children are real,
separate processes with their own SQLite connections, opened after the fork).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import decimal
import json
import multiprocessing as mp
import os
import platform
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import traceback
import uuid
from pathlib import Path
from typing import Any
from collections.abc import Callable, Iterable

import ragdb
from ragdb.files import loaders as rl
from ragdb.text.chunking import get_chunker
from ragdb.errors import DatabaseBusy, RagdbError, StorageError

CHUNKER = "window:size=6,overlap=0"   # every generated document: n chunks of exactly 6 tokens
FLUSH_EVERY = 48                      # small flush threshold, so flushes and merges happen under load
SCENARIOS = ("concurrency", "crashes", "faults", "torture")

#: Scenario sizes. "ci": the test suite and ``benchmarks/reliability.py --ci`` (under ~90 s on 2 busy
#: cores); "long": ``benchmarks/reliability.py`` (~11 min on 2 cores: 8 reader processes and 2 writer
#: processes for 60 s, 1,000 kills, ~10,700 hostile cases). ``faults`` takes no sizes.
SIZES: dict[str, dict[str, dict[str, Any]]] = {
    "ci": {
        "concurrency": {"seconds": 5.0, "readers": 3, "threads": 3, "seed": 1, "check_every": 2.0},
        "crashes": {"kills": 22, "seed": 7, "max_delay": 0.4, "cli_checks": 2},
        "faults": {},
        "torture": {"seed": 11, "scale": 1.0, "big_mb": 5, "token_mb": 1, "deep": 50_000,
                    "case_timeout": 30.0, "heavy_timeout": 120.0},
    },
    "long": {
        "concurrency": {"seconds": 60.0, "readers": 8, "threads": 8, "seed": 101, "check_every": 3.0},
        "crashes": {"kills": 1000, "seed": 107, "max_delay": 0.5, "cli_checks": 20},
        "faults": {},
        "torture": {"seed": 111, "scale": 10.0, "big_mb": 50, "token_mb": 1, "deep": 100_000,
                    "case_timeout": 60.0, "heavy_timeout": 900.0},
    },
}

#: What each size must reach (on top of :func:`failures`' fixed expectations); the long run's are the
#: issue's: >= 1,000 kills, >= 10,000 hostile cases with >= 25% through the CLI, 8 readers + 2 writers.
TARGETS: dict[str, dict[str, float]] = {
    "ci": {"kills": 20, "torture_cases": 1000, "cli_cases": 200, "cli_share": 0.25, "reader_processes": 3},
    "long": {"kills": 1000, "torture_cases": 10_000, "cli_cases": 2500, "cli_share": 0.25, "reader_processes": 8,
             "seconds": 60.0},
}

#: Library bugs these tests found; all fixed, each guarded by a regression test in tests/engine/test_reliability.py.
KNOWN_BUGS = {
    "B1": "a string holding a lone surrogate (what os.fsdecode makes of a file name that is not UTF-8, and what "
          "Python puts in sys.argv for such bytes) as a source, title, version, ACL label, delete pattern, filter "
          "key or value, or principal raises UnicodeEncodeError/TypeError instead of a RagdbError; `ragdb add "
          "--json` and `ragdb sync --json` of a folder holding such a file name end in 'internal error: "
          "TypeError' (the plain output reports the file as skipped, with a misleading 'metadata is not "
          "JSON-serialisable')",
    "B2": "search(k1=..., b=...) with a non-numeric value raises a bare ValueError, not InvalidInput",
    "B3": "opening an up-to-date database read-write takes the write lock (migrate() always runs BEGIN "
          "IMMEDIATE), so a reader that opens while a writer holds a long transaction (a big add or sync) "
          "waits, and past busy_timeout gets DatabaseBusy 'database is locked'; the CLI's search/stats/check "
          "open read-write",
    "B4": "an integer outside SQLite's 64-bit range as a document id (get(), delete(), `ragdb show`, "
          "`ragdb delete --id`) or as a metadata filter value raises OverflowError ('internal error' in the "
          "CLI) instead of DocumentNotFound/InvalidInput",
    "B5": "add()/add_many() do not check two argument types: spans= that is not a sequence of Span objects "
          "(e.g. a string) raises AttributeError, and add_many(None) raises TypeError, instead of InvalidInput",
    "B6": "Markdown front matter whose YAML values fail PyYAML's constructors (an impossible date such as "
          "`date: 2026-13-45`, `!!int abc`, `!!float xyz`, `!!timestamp garbage`, `!!bool maybe`) makes "
          "load_file raise ValueError/AttributeError/KeyError instead of LoaderError: `ragdb add` says 'internal "
          "error', and sync_folder / `ragdb sync` of a folder holding such a file fails as a whole (nothing is "
          "synced) instead of skipping that file",
}


# ============================================================================ shared helpers


def mp_context() -> Any:
    """A forkserver context that preloads ragdb and this module (spawn where forkserver is missing)."""
    try:
        ctx = mp.get_context("forkserver")
    except ValueError:  # pragma: no cover - not on Linux
        return mp.get_context("spawn")
    ctx.set_forkserver_preload([__name__, "ragdb", "ragdb.files.sync", "ragdb.files.loaders", "numpy"])
    return ctx


def marker(key: str) -> str:
    """A term unique to one source (every chunk of every version holds it)."""
    return f"mark{key}z"


def vtag(key: str, gen: int) -> str:
    """A term unique to one version of a source."""
    return f"ver{key}g{gen}z"


def doc_text(key: str, gen: int, n: int) -> str:
    """Text of ``n`` chunks of exactly 6 tokens under :data:`CHUNKER`; its first two tokens
    are the source's marker and the version tag."""
    parts = []
    for j in range(n):
        parts.append(f"{marker(key)} {vtag(key, gen)} common fill{j % 10} w{(gen * 7 + j) % 13} pos{j}")
    return "\n".join(parts)


def tag_of(text: str | None) -> str | None:
    if text is None:
        return None
    words = text.split()
    return words[1] if len(words) > 1 else None


def whole_problems(db: ragdb.Database, *, sample: int | None = None, rng: random.Random | None = None
                   ) -> tuple[list[str], int]:
    """Every latest document wholly present: its chunk rows are exactly the chunks of its text, and a
    search for its marker returns exactly those chunks (ordinals 0..n-1). Returns (problems, docs checked)."""
    chunker = get_chunker(CHUNKER)
    problems: list[str] = []
    docs = db.documents()
    searched = docs if sample is None or len(docs) <= sample else (rng or random).sample(docs, sample)
    searched_ids = {d.id for d in searched}
    for d in docs:
        text = db.get(d.id, with_text=True).text or ""
        n = len(chunker.split(text))
        if d.chunk_count != n:
            problems.append(f"{d.source}: {d.chunk_count} chunk rows, its text makes {n}")
            continue
        if d.id not in searched_ids:
            continue
        words = text.split()
        if not words:
            problems.append(f"{d.source}: empty text")
            continue
        hits = db.search(words[0], k=1000, collapse=False)  # every chunk
        ids = {h.doc_id for h in hits}
        ords = sorted(h.ordinal for h in hits)
        if ids != {d.id} or ords != list(range(n)):
            problems.append(f"{d.source}: marker search shows docs {sorted(ids)} ordinals {ords[:12]}, "
                            f"expected doc {d.id} ordinals 0..{n - 1}")
    return problems, len(docs)


def cli_command() -> list[str]:
    exe = Path(sys.executable).parent / "ragdb"
    if exe.exists():
        return [str(exe)]
    return [sys.executable, "-c", "from ragdb.cli.main import main; main()"]  # pragma: no cover


def run_cli_check(path: str | os.PathLike[str], timeout: float = 120) -> tuple[int, str]:
    """``ragdb -d PATH check`` as a real subprocess: (exit code, output)."""
    r = subprocess.run([*cli_command(), "-d", os.fspath(path), "check"], capture_output=True, text=True,
                       timeout=timeout)
    return r.returncode, (r.stdout + r.stderr).strip()


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def _write_json(path: str | os.PathLike[str], obj: Any) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(obj, fh)
    os.replace(tmp, path)


def _err(e: BaseException) -> str:
    return f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"


# ============================================================================ concurrency


def _marker_problem(db: ragdb.Database, key: str) -> tuple[str | None, int]:
    """One search (one snapshot) for a source's marker: absent, or exactly one whole version."""
    hits = db.search(marker(key), k=200, collapse=False)  # every chunk
    if not hits:
        return None, 0
    ids = {h.doc_id for h in hits}
    if len(ids) != 1:
        return f"{key}: one search shows chunks of documents {sorted(ids)}", len(hits)
    n = hits[0].metadata.get("n")
    gen = hits[0].metadata.get("gen")
    ords = sorted(h.ordinal for h in hits)
    if ords != list(range(n if isinstance(n, int) else -1)):
        return f"{key}: saw chunks {ords} of a {n}-chunk document (a half-added document)", len(hits)
    tag = vtag(key, gen)
    if any(tag not in h.text for h in hits):
        return f"{key}: chunks of two versions in one search", len(hits)
    return None, len(hits)


def _snapshot_problem(db: ragdb.Database) -> str | None:
    """stats() and documents() read in one read transaction must agree (private hook: Store.read)."""
    with db._store.read():
        s = db.stats()
        docs = db.documents()
    if s.documents != len(docs) or s.chunks != sum(d.chunk_count for d in docs):
        return (f"stats say {s.documents} documents/{s.chunks} chunks, the same snapshot lists "
                f"{len(docs)}/{sum(d.chunk_count for d in docs)}")
    return None


def _keys_from(db: ragdb.Database) -> list[str]:
    return [d.source[4:] for d in db.documents("doc/*")]


class _Tally:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.searches = 0
        self.whole = 0
        self.snapshots = 0
        self.checks = 0
        self.violations: list[str] = []
        self.errors: list[str] = []

    def as_dict(self) -> dict[str, Any]:
        return {"searches": self.searches, "whole": self.whole, "snapshots": self.snapshots,
                "checks": self.checks, "violations": self.violations[:20], "n_violations": len(self.violations),
                "errors": self.errors[:20], "n_errors": len(self.errors)}


def _reader_loop(db: ragdb.Database, rng: random.Random, deadline: float, tally: _Tally,
                 check_every: float) -> None:
    keys: list[str] = []
    next_check = time.monotonic() + rng.uniform(0, check_every)
    i = 0
    while time.monotonic() < deadline:
        i += 1
        try:
            if i % 40 == 1 or not keys:
                keys = _keys_from(db) or ["a0"]
            key = rng.choice(keys)
            problem, seen = _marker_problem(db, key)
            if rng.random() < 0.2:  # an ordinary multi-term search too
                db.search(f"common fill{rng.randrange(10)} w{rng.randrange(13)}", k=20,
                          scorer=rng.choice(["bm25", "tfidf"]))
            snap = _snapshot_problem(db) if i % 10 == 0 else None
            checked = None
            if time.monotonic() >= next_check:
                checked = db.check()
                next_check = time.monotonic() + check_every
            with tally.lock:
                tally.searches += 1
                tally.whole += 1 if seen else 0
                if problem:
                    tally.violations.append(problem)
                if i % 10 == 0:
                    tally.snapshots += 1
                    if snap:
                        tally.violations.append(snap)
                if checked is not None:
                    tally.checks += 1
                    if checked:
                        tally.violations.append(f"check() during writes: {checked}")
        except Exception as e:  # noqa: BLE001 - every escape is a finding
            with tally.lock:
                tally.errors.append(_err(e))
            time.sleep(0.01)


class _WriterState:
    def __init__(self) -> None:
        self.state: dict[str, list[int] | None] = {}  # key -> [gen, n] or None (deleted)
        self.ops: dict[str, int] = {}
        self.errors: list[str] = []
        self.max_op_s = 0.0


def _writer_loop(db: ragdb.Database, rng: random.Random, prefix: str, deadline: float, ws: _WriterState,
                 *, optimize: bool, pause: float = 0.0) -> None:
    """Adds, replaces, deletes and bulk-adds documents ``doc/<prefix><i>`` until ``deadline``."""
    gen = 0
    nxt = 0
    while time.monotonic() < deadline:
        live = [k for k, v in ws.state.items() if v is not None]
        r = rng.random()
        gen += 1
        t0 = time.monotonic()
        try:
            if r < 0.35 or len(live) < 3:
                op = "add"
                key = f"{prefix}{nxt}"
                nxt += 1
                n = rng.randint(2, 7)
                db.add(doc_text(key, gen, n), source=f"doc/{key}", metadata={"n": n, "gen": gen})
                ws.state[key] = [gen, n]
            elif r < 0.60:
                op = "replace"
                key = rng.choice(live)
                n = rng.randint(2, 7)
                db.add(doc_text(key, gen, n), source=f"doc/{key}", metadata={"n": n, "gen": gen})
                ws.state[key] = [gen, n]
            elif r < 0.72:
                op = "delete"
                key = rng.choice(live)
                db.delete(source=f"doc/{key}")
                ws.state[key] = None
            elif r < 0.95 or not optimize:
                op = "add_many"
                recs, new_state = [], {}
                for _ in range(rng.randint(2, 6)):
                    if rng.random() < 0.5 or not live:
                        key = f"{prefix}{nxt}"
                        nxt += 1
                    else:
                        key = rng.choice(live)
                    if key in new_state:
                        continue
                    n = rng.randint(2, 7)
                    recs.append({"text": doc_text(key, gen, n), "source": f"doc/{key}",
                                 "metadata": {"n": n, "gen": gen}})
                    new_state[key] = [gen, n]
                db.add_many(recs)
                ws.state.update(new_state)
            else:
                op = "optimize"
                db.optimize(vacuum=False)
            ws.ops[op] = ws.ops.get(op, 0) + 1
        except Exception as e:  # noqa: BLE001
            ws.errors.append(_err(e))
        ws.max_op_s = max(ws.max_op_s, time.monotonic() - t0)
        if pause:
            time.sleep(pause)


def _open_at(path: str, go: Any, timeout: float = 60) -> ragdb.Database:
    go.wait(timeout)
    return ragdb.open(path, chunker=CHUNKER)


def conc_writer(path: str, go: Any, seconds: float, seed: int, prefix: str, out: str, optimize: bool) -> None:
    res: dict[str, Any] = {"role": "writer", "prefix": prefix}
    try:
        db = _open_at(path, go)
        db._settings["flush_threshold"] = FLUSH_EVERY  # private: flush often, so readers see flushes
        ws = _WriterState()
        _writer_loop(db, random.Random(seed), prefix, time.monotonic() + seconds, ws, optimize=optimize)
        db.close()
        res.update(state=ws.state, ops=ws.ops, errors=ws.errors, max_op_s=ws.max_op_s)
    except Exception as e:  # noqa: BLE001
        res.update(fatal=_err(e), trace=traceback.format_exc())
    _write_json(out, res)


def conc_reader(path: str, go: Any, seconds: float, seed: int, out: str, check_every: float) -> None:
    res: dict[str, Any] = {"role": "reader"}
    try:
        db = _open_at(path, go)
        tally = _Tally()
        _reader_loop(db, random.Random(seed), time.monotonic() + seconds, tally, check_every)
        db.close()
        res.update(tally.as_dict())
    except Exception as e:  # noqa: BLE001
        res.update(fatal=_err(e), trace=traceback.format_exc())
    _write_json(out, res)


def conc_threads(path: str, go: Any, seconds: float, seed: int, out: str, n_threads: int,
                 check_every: float) -> None:
    """``n_threads`` searching threads and one writing thread share ONE Database object."""
    res: dict[str, Any] = {"role": "threads", "threads": n_threads + 1}
    try:
        db = _open_at(path, go)
        deadline = time.monotonic() + seconds
        tally = _Tally()
        ws = _WriterState()
        threads = [threading.Thread(target=_reader_loop, args=(db, random.Random(seed + i), deadline, tally,
                                                                check_every)) for i in range(n_threads)]
        threads.append(threading.Thread(target=_writer_loop, args=(db, random.Random(seed + 99), "t", deadline, ws),
                                        kwargs={"optimize": True, "pause": 0.005}))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        db.close()
        res.update(tally.as_dict(), state=ws.state, ops=ws.ops, writer_errors=ws.errors, max_op_s=ws.max_op_s)
    except Exception as e:  # noqa: BLE001
        res.update(fatal=_err(e), trace=traceback.format_exc())
    _write_json(out, res)


def busy_checks(path: str) -> dict[str, Any]:
    """A second writer with a tiny busy timeout gets a clear DatabaseBusy while another connection holds
    the write lock; one with the default timeout waits and succeeds; readers are never blocked."""
    out: dict[str, Any] = {}
    fast = ragdb.open(path, chunker=CHUNKER, busy_timeout=0.2)
    patient = ragdb.open(path, chunker=CHUNKER)
    before = fast.stats()
    blocker = sqlite3.connect(path, isolation_level=None, timeout=30)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        t0 = time.monotonic()
        try:
            fast.add(doc_text("busy0", 1, 3), source="doc/busy0", metadata={"n": 3, "gen": 1})
            out["tiny_timeout"] = "no error (unexpected)"
        except DatabaseBusy as e:
            out["tiny_timeout"] = "DatabaseBusy"
            out["tiny_timeout_message"] = str(e)
        except Exception as e:  # noqa: BLE001
            out["tiny_timeout"] = _err(e)
        out["tiny_timeout_waited_s"] = round(time.monotonic() - t0, 3)
        t0 = time.monotonic()
        out["search_while_locked"] = len(fast.search(marker("a0"), k=5)) >= 0
        out["search_while_locked_s"] = round(time.monotonic() - t0, 3)
        out["unchanged_after_busy"] = fast.stats() == before
        # a writer with the default timeout waits for the lock and then succeeds
        done: dict[str, Any] = {}
        # Set just before the lock is let go: a write that finished with it clear did not wait.
        # (An order, not a duration: a loaded machine may start the thread late, which made a
        # "waited at least 0.4 s" check fail once.)
        releasing = threading.Event()

        def patient_add() -> None:
            t1 = time.monotonic()
            try:
                patient.add(doc_text("busy1", 1, 3), source="doc/busy1", metadata={"n": 3, "gen": 1})
                done["ok"] = True
            except Exception as e:  # noqa: BLE001
                done["ok"] = _err(e)
            done["after_release"] = releasing.is_set()
            done["waited_s"] = round(time.monotonic() - t1, 3)

        th = threading.Thread(target=patient_add)
        th.start()
        time.sleep(0.6)
        releasing.set()
        blocker.execute("COMMIT")
        th.join(60)
        out["default_timeout_waited_and_succeeded"] = done.get("ok") is True and done.get("after_release") is True
        out["default_timeout_finished_after_release"] = done.get("after_release")
        out["default_timeout_waited_s"] = done.get("waited_s")
    finally:
        if blocker.in_transaction:
            blocker.execute("ROLLBACK")
        blocker.close()
    fast.add(doc_text("busy0", 1, 3), source="doc/busy0", metadata={"n": 3, "gen": 1})
    out["retry_after_release"] = True
    out["check"] = fast.check()
    fast.close()
    patient.close()
    return out


def run_concurrency(workdir: str | os.PathLike[str], *, seconds: float = 8.0, readers: int = 3,
                    threads: int = 4, seed: int = 1, check_every: float = 2.0) -> dict[str, Any]:
    """Run the concurrency scenario; returns its figures (see the module docs)."""
    work = Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    path = str(work / "concurrency.db")
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.remove(path + suffix)
    ctx = mp_context()
    go = ctx.Event()
    outs: list[str] = []
    procs = []
    plan: list[tuple[Callable[..., None], tuple[Any, ...]]] = []
    plan.append((conc_writer, (seconds, seed, "a", "w1", True)))
    plan.append((conc_writer, (seconds, seed + 1, "b", "w2", False)))
    plan.append((conc_threads, (seconds, seed + 2, "th", threads, check_every)))
    for r in range(readers):
        plan.append((conc_reader, (seconds, seed + 10 + r, f"r{r}", check_every)))
    for fn, args in plan:
        out = str(work / f"{args[3] if fn is not conc_threads else args[2]}.json")
        if fn is conc_writer:
            a = (path, go, args[0], args[1], args[2], out, args[4])
        elif fn is conc_threads:
            a = (path, go, args[0], args[1], out, args[3], args[4])
        else:
            a = (path, go, args[0], args[1], out, args[3])
        outs.append(out)
        p = ctx.Process(target=fn, args=a, daemon=True)
        p.start()
        procs.append(p)
    t0 = time.monotonic()
    go.set()  # every process opens the not-yet-existing file at the same moment
    for p in procs:
        p.join(seconds + 120)
        if p.is_alive():  # pragma: no cover - a hang is a finding
            p.kill()
            p.join()
    wall = time.monotonic() - t0
    results = []
    for out, p in zip(outs, procs):
        try:
            results.append(json.loads(Path(out).read_text()))
        except (OSError, ValueError):
            results.append({"fatal": f"no result (exit code {p.exitcode}; its traceback is on stderr)"})
    figures: dict[str, Any] = {"seconds": seconds, "wall_s": round(wall, 1), "reader_processes": readers,
                               "writer_processes": 2, "thread_process_threads": threads + 1,
                               "processes": len(procs)}
    fatal = [r.get("fatal") for r in results if r.get("fatal")]
    figures["fatal"] = fatal
    readers_res = [r for r in results if r.get("role") in ("reader", "threads")]
    figures["searches"] = sum(r.get("searches", 0) for r in readers_res)
    figures["whole_documents_seen"] = sum(r.get("whole", 0) for r in readers_res)
    figures["snapshot_checks"] = sum(r.get("snapshots", 0) for r in readers_res)
    figures["check_calls_during_writes"] = sum(r.get("checks", 0) for r in readers_res)
    figures["violations"] = [v for r in readers_res for v in r.get("violations", [])][:20]
    figures["n_violations"] = sum(r.get("n_violations", 0) for r in readers_res)
    errors = [e for r in results for e in r.get("errors", []) + r.get("writer_errors", [])]
    figures["errors"] = errors[:20]
    figures["n_errors"] = sum(r.get("n_errors", 0) for r in readers_res) + sum(
        len(r.get("errors", [])) for r in results if r.get("role") == "writer") + sum(
        len(r.get("writer_errors", [])) for r in results)
    figures["locked_errors"] = sum(1 for e in errors if "locked" in e.lower() or "busy" in e.lower())
    writers = [r for r in results if r.get("role") == "writer"] + [r for r in results if r.get("role") == "threads"]
    figures["write_ops"] = {r.get("prefix", "t"): r.get("ops", {}) for r in writers}
    figures["write_ops_total"] = sum(sum(r.get("ops", {}).values()) for r in writers)
    figures["max_write_op_s"] = round(max((r.get("max_op_s", 0.0) for r in writers), default=0.0), 3)
    figures["writers"] = {("thread t" if r.get("role") == "threads" else f"process {r.get('prefix')}"):
                          {"ops": sum(r.get("ops", {}).values()), "slowest_s": round(r.get("max_op_s", 0.0), 3)}
                          for r in writers}
    # final state: every writer's last committed state is exactly what the file holds
    db = ragdb.open(path)
    mismatches = []
    expected_docs = 0
    for r in writers:
        for key, st in (r.get("state") or {}).items():
            docs = db.documents(f"doc/{key}", glob=False)
            if st is None:
                if docs:
                    mismatches.append(f"{key}: deleted but present")
                continue
            expected_docs += 1
            if len(docs) != 1 or docs[0].metadata.get("gen") != st[0] or docs[0].chunk_count != st[1]:
                mismatches.append(f"{key}: expected gen {st[0]} with {st[1]} chunks, found "
                                  f"{[(d.metadata.get('gen'), d.chunk_count) for d in docs]}")
    figures["final_documents"] = db.stats().documents
    figures["expected_documents"] = expected_docs
    figures["final_mismatches"] = mismatches[:20]
    figures["final_check"] = db.check()
    whole, _n = whole_problems(db, sample=200, rng=random.Random(seed))
    figures["final_whole_problems"] = whole[:20]
    db.close()
    figures["busy"] = busy_checks(path)
    return figures


# ============================================================================ crashes (SIGKILL)


CRASH_KEYS = 40    # sources doc/k0..k39 for add/replace/delete/add_many
CRASH_FILES = 12   # files f0..f11 in the synced folder


def _jwrite(fd: int, rec: dict[str, Any]) -> None:
    os.write(fd, (json.dumps(rec) + "\n").encode())  # one write(2): whole line or nothing


def _write_file_atomic(path: Path, text: str) -> None:
    tmp = path.parent / f".tmp-{path.name}"
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def crash_child(path: str, folder: str, journal: str, seed: int, ready: Any, flush_every: int) -> None:
    """Loop writes forever (the parent kills this process). Each operation is journalled as
    ``begin`` (with its effects: source -> version tag or None) before it starts and ``end`` after
    it returns."""
    from ragdb.files import sync

    db = ragdb.open(path, chunker=CHUNKER)
    db._settings["flush_threshold"] = flush_every  # private: flush and merge often
    ready.set()
    rng = random.Random(seed)
    fd = os.open(journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    fold = Path(folder)
    gen = seed * 100_000
    live = {d.source for d in db.documents("doc/*")}
    parent = os.getppid()
    while True:
        if os.getppid() != parent:  # the harness is gone (interrupted): do not write forever
            os._exit(0)
        gen += 1
        r = rng.random()
        absent = [f"doc/k{i}" for i in range(CRASH_KEYS) if f"doc/k{i}" not in live]
        if r < 0.22 and absent:
            op, src = "add", rng.choice(absent)
        elif r < 0.42 and live:
            op, src = "replace", rng.choice(sorted(live))
        elif r < 0.55 and live:
            op, src = "delete", rng.choice(sorted(live))
        elif r < 0.75:
            op, src = "add_many", None
        elif r < 0.93:
            op, src = "sync", None
        else:
            op, src = "optimize", None
        if op in ("add", "replace"):
            assert src is not None
            key = src[4:]
            n = rng.randint(1, 9)
            effects = {src: vtag(key, gen)}
            _jwrite(fd, {"op": op, "phase": "begin", "gen": gen, "effects": effects})
            db.add(doc_text(key, gen, n), source=src, metadata={"n": n, "gen": gen})
            live.add(src)
        elif op == "delete":
            assert src is not None
            _jwrite(fd, {"op": op, "phase": "begin", "gen": gen, "effects": {src: None}})
            db.delete(source=src)
            live.discard(src)
        elif op == "add_many":
            recs, effects = [], {}
            for _ in range(rng.randint(2, 8)):
                key = f"k{rng.randrange(CRASH_KEYS)}"
                if f"doc/{key}" in effects:
                    continue
                n = rng.randint(1, 9)
                recs.append({"text": doc_text(key, gen, n), "source": f"doc/{key}", "metadata": {"n": n, "gen": gen}})
                effects[f"doc/{key}"] = vtag(key, gen)
            _jwrite(fd, {"op": op, "phase": "begin", "gen": gen, "effects": effects})
            db.add_many(recs, batch_size=1000)  # one transaction
            live.update(effects)
        elif op == "sync":
            for _ in range(rng.randint(1, 3)):  # change the folder first (not transactional, and need not be)
                i = rng.randrange(CRASH_FILES)
                f = fold / f"f{i}.txt"
                if f.exists() and rng.random() < 0.3:
                    f.unlink()
                else:
                    _write_file_atomic(f, doc_text(f"f{i}", gen, rng.randint(1, 9)))
            effects = {}
            for f in sorted(fold.glob("f*.txt")):
                effects[f"sync/{f.name}"] = tag_of(f.read_text(encoding="utf-8"))
            for d in db.documents("sync/*"):
                effects.setdefault(d.source, None)
            _jwrite(fd, {"op": op, "phase": "begin", "gen": gen, "effects": effects})
            sync.sync_folder(db, fold, source_prefix="sync/", relative_to=fold)  # one transaction
        else:
            vacuum = rng.random() < 0.15
            op = "optimize+vacuum" if vacuum else "optimize"
            _jwrite(fd, {"op": op, "phase": "begin", "gen": gen, "effects": {}})
            db.optimize(vacuum=vacuum)
        _jwrite(fd, {"op": op, "phase": "end", "gen": gen})


def _read_journal(journal: str) -> tuple[dict[str, str | None], dict[str, Any] | None, int]:
    """(committed state source -> tag, the begun-but-unfinished operation or None, finished operations)."""
    state: dict[str, str | None] = {}
    pending: dict[str, Any] | None = None
    finished = 0
    try:
        lines = Path(journal).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return state, None, 0
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # a line the kill cut short
        if rec["phase"] == "begin":
            if pending is not None:  # begun, never ended: the process died inside it (a previous round)
                raise AssertionError("journal: an unfinished operation was not resolved")
            pending = rec
        elif rec["phase"] == "snapshot":  # what _compact_journal left of the earlier rounds
            assert pending is None
            state, finished = dict(rec["state"]), rec["finished"]
        else:
            assert pending is not None and pending["gen"] == rec["gen"]
            if not rec.get("rolled_back"):
                state.update(pending["effects"])
            finished += 1
            pending = None
    return state, pending, finished


def _compact_journal(journal: str) -> None:
    """Replace the journal by one ``snapshot`` line (committed state, finished count), so that the check
    after each kill reads one round's lines, not every round's (with 1,000 kills the whole journal holds
    some 300,000 lines). Only between rounds: no worker is alive, and the interrupted operation is resolved."""
    state, pending, finished = _read_journal(journal)
    if pending is not None:  # pragma: no cover - verify_crash resolves it first
        return
    _write_text_atomic(journal, json.dumps({"phase": "snapshot", "state": state, "finished": finished}) + "\n")


def _write_text_atomic(path: str, text: str) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, path)


def _resolve_pending(journal: str, pending: dict[str, Any], applied: bool) -> None:
    """Record how the interrupted operation ended (so the next round starts from a known state)."""
    with open(journal, "a", encoding="utf-8") as fh:
        if applied:
            fh.write(json.dumps({"op": pending["op"], "phase": "end", "gen": pending["gen"], "recovered": True}) + "\n")
        else:
            fh.write(json.dumps({"op": pending["op"], "phase": "end", "gen": pending["gen"], "rolled_back": True}) + "\n")


def verify_crash(path: str, journal: str, rng: random.Random, sample: int = 25) -> dict[str, Any]:
    """Open after a kill; check(); whole documents; committed operations present; the interrupted one
    all-or-nothing. Resolves the journal's unfinished operation."""
    out: dict[str, Any] = {"problems": []}
    t0 = time.monotonic()
    db = ragdb.open(path)
    out["open_s"] = time.monotonic() - t0
    try:
        problems = db.check()
        out["problems"] += [f"check: {p}" for p in problems]
        whole, ndocs = whole_problems(db, sample=sample, rng=rng)
        out["problems"] += whole
        out["documents"] = ndocs
        actual = {}
        for d in db.documents():
            actual[d.source] = tag_of(db.get(d.id, with_text=True).text)
        # the interrupted operation's own "end" line may be missing; lines cut short are skipped
        state, pending, _ = _read_journal(journal)
        pend_fx = pending["effects"] if pending else {}
        for src in set(state) | set(actual):
            if src in pend_fx:
                continue
            if actual.get(src) != state.get(src):
                out["problems"].append(f"{src}: holds {actual.get(src)}, the committed operations say {state.get(src)}")
        out["interrupted"] = pending["op"] if pending else None
        if pending:
            old = all(actual.get(s) == state.get(s) for s in pend_fx)
            new = all(actual.get(s) == t for s, t in pend_fx.items())
            if not (old or new):
                out["problems"].append(f"interrupted {pending['op']} (gen {pending['gen']}) is partly applied: "
                                       + ", ".join(f"{s}: {actual.get(s)} (old {state.get(s)}, new {t})"
                                                   for s, t in pend_fx.items()))
            out["interrupted_outcome"] = ("no document changes" if old and new else "applied wholly" if new
                                          else "not applied" if old else "PARTLY applied")
            _resolve_pending(journal, pending, applied=new and not old)
    finally:
        db.close()
    return out


def run_crashes(workdir: str | os.PathLike[str], *, kills: int = 20, seed: int = 7, max_delay: float = 0.6,
                early_kill_share: float = 0.1, cli_checks: int = 2, flush_every: int = FLUSH_EVERY
                ) -> dict[str, Any]:
    """Kill the writing worker ``kills`` times at random moments; verify after each kill."""
    work = Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    path = str(work / "crash.db")
    folder = work / "synced"
    folder.mkdir(exist_ok=True)
    journal = str(work / "journal.jsonl")
    ctx = mp_context()
    rng = random.Random(seed)
    figures: dict[str, Any] = {"kills": 0, "problems": [], "interrupted": {}, "early_kills": 0,
                               "exited_by_itself": [], "cli_checks": [], "max_delay_s": max_delay}
    cli_rounds = {kills - 1} | {round(i * kills / max(cli_checks, 1)) for i in range(max(cli_checks - 1, 0))}
    t_start = time.monotonic()
    max_docs = 0
    open_s = 0.0
    for rnd in range(kills):
        ready = ctx.Event()
        p = ctx.Process(target=crash_child, args=(path, str(folder), journal, seed * 1000 + rnd, ready, flush_every),
                        daemon=True)
        p.start()
        if rng.random() < early_kill_share:
            time.sleep(rng.uniform(0, 0.08))  # maybe while it opens (WAL recovery, migrations check)
            figures["early_kills"] += 1
        else:
            t_ready = time.monotonic()
            while not ready.wait(0.05):
                if not p.is_alive() or time.monotonic() - t_ready > 60:
                    figures["problems"].append(f"round {rnd}: the worker did not open the database")
                    break
            time.sleep(rng.uniform(0, max_delay))
        if p.is_alive():
            os.kill(p.pid, signal.SIGKILL)
            p.join(30)
            figures["kills"] += 1
        else:
            p.join()
            figures["exited_by_itself"].append(f"round {rnd}: exit code {p.exitcode}")
            figures["problems"].append(f"round {rnd}: the worker stopped by itself (exit code {p.exitcode}); "
                                       f"its traceback is on stderr")
        res = verify_crash(path, journal, rng)
        open_s = max(open_s, res.get("open_s", 0.0))
        max_docs = max(max_docs, res.get("documents", 0))
        op = res.get("interrupted")
        if op:
            key = f"{op} ({res.get('interrupted_outcome')})"
            figures["interrupted"][key] = figures["interrupted"].get(key, 0) + 1
        for prob in res["problems"]:
            figures["problems"].append(f"round {rnd}: {prob}")
        if rnd in cli_rounds:
            rc, text = run_cli_check(path)
            figures["cli_checks"].append({"round": rnd, "exit": rc, "output": text[:300]})
        if res["problems"]:
            break  # the journal no longer describes the file; one failing round is enough
        _compact_journal(journal)
    _state, _pending, finished = _read_journal(journal)
    figures["operations_completed"] = finished
    figures["max_documents"] = max_docs
    figures["max_open_s"] = round(open_s, 3)
    figures["wall_s"] = round(time.monotonic() - t_start, 1)
    figures["interrupted_total"] = sum(figures["interrupted"].values())
    return figures


# ============================================================================ disk full and read-only


def _snapshot(db: ragdb.Database, queries: Iterable[str]) -> Any:
    s = db.stats()
    stats = dataclasses.replace(s, file_size=0)
    docs = [(d.id, d.source, d.content_hash, d.chunk_count, d.version) for d in db.documents(versions="all")]
    hits = {q: [(h.source, h.chunk_id, round(h.score, 9)) for h in db.search(q, k=20)] for q in queries}
    return stats, docs, hits


def _fault_db(path: str, seed: int = 3) -> ragdb.Database:
    db = ragdb.open(path, chunker=CHUNKER)
    db._settings["flush_threshold"] = 64
    rng = random.Random(seed)
    for i in range(40):
        n = rng.randint(2, 8)
        db.add(doc_text(f"s{i}", 1, n), source=f"doc/s{i}", metadata={"n": n, "gen": 1})
    db.optimize(vacuum=False)                     # flushed postings ...
    db.delete(source="doc/s0")                    # ... a deleted flushed document (dead chunks) ...
    # ... and an unflushed tail, large enough that flushing it needs new pages: merged
    # segments are packed (smaller than the ones they replace), so an optimize with only
    # the merges to do can fit in the pages it frees and succeed on a full disk
    db._settings["flush_threshold"] = 10_000
    for i in range(40, 90):
        db.add(doc_text(f"s{i}", 1, 3), source=f"doc/s{i}", metadata={"n": 3, "gen": 1})
    return db


def _big_text(tag: str, words: int = 4000) -> str:
    return " ".join(f"{tag}{i}" for i in range(words))


FAULT_QUERIES = ("common", "marks3z fill2", "marks45z", "w3 pos1")


def _fault_case(work: Path, name: str, condition: str, op: Callable[[ragdb.Database, Path], Any],
                arm: Callable[[ragdb.Database], Callable[[], None]]) -> dict[str, Any]:
    """Make a database, arm the fault, run ``op``; compare before/after (this connection and a fresh one),
    lift the fault, write more, compare search results with a fresh connection."""
    path = str(work / f"{name}.db")
    db = _fault_db(path)
    folder = work / f"{name}-folder"
    folder.mkdir(exist_ok=True)
    for i in range(5):
        (folder / f"n{i}.txt").write_text(_big_text(f"sy{i}x", 1000), encoding="utf-8")
    before = _snapshot(db, FAULT_QUERIES)
    res: dict[str, Any] = {"condition": condition, "operation": name}
    disarm = arm(db)
    try:
        op(db, folder)
        res["outcome"] = "no error"
    except StorageError as e:
        res["outcome"] = "StorageError"
        res["message"] = str(e)
    except RagdbError as e:
        res["outcome"] = type(e).__name__
        res["message"] = str(e)
    except Exception as e:  # noqa: BLE001
        res["outcome"] = "crash"
        res["message"] = _err(e)
    finally:
        disarm()
    fresh = ragdb.open(path)
    res["file_unchanged"] = _snapshot(fresh, FAULT_QUERIES) == before
    res["file_check"] = fresh.check()
    res["same_connection_unchanged"] = _snapshot(db, FAULT_QUERIES) == before
    # afterwards: more writes through the same Database, including the failed operation's terms
    try:
        db.add("phantom " + _big_text("big", 50) + " recovery", source="doc/after1")
        db.add(_big_text("sy0x", 20) + " zebra", source="doc/after2")
        db.optimize(vacuum=False)
        fresh2 = ragdb.open(path)
        q = ("phantom", "recovery", "zebra", "big7", "sy0x3", "common", "marks3z fill2")
        mine = {x: [(h.source, h.chunk_id, round(h.score, 9)) for h in db.search(x, k=20)] for x in q}
        theirs = {x: [(h.source, h.chunk_id, round(h.score, 9)) for h in fresh2.search(x, k=20)] for x in q}
        ok = (mine == theirs and [h.source for h in fresh2.search("phantom")] == ["doc/after1"]
              and [h.source for h in fresh2.search("zebra")] == ["doc/after2"] and not fresh2.check())
        res["later_writes_correct"] = ok
        if not ok:
            res["later_problem"] = (f"phantom -> {[h.source for h in fresh2.search('phantom')]}, "
                                    f"zebra -> {[h.source for h in fresh2.search('zebra')]}, "
                                    f"check -> {fresh2.check()[:1]}, same results as a fresh connection: "
                                    f"{mine == theirs}")
        fresh2.close()
    except Exception as e:  # noqa: BLE001
        res["later_writes_correct"] = False
        res["later_problem"] = _err(e)
    fresh.close()
    db.close()
    return res


def _arm_full(extra_pages: int = 0) -> Callable[[ragdb.Database], Callable[[], None]]:
    def arm(db: ragdb.Database) -> Callable[[], None]:
        conn = db._store.conn
        pc = conn.execute("PRAGMA page_count").fetchone()[0]
        conn.execute(f"PRAGMA max_page_count = {pc + extra_pages}")
        return lambda: conn.execute("PRAGMA max_page_count = 4294967294")
    return arm


def _arm_query_only(db: ragdb.Database) -> Callable[[], None]:
    conn = db._store.conn
    conn.execute("PRAGMA query_only = ON")
    return lambda: conn.execute("PRAGMA query_only = OFF")


def _op_add(db: ragdb.Database, _f: Path) -> Any:
    return db.add("phantom " + _big_text("big"), source="doc/big")


def _op_add_many(db: ragdb.Database, _f: Path) -> Any:
    return db.add_many([{"text": _big_text(f"bm{i}x", 1500), "source": f"doc/bm{i}"} for i in range(8)])


def _op_replace(db: ragdb.Database, _f: Path) -> Any:
    return db.add("phantom " + _big_text("big"), source="doc/s5")


def _op_delete(db: ragdb.Database, _f: Path) -> Any:
    return db.delete(source="doc/s*", glob=True)


def _op_sync(db: ragdb.Database, folder: Path) -> Any:
    from ragdb.files import sync
    return sync.sync_folder(db, folder, source_prefix="files/", relative_to=folder)


def _op_optimize(db: ragdb.Database, _f: Path) -> Any:
    return db.optimize(vacuum=False)


def _op_vacuum(db: ragdb.Database, _f: Path) -> Any:
    return db.optimize(vacuum=True)


def _open_and_add(path: str, res: dict[str, Any]) -> None:
    """Open ``path`` and add one document; record in ``res`` how that ended
    (no error, a RagdbError at open or at the add, or a crash)."""
    try:
        db = ragdb.open(path)
        try:
            db.add("new text here", source="doc/new")
            res["outcome"] = "no error"
        except RagdbError as e:
            res["outcome"] = type(e).__name__
            res["message"] = str(e)
        db.close()
    except RagdbError as e:
        res["outcome"] = f"{type(e).__name__} at open"
        res["message"] = str(e)
    except Exception as e:  # noqa: BLE001
        res["outcome"] = "crash"
        res["message"] = _err(e)


def readonly_checks(work: Path) -> list[dict[str, Any]]:
    """Writes through a read-only open, a ``file:...?mode=ro`` path, and (when not root) a chmod-ed file."""
    out: list[dict[str, Any]] = []
    path = str(work / "ro.db")
    db = _fault_db(path)
    db.close()
    ro = ragdb.open(path, readonly=True)
    before = _snapshot(ro, FAULT_QUERIES)
    folder = work / "ro-folder"
    folder.mkdir(exist_ok=True)
    (folder / "a.txt").write_text("read only sync", encoding="utf-8")

    def attempt(cond: str, name: str, fn: Callable[[], Any]) -> None:
        res: dict[str, Any] = {"condition": cond, "operation": name}
        try:
            fn()
            res["outcome"] = "no error"
        except RagdbError as e:
            res["outcome"] = type(e).__name__
            res["message"] = str(e)
        except Exception as e:  # noqa: BLE001
            res["outcome"] = "crash"
            res["message"] = _err(e)
        fresh = ragdb.open(path, readonly=True)
        res["file_unchanged"] = _snapshot(fresh, FAULT_QUERIES) == before
        res["file_check"] = fresh.check()
        fresh.close()
        out.append(res)

    from ragdb.files import sync
    attempt("open(readonly=True)", "add", lambda: ro.add("new text here", source="doc/new"))
    attempt("open(readonly=True)", "delete", lambda: ro.delete(source="doc/s1"))
    attempt("open(readonly=True)", "optimize", lambda: ro.optimize())
    attempt("open(readonly=True)", "sync", lambda: sync.sync_folder(ro, folder, source_prefix="ro/", relative_to=folder))
    ro.close()
    # an ordinary open whose connection cannot write (what a read-only file does; root ignores chmod)
    rw = ragdb.open(path)
    rw._store.conn.execute("PRAGMA query_only = ON")
    attempt("read-only connection (query_only)", "add", lambda: rw.add("new text here", source="doc/new"))
    attempt("read-only connection (query_only)", "add_many",
            lambda: rw.add_many([{"text": "one two", "source": "doc/n1"}, {"text": "three", "source": "doc/n2"}]))
    attempt("read-only connection (query_only)", "delete", lambda: rw.delete(source="doc/s1"))
    rw._store.conn.execute("PRAGMA query_only = OFF")
    rw.close()
    # a SQLite URI that asks for read-only mode
    files_before = sorted(os.listdir(work))
    uri = f"file:{path}?mode=ro"
    res: dict[str, Any] = {"condition": "path 'file:...?mode=ro'", "operation": "open + add"}
    _open_and_add(uri, res)
    res["stray_files"] = sorted(f for f in set(os.listdir(work)) - set(files_before)
                                if not f.startswith("ro.db"))  # SQLite's own -wal/-shm of ro.db are fine
    fresh = ragdb.open(path, readonly=True)
    res["file_unchanged"] = _snapshot(fresh, FAULT_QUERIES) == before
    res["file_check"] = fresh.check()
    fresh.close()
    out.append(res)
    # real file permissions: only meaningful when not root (root bypasses chmod)
    if os.geteuid() != 0:
        d = work / "chmod"
        d.mkdir(exist_ok=True)
        cpath = str(d / "c.db")
        c = _fault_db(cpath)
        c.close()
        os.chmod(cpath, 0o444)
        for suffix in ("-wal", "-shm"):
            if os.path.exists(cpath + suffix):
                os.chmod(cpath + suffix, 0o444)
        os.chmod(d, 0o555)
        res = {"condition": "chmod 0444 file, 0555 folder", "operation": "open + add"}
        try:
            _open_and_add(cpath, res)
        finally:
            os.chmod(d, 0o755)
            os.chmod(cpath, 0o644)
        fresh = ragdb.open(cpath, readonly=True)
        res["file_unchanged"] = _snapshot(fresh, FAULT_QUERIES) == before
        res["file_check"] = fresh.check()
        fresh.close()
        out.append(res)
    return out


def run_faults(workdir: str | os.PathLike[str]) -> dict[str, Any]:
    """Disk full (SQLITE_FULL via max_page_count) and read-only conditions."""
    work = Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    cases = [
        _fault_case(work, "add", "disk full", _op_add, _arm_full()),
        _fault_case(work, "add_many", "disk full", _op_add_many, _arm_full(20)),
        _fault_case(work, "replace", "disk full", _op_replace, _arm_full()),
        _fault_case(work, "delete", "disk full", _op_delete, _arm_full()),
        _fault_case(work, "sync", "disk full", _op_sync, _arm_full()),
        _fault_case(work, "optimize", "disk full", _op_optimize, _arm_full()),
        _fault_case(work, "optimize+vacuum", "disk full", _op_vacuum, _arm_full()),
        _fault_case(work, "add (read-only connection)", "read-only connection", _op_add, _arm_query_only),
    ]
    cases += readonly_checks(work)
    return {"cases": cases, "root": os.geteuid() == 0, "wall_s": round(time.monotonic() - t0, 1)}


# ============================================================================ torture


@dataclasses.dataclass
class Case:
    cls: str
    channel: str          # lib | loader | cli
    label: str
    run: Callable[["_TortureCtx"], tuple[str, str]]
    known_bug: str | None = None
    heavy: bool = False


class _TortureCtx:
    def __init__(self, db_path: str, work: Path) -> None:
        from click.testing import CliRunner
        from ragdb.cli import cli
        self.db_path = db_path
        self.db = ragdb.open(db_path)
        self.work = work
        self.runner = CliRunner()
        self.cli = cli
        self.n = 0

    def new_dir(self) -> Path:
        self.n += 1
        d = self.work / f"c{self.n}"
        d.mkdir(parents=True, exist_ok=True)
        return d

    def invoke(self, args: list[str]) -> tuple[str, str]:
        res = self.runner.invoke(self.cli, ["-d", self.db_path, *args], catch_exceptions=True)
        err = res.stderr if hasattr(res, "stderr") else ""
        out = res.stdout
        if res.exception is not None and not isinstance(res.exception, SystemExit):
            return "crash", f"exit {res.exit_code}: {_err(res.exception)}"
        text = (out or "") + (err or "")
        if "Traceback" in text or "internal error" in text:
            return "crash", f"exit {res.exit_code}: {' '.join(text.split())[:300]}"
        if res.exit_code == 0:
            return "stored" if args and args[0] in ("add", "sync") else "ok", " ".join(out.split())[:120]
        if res.exit_code == 1 and not (err or "").strip():
            try:  # --json: the failures are in the JSON report
                js = json.loads(out)
            except ValueError:
                js = None
            if isinstance(js, dict) and js.get("failed") and all(f.get("error") for f in js["failed"]):
                return "error", str(js["failed"][0]["error"])[:200]
        if res.exit_code in (1, 2):
            lines = [ln for ln in (err or "").splitlines() if ln.strip()]
            if not lines:
                return "crash", f"exit {res.exit_code} without a message"
            return "error", lines[-1][:200]
        return "crash", f"exit {res.exit_code}: {' '.join(text.split())[:200]}"


def _lib_add(text: Any, source: str | None = None, **kw: Any) -> Callable[[_TortureCtx], tuple[str, str]]:
    def run(t: _TortureCtx) -> tuple[str, str]:
        doc = t.db.add(text, source=source, **kw)
        got = t.db.get(doc.id, with_text=True)
        if got.text != text:
            return "crash", "stored text differs from the input"
        return "stored", f"{doc.chunk_count} chunks"
    return run


def _lib_add_many(records: Any, **kw: Any) -> Callable[[_TortureCtx], tuple[str, str]]:
    def run(t: _TortureCtx) -> tuple[str, str]:
        docs = t.db.add_many(records, **kw)
        return "stored", f"{len(docs)} documents"
    return run


def _file(name: str | bytes, data: bytes, channel: str) -> Callable[[_TortureCtx], tuple[str, str]]:
    """Write ``data`` to a file called ``name`` and ingest it through the loader (+ add_many) or the CLI."""
    def run(t: _TortureCtx) -> tuple[str, str]:
        d = t.new_dir()
        if isinstance(name, bytes):
            p = os.path.join(os.fsencode(d), name)
            with open(p, "wb") as fh:
                fh.write(data)
            path = os.fsdecode(p)
        else:
            path = str(d / name)
            with open(path, "wb") as fh:
                fh.write(data)
        try:
            if channel == "cli":  # every other case with --json
                return t.invoke(["add", path, "--json"] if t.n % 2 else ["add", path])
            if channel == "cli-json":
                return t.invoke(["add", path, "--json"])
            if channel == "cli-plain":
                return t.invoke(["add", path])
            if channel == "load_bytes":
                docs = rl.load_bytes(data, source=f"bytes/{t.n}", kind=None)
            else:
                docs = rl.load_file(path)
            stored = t.db.add_many(docs)
            for doc, ld in zip(stored, docs):
                if t.db.get(doc.id, with_text=True).text != ld.text:
                    return "crash", "stored text differs from the loaded text"
            return "stored", f"{len(stored)} documents"
        finally:
            shutil.rmtree(d, ignore_errors=True)
    return run


def _search(query: Any, **kw: Any) -> Callable[[_TortureCtx], tuple[str, str]]:
    def run(t: _TortureCtx) -> tuple[str, str]:
        hits = t.db.search(query, **kw)
        if not isinstance(hits, list):
            return "crash", f"search returned {type(hits).__name__}"
        return "ok", f"{len(hits)} hits"
    return run


def _cli(args: list[str]) -> Callable[[_TortureCtx], tuple[str, str]]:
    return lambda t: t.invoke(args)


def _call(fn: Callable[[ragdb.Database], Any]) -> Callable[[_TortureCtx], tuple[str, str]]:
    def run(t: _TortureCtx) -> tuple[str, str]:
        r = fn(t.db)
        return "ok", repr(r)[:80]
    return run


def _scratch_file(db: ragdb.Database, data: bytes) -> str:
    path = os.path.join(os.path.dirname(db.path), f"scratch-{uuid.uuid4().hex}.db")
    with open(path, "wb") as fh:
        fh.write(data)
    return path


def _file_head(path: str, n: int) -> bytes:
    """The first ``n`` bytes of a file."""
    with open(path, "rb") as fh:
        return fh.read(n)


def _pdf_bytes(pages: int, *, user_password: str | None = None, encrypt: bool = False) -> bytes:
    import fpdf
    pdf = fpdf.FPDF()
    if encrypt:
        pdf.set_encryption(owner_password="owner-pw", user_password=user_password)
    pdf.set_font("Helvetica", size=12)
    for i in range(pages):
        pdf.add_page()
        pdf.multi_cell(0, 8, f"Page {i + 1} of a torture PDF. " + "Retrieval needs robust loaders. " * 20)
    return bytes(pdf.output())


_WS = [" ", "\t", "\n", "\r", "\x0b", "\x0c", "\u3000", "\u00a0", "\u2028", "\u2029", "\u200b", "\ufeff",
       "\u180e", "\u2003", "\x85"]
_SQL = ["'; DROP TABLE documents; --", "\" OR 1=1 --", "1) UNION SELECT * FROM chunks --", "%' AND '1'='1",
        "); DELETE FROM vocabulary; --", "' || (SELECT sqlite_version()) || '", "/* comment */", "\\", "?", ":name",
        "@p", "$x", "NULL", "*", "[a-z]", "[!]", "?*?*", "\x00", "'", "\"", "`", ";", "--", "\u0000DROP"]
_FTS = ["NEAR(a b, 3)", "a AND OR NOT b", "\"unclosed phrase", "col:val", "^start", "prefix*", "-exclude", "+must",
        "a OR", "(((((", ")))", "{a b}", "a:b:c", "\"\"", "* * *", "NOT", "AND", "title:\"x\"", "~fuzzy~2",
        "field:[a TO z]", "a^5", "?wild", "MATCH 'x'", "rank:bm25(1,2)"]
_UNI = ["\u202e\u202dreversed", "e\u0301\u0301\u0301", "\U0001F600\U0001F4A9", "日本語のテキスト", "中文检索增强生成",
        "\u0000\u0001\u0002", "\ud800", "\udfff", "\ufffe\uffff", "Ω≈ç√∫", "𝕳𝖊𝖑𝖑𝖔", "ﬁﬂﬀ", "İıŞş", "ß ẞ",
        "\u200d\u200c", "a\u0300\u0301\u0302\u0303\u0304" * 50, "𒀀𒀁𒀂", "\U000e0041\U000e0042"]


def _rand_text(rng: random.Random, n: int) -> str:
    pool = ["alpha", "beta", "gamma", "retrieval", "chunk", "index", "query", "sqlite", "robust"]
    return " ".join(rng.choice(pool) for _ in range(n))


def torture_cases(seed: int = 11, scale: float = 1.0, big_mb: int = 5, token_mb: int = 1,
                  deep: int = 50_000) -> list[Case]:
    """The seeded list of bad inputs (deterministic for a given seed and sizes)."""
    rng = random.Random(seed)
    cases: list[Case] = []

    def n(k: int) -> int:
        return max(1, int(round(k * scale)))

    def add(cls: str, channel: str, label: str, run: Callable[[_TortureCtx], tuple[str, str]], **kw: Any) -> None:
        cases.append(Case(cls, channel, label, run, **kw))

    # -- empty and whitespace-only ------------------------------------------------------------
    for i in range(n(70)):
        text = "".join(rng.choice(_WS) for _ in range(rng.randint(0, 40)))
        ch = rng.choice(["lib", "lib", "lib_many", "loader", "cli"])
        label = f"{len(text)} whitespace chars {text[:6]!r}"
        if ch == "lib":
            add("empty/whitespace", "lib", label, _lib_add(text, source=f"ws/{i}"))
        elif ch == "lib_many":
            add("empty/whitespace", "lib", label, _lib_add_many([{"text": "fine text", "source": f"wsok/{i}"},
                                                                {"text": text, "source": f"ws/{i}"}]))
        else:
            suffix = rng.choice([".txt", ".md", ".html", ".htm", "", ".jsonl"])
            data = text.encode("utf-8")
            if suffix in (".html", ".htm") and rng.random() < 0.5:
                data = b"<html><head><title> </title></head><body>" + data + b"<p>  </p><script>x=1</script></body></html>"
            if suffix == ".md" and rng.random() < 0.5:
                data = b"---\ntitle: only front matter\n---\n" + data
            add("empty/whitespace", "cli" if ch == "cli" else "loader", label + f" in {suffix or 'no suffix'}",
                _file(f"blank{i}{suffix}", data, ch))

    # -- invalid UTF-8 -------------------------------------------------------------------------
    bad_seqs = [b"\x80", b"\xbf", b"\xc0\xaf", b"\xe0\x80\xaf", b"\xed\xa0\x80", b"\xf5\x80\x80\x80", b"\xff",
                b"\xfe\xff", b"\xc3", b"\xe2\x82", b"\xf0\x9f\x98", b"\xc3\x28", b"\xa0\xa1", b"\xf8\x88\x80\x80\x80"]
    for i in range(n(80)):
        parts = []
        for _ in range(rng.randint(1, 30)):
            parts.append(rng.choice(bad_seqs) if rng.random() < 0.4 else rng.choice([b"word ", b"text ", b"\n"]))
        data = b"".join(parts)
        if rng.random() < 0.1:
            data = b"\xef\xbb\xbf" + data
        if rng.random() < 0.1:
            data = "utf16 text without bom".encode("utf-16-le") + data
        ch = rng.choice(["loader", "loader", "load_bytes", "cli"])
        suffix = rng.choice([".txt", ".md", ".html", "", ".jsonl", ".dat"])
        add("invalid UTF-8", "cli" if ch == "cli" else "loader", f"{len(data)} bytes in {suffix or 'no suffix'}",
            _file(f"bad{i}{suffix}", data, ch))
    for i in range(n(20)):
        s = rng.choice(["\ud800", "\udfff", "\udcff", "\udc80"])
        text = _rand_text(rng, 5) + s + _rand_text(rng, 3)
        add("invalid UTF-8", "lib", "text with a lone surrogate", _lib_add(text, source=f"sur/{i}"))
    for i, field in enumerate(["source", "title", "version", "acl"] * max(1, n(3))):
        s = "x\udcff"
        kw: dict[str, Any] = {"source": f"surf/{i}"}
        if field == "source":
            kw["source"] = f"surf/{i}/" + s
        elif field == "acl":
            kw["acl"] = [s]
        else:
            kw[field] = s
        add("invalid UTF-8", "lib", f"lone surrogate in {field}", _lib_add("valid text here", **kw), known_bug="B1")
    add("invalid UTF-8", "lib", "delete(source=lone surrogate, glob=True)",
        _call(lambda db: db.delete(source="x\udcff", glob=True)), known_bug="B1")
    add("invalid UTF-8", "loader", "file name that is not UTF-8 (load_file + add)",
        _file(b"name\xff\xfe.txt", b"text in a file whose name is not UTF-8", "loader"))
    add("invalid UTF-8", "cli", "file name that is not UTF-8 (ragdb add)",
        _file(b"name\xff\xfd.txt", b"text in a file whose name is not UTF-8", "cli-plain"))
    add("invalid UTF-8", "cli", "file name that is not UTF-8 (ragdb add --json)",
        _file(b"name\xff\xfc.txt", b"text in a file whose name is not UTF-8", "cli-json"), known_bug="B1")
    for k, v in [("k\udcff", "x"), ("k", "x\udcff"), ("source", "a\udcff"), ("version", "\udcff"),
                 ("tags", "\udcff")]:
        add("invalid UTF-8", "lib", f"filter {{{k!r}: {v!r}}}", _search("alpha", filter={k: v}), known_bug="B1")
    add("invalid UTF-8", "lib", "principals=[lone surrogate]", _search("alpha", principals=["\udcff"]), known_bug="B1")
    add("invalid UTF-8", "cli", "ragdb search --filter k=<undecodable byte>",
        _cli(["search", "--filter", "k=\udcff", "--", "alpha"]), known_bug="B1")
    add("invalid UTF-8", "cli", "ragdb search <undecodable byte>", _cli(["search", "--", "alpha\udcff"]))

    def sync_bad_name(t: _TortureCtx, as_json: bool) -> tuple[str, str]:
        d = t.new_dir()
        (d / "good.txt").write_text("a good file next to a badly named one", encoding="utf-8")
        with open(os.path.join(os.fsencode(d), b"b\xffd.txt"), "wb") as fh:
            fh.write(b"text in a file whose name is not UTF-8")
        try:
            return t.invoke(["sync", str(d), "--source-prefix", f"badname{t.n}/", "--relative-to", str(d)] + (["--json"] if as_json else []))
        finally:
            shutil.rmtree(d, ignore_errors=True)
    add("invalid UTF-8", "cli", "ragdb sync of a folder with a file name that is not UTF-8",
        lambda t: sync_bad_name(t, False))
    add("invalid UTF-8", "cli", "ragdb sync --json of a folder with a file name that is not UTF-8",
        lambda t: sync_bad_name(t, True), known_bug="B1")

    # -- NUL bytes -----------------------------------------------------------------------------
    for i in range(n(60)):
        ch = rng.choice(["lib", "lib", "loader", "cli", "jsonl"])
        if ch == "lib":
            text = "".join(rng.choice(["\x00", "nul", " ", "word", "\x00\x00"]) for _ in range(rng.randint(1, 30)))
            add("NUL bytes", "lib", f"text with {text.count(chr(0))} NULs", _lib_add(text, source=f"nul/{i}"))
        elif ch == "jsonl":
            rec = {"text": "a\u0000b text " * rng.randint(1, 5), "source": f"nulj\u0000{i}", "metadata": {"k\u0000": "v\u0000"}}
            data = (json.dumps(rec) + "\n").encode()
            add("NUL bytes", "loader", "JSONL record with \\u0000 escapes", _file(f"nul{i}.jsonl", data, "loader"))
        else:
            data = b"".join(rng.choice([b"\x00", b"text ", b"more words ", b"\x00\x00\x00"]) for _ in range(rng.randint(2, 40)))
            suffix = rng.choice([".txt", ".md", ".html", ""])
            add("NUL bytes", "cli" if ch == "cli" else "loader", f"{data.count(0)} NUL bytes in {suffix or 'no suffix'}",
                _file(f"nul{i}{suffix}", data, ch))
    add("NUL bytes", "lib", "query with NUL", _search("alpha\x00beta"))
    add("NUL bytes", "lib", "source with NUL", _lib_add("text with a NUL source", source="nul\x00source"))

    # -- huge single lines and tokens --------------------------------------------------------
    def big_line(mb: int) -> bytes:
        words = [b"alpha", b"beta", b"gamma", b"delta", b"retrieval", b"augmented", b"generation", b"sqlite"]
        one = b" ".join(words[(i * 7) % len(words)] + str(i % 1000).encode() for i in range(10000)) + b" "
        return (one * (mb * 1024 * 1024 // len(one) + 1))[: mb * 1024 * 1024]

    add("huge single line", "loader", f"{big_mb} MB single-line .txt file (load_file + add)",
        lambda t: _file("bigline.txt", big_line(big_mb), "loader")(t), heavy=True)
    add("huge single line", "cli", f"{big_mb} MB single-line .md file (ragdb add)",
        lambda t: _file("bigline.md", big_line(big_mb), "cli")(t), heavy=True)
    tok = token_mb * 1024 * 1024
    add("huge token", "lib", f"{token_mb} MB token of one letter", _lib_add("a" * tok, source="tok/a"), heavy=True)
    add("huge token", "lib", f"{token_mb} MB token of random letters",
        lambda t: _lib_add("".join(random.Random(5).choices("abcdefghij", k=tok)), source="tok/r")(t),
        heavy=True)
    add("huge token", "loader", f"{token_mb} MB of digits in a .txt file",
        lambda t: _file("digits.txt", b"7" * tok, "loader")(t), heavy=True)
    add("huge token", "cli", f"{token_mb} MB token in a .txt file (ragdb add)",
        lambda t: _file("token.txt", b"z" * tok, "cli")(t), heavy=True)
    add("huge token", "lib", f"{token_mb} MB run of CJK characters",
        lambda t: _lib_add("".join(random.Random(6).choices("检索增强生成数据库文本测试中文", k=tok // 3)),
                           source="tok/cjk")(t), heavy=True)
    add("huge token", "lib", "a letter with 100,000 combining accents",
        _lib_add("a" + "\u0301" * 100_000 + " tail", source="tok/comb"), heavy=True)
    add("huge token", "lib", f"{token_mb} MB query of one token", _search("q" * tok), heavy=True)

    # -- HTML ----------------------------------------------------------------------------------
    tags = ["div", "span", "b", "p", "table", "tr", "td", "ul", "li", "a", "em", "section", "font", "svg", "math"]
    for i in range(n(70)):
        kind = rng.choice(["deep", "soup", "unclosed", "entities", "attr", "charset", "scripts"])
        if kind == "deep":
            depth = rng.choice([100, 1000, 5000, deep])
            tg = rng.choice(tags)
            data = (f"<{tg}>" * depth + "deep text" + (f"</{tg}>" * depth if rng.random() < 0.5 else "")).encode()
            label = f"{depth} nested <{tg}>"
        elif kind == "soup":
            parts = []
            for _ in range(rng.randint(10, 400)):
                r = rng.random()
                tg = rng.choice(tags + ["script", "style", "title", "head", "body", "html", "!--", "![CDATA["])
                if r < 0.3:
                    parts.append(f"<{tg}{' x=' + repr(rng.random()) if rng.random() < 0.3 else ''}>")
                elif r < 0.5:
                    parts.append(f"</{tg}>")
                elif r < 0.6:
                    parts.append(rng.choice(["<", ">", "&", "&#", "&#x;", "<!", "<?php", "]]>", "-->", "</", "<a href='"]))
                else:
                    parts.append(_rand_text(rng, rng.randint(1, 5)))
            data = "".join(parts).encode()
            label = "random tag soup"
        elif kind == "unclosed":
            data = rng.choice([b"<html><body><p>text <b>bold <i>both", b"<script>var x = 'never closed';",
                               b"<!-- comment never closed <p>hidden", b"<style>p{color:red}", b"<title>only a title",
                               b"<p>a<p>b<p>c<li>d<td>e</table></ul>", b"<<<<>>>><p>visible</p>", b"<div"]) * rng.randint(1, 50)
            label = "unclosed / malformed tags"
        elif kind == "entities":
            data = (b"<p>" + rng.choice([b"&amp;", b"&#0;", b"&#xD800;", b"&#1114112;", b"&nosuch;", b"&#99999999999;"])
                    * rng.randint(1, 20000) + b" words</p>")
            label = "entity flood"
        elif kind == "attr":
            data = b"<p title='" + b"x" * rng.randint(1000, 300_000) + b"'>attr text</p><a href=\"" + b"\"" * 1000
            label = "huge attribute"
        elif kind == "charset":
            data = (b"<meta charset='" + rng.choice([b"x-no-such", b"utf-7", b"utf-32", b"\xff\xfe", b"../../etc"])
                    + b"'><p>charset text \xe9\xff</p>")
            label = "bogus charset"
        else:
            data = b"<p>" + b"<script>" * rng.randint(1, 3000) + b"visible?</p>" + b"<noscript>x" * 100
            label = "nested scripts"
        ch = rng.choice(["loader", "loader", "load_bytes", "cli"])
        add("malformed/deep HTML", "cli" if ch == "cli" else "loader", label,
            _file(f"page{i}.{rng.choice(['html', 'htm'])}", data, ch), heavy=kind == "deep" and depth >= 5000)

    # -- Markdown ------------------------------------------------------------------------------
    for i in range(n(70)):
        kind = rng.choice(["deep", "brackets", "fm", "fence", "soup", "heading"])
        if kind == "deep":
            depth = rng.choice([100, 1000, 10000, deep])
            unit = rng.choice([">", "- ", "1. ", "  - ", "> - ", "*", "_", "`", "[", "![", "<", "|", "#"])
            data = (unit * depth + " deep text\n").encode()
            label = f"{depth} x {unit!r}"
        elif kind == "brackets":
            data = ("[" * rng.randint(100, 20000) + "link" + "](" * rng.randint(1, 5000) + "x)").encode()
            label = "unbalanced link brackets"
        elif kind == "fm":
            fm = rng.choice([
                "title: [unclosed", "a: b: c:", "- just\n- a list", "!!python/object/apply:os.system ['true']",
                "a: &a [\"x\",\"x\"]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\n"
                "d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\ne: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]\n"
                "f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]\ng: [*f,*f,*f,*f,*f,*f,*f,*f,*f]",
                "k: " + "[" * 5000 + "]" * 5000, "\t\tbad: indent\n  - x", "date: 2026-13-45",
                "n: .nan\ni: .inf\nbig: 123456789012345678901234567890", "? complex key\n: value",
                "x: !!binary aGVsbG8=", "\x00: nul", "title: " + "y" * 100000, "k: *undefined_alias",
            ])
            body = rng.choice(["# Heading\n\nbody text", "", "   ", "text"])
            data = f"---\n{fm}\n---\n{body}".encode()
            if rng.random() < 0.3:
                data = data.replace(b"\n---\n", b"\n", 1)  # front matter never closed
            label = "front matter: " + fm[:30].replace("\n", " ")
        elif kind == "fence":
            data = ("```" + rng.choice(["python", "", "~~~", "`" * 100]) + "\ncode never closed\n" * rng.randint(1, 2000)).encode()
            label = "unclosed code fence"
        elif kind == "heading":
            data = ("#" * rng.randint(1, 12) + " " + "heading " * rng.randint(1, 20000) + "\n\nbody").encode()
            label = "huge heading"
        else:
            meta = "#*_`[]()!<>|-+=~\\\n>"
            data = "".join(rng.choice(meta) if rng.random() < 0.6 else rng.choice(["word", " ", "text"])
                           for _ in range(rng.randint(10, 3000))).encode()
            label = "random Markdown metacharacters"
        ch = rng.choice(["loader", "loader", "loader", "cli"])
        add("malformed/deep Markdown", "cli" if ch == "cli" else "loader", label, _file(f"note{i}.md", data, ch),
            known_bug="B6" if "2026-13-45" in label else None,
            heavy=kind == "deep" and depth >= 10000)

    b6 = ["date: 2026-13-45", "d: 2026-02-30 10:00:00", "n: !!int abc", "f: !!float xyz", "t: !!timestamp garbage",
          "x: !!bool maybe"]
    for fm in b6:
        data = f"---\n{fm}\n---\n# Title\n\nbody text".encode()
        add("malformed/deep Markdown", "loader", f"front matter {fm!r}", _file("fm.md", data, "loader"), known_bug="B6")
        add("malformed/deep Markdown", "cli", f"ragdb add, front matter {fm!r}", _file("fm.md", data, "cli-plain"),
            known_bug="B6")

    def sync_bad_front_matter(t: _TortureCtx, cli: bool) -> tuple[str, str]:
        from ragdb.files import sync
        d = t.new_dir()
        (d / "good.txt").write_text("a good file next to a bad one", encoding="utf-8")
        (d / "bad.md").write_text("---\ndate: 2026-13-45\n---\nbody", encoding="utf-8")
        try:
            if cli:
                return t.invoke(["sync", str(d), "--source-prefix", f"fm{t.n}/", "--relative-to", str(d)])
            rep = sync.sync_folder(t.db, d, source_prefix=f"fm{t.n}/", relative_to=d)
            return "stored", f"added {len(rep.added)}, failed {len(rep.failed)}"
        finally:
            shutil.rmtree(d, ignore_errors=True)
    add("malformed/deep Markdown", "lib", "sync_folder over a bad front-matter date and a good file",
        lambda t: sync_bad_front_matter(t, False), known_bug="B6")
    add("malformed/deep Markdown", "cli", "ragdb sync over a bad front-matter date and a good file",
        lambda t: sync_bad_front_matter(t, True), known_bug="B6")

    # -- PDFs ------------------------------------------------------------------------------------
    base_pdfs: dict[str, bytes] = {}

    def pdf(kind: str) -> bytes:
        if kind not in base_pdfs:
            if kind == "plain":
                base_pdfs[kind] = _pdf_bytes(3)
            elif kind == "locked":
                base_pdfs[kind] = _pdf_bytes(1, encrypt=True, user_password="user-pw")
            else:
                base_pdfs[kind] = _pdf_bytes(1, encrypt=True, user_password="")
        return base_pdfs[kind]

    for i in range(n(60)):
        kind = rng.choice(["truncated", "truncated", "truncated", "locked", "open-encrypted", "flipped", "garbage",
                           "header", "nested", "text"])
        cut = rng.random()
        flips = [(rng.random(), rng.randrange(256)) for _ in range(rng.randint(1, 20))]

        def make(kind: str = kind, cut: float = cut, flips: list[tuple[float, int]] = flips) -> bytes:
            if kind == "truncated":
                b = pdf("plain")
                return b[: max(1, int(len(b) * cut))]
            if kind == "locked":
                return pdf("locked")
            if kind == "open-encrypted":
                return pdf("open")
            if kind == "flipped":
                b = bytearray(pdf("plain"))
                for pos, val in flips:
                    b[int(pos * (len(b) - 1))] = val
                return bytes(b)
            if kind == "garbage":
                return b"%PDF-1.7\n" + bytes(random.Random(int(cut * 1e9)).randrange(256) for _ in range(5000))
            if kind == "header":
                return b"%PDF-1.4\n%%EOF"
            if kind == "nested":
                return (b"%PDF-1.4\n1 0 obj\n" + b"[" * 50000 + b"]" * 50000 + b"\nendobj\ntrailer\n<< /Root 1 0 R >>\n%%EOF")
            return b"this is plain text pretending to be a PDF"
        ch = rng.choice(["loader", "loader", "cli"])
        add("truncated/encrypted PDF", ch, f"{kind} PDF",
            lambda t, make=make, ch=ch, i=i: _file(f"doc{i}.pdf", make(), ch)(t))

    # -- symlink loops -------------------------------------------------------------------------------
    def loop_folder(t: _TortureCtx, variant: int) -> Path:
        root = t.new_dir() / "tree"
        (root / "sub" / "deeper").mkdir(parents=True)
        (root / "a.txt").write_text(f"loop folder file {variant} alpha", encoding="utf-8")
        (root / "sub" / "b.md").write_text(f"# Loop {variant}\n\nbeta text", encoding="utf-8")
        (root / "sub" / "deeper" / "c.txt").write_text(f"gamma {variant}", encoding="utf-8")
        os.symlink("..", root / "sub" / "up")                      # back to root
        os.symlink(".", root / "sub" / "deeper" / "self")          # to itself
        os.symlink(str(root), root / "sub" / "deeper" / "abs")     # absolute link to root
        os.symlink("x1", root / "x2")
        os.symlink("x2", root / "x1")                              # a two-link cycle (ELOOP)
        os.symlink("loopy", root / "loopy")                        # a link to itself
        os.symlink("missing-target", root / "dangling")
        if variant % 3 == 0:
            os.symlink("a.txt", root / "alias.txt")                # the same file under two names
        if variant % 4 == 0:
            os.mkfifo(root / "sub" / "fifo.txt")                  # never readable to the end
        return root

    for i in range(n(30)):
        ch = rng.choice(["iter_files", "sync", "cli add", "cli sync"])

        def run(t: _TortureCtx, i: int = i, ch: str = ch) -> tuple[str, str]:
            root = loop_folder(t, i)
            try:
                if ch == "iter_files":
                    files = list(rl.iter_files(root))
                    return ("ok" if len(files) >= 3 else "crash"), f"{len(files)} files"
                if ch == "sync":
                    from ragdb.files import sync
                    rep = sync.sync_folder(t.db, root, source_prefix=f"loop{i}/", relative_to=root)
                    return "stored", f"added {len(rep.added)}, failed {len(rep.failed)}"
                if ch == "cli add":
                    return t.invoke(["add", str(root), "--json"])
                return t.invoke(["sync", str(root), "--source-prefix", f"cliloop{i}/", "--relative-to", str(root), "--json"])
            finally:
                shutil.rmtree(root.parent, ignore_errors=True)
        add("symlink loops", "cli" if ch.startswith("cli") else "lib", f"{ch} over a folder with link loops", run)
    add("symlink loops", "loader", "load_file on a FIFO",
        lambda t: (lambda d: (os.mkfifo(d / "f.txt"), _call(lambda db: rl.load_file(d / "f.txt"))(t))[1])(t.new_dir()))
    add("symlink loops", "loader", "load_file on a self-link",
        lambda t: (lambda d: (os.symlink("s.txt", d / "s.txt"), _call(lambda db: rl.load_file(d / "s.txt"))(t))[1])(t.new_dir()))

    # -- odd paths -------------------------------------------------------------------------------------
    odd_pool = [" ", "  ", "\t", "\n", "'", "\"", "`", "$", "$(x)", ";", "&", "|", "*", "?", "[", "]", "{", "}", "#",
                "%", "%20", "\\", ":", "=", "+", "~", "!", "é", "e\u0301", "日本", "😀", "\u202e", "\u200b", "..",
                "-", "--", "file:", "?mode=ro", ",", "@", "^"]
    for i in range(n(80)):
        name = "".join(rng.choice(odd_pool) if rng.random() < 0.5 else rng.choice("abcxyz") for _ in range(rng.randint(1, 12)))
        name = name.replace("/", "_").replace("\x00", "_")
        if rng.random() < 0.1:
            name = "-" + name
        if rng.random() < 0.05:
            name = "n" * 240
        name = (name.strip() or "blank") + rng.choice([".txt", ".md", ".html", ""])
        if name in (".", "..") or name.startswith("."):
            name = "x" + name
        ch = rng.choice(["loader", "loader", "cli", "cli-dotslash", "sync"])
        text = f"odd path document {i} with marker oddpath{i}z".encode()

        def run(t: _TortureCtx, name: str = name, ch: str = ch, text: bytes = text, i: int = i) -> tuple[str, str]:
            d = t.new_dir()
            p = d / name
            try:
                p.write_bytes(text)
            except OSError as e:
                return "skipped", f"the file system refused the name ({e.strerror})"
            try:
                if ch == "loader":
                    docs = rl.load_file(str(p))
                    stored = t.db.add_many(docs)
                    hits = t.db.search(f"oddpath{i}z")
                    if not hits or hits[0].source != str(p):
                        return "crash", f"stored under {stored[0].source!r}, search finds {[h.source for h in hits]}"
                    return "stored", "searchable under its path"
                if ch == "sync":
                    from ragdb.files import sync
                    rep = sync.sync_folder(t.db, d, source_prefix=f"odd{i}/", relative_to=d)
                    if not rep.added and not rep.failed and rep.skipped:
                        # a folder walk takes text by extension: an odd suffix is skipped, with its reason
                        return "skipped", f"walk skipped it: {[k.reason for k in rep.skipped]}"[:200]
                    return ("stored" if rep.added else "crash" if not rep.failed else "error"), \
                        f"added {len(rep.added)} failed {[f.error for f in rep.failed]}"[:200]
                arg = ("./" + os.path.relpath(p)) if ch == "cli-dotslash" else str(p)
                return t.invoke(["add", arg, "--json"])
            finally:
                shutil.rmtree(d, ignore_errors=True)
        add("odd paths", "cli" if ch.startswith("cli") else "lib" if ch == "sync" else "loader", f"name {name!r}", run)

    # -- metadata that is not JSON-serialisable ----------------------------------------------------
    class Weird:
        def __repr__(self) -> str:
            raise RuntimeError("repr fails too")

    def cyc_dict() -> dict[str, Any]:
        d: dict[str, Any] = {}
        d["self"] = d
        return d

    def cyc_list() -> list[Any]:
        lst: list[Any] = []
        lst.append(lst)
        return lst

    def deep_dict(k: int) -> dict[str, Any]:
        d: dict[str, Any] = {}
        cur = d
        for _ in range(k):
            cur["x"] = {}
            cur = cur["x"]
        return d

    import numpy as np
    meta_pool: list[tuple[str, Callable[[], Any]]] = [
        ("set", lambda: {"k": {1, 2}}), ("frozenset", lambda: {"k": frozenset("ab")}), ("bytes", lambda: {"k": b"x"}),
        ("bytearray", lambda: {"k": bytearray(b"x")}), ("object", lambda: {"k": object()}),
        ("lambda", lambda: {"k": lambda: 1}), ("complex", lambda: {"k": 1j}), ("Decimal", lambda: {"k": decimal.Decimal("1.1")}),
        ("datetime", lambda: {"k": _dt.datetime(2026, 1, 1)}), ("date", lambda: {"k": _dt.date(2026, 1, 1)}),
        ("uuid", lambda: {"k": uuid.UUID(int=5)}), ("NaN", lambda: {"k": float("nan")}), ("inf", lambda: {"k": float("-inf")}),
        ("2**64", lambda: {"k": 2 ** 64}), ("-2**70", lambda: {"k": -(2 ** 70)}), ("int key", lambda: {1: "v"}),
        ("tuple key", lambda: {(1, 2): "v"}), ("None key", lambda: {None: "v"}), ("cyclic dict", cyc_dict),
        ("cyclic list", lambda: {"k": cyc_list()}), ("300-deep dict", lambda: deep_dict(300)),
        ("10000-deep dict", lambda: deep_dict(10000)), ("numpy int64", lambda: {"k": np.int64(3)}),
        ("numpy array", lambda: {"k": np.arange(3)}), ("generator", lambda: {"k": (i for i in range(3))}),
        ("1 MB string", lambda: {"k": "v" * (1 << 20)}), ("list metadata", lambda: ["not", "a", "mapping"]),
        ("str metadata", lambda: "k=v"), ("unrepresentable object", lambda: {"k": Weird()}),
        ("surrogate value", lambda: {"k": "\udcff"}), ("type object", lambda: {"k": int}),
        ("Ellipsis", lambda: {"k": ...}), ("range", lambda: {"k": range(3)}), ("nested set", lambda: {"k": [{"a": {1}}]}),
    ]
    for i in range(n(80)):
        label, make = rng.choice(meta_pool)
        ch = rng.choice(["add", "add", "add_many", "acl-ts"])
        run: Callable[[_TortureCtx], tuple[str, str]]
        if ch == "add":
            def run(t: _TortureCtx, make: Callable[[], Any] = make, i: int = i) -> tuple[str, str]:
                return _lib_add(f"metadata case {i} text", source=f"meta/{i}", metadata=make())(t)
        elif ch == "add_many":
            def run(t: _TortureCtx, make: Callable[[], Any] = make, i: int = i) -> tuple[str, str]:
                return _lib_add_many([{"text": "ok record", "source": f"metaok/{i}"},
                                      {"text": f"metadata case {i}", "source": f"meta/{i}", "metadata": make()}])(t)
        else:
            bad = rng.choice([("acl", "public"), ("acl", [1, 2]), ("acl", [""]), ("acl", [None]), ("timestamp", object()),
                              ("timestamp", "not a time"), ("timestamp", float("nan")), ("timestamp", 10 ** 20),
                              ("version", ["1"]), ("version", float("nan")), ("title", 5), ("title", b"bytes"),
                              ("source", 5), ("source", ""), ("spans", "bogus"), ("text", None), ("text", b"bytes")])
            label = f"{bad[0]}={bad[1]!r}"[:60]
            run = _lib_add_many([{"text": f"metadata case {i}", "source": f"meta/{i}", bad[0]: bad[1]}])
        add("unserialisable metadata", "lib", f"{ch}: {label}", run,
            known_bug="B5" if ch == "acl-ts" and label.startswith("spans=") else None)
    for i in range(n(15)):
        args = rng.choice([["--metadata", "=x"], ["--metadata", "k"], ["--metadata", "k=v=w"], ["--metadata", "k="],
                           ["--metadata", " =v"], ["--metadata", "k=" + "v" * 10000], ["--version", ""],
                           ["--source", ""], ["--kind", "nonsense"], ["--glob", "[["], ["--source-prefix", "\x01"]])

        def run(t: _TortureCtx, args: list[str] = args, i: int = i) -> tuple[str, str]:
            d = t.new_dir()
            p = d / "meta.txt"
            p.write_text(f"cli metadata case {i}", encoding="utf-8")
            try:
                return t.invoke(["add", str(p), *args, "--json"])
            finally:
                shutil.rmtree(d, ignore_errors=True)
        add("unserialisable metadata", "cli", "ragdb add " + " ".join(a[:20] for a in args), run)

    # -- queries full of SQL and FTS syntax ------------------------------------------------------------
    for _i in range(n(110)):
        parts = [rng.choice(_SQL + _FTS + _UNI + ["alpha", "beta", "retrieval"]) for _ in range(rng.randint(1, 6))]
        q = " ".join(parts)
        if rng.random() < 0.05:
            q = q * rng.randint(100, 3000)
        kw: dict[str, Any] = {"k": rng.choice([1, 5, 10, 100]), "scorer": rng.choice(["bm25", "tfidf"])}
        if rng.random() < 0.3:
            kw["explain"] = True
        if rng.random() < 0.2:
            kw["min_score"] = rng.choice([0.0, -1.0, 1e9, float("nan")])
        add("hostile queries", "lib", repr(q[:50]), _search(q, **kw))
    for _i in range(n(50)):
        q = " ".join(rng.choice(_SQL + _FTS + _UNI) for _ in range(rng.randint(1, 4)))
        q = q.replace("\x00", " ")  # argv cannot hold NUL (lone surrogates it can: undecodable bytes)
        args = ["search", "--json"] + (["--explain"] if rng.random() < 0.3 else []) + ["-k", str(rng.choice([1, 10])),
                                                                                        "--", q]
        add("hostile queries", "cli", f"ragdb search {q[:40]!r}", _cli(args))
    add("hostile queries", "lib", "query of 20,000 distinct terms", _search(" ".join(f"t{i}" for i in range(20000))))
    add("hostile queries", "lib", "query that is not a string", _search(b"bytes query"))
    add("hostile queries", "lib", "query None", _search(None))

    # -- filters full of SQL and glob syntax -------------------------------------------------------------
    fvals: list[Any] = _SQL + _FTS + [None, {"a": 1}, [{"a": 1}], float("nan"), float("inf"), 2 ** 70, True, b"x",
                                      [], list(range(5000)), "", " ", 0, -1, 1.5, ["a", None], ("t", "u")]
    fkeys = ["source", "version", "tags", "k", "", " ", "a.b", "$.x", "key'; DROP TABLE doc_meta; --", "\x00",
             "\udcff", "k" * 10000, "id", "latest", "metadata", "acl", "title"]
    for _i in range(n(110)):
        r = rng.random()
        kw = {}
        if r < 0.6:
            kw["filter"] = {rng.choice(fkeys): rng.choice(fvals) for _ in range(rng.randint(1, 3))}
        elif r < 0.7:
            kw[rng.choice(["since", "until", "as_of"])] = rng.choice(
                ["2026-13-40", "yesterday", "", "9999-12-31T23:59:59Z", "0001-01-01", 1e300, -1e300, None, [], "'; --"])
        elif r < 0.8:
            kw["principals"] = rng.choice([[], [""], ["'; DROP TABLE doc_acl; --"], "alice", [None], [1], ["*"], None])
        elif r < 0.9:
            kw["versions"] = rng.choice(["all", "latest", "ALL", "", None, 1, "'; --"])
        else:
            kw["filter"] = rng.choice([[], "source=x", 5, {"source": ["a"] * 20000}, {"tags": "*"}, {}])
        kwa = dict(kw)
        add("hostile filters", "lib", repr(kwa)[:70], _search("alpha retrieval", **kwa),
            known_bug="B1" if "\\udcff" in repr(kwa) else "B4" if "1180591620717411303424" in repr(kwa) else None)
    for _i in range(n(40)):
        args = ["search", "--json"]
        for _ in range(rng.randint(1, 3)):
            r = rng.random()
            if r < 0.6:
                key = rng.choice(["source", "version", "tags", "k", "", "a b", "x'; DROP TABLE documents; --", "="])
                val = rng.choice([v for v in _SQL + _FTS if isinstance(v, str) and "\x00" not in v] + ["", "[[", "*"])
                args += ["--filter", f"{key}={val}" if rng.random() < 0.9 else key]
            elif r < 0.8:
                args += [rng.choice(["--since", "--until", "--as-of"]), rng.choice(["2026-13-40", "x", "", "1e300"])]
            else:
                args += ["--principal", rng.choice(["", "'; --", "*", "alice"])]
        args += ["--", "alpha"]
        add("hostile filters", "cli", " ".join(a[:25] for a in args[2:]), _cli(args))

    # -- bad arguments ----------------------------------------------------------------------------------
    arg_pool: list[tuple[str, Callable[[ragdb.Database], Any]]] = [
        ("search k=0", lambda db: db.search("alpha", k=0)), ("search k=-1", lambda db: db.search("alpha", k=-1)),
        ("search k=10**9", lambda db: db.search("alpha", k=10 ** 9)), ("search k='5'", lambda db: db.search("alpha", k="5")),
        ("search k=None", lambda db: db.search("alpha", k=None)), ("search k=True", lambda db: db.search("alpha", k=True)),
        ("search scorer='x'", lambda db: db.search("alpha", scorer="x")),
        ("search min_score='x'", lambda db: db.search("alpha", min_score="x")),
        ("add_many batch_size=0", lambda db: db.add_many([{"text": "x"}], batch_size=0)),
        ("add_many not records", lambda db: db.add_many([1, 2])), ("add_many None", lambda db: db.add_many(None)),
        ("add_many unknown key", lambda db: db.add_many([{"text": "x", "bogus": 1}])),
        ("delete()", lambda db: db.delete()), ("delete(1, source='x')", lambda db: db.delete(1, source="x")),
        ("delete(True)", lambda db: db.delete(True)), ("delete('1')", lambda db: db.delete("1")),
        ("delete(10**30)", lambda db: db.delete(10 ** 30)), ("get(-1)", lambda db: db.get(-1)),
        ("get(10**30)", lambda db: db.get(10 ** 30)), ("get('x')", lambda db: db.get("x")),
        ("documents(limit=-1)", lambda db: db.documents(limit=-1)), ("documents(offset=-5)", lambda db: db.documents(offset=-5)),
        ("documents(source='[[')", lambda db: db.documents(source="[[")),
        ("chunker window:size=-1", lambda db: db.add("chunk me", source="ch/1", chunker="window:size=-1")),
        ("chunker window:size=abc", lambda db: db.add("chunk me", source="ch/2", chunker="window:size=abc")),
        ("chunker nonsense", lambda db: db.add("chunk me", source="ch/3", chunker="nonsense")),
        ("chunker window:size=1,overlap=1", lambda db: db.add("chunk me", source="ch/4", chunker="window:size=1,overlap=1")),
        ("chunker recursive:size=0", lambda db: db.add("chunk me", source="ch/5", chunker="recursive:size=0")),
        ("chunker window:size=10**9", lambda db: db.add("chunk me", source="ch/6", chunker=f"window:size={10 ** 9}")),
        ("chunker window:size=1,overlap=0", lambda db: db.add("chunk me twice", source="ch/7", chunker="window:size=1,overlap=0")),
        ("chunker window:", lambda db: db.add("chunk me", source="ch/8", chunker="window:")),
        ("chunker object", lambda db: db.add("chunk me", source="ch/9", chunker=object())),
        ("search k1='x'", lambda db: db.search("alpha", k1="x")), ("search b='x'", lambda db: db.search("alpha", b="x")),
        ("search k1=-5", lambda db: db.search("alpha", k1=-5.0)), ("search b=7", lambda db: db.search("alpha", b=7.0)),
        ("open with analyzer 'bogus'", lambda db: ragdb.open(":memory:", analyzer="bogus")),
        ("open with chunker 'bogus'", lambda db: ragdb.open(":memory:", chunker="bogus")),
        ("open a folder", lambda db: ragdb.open(os.path.dirname(db.path))),
        ("open a text file as a database", lambda db: ragdb.open(_scratch_file(db, b"not sqlite at all\n" * 100))),
        ("open an empty file as a database", lambda db: ragdb.open(_scratch_file(db, b""))),
        ("open a truncated SQLite file", lambda db: ragdb.open(_scratch_file(db, _file_head(db.path, 3000)))),
    ]
    for _i in range(n(60)):
        label, fn = rng.choice(arg_pool)
        bug = ("B2" if label in ("search k1='x'", "search b='x'") else "B4" if "10**30" in label
               else "B5" if label == "add_many None" else None)
        add("bad arguments", "lib", label, _call(fn), known_bug=bug)
    for args in (["search", "-k", "0", "x"], ["search", "-k", "abc", "x"], ["search", "--scorer", "bogus", "x"],
                 ["delete"], ["delete", "--id", "x"], ["show", "99999999"], ["show", "no such source"],
                 ["list", "--limit", "-1"], ["export", "/nonexistent/dir/out.jsonl"], ["import", "/nonexistent.jsonl"],
                 ["bogus-command"], ["add"], ["add", "/nonexistent/path.txt"], ["sync", "/nonexistent/dir"],
                 ["show", "99999999999999999999999"], ["delete", "--id", "-99999999999999999999999"]):
        add("bad arguments", "cli", "ragdb " + " ".join(args), _cli(list(args)),
            known_bug="B4" if "99999999999999999999999" in " ".join(args) else None)

    # -- malformed JSON Lines -----------------------------------------------------------------------------
    jl_pool = [b"{not json}\n", b"[1, 2]\n", b"\"a string\"\n", b"{}\n", b"{\"text\": 5}\n", b"{\"text\": null}\n",
               b"{\"text\": \"ok\", \"metadata\": [1]}\n", b"{\"text\": \"ok\", \"id\": {\"a\": 1}}\n",
               b"{\"text\": \"ok\", \"timestamp\": \"never\"}\n", b"{\"text\": \"\"}\n", b"{\"text\": \"   \"}\n",
               b"{\"text\": \"ok\", \"source\": \"\"}\n", b"{\"text\": \"ok\", \"title\": [1]}\n",
               b"{\"_id\": \"1\", \"text\": \"beir\", \"title\": \"t\"}\n", b"\xef\xbb\xbf{\"text\": \"bom\"}\n",
               b"{\"text\": \"ok\"", b"\n\n\n", b"{\"text\": \"" + b"d" * 200000 + b"\"}\n",
               b"{\"text\": \"nested\", \"metadata\": " + b"{\"a\":" * 300 + b"1" + b"}" * 300 + b"}\n",
               b"{\"text\": \"ok\", \"version\": [1]}\n", b"{\"text\": \"ok\", \"metadata\": {\"k\": NaN}}\n",
               b"{\"text\": \"dup\", \"text\": 7}\n", b"{\"text\": \"ok\", \"acl\": \"x\"}\n"]
    for i in range(n(50)):
        lines = [rng.choice(jl_pool) for _ in range(rng.randint(1, 6))]
        if rng.random() < 0.3:
            lines.append(b"{\"text\": \"a valid record %d\"}\n" % i)
        ch = rng.choice(["loader", "cli"])
        add("malformed JSON Lines", ch, f"{len(lines)} lines", _file(f"recs{i}.jsonl", b"".join(lines), ch))
    # the heavy cases last: the CLI cases, which reload the index on every open, then run on a small database
    return [c for c in cases if not c.heavy] + [c for c in cases if c.heavy]


def torture_child(db_path: str, work: str, seed: int, scale: float, big_mb: int, token_mb: int, deep: int,
                  start: int, results: str, case_timeout: float, heavy_timeout: float) -> None:
    """Run cases from ``start`` on, appending one JSON line per case to ``results``."""
    cases = torture_cases(seed, scale, big_mb, token_mb, deep)
    ctx = _TortureCtx(db_path, Path(work))

    class _Timeout(BaseException):
        pass

    def on_alarm(signum: int, frame: Any) -> None:
        raise _Timeout()

    signal.signal(signal.SIGALRM, on_alarm)
    fd = os.open(results, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    for i in range(start, len(cases)):
        c = cases[i]
        os.write(fd, (json.dumps({"i": i, "phase": "start"}) + "\n").encode())
        t0 = time.monotonic()
        limit = heavy_timeout if c.heavy else case_timeout
        signal.setitimer(signal.ITIMER_REAL, limit)
        try:
            outcome, detail = c.run(ctx)
        except _Timeout:
            outcome, detail = "hang", f"did not finish within {limit:.0f} s"
        except RagdbError as e:
            msg = " ".join(str(e).split())
            outcome, detail = ("error", msg[:200]) if msg else ("crash", f"{type(e).__name__} without a message")
        except Exception as e:  # noqa: BLE001 - anything else escaping the library is a finding
            outcome, detail = "crash", _err(e)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        rec = {"i": i, "phase": "done", "cls": c.cls, "channel": c.channel, "label": c.label[:120],
               "outcome": outcome, "detail": detail, "s": round(time.monotonic() - t0, 3), "known_bug": c.known_bug}
        os.write(fd, (json.dumps(rec) + "\n").encode())
    os.close(fd)


def _baseline(db: ragdb.Database) -> Any:
    docs = sorted((d.source, d.content_hash, d.chunk_count, json.dumps(d.metadata, sort_keys=True, default=str))
                  for d in db.documents("base/*"))
    hits = {}
    for i in range(30):
        hits[i] = sorted((h.source, h.chunk_id, h.ordinal) for h in db.search(marker(f"base{i}"), k=100))
    return docs, hits


def run_torture(workdir: str | os.PathLike[str], *, seed: int = 11, scale: float = 1.0, big_mb: int = 5,
                token_mb: int = 1, deep: int = 50_000, case_timeout: float = 30.0,
                heavy_timeout: float = 120.0) -> dict[str, Any]:
    """Feed every generated case through a child process (restarted after a crash or a hang)."""
    work = Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    db_path = str(work / "torture.db")
    db = ragdb.open(db_path)
    for i in range(30):  # documents stored before the torture, which it must not damage
        db.add(doc_text(f"base{i}", 1, 1 + i % 5), source=f"base/{i}", metadata={"i": i, "tags": ["x", "y"]},
               chunker=CHUNKER)
    before = _baseline(db)
    db.close()
    cases = torture_cases(seed, scale, big_mb, token_mb, deep)
    results = str(work / "torture-results.jsonl")
    ctx = mp_context()
    t0 = time.monotonic()
    start = 0
    restarts: list[str] = []
    tail = _Tail(results)
    while start < len(cases):
        p = ctx.Process(target=torture_child, args=(db_path, str(work / "cases"), seed, scale, big_mb, token_mb, deep,
                                                    start, results, case_timeout, heavy_timeout), daemon=True)
        p.start()
        last_i, last_t = start, time.monotonic()
        while p.is_alive():
            p.join(0.5)
            cur = tail.last_started()
            if cur is not None and cur != last_i:
                last_i, last_t = cur, time.monotonic()
            limit = (heavy_timeout if cases[last_i].heavy else case_timeout) + 30
            if p.is_alive() and time.monotonic() - last_t > limit:  # the alarm did not fire: stuck in C code
                p.kill()
                p.join()
                _append(results, {"i": last_i, "phase": "done", "cls": cases[last_i].cls,
                                  "channel": cases[last_i].channel, "label": cases[last_i].label[:120],
                                  "outcome": "hang", "detail": "killed by the watchdog", "s": limit,
                                  "known_bug": cases[last_i].known_bug})
        done = _done_indexes(results)
        if p.exitcode not in (0, None) and (last_i not in done):
            _append(results, {"i": last_i, "phase": "done", "cls": cases[last_i].cls, "channel": cases[last_i].channel,
                              "label": cases[last_i].label[:120], "outcome": "crash",
                              "detail": f"the process died (exit code {p.exitcode})", "s": 0,
                              "known_bug": cases[last_i].known_bug})
            restarts.append(f"case {last_i}: exit code {p.exitcode}")
        done = _done_indexes(results)
        nxt = [i for i in range(len(cases)) if i not in done]
        if not nxt:
            break
        if nxt[0] <= start and p.exitcode == 0:  # pragma: no cover - defensive
            break
        start = nxt[0]
    wall = time.monotonic() - t0
    recs = [r for r in _lines(results) if r.get("phase") == "done"]
    by_i = {r["i"]: r for r in recs}
    per_class: dict[str, dict[str, int]] = {}
    findings = []
    for i, c in enumerate(cases):
        r = by_i.get(i, {"outcome": "missing", "detail": "no result"})
        o = r["outcome"]
        # (known_bug names the bug a case was written for; all are fixed, so a crash counts)
        row = per_class.setdefault(c.cls, {"cases": 0, "lib": 0, "cli": 0})
        row["cases"] += 1
        row["cli" if c.channel == "cli" else "lib"] += 1
        row[o] = row.get(o, 0) + 1
        if o in ("crash", "hang", "missing"):
            findings.append(f"[{c.cls}] {c.channel} {c.label}: {o}: {r.get('detail')}")
    slowest = sorted(recs, key=lambda r: -r.get("s", 0))[:5]
    db = ragdb.open(db_path)
    after = _baseline(db)
    figures = {
        "cases": len(cases), "wall_s": round(wall, 1), "per_class": per_class, "findings": findings[:40],
        "n_findings": len(findings), "restarts": restarts, "check": db.check(), "baseline_unchanged": before == after,
        "stored_documents": db.stats().documents, "big_mb": big_mb, "token_mb": token_mb, "deep": deep,
        "cli_cases": sum(1 for c in cases if c.channel == "cli"), "seed": seed,
        "slowest": [(cases[r["i"]].label[:60], r["s"]) for r in slowest],
        "known_bug_cases": sorted({c.known_bug for i, c in enumerate(cases)
                                   if c.known_bug and by_i.get(i, {}).get("outcome") == "crash"}),
    }
    db.close()
    return figures


def _lines(path: str) -> list[dict[str, Any]]:
    out = []
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return out
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


class _Tail:
    """The watchdog's view of the results file: reads only what was appended since the last look
    (with ~10,000 cases, parsing the whole file twice a second would compete with the child for the CPUs)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.pos = 0
        self.partial = b""
        self.last: int | None = None

    def last_started(self) -> int | None:
        """The index of the last case the child started (None before the first)."""
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.pos)
                data = fh.read()
        except FileNotFoundError:
            return self.last
        self.pos += len(data)
        *lines, self.partial = (self.partial + data).split(b"\n")
        for line in lines:
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if r.get("phase") == "start":
                self.last = r["i"]
        return self.last


def _done_indexes(path: str) -> set[int]:
    return {r["i"] for r in _lines(path) if r.get("phase") == "done"}


def _append(path: str, rec: dict[str, Any]) -> None:
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(rec) + "\n")


# ============================================================================ expectations


TORTURE_CLASSES = ("empty/whitespace", "invalid UTF-8", "NUL bytes", "huge single line", "huge token",
                   "malformed/deep HTML", "malformed/deep Markdown", "truncated/encrypted PDF", "symlink loops",
                   "odd paths", "unserialisable metadata", "hostile queries", "hostile filters")
TORTURE_EXTRA_CLASSES = ("bad arguments", "malformed JSON Lines")


def failures(fig: dict[str, Any], targets: dict[str, float] | None = None) -> list[str]:
    """Every expectation of the issue that the figures show broken (empty: all hold). ``targets``: the
    sizes the run must reach (default ``TARGETS["ci"]``; a key left out is not checked)."""
    out: list[str] = []
    tg = TARGETS["ci"] if targets is None else targets

    def need(ok: Any, what: str) -> None:
        if not ok:
            out.append(what)

    c = fig.get("concurrency")
    if c is not None:
        need(not c["fatal"], f"concurrency: a process failed: {c['fatal']}")
        need(c["n_errors"] == 0, f"concurrency: {c['n_errors']} errors escaped to callers: {c['errors'][:3]}")
        need(c["n_violations"] == 0, f"concurrency: {c['n_violations']} torn reads: {c['violations'][:3]}")
        need(c["searches"] > 100 and c["whole_documents_seen"] > 50, "concurrency: the readers hardly read")
        need(c["check_calls_during_writes"] >= 3, "concurrency: check() hardly ran during the writes")
        need(c["write_ops"] and all(c["write_ops"].values()), f"concurrency: a writer never wrote: {c['write_ops']}")
        need(not c["final_mismatches"], f"concurrency: committed writes missing: {c['final_mismatches'][:3]}")
        need(c["final_documents"] == c["expected_documents"],
             f"concurrency: {c['final_documents']} documents stored, the writers committed {c['expected_documents']}")
        need(not c["final_check"] and not c["final_whole_problems"],
             f"concurrency: final check {c['final_check'][:2]} {c['final_whole_problems'][:2]}")
        b = c["busy"]
        need(b["tiny_timeout"] == "DatabaseBusy" and "locked" in b.get("tiny_timeout_message", ""),
             f"busy: a second writer with a tiny timeout got {b['tiny_timeout']}")
        need(b["unchanged_after_busy"] and b["search_while_locked"], "busy: the database changed or a read blocked")
        need(b["default_timeout_waited_and_succeeded"],
             "busy: a second writer with the default timeout failed, or finished while the lock was held")
        need(not b["check"], f"busy: check {b['check']}")
        need(c["reader_processes"] >= tg.get("reader_processes", 0) and c["writer_processes"] >= 2,
             f"concurrency: {c['reader_processes']} readers and {c['writer_processes']} writers, the size asks for "
             f"{tg.get('reader_processes')} and 2")
        need(c["seconds"] >= tg.get("seconds", 0), f"concurrency: {c['seconds']} s of load, the size asks for "
                                                   f"{tg.get('seconds')} s")
    k = fig.get("crashes")
    if k is not None:
        need(not k["problems"], f"crashes: {len(k['problems'])} problems: {k['problems'][:3]}")
        need(k["kills"] >= tg.get("kills", 1), f"crashes: only {k['kills']} kills of {tg.get('kills')}")
        need(not k["exited_by_itself"], f"crashes: the worker stopped by itself: {k['exited_by_itself'][:3]}")
        need(k["operations_completed"] > k["kills"], "crashes: the worker hardly worked between kills")
        need(k["interrupted_total"] >= 1, "crashes: no kill landed inside an operation")
        need(k["cli_checks"] and all(x["exit"] == 0 and "ok" in x["output"] for x in k["cli_checks"]),
             f"crashes: ragdb check failed: {k['cli_checks']}")
    f = fig.get("faults")
    if f is not None:
        for r in f["cases"]:
            name = f"{r['condition']} / {r['operation']}"
            need(r["outcome"] != "crash", f"faults: {name}: {r.get('message')}")
            need(not r["file_check"], f"faults: {name}: check {r['file_check'][:2]}")
            need(r.get("later_writes_correct") in (None, True), f"faults: {name}: afterwards {r.get('later_problem')}")
            if r["outcome"] == "no error":
                need(r["condition"] == "disk full" and r["operation"] in ("delete", "optimize+vacuum"),
                     f"faults: {name}: no error")
                continue
            need(r["file_unchanged"], f"faults: {name}: the file changed")
            msg = r.get("message", "")
            if r["condition"] == "disk full":
                need(r["outcome"] == "StorageError" and "disk is full" in msg, f"faults: {name}: {r['outcome']} {msg}")
            elif r["condition"].startswith("path 'file:"):
                need(not r["stray_files"], f"faults: {name}: made files {r['stray_files']}")
            else:
                need(r["outcome"].startswith(("StorageError", "NotADatabase")) and "read" in msg.lower(),
                     f"faults: {name}: {r['outcome']} {msg}")
        full = {r["operation"]: r for r in f["cases"] if r["condition"] == "disk full"}
        for op in ("add", "add_many", "replace", "sync", "optimize"):
            need(full.get(op, {}).get("outcome") == "StorageError", f"faults: disk full / {op}: no StorageError")
    t = fig.get("torture")
    if t is not None:
        need(t["cases"] >= tg.get("torture_cases", 1), f"torture: only {t['cases']} cases of "
                                                           f"{tg.get('torture_cases')}")
        need(not t["findings"], f"torture: {t['n_findings']} crashes or hangs: {t['findings'][:5]}")
        need(not t["check"] and t["baseline_unchanged"], f"torture: check {t['check'][:2]}, earlier documents "
                                                         f"unchanged: {t['baseline_unchanged']}")
        for cls in TORTURE_CLASSES:
            need(t["per_class"].get(cls, {}).get("cases"), f"torture: no {cls} cases")
        cli = sum(r["cli"] for r in t["per_class"].values())
        need(cli >= tg.get("cli_cases", 1), f"torture: {cli} CLI cases, fewer than {tg.get('cli_cases')}")
        need(cli >= tg.get("cli_share", 0) * t["cases"],
             f"torture: {cli} of {t['cases']} cases through the CLI, under {tg.get('cli_share', 0):.0%}")
    return out


# ============================================================================ running


def run_scenario(name: str, workdir: str | os.PathLike[str], sizes: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run scenario ``name`` in ``workdir`` with ``sizes`` (default: the CI sizes); its figures."""
    runner = {"concurrency": run_concurrency, "crashes": run_crashes, "faults": run_faults,
              "torture": run_torture}[name]
    kw = SIZES["ci"][name] if sizes is None else sizes
    return runner(workdir, **kw)


def machine() -> dict[str, Any]:
    """The facts about this machine and run that a report shows next to the figures."""
    return {"date": _now(), "python": platform.python_version(), "sqlite": sqlite3.sqlite_version,
            "ragdb": ragdb.__version__, "platform": f"{platform.system()} {platform.machine()}",
            "cpus": os.cpu_count(), "root": os.geteuid() == 0}
