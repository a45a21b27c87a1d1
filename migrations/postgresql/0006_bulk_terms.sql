-- ragdb PostgreSQL schema version 6: the new terms of a bulk load, without an index on
-- ``term``, until it ends.
--
-- The same table as SQLite schema 14 (migrations/0014_bulk_terms.sql): a bulk load's
-- batches after its first add their new terms here, and the flush or the load's end moves
-- them into ``vocabulary`` or ``new_terms``; the vocabulary is all three tables.
CREATE TABLE bulk_terms (
    id    bigint PRIMARY KEY,
    term  text COLLATE "C" NOT NULL
);
