-- ragdb schema version 5: the text hash of every vector, so a chunk whose text
-- already has a vector takes that vector over instead of being embedded again.
--
-- ``text_hash``: SHA-256 (32 bytes) of the UTF-8 text the vector was made from
-- (the chunk's text). Every vector in the table is of the recorded model (a
-- model change deletes them all), so equal hashes mean an equal vector: a
-- replaced document's unchanged chunks, and any new chunk whose text some stored
-- chunk already has, get their vector copied in the write that stores them.
-- Vectors stored before this migration have NULL here: SQLite has no SHA-256,
-- so the write path hashes their chunk text when it needs it and the next
-- ``ragdb embed`` (or embedding add) fills the column.
ALTER TABLE vectors ADD COLUMN text_hash BLOB;
CREATE INDEX vectors_text_hash ON vectors (text_hash);
