"""ragbench: the benchmark behind ``benchmarks/run.py`` (which writes BENCHMARKS.md).

Modules:

* ``common``   -- constants (K, warm-up queries, update ops, paths) and helpers shared by
  the parent and the workers (percentiles, peak RSS, reading prepared corpora);
* ``harness``  -- the registries (``@system``, ``@section``, ``@worker_stage``), the
  worker subprocess (``Context.run_worker`` / ``worker_main``), the run's ``Context``
  and stages in rounds;
* ``corpora``  -- reading BEIR data, replicating SciFact, the documents to delete;
* ``realistic`` -- the scale section's realistic corpus (SciFact + CMRC among seeded
  generated documents with real text's term statistics), generated and cached;
* ``reference`` -- the exhaustive BM25 reference (is ragdb's ranking exact?) and the
  corpus statistics;
* ``peers``    -- the system adapters: ragdb, ragdb-tfidf, FTS5, tantivy, bm25s,
  rank_bm25, and which sections measure which;
* ``report``   -- formatting, bars, machine facts, the source fingerprint, BENCHMARKS.md;
* ``sections`` -- one module per report section with its worker stages: quality
  (with the add/delete split), scale, filters, sync, hybrid, tfidf.

Nothing here imports ragdb or a peer's library at import time: a worker process
imports these modules and then only what its stage needs.
"""
