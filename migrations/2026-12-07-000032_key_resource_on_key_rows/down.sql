ALTER TABLE idempotency_keys DROP COLUMN resource_id;
