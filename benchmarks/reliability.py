"""The reliability runs that write RELIABILITY.md: concurrency, SIGKILL crashes, disk full / read-only,
hostile input.

One command, from the repository root:

    .venv/bin/python benchmarks/reliability.py            # the long run, ~11 min on 2 cores
    .venv/bin/python benchmarks/reliability.py --ci       # the CI sizes, ~1 min: rewrites the CI run section
    .venv/bin/python benchmarks/reliability.py --quick    # the CI sizes as a trial (= --ci --no-write)

The long run uses 60 s of concurrent load with 8 reader processes, 2 writer
processes and a process of 8 searching threads and 1 writing thread; 1,000
SIGKILLs of the writing worker (random delay 0-0.5 s), each followed by the
integrity check; and 10x the hostile cases (~10,700, a quarter through the CLI,
in-process CliRunner) with 50 MB single-line files. It rewrites the *Long run*
section of RELIABILITY.md. ``--ci`` runs the scenarios at the sizes
``tests/engine/test_reliability.py`` uses (the test suite asserts them but writes
nothing) and rewrites the *CI run* section. ``--no-write``: only print. The
trial options (``--only``, ``--kills``, ``--seconds``, ``--torture-scale``,
``--big-mb``) imply it; e.g. ``--only crashes --kills 30`` or ``--only torture
--torture-scale 1 --big-mb 5`` time a piece of the long run. Exit status 1 when
any expectation fails (the failures are printed). The scenarios, their sizes
(``SIZES``), the figures each size must reach (``TARGETS``) and the
expectations live in ``tests/reliability_worker.py``; the writer of
RELIABILITY.md is here.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
REPORT = ROOT / "RELIABILITY.md"
sys.path.insert(0, str(ROOT / "tests"))

import reliability_worker as rw  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    size = ap.add_mutually_exclusive_group()
    size.add_argument("--ci", action="store_true",
                      help="the CI sizes of tests/engine/test_reliability.py; rewrites the CI run section")
    size.add_argument("--quick", action="store_true", help="the CI sizes as a trial (implies --no-write)")
    ap.add_argument("--no-write", action="store_true", help="print the figures, do not touch RELIABILITY.md")
    ap.add_argument("--only", choices=rw.SCENARIOS, action="append",
                    help="run only this scenario (repeatable; implies --no-write)")
    ap.add_argument("--kills", type=int, help="override the number of kills (implies --no-write)")
    ap.add_argument("--seconds", type=float,
                    help="override the seconds of concurrent load (implies --no-write)")
    ap.add_argument("--torture-scale", type=float,
                    help="override the hostile cases' scale (long 10, CI 1: ~1,070 cases per unit; implies --no-write)")
    ap.add_argument("--big-mb", type=int,
                    help="override the size of the huge single-line files in MB (long 50; implies --no-write)")
    ap.add_argument("--workdir", help="keep the databases here (default: a temporary folder)")
    ap.add_argument("--files", action="store_true",
                    help="run only the file families (ignore files, HTML, file-swap races; ~1 min) and rewrite "
                         "their section (with --no-write: print only)")
    ap.add_argument("--bounds", action="store_true",
                    help="only the bounds families (filters, expansions); rewrites their block of RELIABILITY.md "
                         "unless --no-write")
    ap.add_argument("--connections", action="store_true",
                    help="only the connections family (idle and trickling clients of ragdb serve); rewrites its "
                         "block of RELIABILITY.md unless --no-write")
    args = ap.parse_args(argv)
    if args.bounds:
        return run_bounds(write=not args.no_write)
    if args.connections:
        return run_connections(write=not args.no_write)
    if args.files:
        figures = files_families(race_seconds=15.0)
        print(json.dumps(figures, indent=1))
        if not args.no_write:
            write_report("files", figures)
            print(f"wrote the {SECTIONS['files'][0]} section of {REPORT}")
        failed = files_failures(figures)
        for f in failed:
            print(f"FAILED: {f}")
        return 1 if failed else 0
    kind = "ci" if (args.ci or args.quick) else "long"
    sizes = {k: dict(v) for k, v in rw.SIZES[kind].items()}
    targets = dict(rw.TARGETS[kind])
    if args.kills:
        sizes["crashes"]["kills"] = args.kills
        targets.pop("kills")
    if args.seconds:
        sizes["concurrency"]["seconds"] = args.seconds
        targets.pop("seconds", None)
    if args.torture_scale:
        sizes["torture"]["scale"] = args.torture_scale
        for key in ("torture_cases", "cli_cases"):
            targets.pop(key)
    if args.big_mb:
        sizes["torture"]["big_mb"] = args.big_mb
    only = args.only or list(rw.SCENARIOS)
    write = not (args.quick or args.no_write or args.only or args.kills or args.seconds or args.torture_scale
                 or args.big_mb)
    figures: dict[str, Any] = {}
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ragdb-reliability-") as tmp:
        work = Path(args.workdir or tmp)
        for name in only:
            t = time.monotonic()
            print(f"== {name} ...", flush=True)
            figures[name] = rw.run_scenario(name, work / name, sizes[name])
            print(f"   {time.monotonic() - t:.1f} s", flush=True)
    figures["machine"] = rw.machine()
    figures["total_s"] = round(time.monotonic() - t0, 1)
    failed = rw.failures(figures, targets)
    print(json.dumps({k: v for k, v in figures.items() if k != "torture"}, indent=1, default=str)[:20000])
    if "torture" in figures:
        t = figures["torture"]
        print(json.dumps({k: t[k] for k in ("cases", "wall_s", "per_class", "findings", "check",
                                            "baseline_unchanged")}, indent=1, default=str))
    if write:
        write_report(kind, figures)
        print(f"wrote the {SECTIONS[kind][0]} section of {REPORT}")
    for f in failed:
        print(f"FAILED: {f}")
    print("all expectations hold" if not failed else f"{len(failed)} expectations failed")
    return 1 if failed else 0


# ============================================================================ RELIABILITY.md


SECTIONS = {
    "ci": ("CI run", "`.venv/bin/python benchmarks/reliability.py --ci` (the scenarios and sizes that "
                     "`tests/engine/test_reliability.py` runs and asserts in the test suite)"),
    "long": ("Long run", "`.venv/bin/python benchmarks/reliability.py`"),
    "files": ("Files: ignore lines, HTML, swaps during sync", "`.venv/bin/python benchmarks/reliability.py --files`"),
}


# ============================================================================ file families (issue 32, items 4, 5, 8)


def _timed(fn: Any) -> tuple[float, Any]:
    t = time.perf_counter()
    out = fn()
    return round(time.perf_counter() - t, 3), out


def ignore_family(work: Path) -> dict[str, Any]:
    """A .gitignore line of ``a*`` x N + ``b`` against names of a's (git's wildmatch does not blow up)."""
    from ragdb.files import walk

    out: dict[str, Any] = {}
    for stars in (20, 200, 2000):
        root = work / f"ignore{stars}"
        root.mkdir(parents=True)
        (root / ".gitignore").write_text("a*" * stars + "b\n")
        (root / ("a" * 30)).write_text("kept")
        (root / ("a" * min(stars + 10, 250))).write_text("kept")
        (root / ("a" * min(stars + 10, 249) + "b")).write_text("ignored when long enough")
        out[f"a*x{stars}+b"] = _timed(lambda root=root: len(walk.walk(root).files))[0]
    return out


def html_family() -> dict[str, Any]:
    """Load time of HTML pages with many distinct attribute or tag names."""
    from ragdb.files import loaders

    out: dict[str, Any] = {}
    pages = {
        "40,000 attributes on a tag": "<p " + " ".join(f"a{i}=x" for i in range(40_000)) + ">words</p>",
        "1,000,000 attributes on a tag (9 MB)": "<p " + " ".join(f"a{i}=x" for i in range(1_000_000)) + ">words</p>",
        "80,000 tags, one new attribute each": "".join(f"<p a{i}=x>words</p>" for i in range(80_000)),
        "40,000 distinct tag names": "".join(f"<x{i}>words</x{i}>" for i in range(40_000)),
    }
    for label, page in pages.items():
        secs, docs = _timed(lambda page=page: loaders.load_bytes(page.encode(), source="p.html", kind="html"))
        out[label] = {"seconds": secs, "text_ok": "words" in docs[0].text}
    return out


def race_family(work: Path, seconds: float) -> dict[str, Any]:
    """Syncs while a thread swaps a file for a link to a file outside the folder, a FIFO or
    another file: nothing from outside may be indexed, no sync may hang or raise OSError."""
    import threading

    import ragdb
    from ragdb.files import sync

    root = work / "race" / "shared"
    root.mkdir(parents=True)
    for i in range(30):
        (root / f"f{i}.md").write_text(f"Inside document {i} about sailing boats.\n")
    outside = work / "race" / "outside.txt"
    outside.write_text("Outside words: zanzibar quokka.\n")
    stop = threading.Event()
    swaps = [0]

    def swapper() -> None:
        while not stop.is_set():
            n = swaps[0] = swaps[0] + 1
            tmp = root / f".swap{n % 2}"
            try:
                if n % 3 == 0:
                    os.symlink(outside, tmp)
                elif n % 3 == 1:
                    os.mkfifo(tmp)
                else:
                    tmp.write_text(f"Inside document 15, version {n}.\n")
                os.replace(tmp, root / "f15.md")
            except OSError:
                pass

    thread = threading.Thread(target=swapper, daemon=True)
    thread.start()
    syncs = leaks = os_errors = ragdb_errors = 0
    skipped: dict[str, int] = {}
    end = time.monotonic() + seconds
    try:
        with ragdb.open(work / "race" / "kb.db") as db:
            while time.monotonic() < end:
                syncs += 1
                try:
                    report = sync.sync_folder(db, root)
                    for k in report.skipped:
                        skipped[k.reason] = skipped.get(k.reason, 0) + 1
                except ragdb.RagdbError:
                    ragdb_errors += 1
                except OSError:
                    os_errors += 1
                leaks += bool(db.search("zanzibar quokka"))
    finally:
        stop.set()
        thread.join()
    return {"seconds": seconds, "syncs": syncs, "swaps": swaps[0], "outside_indexed": leaks,
            "bare_oserrors": os_errors, "ragdb_errors": ragdb_errors, "skipped": skipped}


def files_families(race_seconds: float = 15.0) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="ragdb-reliability-files-") as tmp:
        work = Path(tmp)
        return {"ignore": ignore_family(work), "html": html_family(), "race": race_family(work, race_seconds),
                "machine": rw.machine()}


def files_failures(fig: dict[str, Any]) -> list[str]:
    out = [f"ignore line {k}: {v} s (bar: 1 s)" for k, v in fig["ignore"].items() if v >= 1.0]
    out += [f"HTML {k}: text lost" for k, v in fig["html"].items() if not v["text_ok"]]
    race = fig["race"]
    if race["outside_indexed"] or race["bare_oserrors"]:
        out.append(f"race: {race['outside_indexed']} syncs indexed outside text, {race['bare_oserrors']} bare OSErrors")
    return out


def render_files(fig: dict[str, Any]) -> str:
    L = [f"## {SECTIONS['files'][0]}", "", f"Command: {SECTIONS['files'][1]}", "",
         "A `.gitignore` line of `a*` repeated and `b` (walk of a folder of names of a's):", "",
         "| line | walk, s |", "|---|---|"]
    L += [f"| `{k}` | {v} |" for k, v in fig["ignore"].items()]
    L += ["", "HTML pages with many distinct names (load, s; text read right):", "",
          "| page | s | text |", "|---|---|---|"]
    L += [f"| {k} | {v['seconds']} | {_yn(v['text_ok'])} |" for k, v in fig["html"].items()]
    r = fig["race"]
    L += ["", f"Syncs for {r['seconds']:g} s while a thread swaps `f15.md` for a link to a file outside the folder, "
          "a FIFO or another file:", "", "| figure | value |", "|---|---|",
          f"| syncs | {r['syncs']:,} |", f"| swaps | {r['swaps']:,} |",
          f"| syncs that indexed outside text | {r['outside_indexed']} |",
          f"| bare OSErrors | {r['bare_oserrors']} |", f"| RagdbErrors | {r['ragdb_errors']} |",
          f"| skips by reason | {', '.join(f'{k} {v}' for k, v in sorted(r['skipped'].items())) or 'none'} |",
          "", "Machine: " + ", ".join(f"{k} {v}" for k, v in fig["machine"].items()), ""]
    return "\n".join(L)


def _command(kind: str) -> str:
    """The section's Command line; the long run's states its sizes (from ``rw.SIZES``)."""
    command = SECTIONS[kind][1]
    if kind != "long":
        return command
    sz = rw.SIZES["long"]
    return (f"{command} (sizes: {sz['concurrency']['readers']} reader processes and 2 writer processes for "
            f"{sz['concurrency']['seconds']:g} s, {sz['crashes']['kills']:,} kills, {sz['torture']['scale']:g}x the "
            f"hostile cases of the CI run)")


def _scrub(text: str) -> str:
    """Drop the temporary folders from a message (they differ on every run)."""
    import re
    return re.sub(r"/(?:[^\s/`'\"]+/)+", "<tmp>/", text)


def _yn(v: Any) -> str:
    return "yes" if v is True else "no" if v is False else str(v)


def render_section(kind: str, fig: dict[str, Any]) -> str:
    title, command = SECTIONS[kind][0], _command(kind)
    m = fig.get("machine", {})
    L = [f"## {title}", "", f"Command: {command}", "",
         f"- Date: {m.get('date')}; total {fig.get('total_s', '?')} s",
         f"- Machine: {m.get('platform')}, {m.get('cpus')} CPUs; Python {m.get('python')}, SQLite {m.get('sqlite')}, "
         f"ragdb {m.get('ragdb')}; running as root: {_yn(m.get('root'))}", ""]
    c = fig.get("concurrency")
    L += ["### Concurrency", ""]
    if c:
        b = c.get("busy", {})
        L += ["| figure | value |", "|---|---|",
              f"| processes at once (all opened the new file together) | {c['processes']} "
              f"({c['reader_processes']} reader processes, {c['writer_processes']} writer processes, 1 process whose "
              f"{c['thread_process_threads']} threads share one Database: {c['thread_process_threads'] - 1} searching, "
              f"1 writing) |",
              f"| duration | {c['seconds']} s of concurrent load ({c['wall_s']} s wall) |",
              f"| searches checked for a whole snapshot | {c['searches']:,} ({c['whole_documents_seen']:,} saw a "
              f"document, each wholly) |",
              f"| stats/documents single-snapshot checks | {c['snapshot_checks']:,} |",
              f"| check() runs during the writes | {c['check_calls_during_writes']} |",
              f"| write operations committed (lock waits included in the slowest) | {c['write_ops_total']:,}: "
              + ", ".join(f"writer {w} {v['ops']:,} (slowest {v['slowest_s']} s)"
                          for w, v in sorted(c.get("writers", {}).items())) + " |",
              f"| half-added documents / inconsistent snapshots seen | {c['n_violations']} |",
              f"| errors escaping to callers ('database is locked' among them) | {c['n_errors']} ({c['locked_errors']}) |",
              f"| final state = every writer's committed operations | {_yn(not c['final_mismatches'])} "
              f"({c['final_documents']} documents) |",
              f"| check() at the end | {'ok' if not c['final_check'] else c['final_check']} |",
              f"| second writer, busy_timeout 0.2 s, lock held elsewhere | {b.get('tiny_timeout')} after "
              f"{b.get('tiny_timeout_waited_s')} s, database unchanged: {_yn(b.get('unchanged_after_busy'))} |",
              f"| second writer, default busy_timeout, lock held 0.6 s | waited {b.get('default_timeout_waited_s')} s "
              f"and succeeded: {_yn(b.get('default_timeout_waited_and_succeeded'))} |",
              f"| search while another connection holds the write lock | not blocked "
              f"({b.get('search_while_locked_s')} s) |", ""]
        if b.get("tiny_timeout_message"):
            L += [f"The busy error reads: `{_scrub(b['tiny_timeout_message'])}`", ""]
    else:
        L += ["not run", ""]
    k = fig.get("crashes")
    L += ["### Crashes (SIGKILL at random moments)", ""]
    if k:
        inter = ", ".join(f"{op} {n}" for op, n in sorted(k["interrupted"].items())) or "none"
        cli = "; ".join(f"after kill {x['round'] + 1}: exit {x['exit']}" for x in k["cli_checks"]) or "not run"
        L += ["| figure | value |", "|---|---|",
              f"| kills survived (database opened, check() passed, documents whole, committed work present) | "
              f"{k['kills'] - len({p.split(':')[0] for p in k['problems']})} of {k['kills']} |",
              f"| kills while the worker opened the database | {k['early_kills']} |",
              f"| operations committed between kills | {k['operations_completed']:,} |",
              f"| kills inside an operation (op: applied all / none) | {k['interrupted_total']} ({inter}) |",
              f"| largest database during the run | {k['max_documents']} documents |",
              f"| slowest open after a kill | {k['max_open_s']} s |",
              f"| `ragdb check` (CLI subprocess) | {cli} |",
              f"| problems | {len(k['problems'])} |",
              f"| duration | {k['wall_s']} s (random delay 0-{k['max_delay_s']} s after the worker is ready) |", ""]
        for p in k["problems"][:10]:
            L.append(f"- problem: {_scrub(p)}")
        if k["problems"]:
            L.append("")
    else:
        L += ["not run", ""]
    f = fig.get("faults")
    L += ["### Disk full and read-only", ""]
    if f:
        L += ["| condition | operation | outcome | file unchanged | check() | same Database afterwards |",
              "|---|---|---|---|---|---|"]
        for r in f["cases"]:
            later = r.get("later_writes_correct")
            later_s = "-" if later is None else ("correct" if later else "WRONG (known bug)")
            unchanged = "n/a (it succeeded)" if r["outcome"] == "no error" else _yn(r.get("file_unchanged"))
            L.append(f"| {r['condition']} | {r['operation']} | {r['outcome']} | {unchanged} | "
                     f"{'ok' if not r.get('file_check') else 'FAILED'} | {later_s} |")
        L.append("")
        msgs = {r["outcome"]: r.get("message") for r in f["cases"] if r.get("message") and "full" in r["message"]}
        msgs.update({r["outcome"] + " (read-only)": r.get("message") for r in f["cases"]
                     if r.get("message") and "read-only" in r["message"]})
        for o, msg in sorted(msgs.items()):
            L.append(f"- {o} message, e.g.: `{_scrub(msg)[:200]}`")
        L.append("")
    else:
        L += ["not run", ""]
    t = fig.get("torture")
    L += ["### Hostile and broken input", ""]
    if t:
        L += [f"{t['cases']:,} generated cases (seed {t['seed']}; {t['cli_cases']:,} ({t['cli_cases'] / t['cases']:.0%}) "
              f"through the CLI, in-process with click's CliRunner), {t['wall_s']} s; "
              f"sizes: {t['big_mb']} MB single-line files, {t['token_mb']} MB tokens, nesting up to {t['deep']:,}. "
              f"Outcomes: *stored* (a document stored, its text read back equal), *ok* (a search or call returned), "
              f"*error* (a RagdbError / CLI exit 1-2 with a one-line message), *crash* (anything else), *hang* (past the "
              f"time limit).", "",
              "| class | cases | library | CLI | stored | ok | clear error | crash | hang |",
              "|---|---|---|---|---|---|---|---|---|"]
        order = [c for c in rw.TORTURE_CLASSES + rw.TORTURE_EXTRA_CLASSES if c in t["per_class"]]
        order += sorted(set(t["per_class"]) - set(order))
        for cls in order:
            row = t["per_class"][cls]
            L.append(f"| {cls} | {row['cases']} | {row['lib']} | {row['cli']} | {row.get('stored', 0)} | "
                     f"{row.get('ok', 0)} | {row.get('error', 0)} | {row.get('crash', 0)} | {row.get('hang', 0)} |")
        L += ["", f"- After the torture: check() {'ok' if not t['check'] else t['check']}; the 30 documents stored "
                  f"before it unchanged: {_yn(t['baseline_unchanged'])}; worker restarts: {len(t['restarts'])}.",
              "- Slowest cases: " + "; ".join(f"{lbl} {s:.1f} s" for lbl, s in t["slowest"]) + "."]
        for x in t["findings"][:10]:
            L.append(f"- finding: {_scrub(x)}")
        L.append("")
    else:
        L += ["not run", ""]
    return "\n".join(L).rstrip() + "\n"


HEADER = """# Reliability

