"""The analysis worker processes of a bulk load (ragdb.text.analysis.AnalysisPool) end when
the process that started them is killed (issue 32, item 9).

A real subprocess starts an add_many of more than 256 records (the workers start there),
reports its workers' pids from inside the record stream, and is SIGKILLed mid-load; the test
then polls /proc until the workers are gone (no assertion on how fast: a minute's patience).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="analysis workers fork on Linux only")

SCRIPT = textwrap.dedent("""
    import multiprocessing, sys, time
    import ragdb

    db = ragdb.open(sys.argv[1])

    def records():
        for i in range(100_000):
            if i == 2_000:
                pids = [p.pid for p in multiprocessing.active_children()]
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
