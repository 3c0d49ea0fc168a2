-- Deliveries: one per event and endpoint that takes it, made by the fan-out, leased by the
-- delivery workers, tried on a schedule until delivered or failed; and every attempt, logged.
-- Online: new tables, new domains, and a nullable column on `webhook_endpoints` (catalog only).
SET LOCAL lock_timeout = '5s';

CREATE DOMAIN delivery_status AS text CHECK (VALUE IN ('pending', 'delivered', 'failed'));
CREATE DOMAIN answer_excerpt AS text CHECK (octet_length(VALUE) <= 4096);

CREATE TABLE webhook_deliveries (
    account_id      uuid            NOT NULL,
    id              uuid            NOT NULL,
    event_id        uuid            NOT NULL,
    endpoint_id     uuid            NOT NULL,
    status          delivery_status NOT NULL DEFAULT 'pending',
    -- Attempts made; also the lease's fence: only the holder of this attempt settles it.
    attempts        attempt_count   NOT NULL DEFAULT 0,
    -- When it is next due; NULL once it is delivered or failed.
    next_attempt_at timestamptz     DEFAULT now(),
    -- A worker holds it until then (in no index: taking the lease is a HOT update).
    leased_until    timestamptz,
    created_at      timestamptz     NOT NULL DEFAULT now(),
    -- When it was delivered or failed.
    ended_at        timestamptz,
    PRIMARY KEY (account_id, id),
    UNIQUE (account_id, event_id, endpoint_id),
    CHECK ((status = 'pending') = (next_attempt_at IS NOT NULL))
);

-- The delivery workers' queue: pending deliveries, those due longest first.
CREATE INDEX webhook_deliveries_due_idx ON webhook_deliveries (next_attempt_at) WHERE status = 'pending';
-- An endpoint's deliveries: those to send again (`recover`), those to drop with it (a delete).
CREATE INDEX webhook_deliveries_endpoint_idx ON webhook_deliveries (account_id, endpoint_id, ended_at);

CREATE TABLE webhook_attempts (
    account_id      uuid           NOT NULL,
    id              bigint         GENERATED ALWAYS AS IDENTITY,
    delivery_id     uuid           NOT NULL,
    endpoint_id     uuid           NOT NULL,
    event_id        uuid           NOT NULL,
    event_type      event_type     NOT NULL,
    attempt         attempt_count  NOT NULL,
    -- The receiver's status, NULL without an HTTP answer.
    status_code     http_status,
    -- Why it failed, NULL when it delivered.
    error           error_text,
    -- The first 4 KiB of the answer, as text.
    response_body   answer_excerpt NOT NULL,
    duration_ms     integer        NOT NULL CHECK (duration_ms >= 0),
    attempted_at    timestamptz    NOT NULL DEFAULT now(),
    next_attempt_at timestamptz,
    PRIMARY KEY (account_id, id)
);

-- `GET /v1/webhook_endpoints/{id}/attempts`: an endpoint's attempts, newest first.
CREATE INDEX webhook_attempts_endpoint_idx ON webhook_attempts (account_id, endpoint_id, id);
-- An event's attempts, which the reaper deletes with it.
CREATE INDEX webhook_attempts_event_idx ON webhook_attempts (account_id, event_id);

-- Since when an endpoint has answered no 2xx while its deliveries kept failing: NULL after a
-- success. Past `PAYMENTS_WEBHOOK_DISABLE_AFTER_SECS` it is disabled (`failing`).
ALTER TABLE webhook_endpoints ADD COLUMN failing_since timestamptz;

-- On a database distributed over Citus, colocated with the keys, by account; on one PostgreSQL
-- this does nothing.
DO $$
BEGIN
    -- Nested: the inner condition names a Citus catalog, which one PostgreSQL does not have.
    IF to_regclass('pg_dist_partition') IS NOT NULL THEN
        IF EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'idempotency_keys'::regclass) THEN
            PERFORM create_distributed_table('webhook_deliveries', 'account_id', colocate_with => 'idempotency_keys');
            PERFORM create_distributed_table('webhook_attempts', 'account_id', colocate_with => 'idempotency_keys');
        END IF;
    END IF;
END
$$;
