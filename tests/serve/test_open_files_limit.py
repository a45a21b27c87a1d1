"""``ragdb serve`` raises its soft limit on open files to the hard one before serving (issue 32,
item 10): under a soft ``ulimit -n 1024``, 1,100 idle connections used every descriptor and
every later client was locked out (benchmarks/reliability.py --connections has the load)."""

from __future__ import annotations

import subprocess
import sys

import pytest

resource = pytest.importorskip("resource")

_PROBE = """
import resource
from ragdb.serve.http_api import raise_open_files_limit
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
print(soft, hard, *raise_open_files_limit())
"""


def test_the_soft_limit_is_raised_to_the_hard_one() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard <= 256:
        pytest.skip("a hard limit this low leaves nothing to raise")
    low = 256
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=60, check=True,
                         preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard)))
    before_soft, before_hard, after_soft, after_hard = map(int, out.stdout.split())
    assert before_soft == low and before_hard == after_hard
    assert after_soft > low
    assert after_soft == (hard if hard != resource.RLIM_INFINITY else 1 << 20)