This file is written by `benchmarks/reliability.py`; do not edit it by hand.
`.venv/bin/python benchmarks/reliability.py --ci` rewrites the *CI run* section: the
scenarios at the sizes `tests/engine/test_reliability.py` runs and asserts in the test suite
(under ~90 s on 2 busy cores; the test suite itself writes nothing here).
`.venv/bin/python benchmarks/reliability.py` (the long version, ~11 min on 2 cores: 8 reader
and 2 writer processes for 60 s, 1,000 SIGKILLs, over 10,000 hostile inputs) rewrites the
*Long run* section. The scenarios and both sets of sizes live in `tests/reliability_worker.py`.

What is tested:

- **Concurrency**: reader processes and threads search while writer processes add,
  replace, delete, bulk-add and optimize (flushes every 48 chunks). Every document
  is several chunks that all hold a marker word unique to its source; each marker
  search must show one whole version of one document, never a subset, and
  `stats()`/`documents()` read in one transaction must agree. A second writer with
  a tiny busy timeout must get `DatabaseBusy` with a clear message.
- **Crashes**: a worker process loops add / replace / delete / `add_many` /
  folder sync / optimize (+VACUUM) and is killed with SIGKILL at a random moment
  (some while it opens the file). After each kill the database must open,
  `check()` must pass (SQLite integrity_check, statistics, df = real postings, no
  orphans), every document must be whole (chunk rows = chunks of its text, marker
  search = those chunks), every operation the worker finished must be there, and
  the interrupted one must be applied wholly or not at all. `ragdb check` runs as a
  subprocess on the killed database too. The CI run kills 22 times, the long run 1,000.
