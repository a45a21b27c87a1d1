-- ragdb schema version 9: the filter index derived from the stored metadata JSON.
--
-- Before this version the write path derived doc_meta rows from the metadata values
-- as given, while documents.metadata stores their JSON: a datetime, date or UUID value
-- (stored as its ISO or hex string) got no row, so equality and range filters never
-- matched it. Writes now derive the rows from the JSON (ragdb.ingest.check_metadata);
-- this back-fill derives every document's rows again, as schema 7 did, from the JSON.
-- ``ragdb check`` compares doc_meta with the documents' metadata.
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
