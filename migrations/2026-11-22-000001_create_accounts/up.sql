-- An account is a tenant: every other row belongs to exactly one account, and every unique key below
-- includes account_id, so the tables can later be distributed by account without a redesign.
CREATE TABLE accounts (
    id           uuid        PRIMARY KEY,
    name         text        NOT NULL CHECK (char_length(name) BETWEEN 1 AND 100),
    -- SHA-256 of the API key. The key itself is shown once, when the account is created, and never stored.
    api_key_hash bytea       NOT NULL CHECK (octet_length(api_key_hash) = 32),
    created_at   timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT accounts_api_key_hash_key UNIQUE (api_key_hash)
);
