-- ragdb schema version 6: range filters ($gt, $gte, $lt, $lte) on metadata.
--
-- ``doc_meta.num``: the number a range filter compares for the row's value:
-- the value itself when it is a number (INTEGER or REAL: no column type, so
-- integers stay exact), the epoch seconds of an ISO-8601 date string, else
-- NULL (booleans, other strings). Booleans are stored in ``value`` as 1/0 and
-- are told from the numbers 1/0 by their NULL here.
--
-- ragdb_iso_instant(text) is ragdb.storage.codec.iso_instant, which the write
-- path also uses; ragdb registers it on the connection that applies this
-- migration (ragdb.storage.store.build_migrations).
ALTER TABLE doc_meta ADD COLUMN num;

-- Back-fill: the rows again from the documents' metadata (as schema 2 derived
-- them), now with ``num``: the type JSON records tells booleans from numbers.
DELETE FROM doc_meta;
INSERT INTO doc_meta (doc_id, key, value, num)
SELECT d.id, j.key, j.value,
       CASE j.type WHEN 'integer' THEN j.value WHEN 'real' THEN j.value
                   WHEN 'text' THEN ragdb_iso_instant(j.value) END
FROM documents d, json_each(d.metadata) j
WHERE j.type NOT IN ('object', 'array', 'null');
INSERT INTO doc_meta (doc_id, key, value, num)
SELECT d.id, j.key, e.value,
       CASE e.type WHEN 'integer' THEN e.value WHEN 'real' THEN e.value
                   WHEN 'text' THEN ragdb_iso_instant(e.value) END
FROM documents d, json_each(d.metadata) j, json_each(j.value) e
WHERE j.type = 'array' AND e.type NOT IN ('object', 'array', 'null');

-- A range filter reads one key's rows in order of ``num``.
CREATE INDEX doc_meta_num ON doc_meta (key, num) WHERE num IS NOT NULL;
