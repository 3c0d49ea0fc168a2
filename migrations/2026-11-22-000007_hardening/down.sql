DROP INDEX payments_account_id_created_seq_idx;
ALTER TABLE payments DROP COLUMN created_seq;
ALTER TABLE payments DROP COLUMN gateway;

UPDATE idempotency_keys SET locked_until = locked_until - interval '90 seconds' WHERE locked_until IS NOT NULL;
ALTER TABLE idempotency_keys RENAME COLUMN locked_until TO locked_at;
