-- ragdb PostgreSQL schema version 7: a float metadata value that is a whole number past
-- 2**53 is held in the filter index as the integer it is.
--
-- jsonb holds a number as the decimal it was written as, and a float was written as its
-- shortest round trip: 2.0**60 as 1.152921504606847e+18, the integer 1152921504606847000,
-- so an equality filter naming 2**60 missed it (SQLite compares the float itself). ``num``
-- holds each number exactly (ragdb/storage/postgres.py: _exact); such values take it.
UPDATE doc_meta SET value = to_jsonb(num)
WHERE num IS NOT NULL AND jsonb_typeof(value) = 'number' AND num = trunc(num)
  AND abs(num) >= 9007199254740992 AND value <> to_jsonb(num);
