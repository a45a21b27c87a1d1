-- ragdb schema version 4: the forward index of a deleted flushed chunk rides
-- on its chunk_log entry instead of a row in dead_chunks.
--
-- Deleting a document wrote the same chunk twice: its state change to
-- chunk_log and its terms to dead_chunks, two statements and two B-tree
-- pages per delete. Now the deletion (state 0) entry of a chunk that was
-- flushed and latest carries the chunk's term ids; the exact live df is
--   df + (latest unflushed chunks holding the term)
--      - (chunk_log entries whose terms hold the term),
-- and a flush, which folds those corrections into df, empties chunk_log as it
-- did before (and dead_chunks with it).
ALTER TABLE chunk_log ADD COLUMN terms BLOB;

-- Carry over: each dead chunk's terms onto its deletion entry (written in the
-- same transaction as the dead_chunks row), or a new entry should one be missing.
UPDATE chunk_log SET terms = (SELECT d.terms FROM dead_chunks d WHERE d.id = chunk_log.chunk_id)
WHERE state = 0 AND seq = (SELECT max(l.seq) FROM chunk_log l WHERE l.chunk_id = chunk_log.chunk_id AND l.state = 0);
INSERT INTO chunk_log (chunk_id, state, terms)
SELECT d.id, 0, d.terms FROM dead_chunks d
WHERE NOT EXISTS (SELECT 1 FROM chunk_log l WHERE l.chunk_id = d.id AND l.terms IS NOT NULL);

DROP TABLE dead_chunks;
