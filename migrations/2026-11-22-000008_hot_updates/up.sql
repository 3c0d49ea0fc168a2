-- Most phase commits change only columns no index covers, so they can be HOT updates (a new row
-- version on the same page, no index entries written): leave room on each page for them, and keep
-- `recovery_point` out of the partial indexes' predicates, which would make every change of it
-- rewrite every index. `finished_at` says the same (a CHECK holds the two together) and changes
-- only once, when the key finishes.
ALTER TABLE idempotency_keys SET (fillfactor = 80);

-- The completer's scan: unfinished keys it may still drive, least recently run first.
DROP INDEX idempotency_keys_unfinished_idx;
CREATE INDEX idempotency_keys_unfinished_idx ON idempotency_keys (last_run_at)
    WHERE finished_at IS NULL AND needs_attention_at IS NULL;
-- The reaper's scan: finished keys by the time they finished.
DROP INDEX idempotency_keys_finished_at_idx;
CREATE INDEX idempotency_keys_finished_at_idx ON idempotency_keys (finished_at) WHERE finished_at IS NOT NULL;
