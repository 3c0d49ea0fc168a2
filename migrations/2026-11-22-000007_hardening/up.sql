-- A lease says when it ends, in the owner's own terms: a taker compares the database's clock with
-- `locked_until` instead of applying its own lock timeout to `locked_at`, so a process with a short
-- timeout never takes over a live request of one with a long timeout. Locks held during the upgrade
-- are given the default lock timeout (90 s); one that a process with a longer timeout holds may be
-- taken over early, which is what stopping every process before migrating avoids.
ALTER TABLE idempotency_keys RENAME COLUMN locked_at TO locked_until;
UPDATE idempotency_keys SET locked_until = locked_until + interval '90 seconds' WHERE locked_until IS NOT NULL;

-- A reaped key's late retry is now answered from its payment, whatever the body, and never stored:
-- drop the 410s stored under new key rows before, which would answer 422 to another body.
DELETE FROM idempotency_keys WHERE response_status = 410;

-- The gateway a payment is charged through, fixed when `started` commits: every later look-up or
-- charge for it must go to the same gateway, never to another one that would find nothing and
-- charge again. Payments made before this column existed have none, and no driver will touch them:
-- an operator who knows their gateway sets it (`UPDATE payments SET gateway = '...' WHERE ...`).
ALTER TABLE payments ADD COLUMN gateway text CHECK (char_length(gateway) BETWEEN 1 AND 500);

-- The order payments were created in, as the database saw it: listing newest first pages on this,
-- not on ids made by each process's own clock. Existing payments are numbered in the order they were
-- created (the table's physical order is not that: every payment is updated after its insert).
ALTER TABLE payments ADD COLUMN created_seq bigint;
UPDATE payments p SET created_seq = ordered.n
FROM (SELECT account_id, id, row_number() OVER (ORDER BY created_at, id) AS n FROM payments) ordered
WHERE p.account_id = ordered.account_id AND p.id = ordered.id;
ALTER TABLE payments ALTER COLUMN created_seq SET NOT NULL,
    ALTER COLUMN created_seq ADD GENERATED ALWAYS AS IDENTITY;
SELECT setval(pg_get_serial_sequence('payments', 'created_seq'),
              coalesce((SELECT max(created_seq) FROM payments), 0) + 1, false);
CREATE INDEX payments_account_id_created_seq_idx ON payments (account_id, created_seq);
