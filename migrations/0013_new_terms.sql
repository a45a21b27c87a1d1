-- ragdb schema version 13: terms added since the last flush are kept apart.
--
-- A write adds its new terms here, and the flush moves them into ``vocabulary``
-- (ragdb/storage/lexical.py: ``add_new_terms``, ``settle_new_terms``); the
-- vocabulary is both tables (a term is in one of them; ``new_terms`` has df 0,
-- as ``vocabulary`` has for a term no flushed chunk holds). Why: new terms land
-- all over the unique index of ``vocabulary.term``, so a batch of a bulk load
-- that added ~3,000 terms dirtied most of its pages, and every commit wrote them
-- to the WAL again: 48% of the WAL frames of a 100k-document load (370 of 760 MB),
-- for a 6 MB index. This table's index holds only the terms since the last flush.
CREATE TABLE new_terms (
    id    INTEGER PRIMARY KEY,
    term  TEXT NOT NULL UNIQUE
);
