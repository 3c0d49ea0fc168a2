-- The reaper has scanned finished keys by `idempotency_keys_expiry_idx` since 000016, and no
-- statement reads this index any more; every finishing key still wrote an entry to it (66 bytes of
-- WAL per payment). 000016 kept it for reapers of the version before, during a rolling upgrade:
-- stop any such reaper before this runs, or each of its batches reads every finished key.
--
-- Dropped CONCURRENTLY (only SHARE UPDATE EXCLUSIVE, so keys are claimed and finished meanwhile):
-- hence a migration of its own, outside a transaction (`metadata.toml`), and a single statement.
-- Interrupted, it leaves the index INVALID and the migration unapplied: run it again.
DROP INDEX CONCURRENTLY IF EXISTS idempotency_keys_finished_at_idx;
