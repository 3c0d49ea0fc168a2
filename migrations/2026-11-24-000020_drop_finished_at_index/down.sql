CREATE INDEX CONCURRENTLY idempotency_keys_finished_at_idx ON idempotency_keys (finished_at)
    WHERE finished_at IS NOT NULL;
