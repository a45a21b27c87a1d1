-- ragdb schema version 14: ``new_terms`` without an index on ``term``.
--
-- Its unique index took the place of the one of ``vocabulary.term`` (schema 13) in
-- the same trouble, only smaller: a bulk load's new terms land all over it, so each
-- batch dirtied most of its pages and every commit wrote them to the WAL again, and
-- it grows until the next flush. On the realistic 100k corpus the load's commits wrote
-- 767 MB with it and 432 MB without, and its write stage took 11.4 s instead of 13.2
-- (commits 3.1 -> 2.0 s, the inserts into this table 1.5 -> 1.0 s). The table is read by
-- id now: each handle keeps the terms it has read and reads the rows above the last
-- id it holds (``Index.recent_terms``, ragdb/index/inverted.py; ``check`` reports a
-- term stored twice). The rows are copied as they are (a damaged file's too, for
-- ``check`` to report and ``reindex`` to mend).
CREATE TABLE new_terms_old AS SELECT id, term FROM new_terms;
DROP TABLE new_terms;
CREATE TABLE new_terms (
    id    INTEGER PRIMARY KEY,
    term  TEXT NOT NULL
);
INSERT INTO new_terms (id, term) SELECT id, term FROM new_terms_old;
DROP TABLE new_terms_old;