- **Disk full and read-only**: disk full is SQLite's `SQLITE_FULL`, produced with
  `PRAGMA max_page_count`; read-only is `open(readonly=True)`, a `file:...?mode=ro`
  path, and a connection that cannot write (`PRAGMA query_only`, what a read-only
  file does). Running as root bypasses file permissions (chmod 0444 changes
  nothing for root), so the chmod case runs only as a normal user.
- **Hostile input**: a seeded generator of bad inputs through the library and the
  CLI, each under a time limit in a child process that is restarted if it dies. The
  CLI cases run in that process through click's CliRunner (a subprocess per case
  would cost more than the case); about a quarter of the cases go through the CLI.
  The CI run: ~1,100 cases, 5 MB single-line files and 1 MB tokens; the long run
  10x the cases (over 10,000), 50 MB and 1 MB.

Worker processes are forked from a `multiprocessing` forkserver that imported
ragdb once (each is a separate process with its own SQLite connections).
"""


def write_report(kind: str, figures: dict[str, Any], path: Path = REPORT) -> None:
    """Rewrite ``kind``'s section of RELIABILITY.md, keeping the other sections as they are."""
    existing = path.read_text(encoding="utf-8") if path.exists() else ""
    sections: dict[str, str] = {}
    for key in SECTIONS:
        start, end = f"<!-- section: {key} -->", f"<!-- end: {key} -->"
        if start in existing and end in existing:
            sections[key] = existing.split(start, 1)[1].split(end, 1)[0].strip("\n") + "\n"
    sections[kind] = render_files(figures) if kind == "files" else render_section(kind, figures)
    out = [HEADER]
    for key, (title, _cmd) in SECTIONS.items():
        body = sections.get(key) or f"## {title}\n\nnot run yet\n"
        out.append(f"<!-- section: {key} -->\n{body}<!-- end: {key} -->\n")
    for name, block in _family_blocks(existing).items():  # the families' own blocks (run_bounds) stay
        out.append(f"<!-- family: {name} -->\n{block}<!-- end family: {name} -->\n")
    bugs = ["## Library bugs found by these tests", "",
            "Each was fixed; its test in `tests/engine/test_reliability.py` (once a strict xfail) now guards the fix:", ""]
    bugs += [f"- **{k}** (fixed): {v}" for k, v in rw.KNOWN_BUGS.items()]
    out.append("\n".join(bugs) + "\n")
    tmp = path.with_suffix(".md.tmp")
    tmp.write_text("\n".join(out), encoding="utf-8")
    os.replace(tmp, path)



