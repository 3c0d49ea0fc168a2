-- Where an account's events go: its webhook endpoints, each with the types of event it takes and
-- the secret its deliveries are signed with (and, for a while after a rotation, the one before).
-- Online: a new table and new domains.
SET LOCAL lock_timeout = '5s';

CREATE DOMAIN webhook_url AS text CHECK (char_length(VALUE) BETWEEN 1 AND 2048);
CREATE DOMAIN webhook_endpoint_status AS text CHECK (VALUE IN ('enabled', 'disabled'));
CREATE DOMAIN webhook_disabled_reason AS text CHECK (VALUE IN ('gone', 'failing'));
-- `whsec_` and the base64 of 24 to 64 bytes.
CREATE DOMAIN webhook_secret AS text CHECK (char_length(VALUE) BETWEEN 38 AND 94 AND VALUE LIKE 'whsec\_%');
-- Event types, or `*` alone: at most one of each type the service stages.
CREATE DOMAIN enabled_events AS text[] CHECK (cardinality(VALUE) BETWEEN 1 AND 20);

CREATE TABLE webhook_endpoints (
    account_id                 uuid                    NOT NULL,
    -- Shown as `we_` and its 32 hex digits.
    id                         uuid                    NOT NULL,
    url                        webhook_url             NOT NULL,
    enabled_events             enabled_events          NOT NULL,
    description                message_text,
    status                     webhook_endpoint_status NOT NULL DEFAULT 'enabled',
    -- Why the service disabled it (`gone`: it answered 410; `failing`: no 2xx for too long);
    -- NULL when it is enabled, or when its account disabled it.
    disabled_reason            webhook_disabled_reason,
    secret                     webhook_secret          NOT NULL,
    -- After a rotation, the secret before, which signs beside the new one until it expires.
    previous_secret            webhook_secret,
    previous_secret_expires_at timestamptz,
    -- The key of the request that made it, for the key's story.
    idempotency_key_id         uuid                    NOT NULL,
    idempotency_key            client_idempotency_key  NOT NULL,
    created_at                 timestamptz             NOT NULL,
    updated_at                 timestamptz             NOT NULL DEFAULT now(),
    -- The database's own order of endpoints, for listing them newest first.
    created_seq                bigint                  GENERATED ALWAYS AS IDENTITY,
    PRIMARY KEY (account_id, id),
    CHECK (status = 'disabled' OR disabled_reason IS NULL),
    CHECK ((previous_secret IS NULL) = (previous_secret_expires_at IS NULL))
);

-- On a database distributed over Citus, colocated with the keys, by account; on one PostgreSQL
-- this does nothing.
DO $$
BEGIN
    -- Nested: the inner condition names a Citus catalog, which one PostgreSQL does not have.
    IF to_regclass('pg_dist_partition') IS NOT NULL THEN
        IF EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'idempotency_keys'::regclass) THEN
            PERFORM create_distributed_table('webhook_endpoints', 'account_id', colocate_with => 'idempotency_keys');
        END IF;
    END IF;
END
$$;
