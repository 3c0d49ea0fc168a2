ALTER TABLE idempotency_keys DROP COLUMN expires_at;
