-- ragdb schema version 7: range filters ($gt, $gte, $lt, $lte) on metadata.
--
-- Two columns hold what a range filter compares for the row's value:
-- ``num``, the value itself when it is a number (no column type, so integers
-- stay exact), and ``at``, the epoch seconds of an ISO-8601 date or date-time
-- string (ragdb.storage.codec.iso_instant); NULL otherwise (booleans, stored
-- in ``value`` as 1/0, have neither, which tells them from the numbers 1/0).
-- A number range reads ``num``, a date range ``at``: numbers never compare with
-- dates, and each index below lists one kind in order, with the document id
-- (a range filter reads only the index).
--
-- ragdb_iso_instant(text) is ragdb.storage.codec.iso_instant, which the write
-- path also uses; ragdb registers it on the connection that applies this
-- migration (ragdb.storage.store.build_migrations).
ALTER TABLE doc_meta ADD COLUMN num;
ALTER TABLE doc_meta ADD COLUMN at REAL;

-- Back-fill: the rows again from the documents' metadata (as schema 2 derived
-- them), now with ``num`` and ``at``: the type JSON records tells booleans from numbers.
DELETE FROM doc_meta;
INSERT INTO doc_meta (doc_id, key, value, num, at)
SELECT d.id, j.key, j.value, CASE WHEN j.type IN ('integer', 'real') THEN j.value END,
       CASE WHEN j.type = 'text' THEN ragdb_iso_instant(j.value) END
FROM documents d, json_each(d.metadata) j
WHERE j.type NOT IN ('object', 'array', 'null');
INSERT INTO doc_meta (doc_id, key, value, num, at)
SELECT d.id, j.key, e.value, CASE WHEN e.type IN ('integer', 'real') THEN e.value END,
       CASE WHEN e.type = 'text' THEN ragdb_iso_instant(e.value) END
FROM documents d, json_each(d.metadata) j, json_each(j.value) e
WHERE j.type = 'array' AND e.type NOT IN ('object', 'array', 'null');

CREATE INDEX doc_meta_num ON doc_meta (key, num, doc_id) WHERE num IS NOT NULL;
CREATE INDEX doc_meta_at ON doc_meta (key, at, doc_id) WHERE at IS NOT NULL;

-- Equality filters likewise: the document id in the (key, value) index, so a
-- filter's documents come from the index alone.
DROP INDEX doc_meta_kv;
CREATE INDEX doc_meta_kv ON doc_meta (key, value, doc_id);
