-- ragdb schema version 6: collections, several knowledge bases in one file.
--
-- The default collection (id 0, named "default") owns the tables of the earlier
-- schema under their plain names, so a file made before this migration opens
-- with its content as the default collection, unchanged. Collection n owns a
-- table set of its own named c<n>_documents, c<n>_chunks, ... (built by
-- replaying the migrations for it: ragdb/storage/collections.py), with its own
-- settings (analyzer, chunker, embedding model) and statistics. Ids are never
-- reused (AUTOINCREMENT): a process still holding a dropped collection never
-- reads the tables of a newer one.
CREATE TABLE collections (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    name        TEXT NOT NULL UNIQUE,
    created_at  TEXT NOT NULL
);
INSERT INTO collections (id, name, created_at) VALUES (0, 'default', strftime('%Y-%m-%dT%H:%M:%fZ', 'now'));
