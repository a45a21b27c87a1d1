-- ragdb schema version 2: indexes for filters applied inside the search.

-- Scalar user metadata (and each scalar element of list values such as
-- tags), one row per (document, key, value), for equality filters.
CREATE TABLE doc_meta (
    doc_id  INTEGER NOT NULL REFERENCES documents (id),
    key     TEXT NOT NULL,
    value
);
CREATE INDEX doc_meta_kv ON doc_meta (key, value);
CREATE INDEX doc_meta_doc ON doc_meta (doc_id);

-- Access labels of each document (its chunks inherit them).
CREATE TABLE doc_acl (
    doc_id  INTEGER NOT NULL REFERENCES documents (id),
    label   TEXT NOT NULL,
    PRIMARY KEY (label, doc_id)
) WITHOUT ROWID;
CREATE INDEX doc_acl_doc ON doc_acl (doc_id);

-- Back-fill from documents stored under schema 1.
INSERT INTO doc_meta (doc_id, key, value)
SELECT d.id, j.key, j.value FROM documents d, json_each(d.metadata) j
WHERE j.type NOT IN ('object', 'array', 'null');
INSERT INTO doc_meta (doc_id, key, value)
SELECT d.id, j.key, e.value FROM documents d, json_each(d.metadata) j, json_each(j.value) e
WHERE j.type = 'array' AND e.type NOT IN ('object', 'array', 'null');
INSERT OR IGNORE INTO doc_acl (doc_id, label)
SELECT d.id, j.value FROM documents d, json_each(d.acl) j;
