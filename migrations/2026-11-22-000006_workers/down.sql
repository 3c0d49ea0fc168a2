DROP INDEX staged_jobs_due_idx;
CREATE INDEX staged_jobs_run_at_idx ON staged_jobs (run_at);
ALTER TABLE staged_jobs DROP COLUMN dead_at;

DROP INDEX idempotency_keys_finished_at_idx;
CREATE INDEX idempotency_keys_finished_created_at_idx ON idempotency_keys (created_at)
    WHERE recovery_point = 'finished';
ALTER TABLE idempotency_keys DROP CONSTRAINT idempotency_keys_finished_at_check, DROP COLUMN finished_at;

DROP INDEX idempotency_keys_attention_idx;
DROP INDEX idempotency_keys_unfinished_idx;
CREATE INDEX idempotency_keys_unfinished_idx ON idempotency_keys (last_run_at)
    WHERE recovery_point <> 'finished';
ALTER TABLE idempotency_keys
    DROP CONSTRAINT idempotency_keys_attention_check,
    DROP COLUMN attention_reason,
    DROP COLUMN needs_attention_at,
    DROP COLUMN completer_attempts;