# ============================================================================ bounds families (issue 32)


def _family_blocks(text: str) -> dict[str, str]:
    """name -> body of every ``<!-- family: name -->`` block of RELIABILITY.md."""
    out: dict[str, str] = {}
    for part in text.split("<!-- family: ")[1:]:
        name, rest = part.split(" -->", 1)
        end = f"<!-- end family: {name} -->"
        if end in rest:
            out[name] = rest.split(end, 1)[0].strip("\n") + "\n"
    return out


def _outcome(fn: Any) -> tuple[str, float]:
    """(outcome, seconds) of one call: "answered", or the RagdbError's class (a refusal)."""
    import ragdb

    t = time.perf_counter()
    try:
        fn()
        outcome = "answered"
    except ragdb.RagdbError as e:
        outcome = f"refused ({type(e).__name__})"
    except Exception as e:  # noqa: BLE001 - anything else is a finding
        outcome = f"FAILED: {type(e).__name__}: {e}"
    return outcome, time.perf_counter() - t


def bounds_filters(db: Any) -> list[tuple[str, str, float, float]]:
    """(case, outcome, seconds, bar) of wide filters (docs/limits.md): each answered or refused within its bar."""
    n = 10_000
    cases = [
        ("$or of 10,000 equality branches, one key", {"$or": [{"team": f"t{i}"} for i in range(n)]}, 1.0),
        ("$or of 10,000 equality branches, 10,000 keys", {"$or": [{f"k{i}": i} for i in range(n)]}, 1.0),
        ("$or of 99 equality branches, one key", {"$or": [{"team": f"t{i}"} for i in range(99)]}, 1.0),
        ("$or of 99 equality branches, 99 keys", {"$or": [{f"k{i}": i} for i in range(99)]}, 1.0),
        ("$in of 10,000 values", {"team": {"$in": [f"t{i}" for i in range(n)]}}, 1.0),
        ("$and of 99 $ne on 99 keys", {"$and": [{f"k{i}": {"$ne": i}} for i in range(99)]}, 1.0),
        ("$and of 99 ranges on one key (matching every document)",
         {"$and": [{"n": {"$gt": -i - 1}} for i in range(99)]}, 30.0),
        ("220,000 branches (a 4 MiB body)", {"$or": [{"team": f"t{i}"} for i in range(220_000)]}, 1.0),
    ]
    return [(name, *_outcome(lambda f=f: db.search("alpha", k=5, filter=f)), bar) for name, f, bar in cases]


