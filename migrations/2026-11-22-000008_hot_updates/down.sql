DROP INDEX idempotency_keys_finished_at_idx;
CREATE INDEX idempotency_keys_finished_at_idx ON idempotency_keys (finished_at)
    WHERE recovery_point = 'finished';
DROP INDEX idempotency_keys_unfinished_idx;
CREATE INDEX idempotency_keys_unfinished_idx ON idempotency_keys (last_run_at)
    WHERE recovery_point <> 'finished' AND needs_attention_at IS NULL;
ALTER TABLE idempotency_keys RESET (fillfactor);
