DROP INDEX CONCURRENTLY IF EXISTS idempotency_keys_expiry_idx;
