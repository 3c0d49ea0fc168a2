-- Gateway events that verify but cannot be read (a field of a shape the service does not know, a
-- time it cannot hold): no retry would change them, so instead of being refused, and sent again
-- for ever, they are answered 200 and kept here, raw and bounded, for a person.
--
-- The one table besides `accounts` whose rows may carry no account: an event that names no
-- request of ours names no account either. `account_id` and `idempotency_key_id` are the key its
-- request names, when that is an account of ours (indexed: the account's foreign key, and a
-- person looking for a key's). A new table is online.
SET LOCAL lock_timeout = '5s';

CREATE TABLE unreadable_gateway_events (
    id                 bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    account_id         uuid        REFERENCES accounts (id),
    idempotency_key_id uuid        CHECK (idempotency_key_id IS NULL OR account_id IS NOT NULL),
    -- The body as it arrived, up to 16 KiB of it; `body_bytes` is its whole length.
    body               bytea       NOT NULL CHECK (octet_length(body) <= 16384),
    body_bytes         integer     NOT NULL CHECK (body_bytes >= octet_length(body)),
    -- Why it could not be read, for the person.
    reason             text        NOT NULL CHECK (char_length(reason) BETWEEN 1 AND 1000),
    received_at        timestamptz NOT NULL DEFAULT now(),
    request_id         request_id
);
CREATE INDEX unreadable_gateway_events_account_id_idempotency_key_id_idx
    ON unreadable_gateway_events (account_id, idempotency_key_id);
