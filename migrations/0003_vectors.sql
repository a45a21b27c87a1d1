-- ragdb schema version 3: dense vectors for vector and hybrid search.

-- One embedding per chunk: ``dimensions`` little-endian float32 values (the
-- ``dtype`` recorded under settings key "embedding"), L2-normalized, so a
-- dot product is the cosine similarity. float32 keeps search exact (1 KiB per
-- 256-d vector); float16 halves the size at the cost of ~1e-3 rounding.
-- A chunk without a row here is *pending*: lexical search finds it, vector
-- search does not, until ``ragdb embed`` (or the next embedding add) fills it.
-- The model that made the vectors is recorded in settings under the key
-- "embedding" as {"model": name, "dimensions": n, "dtype": "float32"}.
CREATE TABLE vectors (
    chunk_id  INTEGER PRIMARY KEY REFERENCES chunks (id),
    vector    BLOB NOT NULL
);

-- Change log of ``vectors``: the chunk id of every vector written or
-- deleted, so a process holding the vectors in memory applies only what
-- changed since it last looked (``seq`` > the one it has seen). Rows are only
-- ever deleted all at once (with an epoch bump), so ``seq`` grows without
-- AUTOINCREMENT (which would write sqlite_sequence in every transaction).
CREATE TABLE vector_log (
    seq       INTEGER PRIMARY KEY,
    chunk_id  INTEGER NOT NULL
);

-- ``epoch`` increases when the log is cut (it is emptied once long) or all
-- vectors are replaced (a rebuild with another model): in-memory copies then
-- reload everything. ``embedded_upto``: every chunk with id <= it has a
-- vector (or no longer exists), so finding pending chunks reads only newer ones.
CREATE TABLE vector_stats (
    id             INTEGER PRIMARY KEY CHECK (id = 1),
    epoch          INTEGER NOT NULL,
    embedded_upto  INTEGER NOT NULL
);
INSERT INTO vector_stats (id, epoch, embedded_upto) VALUES (1, 0, 0);

-- Vectors are deleted with their chunks, whatever deletes the chunk.
CREATE TRIGGER chunks_delete_vectors AFTER DELETE ON chunks
BEGIN
    INSERT INTO vector_log (chunk_id)
    SELECT old.id WHERE EXISTS (SELECT 1 FROM vectors WHERE chunk_id = old.id);
    DELETE FROM vectors WHERE chunk_id = old.id;
END;
