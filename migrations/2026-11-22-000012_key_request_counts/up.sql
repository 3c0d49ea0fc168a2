-- How each account's requests with an Idempotency-Key were taken in, per hour: what `payments
-- stats` reads to spot a client that retries too much (a broken client, or a replay attack). A
-- replay writes nothing on its own (it is answered from the stored response), so each process
-- tallies in memory and adds its tallies here every few seconds, one statement for all accounts.
CREATE TABLE key_request_counts (
    account_id uuid        NOT NULL,
    -- A whole hour in UTC, whatever the session's time zone.
    hour       timestamptz NOT NULL CHECK (date_trunc('hour', hour, 'UTC') = hour),
    created    bigint      NOT NULL DEFAULT 0 CHECK (created >= 0),
    resumed    bigint      NOT NULL DEFAULT 0 CHECK (resumed >= 0),
    replayed   bigint      NOT NULL DEFAULT 0 CHECK (replayed >= 0),
    in_flight  bigint      NOT NULL DEFAULT 0 CHECK (in_flight >= 0),
    key_reused bigint      NOT NULL DEFAULT 0 CHECK (key_reused >= 0),
    expired    bigint      NOT NULL DEFAULT 0 CHECK (expired >= 0),
    PRIMARY KEY (account_id, hour)
);
