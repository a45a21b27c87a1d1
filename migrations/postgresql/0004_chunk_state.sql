-- ragdb PostgreSQL schema version 4: the chunk-state snapshot.
--
-- The same table as SQLite schema 12 (migrations/0012_chunk_state.sql): every chunk's
-- length, document, state and whole-document flag as of the last flush (ragdb/index/snapshot.py),
-- read by a handle opening instead of one row a chunk; a snapshot of another flush is not used.
CREATE TABLE chunk_state (
    id            integer PRIMARY KEY CHECK (id = 1),
    flush_count   bigint NOT NULL,
    flushed_upto  bigint NOT NULL,
    body          bytea NOT NULL
);
