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
-- A client key can have several such records: before 000007, a retry after its key row was reaped
-- made a key row of its own, which answered 410 (no payment) and was reaped in turn. The payment's
-- is the first: every later row under that key was made after it was deleted. So the backfill
-- takes the earliest record, never a 410's; a payment with only a 410's record keeps no id. (An
-- UPDATE joined to several rows takes whichever the plan meets first.) This choice was made after
-- 000011 had run on deployed databases; there, diesel does not apply it again, and such a payment may
-- name a 410's key row, whose trail its key's story then shows.
UPDATE payments p SET idempotency_key_id = r.resource_id
FROM (SELECT DISTINCT ON (account_id, data ->> 'idempotency_key')
             account_id, data ->> 'idempotency_key' AS idempotency_key, resource_id
      FROM audit_records
      WHERE resource_type = 'idempotency_key' AND action = 'idempotency_key.reaped'
        AND data -> 'response_status' IS DISTINCT FROM '410'
      ORDER BY account_id, data ->> 'idempotency_key', id) r
WHERE p.idempotency_key_id IS NULL
  AND r.account_id = p.account_id AND r.idempotency_key = p.idempotency_key;
