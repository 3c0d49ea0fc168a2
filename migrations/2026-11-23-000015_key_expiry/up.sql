-- When a finished key expires: written once, by the database, in the statement that finishes the
-- key (`now()` plus the finishing process's PAYMENTS_KEY_RETENTION_SECS), and read by everyone
-- after: the claim answers an expired key `410` (even before it is reaped) and tells a process how
-- long it may keep the answer in memory, and the reaper deletes keys past it. Processes with
-- different retention settings thus never disagree about a key.
--
-- Online: a nullable column without a default, and a CHECK marked NOT VALID, change the catalog
-- only (no rewrite, no scan); each holds ACCESS EXCLUSIVE for an instant. So that the migration
-- never queues behind a long transaction while every request queues behind it, it gives up after
-- a few seconds instead (run it again). The CHECK (an expiry only on a finished key, and not before
-- it finished) holds for every existing row, whose expiry is null, and is enforced on every write
-- from now on; it is left unvalidated, as a scan would prove nothing more.
--
-- Keys finished before this migration (or by a process of an older version during a rolling
-- upgrade) have no expiry: the claim replays them from the database and no process keeps them in
-- memory, until the reaper deletes them by its own retention, counted from when they finished.
SET LOCAL lock_timeout = '5s';
ALTER TABLE idempotency_keys ADD COLUMN expires_at timestamptz;
ALTER TABLE idempotency_keys ADD CONSTRAINT idempotency_keys_expires_at_check
    CHECK (expires_at IS NULL OR (finished_at IS NOT NULL AND expires_at >= finished_at)) NOT VALID;
