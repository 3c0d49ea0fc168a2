-- The reaper's scan, by the recorded expiry: finished keys past it, soonest first; and, under the
-- same index, keys finished without one (`expires_at IS NULL`), by when they finished. Built
-- CONCURRENTLY, so writes go on meanwhile: hence a migration of its own, outside a transaction
-- (`metadata.toml`), and a single statement (PostgreSQL runs several sent at once in one implicit
-- transaction, which CONCURRENTLY refuses).
--
-- If it fails or is interrupted, it leaves an INVALID index of this name behind and is not marked
-- as applied: `DROP INDEX CONCURRENTLY idempotency_keys_expiry_idx;` and migrate again.
--
-- `idempotency_keys_finished_at_idx`, which the reaper used before, stays for now: reapers of the
-- previous version, still running during a rolling upgrade, scan by it. A later migration drops it.
CREATE INDEX CONCURRENTLY idempotency_keys_expiry_idx ON idempotency_keys (expires_at, finished_at)
    WHERE finished_at IS NOT NULL;
