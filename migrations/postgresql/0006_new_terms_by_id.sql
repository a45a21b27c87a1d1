-- ragdb PostgreSQL schema version 6: ``new_terms`` without an index on ``term``, as SQLite
-- schema 14 (migrations/0014_new_terms_by_id.sql): the table is read by id, each handle
-- keeping what it has read. Its terms are moved into ``vocabulary`` (df 0) first.
INSERT INTO vocabulary (id, term, df) SELECT id, term, 0 FROM new_terms ORDER BY term;
DROP TABLE new_terms;
CREATE TABLE new_terms (
    id    bigint PRIMARY KEY,
    term  text COLLATE "C" NOT NULL
);
