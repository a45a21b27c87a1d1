-- ragdb schema version 1. Never edit a migration once released: add a new file.

-- Database-wide settings (JSON values): analyzer configuration, default
-- chunker, version keeping, visibility of unlabeled chunks.
CREATE TABLE settings (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);

-- Collection statistics over the chunks that default searches see (the
-- latest version of each source). ``generation`` increases with every write
-- so readers know when their in-memory caches are stale. Chunks with
-- id > ``flushed_upto`` have no rows in ``postings`` yet: their postings are
-- read from their forward index (chunks.terms) until the next flush.
CREATE TABLE stats (
    id            INTEGER PRIMARY KEY CHECK (id = 1),
    generation    INTEGER NOT NULL,
    n_docs        INTEGER NOT NULL,
    n_chunks      INTEGER NOT NULL,
    total_length  INTEGER NOT NULL,
    flushed_upto  INTEGER NOT NULL,
    vocab_epoch   INTEGER NOT NULL,    -- bumped when terms are removed (ids may then be reused)
    -- Next document and chunk ids. Ids are never reused (segments may still
    -- list deleted chunk ids); counters here instead of AUTOINCREMENT save
    -- a page write (sqlite_sequence) per transaction.
    next_doc_id   INTEGER NOT NULL,
    next_chunk_id INTEGER NOT NULL,
    flush_count   INTEGER NOT NULL     -- bumped by every flush; chunk_log restarts then
);
INSERT INTO stats (id, generation, n_docs, n_chunks, total_length, flushed_upto, vocab_epoch,
                   next_doc_id, next_chunk_id, flush_count)
VALUES (1, 0, 0, 0, 0, 0, 0, 1, 1, 0);

-- State changes of existing chunks since the last flush (deleted: 0,
-- latest: 1, kept older version: 2), so other processes bring their
-- in-memory view up to date by reading only what changed. New chunks need no
-- entry: their ids are above any id a reader has seen.
CREATE TABLE chunk_log (
    seq       INTEGER PRIMARY KEY,
    chunk_id  INTEGER NOT NULL,
    state     INTEGER NOT NULL
);

CREATE TABLE documents (
    id            INTEGER PRIMARY KEY,
    source        TEXT NOT NULL,
    version       TEXT,
    timestamp     TEXT NOT NULL,       -- ISO-8601 UTC, as given (normalized)
    ts            REAL NOT NULL,       -- the same instant as epoch seconds
    valid_to      REAL,                -- epoch seconds a newer version replaced it
    latest        INTEGER NOT NULL DEFAULT 1,
    content_hash  TEXT NOT NULL,       -- sha256 of the text
    metadata      TEXT NOT NULL DEFAULT '{}',
    acl           TEXT NOT NULL DEFAULT '[]',
    chunker       TEXT NOT NULL,
    added_at      TEXT NOT NULL,
    title         TEXT,
    text          TEXT NOT NULL        -- last: reading the columns before it skips its overflow pages
);
-- One index serves lookups of the latest version and of all versions of a
-- source (and GLOB prefixes); one latest version per source is kept by the
-- writer and verified by check().
CREATE INDEX documents_source ON documents (source, latest);
CREATE INDEX documents_ts ON documents (ts);

-- One row per chunk. ``terms``/``tfs`` are the chunk's forward index:
-- little-endian uint32 term ids in the analyzer's order, and uint16 term
-- frequencies aligned with them. ``length`` is the number of terms.
CREATE TABLE chunks (
    id        INTEGER PRIMARY KEY,
    doc_id    INTEGER NOT NULL REFERENCES documents (id),
    ordinal   INTEGER NOT NULL,
    start     INTEGER NOT NULL,
    "end"     INTEGER NOT NULL,
    length    INTEGER NOT NULL,
    latest    INTEGER NOT NULL,
    metadata  TEXT NOT NULL DEFAULT '{}',
    terms     BLOB NOT NULL,
    tfs       BLOB NOT NULL,
    text      TEXT              -- last, so reading the forward index skips it; NULL when the
                                -- chunk is the whole document text (read documents.text)
);
CREATE INDEX chunks_doc ON chunks (doc_id);

-- Vocabulary with document frequencies. ``df`` counts the latest chunks as
-- of the last flush; the exact, live document frequency is
--   df + (latest unflushed chunks holding the term)
--      - (chunks in dead_chunks holding the term),
-- so adding or deleting a document never rewrites vocabulary rows (the
-- correction is folded into ``df`` at the next flush).
CREATE TABLE vocabulary (
    id    INTEGER PRIMARY KEY,
    term  TEXT NOT NULL UNIQUE,
    df    INTEGER NOT NULL
);

-- Forward indexes of flushed latest chunks deleted since the last flush.
CREATE TABLE dead_chunks (
    id     INTEGER PRIMARY KEY,
    terms  BLOB NOT NULL
);

-- Sparse postings, packed: for each term, segments of sorted little-endian
-- uint32 chunk ids and aligned uint16 term frequencies. Segments may still
-- list chunks deleted since they were written; readers skip chunks that no
-- longer exist, and merges (flush, optimize) drop them.
CREATE TABLE postings (
    term_id    INTEGER NOT NULL,
    segment    INTEGER NOT NULL,
    n          INTEGER NOT NULL,
    chunk_ids  BLOB NOT NULL,
    tfs        BLOB NOT NULL,
    PRIMARY KEY (term_id, segment)
) WITHOUT ROWID;
