"""Benchmark stages that drive ragdb's internals directly run at a small size here, so a change
of those internals that breaks the benchmark fails the suite, not the next benchmark run (the
ANN stage's stand-in store lacked ``Store.in_write`` for a day). The measurements themselves are
the benchmark's (``benchmarks/run.py``); nothing here times anything."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_the_ann_stage_runs_on_a_small_collection(tmp_path, monkeypatch):
    pytest.importorskip("usearch.index", reason="usearch is in the test extra (ragdb[ann])")
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    from ragbench.sections import ann as stage

    out = stage._stage_ann({"n": 3_000, "queries": 30, "index_dir": str(tmp_path / "ann")})
    assert out["loaded_from_file"] is True  # the graph was saved, then loaded and checked
    assert out["violations"] == 0 and out["shortfalls"] == 0
    assert set(out["exact_by_size"]) == {"3000"}
    assert all(out[f"ann_{label}"]["recall"] > 0.5 for label in ("none", "1%", "10%", "50%"))