def bounds_expansions(db: Any) -> list[tuple[str, str, float, float]]:
    """(case, outcome, seconds, bar) of costly queries: expansions, long fuzzy words, long CJK text."""
    import itertools
    import string

    pre = [a + b + "*" for a, b in itertools.product(string.ascii_lowercase, repeat=2)][:1000]
    cjk = "".join(chr(0x4E00 + (i * 7919) % 20000) for i in range(400_000))
    cases = [
        ("1,000 two-letter prefixes", lambda: db.search(" ".join(pre), k=10), 1.0),
        ("500 boosted prefixes", lambda: db.search(" ".join(w[:-1] + "*^2" for w in pre[:500]), k=10), 1.0),
        ("query_plan of a 3,000-letter fuzzy word", lambda: db.query_plan("q" * 3000 + "~"), 10.0),
        ("search of a 3,000-letter fuzzy word", lambda: db.search("q" * 3000 + "~"), 10.0),
        ("search of 400,000 CJK characters", lambda: db.search(cjk), 10.0),
    ]
    return [(name, *_outcome(fn), bar) for name, fn, bar in cases]


def run_bounds(write: bool = True, docs: int = 20_000) -> int:
    """The filters and expansions families on ``docs`` documents; exit status 1 when a case
    fails or passes its bar."""
    import random

    import ragdb

    rnd = random.Random(32)
    words = ["".join(rnd.choice(string_letters()) for _ in range(rnd.randint(3, 9))) for _ in range(30_000)]
    rows: dict[str, list[tuple[str, str, float, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="ragdb-bounds-") as tmp, ragdb.open(Path(tmp) / "kb.db") as db:
        db.add_many([{"source": f"s{i}", "text": "alpha " + " ".join(rnd.choice(words) for _ in range(40)),
                      "metadata": {"team": f"t{i % 500}", "n": i, f"k{i % 300}": i}} for i in range(docs)])
        rows["filters"] = bounds_filters(db)
        rows["expansions"] = bounds_expansions(db)
    failed = [(fam, r) for fam, rs in rows.items() for r in rs if r[1].startswith("FAILED") or r[2] > r[3]]
    lines = ["## Bounds: filters and expansions (issue 32)", "",
             f"`.venv/bin/python benchmarks/reliability.py --bounds`: {docs:,} documents (SQLite), each case "
             f"run once, cold; limits in [docs/limits.md](docs/limits.md). Machine: "
             + ", ".join(f"{k} {v}" for k, v in rw.machine().items()) + ".", ""]
    for fam, rs in rows.items():
        lines += [f"### {fam.capitalize()}", "", "| case | outcome | seconds | bar |", "|---|---|---:|---:|"]
        lines += [f"| {name} | {out} | {sec:.2f} | {bar:g} s |" for name, out, sec, bar in rs]
        lines.append("")
    text = "\n".join(lines)
    print(text)
    if write:
        existing = REPORT.read_text(encoding="utf-8")
        start, end = "<!-- family: bounds -->", "<!-- end family: bounds -->"
        block = f"{start}\n{text}{end}\n"
        if start in existing and end in existing:
            existing = existing.split(start, 1)[0] + block + existing.split(end, 1)[1].lstrip("\n")
        else:
            marker = "## Library bugs found by these tests"
            existing = existing.replace(marker, block + "\n" + marker, 1) if marker in existing else existing + block
        REPORT.write_text(existing, encoding="utf-8")
    for fam, r in failed:
        print(f"FAILED: {fam}: {r}")
    return 1 if failed else 0


# ============================================================================ connections family (issue 32, item 10)


def _write_family(name: str, text: str) -> None:
    """Put ``text`` in the ``<!-- family: name -->`` block of RELIABILITY.md (write_report keeps it)."""
    existing = REPORT.read_text(encoding="utf-8")
    start, end = f"<!-- family: {name} -->", f"<!-- end family: {name} -->"
    block = f"{start}\n{text}{end}\n"
    if start in existing and end in existing:
        existing = existing.split(start, 1)[0] + block + existing.split(end, 1)[1].lstrip("\n")
    else:
        marker = "## Library bugs found by these tests"
        existing = existing.replace(marker, block + "\n" + marker, 1) if marker in existing else existing + block
    REPORT.write_text(existing, encoding="utf-8")


def run_connections(write: bool = True, idle: int = 1_100, header_timeout: float = 2.0) -> int:
    """``ragdb serve`` under ``idle`` connections that never send a byte and as many that trickle a
    request head one byte a second (the issue's lockout: 1,100 idle connections under the usual
    ``ulimit -n 1024``), then: does a new client get its answer while they hang on, are they closed
    after the header timeout, and does the server answer afterwards? Exit status 1 when not."""
    import resource
    import select
    import socket
    import subprocess

    import httpx

    import ragdb

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, 2 * idle + 256)  # (hard: the server's too, which it raises its soft limit to)
    if soft < want:  # this process holds the idle sockets: it needs the descriptors, the server keeps 1024
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    figures: dict[str, Any] = {"idle connections": idle, "header timeout (s)": header_timeout}
    with tempfile.TemporaryDirectory(prefix="ragdb-conns-") as tmp:
        kb = Path(tmp) / "kb.db"
        with ragdb.open(kb) as db:
            db.add("Idle connections are closed after the header timeout.", source="a.md")
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        url = f"http://127.0.0.1:{port}"
        env = {k: v for k, v in os.environ.items() if k != "RAGDB_API_TOKEN"}
        env["PYTHONPATH"] = str(ROOT)
        server = subprocess.Popen(
            ["bash", "-c", 'ulimit -Sn 1024; exec "$0" -m ragdb.cli serve -d "$1" --port "$2" --header-timeout "$3"',
             sys.executable, str(kb), str(port), str(header_timeout)],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        socks: list[socket.socket] = []
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError("ragdb serve did not start")
                time.sleep(0.1)
            opened = 0
            for i in range(idle):
                try:
                    s = socket.create_connection(("127.0.0.1", port), timeout=5)
                except OSError:
                    break
                if i % 2:
                    s.sendall(b"G")  # the start of a request head, and no more for now
                socks.append(s)
                opened += 1
            figures["connections opened"] = opened
            t = time.perf_counter()
            try:
                r = httpx.get(url + "/healthz", timeout=30)
                figures["new client while they hang on"] = f"{r.status_code} in {time.perf_counter() - t:.2f} s"
                served = r.status_code in (200, 503)
            except httpx.HTTPError as e:
                figures["new client while they hang on"] = f"no answer ({type(e).__name__})"
                served = False
            time.sleep(header_timeout + 3)
            closed = 0
            poller = select.poll()  # (select() takes no descriptor past 1023)
            by_fd = {s.fileno(): s for s in socks}
            for fd in by_fd:
                poller.register(fd, select.POLLIN | select.POLLHUP)
            wait_until = time.monotonic() + 10  # a bound on this check, not a figure
            while by_fd and time.monotonic() < wait_until:
                ready = poller.poll(500)
                if not ready:
                    break
                for fd, _event in ready:
                    try:
                        gone = by_fd[fd].recv(1) == b""
                    except OSError:
                        gone = True
                    if gone:
                        closed += 1
                        poller.unregister(fd)
                        del by_fd[fd]
            figures["closed by the server after the timeout"] = closed
            t = time.perf_counter()
            try:
                r = httpx.post(url + "/search", json={"query": "idle"}, timeout=30)
                figures["a search afterwards"] = f"{r.status_code} in {time.perf_counter() - t:.2f} s"
                after_ok = r.status_code == 200
            except httpx.HTTPError as e:
                figures["a search afterwards"] = f"no answer ({type(e).__name__})"
                after_ok = False
        finally:
            for s in socks:
                s.close()
            server.terminate()
            err = server.communicate(timeout=30)[1].decode(errors="replace")
            Path(tempfile.gettempdir(), "ragdb-connections-serve.err").write_text(err)
        figures["tracebacks in the server log"] = err.count("Traceback")
    failed = [] if served else ["a new client got no answer while idle connections were open"]
    if figures["closed by the server after the timeout"] < opened:
        failed.append(f"{opened - figures['closed by the server after the timeout']} idle connections still open")
    if not after_ok:
        failed.append("the server did not answer afterwards")
    if figures["tracebacks in the server log"]:
        failed.append("tracebacks in the server log")
    lines = ["## Connections: idle and trickling clients (issue 32)", "",
             "`.venv/bin/python benchmarks/reliability.py --connections`: `ragdb serve` started under "
             f"`ulimit -Sn 1024` (the common soft limit; the hard one here: {hard}) with `--header-timeout {header_timeout:g}`; half the connections send nothing, half "
             "one byte of a request head. Machine: " + ", ".join(f"{k} {v}" for k, v in rw.machine().items()) + ".",
             "", "| figure | value |", "|---|---|"]
    lines += [f"| {k} | {v:,} |" if isinstance(v, int) else f"| {k} | {v} |" for k, v in figures.items()]
    lines.append("")
    text = "\n".join(lines)
    print(text)
    if write:
        _write_family("connections", text)
    for f in failed:
        print(f"FAILED: {f}")
    return 1 if failed else 0


def string_letters() -> str:
    import string

    return string.ascii_lowercase


if __name__ == "__main__":
    sys.exit(main())
