-- Events kept: every event the service stages is a row here for its account, written in the
-- transaction of the change it announces, and read back by `GET /v1/events`. The fan-out takes
-- each once, after it commits (`fanned_out_at`), and hands it to delivery; the reaper deletes it
-- after its retention. Online: a new table and a new domain.
SET LOCAL lock_timeout = '5s';

CREATE DOMAIN event_type AS text CHECK (char_length(VALUE) <= 100 AND VALUE ~ '^[a-z_]+\.[a-z_]+$');

CREATE TABLE events (
    account_id    uuid        NOT NULL,
    -- Shown as `evt_` and its 32 hex digits; the `webhook-id` of every delivery of it.
    id            uuid        NOT NULL,
    event_type    event_type  NOT NULL,
    -- The event exactly as the API shows it and a receiver gets it, byte for byte on every read.
    body          jsonb       NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    -- The database's own order of events, for paging (process clocks may disagree, ids with them).
    created_seq   bigint      GENERATED ALWAYS AS IDENTITY,
    -- When the fan-out handed it to delivery; until then it waits in the partial index below.
    fanned_out_at timestamptz,
    PRIMARY KEY (account_id, id)
);

-- `GET /v1/events`: an account's events, newest first.
CREATE INDEX events_account_id_created_seq_idx ON events (account_id, created_seq);

-- The fan-out's queue: the events not yet handed over, oldest first. An event leaves it when it
-- is fanned out, so it holds only the few in flight.
CREATE INDEX events_to_fan_out_idx ON events (created_at) WHERE fanned_out_at IS NULL;

-- The reaper's scan for events past their retention. Events arrive in time order, so a block
-- range index (a summary per 128 pages) finds them, and costs almost nothing per insert.
CREATE INDEX events_created_at_idx ON events USING brin (created_at);

-- On a database distributed over Citus, colocated with the keys, by account; on one PostgreSQL
-- this does nothing.
DO $$
BEGIN
    -- Nested: the inner condition names a Citus catalog, which one PostgreSQL does not have.
    IF to_regclass('pg_dist_partition') IS NOT NULL THEN
        IF EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'idempotency_keys'::regclass) THEN
            PERFORM create_distributed_table('events', 'account_id', colocate_with => 'idempotency_keys');
        END IF;
    END IF;
END
$$;
