-- One row per (account, Idempotency-Key): the request it stands for, how far that request has got
-- (recovery_point), who is driving it (locked_at, lock_token) and, once finished, the exact response.
CREATE TABLE idempotency_keys (
    id                  uuid        NOT NULL,
    account_id          uuid        NOT NULL REFERENCES accounts (id),
    -- The client's key: 1 to 255 printable ASCII characters (the API rejects anything else with a 400).
    idempotency_key     text        NOT NULL CHECK (idempotency_key ~ '^[ -~]{1,255}$'),
    request_method      text        NOT NULL CHECK (char_length(request_method) BETWEEN 1 AND 10),
    request_path        text        NOT NULL CHECK (char_length(request_path) BETWEEN 1 AND 100),
    -- SHA-256 of the canonical JSON of the validated body; a retry must match it (else 422).
    request_fingerprint bytea       NOT NULL CHECK (octet_length(request_fingerprint) = 32),
    -- The validated body, so that a background worker can re-drive the request without its client.
    request_params      jsonb       NOT NULL,
    recovery_point      text        NOT NULL DEFAULT 'started'
                                    CHECK (recovery_point IN ('started', 'charge_created', 'finished')),
    -- A lease: a lock older than the lock timeout is stale and may be taken over. The token fences
    -- every phase commit, so a request that lost its lease can no longer write.
    locked_at           timestamptz,
    lock_token          uuid,
    last_run_at         timestamptz NOT NULL DEFAULT now(),
    created_at          timestamptz NOT NULL DEFAULT now(),
    -- The final response, stored once and replayed byte for byte (bytea, not jsonb, which would
    -- reformat it).
    response_status     smallint    CHECK (response_status BETWEEN 100 AND 599),
    response_body       bytea       CHECK (octet_length(response_body) <= 65536),
    PRIMARY KEY (account_id, id),
    CONSTRAINT idempotency_keys_account_id_idempotency_key_key UNIQUE (account_id, idempotency_key),
    CONSTRAINT idempotency_keys_lock_check CHECK ((locked_at IS NULL) = (lock_token IS NULL)),
    CONSTRAINT idempotency_keys_finished_check CHECK (
        (recovery_point = 'finished') = (response_status IS NOT NULL)
        AND (response_status IS NULL) = (response_body IS NULL)
        AND (recovery_point <> 'finished' OR locked_at IS NULL)
    )
);

-- The completer's scan: unfinished keys, oldest run first. Partial, so finished keys cost nothing.
CREATE INDEX idempotency_keys_unfinished_idx ON idempotency_keys (last_run_at)
    WHERE recovery_point <> 'finished';
-- The reaper's scan: finished keys by age.
CREATE INDEX idempotency_keys_finished_created_at_idx ON idempotency_keys (created_at)
    WHERE recovery_point = 'finished';
