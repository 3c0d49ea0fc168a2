-- An audit record's time is when it was written, not when its transaction began: a key's story
-- lists its records by that time (then by number), and a transaction that writes a record late
-- (a gateway event's) must list it after what others wrote meanwhile, as its number does. On
-- Citus the numbers alone do not tell the order: records written on an account's node and through
-- the coordinator are numbered from ranges of their own. Only the default changes: no row is
-- rewritten, and the lock is held for a moment.
SET LOCAL lock_timeout = '5s';
ALTER TABLE audit_records ALTER COLUMN created_at SET DEFAULT clock_timestamp();
