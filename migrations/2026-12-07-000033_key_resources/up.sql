-- What a key's request made, kept by the idempotency layer itself: the finishing phase records it
-- on the key row (`resource_id`, 000032), and the reaper, as it deletes the row, in
-- `key_resources`, which outlives the key. The claim reads them for a key that expired or was
-- reaped, where it read the view `made_by_keys`, which named every endpoint's table: a new
-- endpoint now adds none of its own here. Online: a new table filled from the three tables the
-- view read (read, never locked against writes), and a view dropped that only the claim of an
-- older version reads.
SET LOCAL lock_timeout = '5s';

CREATE TABLE key_resources (
    account_id      uuid                   NOT NULL,
    idempotency_key client_idempotency_key NOT NULL,
    request_method  http_method            NOT NULL,
    request_path    http_path              NOT NULL,
    -- The payment, refund or change the key made, in its endpoint's table.
    resource_id     uuid                   NOT NULL,
    PRIMARY KEY (account_id, idempotency_key)
);

-- On a database distributed over Citus, colocated with the keys, by account; on one PostgreSQL
-- this does nothing.
DO $$
BEGIN
    -- Nested: the inner condition names a Citus catalog, which one PostgreSQL does not have.
    IF to_regclass('pg_dist_partition') IS NOT NULL THEN
        IF EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'idempotency_keys'::regclass) THEN
            PERFORM create_distributed_table('key_resources', 'account_id', colocate_with => 'idempotency_keys');
        END IF;
    END IF;
END
$$;

-- What every key made so far, as the view showed it: the finished keys' rows, not yet reaped,
-- have no `resource_id`, and are answered from here too.
INSERT INTO key_resources (account_id, idempotency_key, request_method, request_path, resource_id)
SELECT account_id, idempotency_key, request_method, request_path, id FROM made_by_keys
ON CONFLICT (account_id, idempotency_key) DO NOTHING;

DROP VIEW made_by_keys;

-- A key's recovery points are its endpoint's to name (see `Endpoint::points`): the database holds
-- each to the shape of a name, and the registry of endpoints to the list. The new rule admits
-- every value the old one did, so no stored value is checked again.
ALTER DOMAIN recovery_point ADD CONSTRAINT recovery_point_named CHECK (char_length(VALUE) <= 40 AND VALUE ~ '^[a-z][a-z_]*$') NOT VALID;
ALTER DOMAIN recovery_point DROP CONSTRAINT recovery_point_with_changes;
