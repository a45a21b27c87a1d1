"""The random histories of ``tests/engine/test_random_operations.py`` on PostgreSQL: each one
runs, step by step, against a PostgreSQL knowledge base (a schema of its own on the test
server) and a SQLite file. At every checkpoint and at the end, each backend's handles (the
writer, one opened before the first write, one opened now and, at the end, a fresh process)
observe what a fresh build does (:func:`observe`, scores within 1e-9, as there), ``check()``
finds nothing on either, and the PostgreSQL observations equal the SQLite ones exactly: the
same values, scores and confidences bit for bit (``==`` on the doubles), handle by handle.
The side collection's searches are compared the same way.

The strategies, :class:`Model` and :class:`Run` are that test's, imported. Everything applies
to PostgreSQL as it is, with these adaptations:

* ``optimize(vacuum=True)`` runs ``VACUUM ANALYZE`` on the collection's tables there (no file
  to rewrite); it is applied as drawn, and the observations must not change.
* ``small_segments`` (flushes every few chunks, merges after two segments, no spare array
  capacity, the writer's term cache on or off) patches the engine, which both backends share,
  so it applies to both alike.
* "reopen" and "another handle writes" open the URL again (a new connection pool);
  the fresh process opens the URL.
* The kernel is drawn per example (compiled or numpy, where the compiled one is installed)
  rather than a parameter, to keep one test within its time.

Skipped without a PostgreSQL server, as the other PostgreSQL tests (conftest.py's
``pg_server``). ``RAGDB_HYPOTHESIS_EXAMPLES`` scales the example count (default 10, under a
minute).
"""

from __future__ import annotations

import os
import uuid

import orjson
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from conftest import with_schema
from engine.test_random_operations import QUERIES, Run, histories, small_segments
from ragdb.index import kernel

EXAMPLES = int(os.environ.get("RAGDB_HYPOTHESIS_EXAMPLES", "10"))


def assert_identical(got, want, where: str, path: str = "") -> None:
    """``got`` equals ``want`` exactly; the message names the handle and the first observation
    that differs (with both values' reprs, so that a last-bit difference shows)."""
    if isinstance(want, dict) and isinstance(got, dict):
        assert got.keys() == want.keys(), f"{where}: {path}: keys {sorted(got)} != {sorted(want)}"
        for key in want:
            assert_identical(got[key], want[key], where, f"{path} {key}" if path else key)
    elif isinstance(want, list) and isinstance(got, list):
        assert len(got) == len(want), f"{where}: {path}: {len(got)} items != {len(want)}\n{got}\n!=\n{want}"
        for i, (a, b) in enumerate(zip(got, want)):
            assert_identical(a, b, where, f"{path}[{i}]")
    else:
        assert type(got) is type(want) and got == want, f"{where}: {path}: PostgreSQL {got!r} != SQLite {want!r}"


class Both:
    """One history against SQLite (``lite``) and PostgreSQL (``pg``), step by step."""

    def __init__(self, lite: Run, pg: Run) -> None:
        self.lite, self.pg = lite, pg

    def side(self, run: Run):
        if run.model.side is None:
            return None
        handle = run.db.collection("side", create=False)
        return orjson.loads(orjson.dumps({q: [[h.source, h.text, h.score] for h in handle.search(q, k=40)]
                                          for q in QUERIES}))

    def compare(self, process: bool) -> None:
        lite = self.lite.compare(process)
        pg = self.pg.compare(process)
        for where in lite:
            assert_identical(pg[where], lite[where], where)
        assert_identical(self.side(self.pg), self.side(self.lite), "the side collection")

    def run(self, ops) -> None:
        try:
            for op in ops:
                if op[0] == "checkpoint":
                    self.compare(process=False)
                else:
                    self.lite.apply(op)
                    self.pg.apply(op)
            self.compare(process=True)
        finally:
            for run in (self.lite, self.pg):
                run.db.close()
                run.reader.close()


@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                 HealthCheck.data_too_large])
@given(ops=histories, chunker=st.sampled_from(["none", "window:size=6,overlap=2"]), keep_versions=st.booleans(),
       public_unlabeled=st.booleans(), whole_vocabulary=st.booleans(), which=st.sampled_from(kernel.available()))
def test_random_operations_on_postgres_equal_sqlite_and_a_fresh_build(pg_server, tmp_path_factory, ops, chunker,
                                                                        keep_versions, public_unlabeled,
                                                                        whole_vocabulary, which):
    """After any history of writes, rollbacks, optimizes, collection changes and reopenings,
    every PostgreSQL handle observes what a fresh build does and exactly what the same handle
    on SQLite does (scores bit for bit)."""
    import psycopg

    note(f"chunker={chunker!r}, keep_versions={keep_versions}, public_unlabeled={public_unlabeled}, "
         f"whole_vocabulary={whole_vocabulary}, kernel={which!r}\nops={ops!r}")
    schema = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")  # a generated name, not input
    before = kernel.use(which)
    try:
        path = str(tmp_path_factory.mktemp("ops") / "kb.db")
        with small_segments(whole_vocabulary):
            settings_ = (chunker, keep_versions, public_unlabeled, which)
            Both(Run(path, *settings_), Run(with_schema(pg_server, schema), *settings_)).run(ops)
    finally:
        kernel.use(before)
        with psycopg.connect(pg_server, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
