UPDATE payments p SET idempotency_key_id = NULL
WHERE NOT EXISTS (SELECT FROM idempotency_keys k WHERE k.account_id = p.account_id AND k.id = p.idempotency_key_id);
ALTER TABLE payments ADD CONSTRAINT payments_idempotency_key_fkey FOREIGN KEY (account_id, idempotency_key_id)
    REFERENCES idempotency_keys (account_id, id) ON DELETE SET NULL (idempotency_key_id);
ALTER TABLE audit_records DROP COLUMN request_id;
DROP DOMAIN request_id;
