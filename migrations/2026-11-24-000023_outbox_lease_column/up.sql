-- An event's lease gets a column of its own. A worker used to lease an event by moving its `run_at`
-- into the future, and `run_at` leads the due index: every lease was a non-HOT update, with a new
-- entry in each of the outbox's three indexes (about 300 bytes of WAL per event). `leased_until` is
-- in no index, so taking a lease is a HOT update; `run_at` now changes only when a failed delivery
-- is put off.
--
-- Online: a nullable column with no default changes the catalog only (ACCESS EXCLUSIVE for an
-- instant, no row read or written), waited for at most 5 s.
--
-- During a rolling upgrade, a worker of the version before does not see this column: it may take
-- an event that a new worker holds and deliver it at the same time, once more. Receivers already
-- de-duplicate by the event's id (delivery is at least once).
SET LOCAL lock_timeout = '5s';
ALTER TABLE staged_jobs ADD COLUMN leased_until timestamptz;
