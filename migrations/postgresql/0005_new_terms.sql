-- ragdb PostgreSQL schema version 5: terms added since the last flush are kept apart.
--
-- The same table as SQLite schema 13 (migrations/0013_new_terms.sql): a write adds its new
-- terms here, the flush moves them into ``vocabulary``; the vocabulary is both tables.
CREATE TABLE new_terms (
    id    bigint PRIMARY KEY,
    term  text COLLATE "C" NOT NULL UNIQUE
);
