-- ragdb PostgreSQL schema version 6: ``new_terms`` without an index on ``term``, as SQLite
-- schema 14 (migrations/0014_new_terms_by_id.sql): the table is read by id, each handle
-- keeping what it has read. The rows are copied as they are.
CREATE TABLE new_terms_old AS SELECT id, term FROM new_terms;
DROP TABLE new_terms;
CREATE TABLE new_terms (
    id    bigint PRIMARY KEY,
    term  text COLLATE "C" NOT NULL
);
INSERT INTO new_terms (id, term) SELECT id, term FROM new_terms_old;
DROP TABLE new_terms_old;
