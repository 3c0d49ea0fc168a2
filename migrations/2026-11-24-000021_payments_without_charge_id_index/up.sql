-- No statement looks a payment up by its gateway charge id: the unique index on it served only as
-- a check that a gateway never gives one charge to two payments, which the gateway itself promises
-- (each charge answers one downstream key, and each key row has its own). And because
-- `charge_created` writes the charge id, that index made the phase's UPDATE of the payment a
-- non-HOT one: a new row version elsewhere, with an entry in each of the five indexes of payments
-- (about 600 bytes of WAL per payment). Without it, the update changes no indexed column.
--
-- Online: dropping a constraint changes the catalog only, under ACCESS EXCLUSIVE for an instant,
-- and reads no row; the lock is waited for at most 5 s (then the migration fails, changing
-- nothing: run it again).
SET LOCAL lock_timeout = '5s';
ALTER TABLE payments DROP CONSTRAINT payments_account_id_gateway_charge_id_key;
