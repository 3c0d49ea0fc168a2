-- What the background workers need: the completer's attempt count and its verdict on keys it
-- cannot finish, when a key finished (its retention counts from then), and the outbox's dead
-- letters.

ALTER TABLE idempotency_keys
    ADD COLUMN completer_attempts integer NOT NULL DEFAULT 0 CHECK (completer_attempts >= 0),
    -- Set when the completer gave up: the key stays unfinished, is never driven again by a worker,
    -- and waits for an operator (`payments attention list|retry`).
    ADD COLUMN needs_attention_at timestamptz,
    ADD COLUMN attention_reason text CHECK (char_length(attention_reason) <= 1000),
    ADD CONSTRAINT idempotency_keys_attention_check CHECK ((needs_attention_at IS NULL) = (attention_reason IS NULL));

-- The completer's scan: unfinished keys it may still drive, least recently run first.
DROP INDEX idempotency_keys_unfinished_idx;
CREATE INDEX idempotency_keys_unfinished_idx ON idempotency_keys (last_run_at)
    WHERE recovery_point <> 'finished' AND needs_attention_at IS NULL;
-- The operator's list.
CREATE INDEX idempotency_keys_attention_idx ON idempotency_keys (needs_attention_at)
    WHERE needs_attention_at IS NOT NULL;

-- A key's retention counts from when it finished, not from when it was created: one finished
-- late (after an outage, or an operator's retry) is kept as long as any other.
ALTER TABLE idempotency_keys ADD COLUMN finished_at timestamptz;
UPDATE idempotency_keys SET finished_at = last_run_at WHERE recovery_point = 'finished';
ALTER TABLE idempotency_keys ADD CONSTRAINT idempotency_keys_finished_at_check
    CHECK ((recovery_point = 'finished') = (finished_at IS NOT NULL));
-- The reaper's scan: finished keys by the time they finished.
DROP INDEX idempotency_keys_finished_created_at_idx;
CREATE INDEX idempotency_keys_finished_at_idx ON idempotency_keys (finished_at)
    WHERE recovery_point = 'finished';

-- A job that failed too often is kept, dead, for an operator, instead of being retried forever.
ALTER TABLE staged_jobs ADD COLUMN dead_at timestamptz;
DROP INDEX staged_jobs_run_at_idx;
CREATE INDEX staged_jobs_due_idx ON staged_jobs (run_at) WHERE dead_at IS NULL;
