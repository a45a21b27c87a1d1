-- Document and chunk text may be stored compressed (ragdb/storage/textcodec.py): documents.text
-- and chunks.text hold either TEXT (as before) or a BLOB, one zstd frame of the text's UTF-8.
-- A frame names the dictionary it was compressed with (0: none) by its id here: one table for
-- the whole file (not per collection), so a reader decodes a frame of any collection, and ids
-- are never reused (a dropped collection's dictionaries stay; each is 64 KiB).
-- After these statements, the migration compresses every stored text (a Python step:
-- ragdb.storage.textcodec.compress_stored).
CREATE TABLE text_dictionaries (
    id            INTEGER PRIMARY KEY,  -- the dictionary id written in its frames (>= 32768)
    collection_id INTEGER NOT NULL,     -- the collection that trained it (and compresses with it)
    created_at    TEXT NOT NULL,
    content       BLOB NOT NULL         -- the zstd dictionary
);
CREATE INDEX text_dictionaries_collection ON text_dictionaries (collection_id, id);
