-- ragdb schema version 14: the new terms of a bulk load, without an index, until it ends.
--
-- ``new_terms`` (schema 13) keeps the unique index on ``term`` that lookups need. A bulk
-- load's batches after its first add ~3,500 new terms each, and they land all over that
-- index, which grows until the next flush (~250k terms at 65k chunks): every commit
-- rewrote most of its pages (the realistic 100k load: 767 MB written by commits, 432 MB
-- without that index). Those batches add their terms here instead, a table with no index
-- but its rowid; the flush that ends the load moves them into ``vocabulary`` with the
-- rest, or, without one, the load's end moves them into ``new_terms`` in one sorted
-- insert (ragdb/storage/lexical.py: ``add_new_terms``, ``settle_bulk_terms``). Lookups
-- read this table only while it holds terms (a scan: during a bulk load in another
-- process, or after one that was interrupted, until the next write settles them).
CREATE TABLE bulk_terms (
    id    INTEGER PRIMARY KEY,
    term  TEXT NOT NULL
);
