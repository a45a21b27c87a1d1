"""The analysis worker processes of a bulk load (ragdb.text.analysis.AnalysisPool) end when
the process that started them is killed (issue 32, item 9).

A real subprocess starts an add_many of more than 256 records (the workers start there),
reports its workers' pids from inside the record stream, and is SIGKILLed mid-load; the test
then polls /proc until the workers are gone (no assertion on how fast: a minute's patience).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import ragdb

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="analysis workers fork on Linux only")

SCRIPT = textwrap.dedent("""
    import glob, sys, time
    import ragdb

    db = ragdb.open(sys.argv[1])

    def records():
        for i in range(100_000):
            if i == 2_000:  # this process's children: the workers (forked, or fresh interpreters)
                pids = sorted({int(p) for f in glob.glob("/proc/self/task/*/children") for p in open(f).read().split()})
                print(" ".join(map(str, pids)), flush=True)
                time.sleep(600)  # killed here, in the middle of the load
            yield {"text": f"record {i} about analysis workers and their parent", "source": f"r{i}"}

    db.add_many(records(), batch_size=100, workers=2)
""")


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie is dead: it only waits to be reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_workers_end_when_the_writing_process_is_killed(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, str(tmp_path / "kb.db")], stdout=subprocess.PIPE,
                            text=True, env=env)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        workers = [int(p) for p in line.split()]
        assert len(workers) == 2, f"expected the 2 analysis workers, got {line!r}"
        assert all(_alive(p) for p in workers)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        deadline = time.monotonic() + 30
        while any(_alive(p) for p in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = [p for p in workers if _alive(p)]
        assert not left, f"analysis workers {left} outlived the killed process"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _records(n: int) -> list[dict]:
    return [{"text": f"record {i} about analysis workers, word{i % 97} and 北京{i % 13}", "source": f"r{i}"}
            for i in range(n)]


def _answers(db) -> list:
    return [[(h.source, round(h.score, 9)) for h in db.search(q, k=20)] for q in ("word5 record", "北京3", "workers")]


def test_workers_start_as_fresh_interpreters_that_answer_as_a_forked_one(tmp_path, monkeypatch):
    """ragdb's own analyzer: the workers are fresh interpreters (ready, running this process's
    code); where they cannot be (another file on disk than this process imported, no interpreter
    to start), the pool forks them, and the load is the same either way."""
    from ragdb.engine import prepare
    from ragdb.text import analysis

    pool = analysis.AnalysisPool(analysis.Analyzer(), 2)  # what a bulk load starts
    try:
        for proc in pool._procs:
            assert Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")[1] == b"-c"
    finally:
        pool.close()
    assert analysis._start_fresh_workers(analysis.Analyzer(cjk="jieba"), 1) is None  # (its dictionary is ours)

    started = analysis._start_fresh_workers(analysis.Analyzer(), 2)
    assert started is not None and len(started) == 2
    for conn, proc in started:
        assert proc.is_alive() and Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")[1] == b"-c"
        conn.send(None)  # the end of the texts: the worker exits
        proc.join(30)
        assert not proc.is_alive()
        conn.close()

    # a worker that cannot import ragdb (isolated, without site-packages or the writer's path)
    # ends quietly, and the pool forks instead
    quiet = subprocess.run([sys.executable, "-I", "-c", analysis._FRESH_WORKER_CODE, "[]", "0", "0"],
                           capture_output=True, text=True, timeout=60)
    assert quiet.returncode == 3 and quiet.stderr == ""

    records = _records(prepare.POOL_AFTER + 700)
    results = []
    for case in ("fresh", "other code", "no interpreter"):
        with monkeypatch.context() as m:
            if case == "other code":  # (as after an upgrade on disk since this process imported ragdb)
                m.setattr(analysis, "_CODE_STAMP", (("elsewhere", 0, 0), ("elsewhere", 0, 0)))
            elif case == "no interpreter":
                m.setattr(sys, "executable", str(tmp_path / "no-python-here"))
            else:  # a path entry json cannot write (the import system takes it) is not a failure
                m.setattr(sys, "path", [*sys.path, tmp_path, b"/nonexistent"])
            if case != "fresh":
                assert analysis._start_fresh_workers(analysis.Analyzer(), 1) is None
            with ragdb.open(tmp_path / f"{case}.db", chunker="none") as db:
                db.add_many(records, workers=2, batch_size=200)
                assert db.check() == [] and db.count() == len(records)
                results.append(_answers(db))
    with ragdb.open(tmp_path / "one.db", chunker="none") as db:
        db.add_many(records, workers=0, batch_size=200)
        assert results == [_answers(db)] * 3
    # opened again: new handles, and a fresh process, read what the loads wrote
    for case in ("fresh", "other code", "no interpreter"):
        with ragdb.open(tmp_path / f"{case}.db") as db:
            assert _answers(db) == results[0] and db.check() == []
    code = ("import json, sys, ragdb\n"
            "db = ragdb.open(sys.argv[1])\n"
            "print(json.dumps([[[h.source, round(h.score, 9)] for h in db.search(q, k=20)]\n"
            "                  for q in ('word5 record', '北京3', 'workers')]))\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, sys.path))}
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "fresh.db")], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert [[tuple(h) for h in hits] for hits in json.loads(out.stdout)] == results[0]


def test_a_script_without_a_main_guard_loads_once(tmp_path):
    """A fresh worker runs ragdb's code only: the user's script (its ``__main__``) is not run
    again, as multiprocessing's spawn would."""
    script = tmp_path / "load.py"
    script.write_text(textwrap.dedent(f"""
        import ragdb
        print("script ran", flush=True)
        with ragdb.open({str(tmp_path / "kb.db")!r}, chunker="none") as db:
            db.add_many(({{"text": f"record {{i}} text", "source": f"r{{i}}"}} for i in range(3000)), workers=2)
            print("documents", db.count(), flush=True)
    """))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n").count("script ran") == 1 and "documents 3000" in out.stdout
