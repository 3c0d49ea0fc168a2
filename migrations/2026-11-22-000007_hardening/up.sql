-- A lease says when it ends, in the owner's own terms: a taker compares the database's clock with
-- `locked_until` instead of applying its own lock timeout to `locked_at`, so a process with a short
-- timeout never takes over a live request of one with a long timeout.
ALTER TABLE idempotency_keys RENAME COLUMN locked_at TO locked_until;
UPDATE idempotency_keys SET locked_until = locked_until + interval '90 seconds' WHERE locked_until IS NOT NULL;

-- The gateway a payment is charged through, fixed when `started` commits: every later look-up or
-- charge for it must go to the same gateway, never to another one that would find nothing and
-- charge again. Payments made before this column existed have none, and no driver will touch them.
ALTER TABLE payments ADD COLUMN gateway text CHECK (char_length(gateway) BETWEEN 1 AND 500);

-- The order payments were created in, as the database saw it: listing newest first pages on this,
-- not on ids made by each process's own clock.
ALTER TABLE payments ADD COLUMN created_seq bigint GENERATED ALWAYS AS IDENTITY;
CREATE INDEX payments_account_id_created_seq_idx ON payments (account_id, created_seq);
