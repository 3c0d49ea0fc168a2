-- As 000021 did for payments' charge ids: no statement looks a refund up by the gateway's refund
-- id, and the unique index on it made `refund_created`, which writes that id, a non-HOT update of
-- the refund (a new entry in each of its five indexes). Each refund the gateway makes answers one
-- downstream key of ours, so the index checked only what the gateway promises.
--
-- Online: dropping a constraint changes the catalog only (ACCESS EXCLUSIVE for an instant, no row
-- read), waited for at most 5 s.
SET LOCAL lock_timeout = '5s';
ALTER TABLE refunds DROP CONSTRAINT refunds_account_id_gateway_refund_id_key;
