-- A payment outlives its idempotency key: the reaper deletes old keys, which only clears the link.
CREATE TABLE payments (
    id                 uuid        NOT NULL,
    account_id         uuid        NOT NULL REFERENCES accounts (id),
    idempotency_key_id uuid,
    -- The client's key, kept after the key row is reaped, so that a late retry can still be told
    -- which payment it already made instead of making another.
    idempotency_key    text        NOT NULL CHECK (idempotency_key ~ '^[ -~]{1,255}$'),
    amount             bigint      NOT NULL CHECK (amount BETWEEN 1 AND 99999999),
    currency           text        NOT NULL CHECK (currency ~ '^[a-z]{3}$'),
    description        text        CHECK (char_length(description) <= 500),
    metadata           jsonb       NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(metadata) = 'object'),
    status             text        NOT NULL DEFAULT 'pending'
                                   CHECK (status IN ('pending', 'succeeded', 'failed')),
    gateway_charge_id  text        CHECK (char_length(gateway_charge_id) BETWEEN 1 AND 255),
    failure_code       text        CHECK (char_length(failure_code) BETWEEN 1 AND 100),
    failure_message    text        CHECK (char_length(failure_message) <= 500),
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (account_id, id),
    -- One payment per key row, and one per client key even after the key row is gone.
    CONSTRAINT payments_account_id_idempotency_key_id_key UNIQUE (account_id, idempotency_key_id),
    CONSTRAINT payments_account_id_idempotency_key_key UNIQUE (account_id, idempotency_key),
    -- Charge ids are globally unique at the gateway; the constraint includes account_id so that it
    -- stays enforceable when the table is distributed by account.
    CONSTRAINT payments_account_id_gateway_charge_id_key UNIQUE (account_id, gateway_charge_id),
    -- SET NULL on only the key column: account_id is part of the reference but must stay.
    CONSTRAINT payments_idempotency_key_fkey FOREIGN KEY (account_id, idempotency_key_id)
        REFERENCES idempotency_keys (account_id, id) ON DELETE SET NULL (idempotency_key_id),
    CONSTRAINT payments_outcome_check CHECK (
        (status <> 'succeeded' OR gateway_charge_id IS NOT NULL)
        AND ((status = 'failed') = (failure_code IS NOT NULL))
    )
);
