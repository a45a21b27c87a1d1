-- ragdb schema version 12: the chunk-state snapshot (ragdb/index/snapshot.py).
--
-- One row: every chunk's length, document, state and whole-document flag as of the last
-- flush, zstd-compressed, tagged with that flush (stats.flush_count, stats.flushed_upto).
-- A handle opening reads it, the chunks after flushed_upto and the change log, instead of
-- one row a chunk. It is a cache of the chunk rows: a snapshot of another flush is not used,
-- and a database without one (every database until its next flush) scans the rows.
CREATE TABLE chunk_state (
    id            INTEGER PRIMARY KEY CHECK (id = 1),
    flush_count   INTEGER NOT NULL,
    flushed_upto  INTEGER NOT NULL,
    body          BLOB NOT NULL
);
