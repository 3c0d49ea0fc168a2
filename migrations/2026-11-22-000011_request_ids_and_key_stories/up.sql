-- Which request wrote each audit record (its `Request-Id`, or the id of the worker run that took
-- the request over), so that support can go from the id a client quotes to what happened. Records
-- written by no request (the reaper's, the outbox's) have none.
CREATE DOMAIN request_id AS text CHECK (VALUE ~ '^[A-Za-z0-9._:+/=-]{1,128}$');
ALTER TABLE audit_records ADD COLUMN request_id request_id;

-- A payment keeps the id of the key row it was made under after the reaper has deleted that row:
-- the key's story (`GET /v1/idempotency_keys?key=`) reads the key's audit records by it. The id is
-- a fact about the payment's past, not a reference to a live row, so it is no longer a foreign
-- key. (Citus refuses `ON DELETE SET NULL` on a key that includes the distribution column, too.)
-- Only the `started` phase writes it, from the fenced key row of the same statement.
ALTER TABLE payments DROP CONSTRAINT payments_idempotency_key_fkey;
-- Payments whose key rows were reaped before now lost the id; their reaping's audit record names it.
UPDATE payments p SET idempotency_key_id = r.resource_id
FROM audit_records r
WHERE p.idempotency_key_id IS NULL
  AND r.account_id = p.account_id AND r.resource_type = 'idempotency_key' AND r.action = 'idempotency_key.reaped'
  AND r.data ->> 'idempotency_key' = p.idempotency_key;
