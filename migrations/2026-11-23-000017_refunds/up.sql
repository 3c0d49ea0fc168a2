-- Refunds: a second money-moving endpoint on the same idempotency keys. Online: no table is
-- rewritten and no lock is held longer than a catalog change (the constraints below are NOT VALID,
-- checked for new rows at once and for old ones by the next migration, under a lock that lets
-- writes through).
-- A lock that cannot be had at once is waited for at most this long, not behind every request.
SET LOCAL lock_timeout = '5s';

-- A refund's key goes from `started` through `refund_created`. The new rule admits every value the
-- old one did, so no stored value is checked again.
ALTER DOMAIN recovery_point ADD CONSTRAINT recovery_point_with_refunds
    CHECK (VALUE IN ('started', 'charge_created', 'refund_created', 'finished')) NOT VALID;
ALTER DOMAIN recovery_point DROP CONSTRAINT recovery_point_check;

-- The money rule that no idempotency key can enforce: two refunds with different keys may race for
-- the same money. A payment carries its running totals, and its own CHECK holds them within its
-- amount: a refund reserves its amount as pending in the transaction that creates it, under the
-- payment's row lock, and a reservation that would break the rule cannot commit. (A constant
-- default is stored in the catalog: adding these columns rewrites nothing.)
ALTER TABLE payments
    ADD COLUMN amount_refunded bigint NOT NULL DEFAULT 0,
    ADD COLUMN amount_refund_pending bigint NOT NULL DEFAULT 0,
    ADD CONSTRAINT payments_refund_totals_check CHECK (
        amount_refunded >= 0 AND amount_refund_pending >= 0
        AND amount_refunded + amount_refund_pending <= amount
    ) NOT VALID;

CREATE DOMAIN refund_status AS text CHECK (VALUE IN ('pending', 'succeeded', 'failed'));
CREATE DOMAIN refund_reason AS text CHECK (VALUE IN ('duplicate', 'fraudulent', 'requested_by_customer'));

-- A refund outlives its idempotency key, as a payment does, and keeps the client's key for late
-- retries and the key row's id for the key's story.
CREATE TABLE refunds (
    id                 uuid                   NOT NULL,
    account_id         uuid                   NOT NULL REFERENCES accounts (id),
    payment_id         uuid                   NOT NULL,
    idempotency_key_id uuid                   NOT NULL,
    idempotency_key    client_idempotency_key NOT NULL,
    amount             minor_units            NOT NULL,
    currency           currency_code          NOT NULL,
    reason             refund_reason,
    metadata           json_object            NOT NULL DEFAULT '{}',
    status             refund_status          NOT NULL DEFAULT 'pending',
    -- The gateway that holds the payment's charge: the only one asked about this refund.
    gateway            gateway_identity       NOT NULL,
    gateway_refund_id  gateway_charge_id,
    failure_code       failure_code,
    failure_message    message_text,
    created_at         timestamptz            NOT NULL DEFAULT now(),
    updated_at         timestamptz            NOT NULL DEFAULT now(),
    -- A refund the gateway answered `pending` is looked up again from this time on, with backoff.
    settle_at          timestamptz,
    settle_attempts    attempt_count          NOT NULL DEFAULT 0,
    created_seq        bigint                 GENERATED ALWAYS AS IDENTITY,
    PRIMARY KEY (account_id, id),
    CONSTRAINT refunds_account_id_idempotency_key_id_key UNIQUE (account_id, idempotency_key_id),
    CONSTRAINT refunds_account_id_idempotency_key_key UNIQUE (account_id, idempotency_key),
    CONSTRAINT refunds_account_id_gateway_refund_id_key UNIQUE (account_id, gateway_refund_id),
    CONSTRAINT refunds_payment_fkey FOREIGN KEY (account_id, payment_id) REFERENCES payments (account_id, id),
    CONSTRAINT refunds_outcome_check CHECK (
        (status <> 'succeeded' OR gateway_refund_id IS NOT NULL)
        AND ((status = 'failed') = (failure_code IS NOT NULL))
        AND (settle_at IS NULL OR status = 'pending')
    )
);
-- A payment's refunds, newest first (and the foreign key's index).
CREATE INDEX refunds_account_id_payment_id_created_seq_idx ON refunds (account_id, payment_id, created_seq);
-- The settler's scan: refunds the gateway left pending, by when they are due again.
CREATE INDEX refunds_settle_at_idx ON refunds (settle_at) WHERE settle_at IS NOT NULL;

-- What each client key made, whichever endpoint it was used on: a claim that finds no key row
-- (reaped after its retention) looks here, so that a late retry is answered from what the key
-- made (410) and never makes it again, and a key reused on another endpoint is still refused.
CREATE VIEW made_by_keys AS
    SELECT account_id, idempotency_key, 'POST'::text AS request_method, '/v1/payments'::text AS request_path, id
    FROM payments
    UNION ALL
    SELECT account_id, idempotency_key, 'POST', '/v1/refunds', id
    FROM refunds;
