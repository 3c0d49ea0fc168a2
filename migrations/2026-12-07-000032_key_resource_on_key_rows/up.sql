-- What a key's request made (a payment's id, a refund's, a change's; a refusal made nothing),
-- recorded on the key row by its finishing phase: the claim answers a late retry of an expired key
-- by it, and the reaper keeps it when it deletes the row (000033). A nullable column: catalog
-- only, under a lock held for a moment, and alone in its migration so that the lock is not held
-- while 000033 reads rows.
SET LOCAL lock_timeout = '5s';
ALTER TABLE idempotency_keys ADD COLUMN resource_id uuid;
