-- Authorize now, capture later: a payment may be only authorized, then captured (all or part of
-- it) or cancelled, each by a request with a key of its own, or cancelled by a worker once its
-- authorization lapses. Online: no table is rewritten (the new columns have constant defaults or
-- none) and no lock is held longer than a catalog change; the new checks are NOT VALID, checked for
-- new rows at once and for old ones by the next migration, under a lock that lets writes through.
SET LOCAL lock_timeout = '5s';

-- A capture's key goes from `started` through `capture_created`, a cancel's through
-- `cancel_created`. The new rules admit every value the old ones did, so no stored value is
-- checked again (and validating a domain's constraint would stop writes; see 000018).
ALTER DOMAIN recovery_point ADD CONSTRAINT recovery_point_with_changes
    CHECK (VALUE IN ('started', 'charge_created', 'refund_created', 'capture_created', 'cancel_created', 'finished'))
    NOT VALID;
ALTER DOMAIN recovery_point DROP CONSTRAINT recovery_point_with_refunds;
ALTER DOMAIN payment_status ADD CONSTRAINT payment_status_with_captures
    CHECK (VALUE IN ('pending', 'requires_capture', 'succeeded', 'canceled', 'failed')) NOT VALID;
ALTER DOMAIN payment_status DROP CONSTRAINT payment_status_check;

CREATE DOMAIN cancellation_reason AS text
    CHECK (VALUE IN ('duplicate', 'fraudulent', 'requested_by_customer', 'abandoned', 'expired'));

-- `automatic`: charged at once, as every payment was before; what it captured is its amount once
-- it succeeded (`amount_captured` stays NULL). `manual`: authorized only; `amount_captured` is 0
-- until a capture records what it took. Refunds take back at most what was captured.
-- (`capture_method` and `cancellation_reason` are text with a check, not domains: a new column of
-- a domain with a check rewrites the table, to check its default, NULL or not, in every row.)
ALTER TABLE payments
    ADD COLUMN capture_method text NOT NULL DEFAULT 'automatic',
    ADD COLUMN amount_captured bigint,
    -- When the authorization lapses: a worker cancels it then, unless a capture or a cancel won.
    ADD COLUMN capture_before timestamptz,
    ADD COLUMN canceled_at timestamptz,
    ADD COLUMN cancellation_reason text;
-- Each constraint by a command of its own: Citus takes no other subcommand beside one.
ALTER TABLE payments
    ADD CONSTRAINT payments_capture_check CHECK (
        capture_method IN ('automatic', 'manual')
        AND (capture_method = 'manual') = (amount_captured IS NOT NULL)
        AND amount_captured BETWEEN 0 AND amount
        AND (status <> 'requires_capture' OR (capture_method = 'manual' AND capture_before IS NOT NULL))
        AND (status = 'canceled') = (canceled_at IS NOT NULL)
        AND (canceled_at IS NOT NULL OR cancellation_reason IS NULL)
        AND cancellation_reason IN ('duplicate', 'fraudulent', 'requested_by_customer', 'abandoned', 'expired')
    ) NOT VALID;
ALTER TABLE payments
    ADD CONSTRAINT payments_refunds_within_captured_check CHECK (
        amount_refunded + amount_refund_pending <= coalesce(amount_captured, amount)
    ) NOT VALID;

CREATE DOMAIN payment_change_kind AS text CHECK (VALUE IN ('capture', 'cancel'));
CREATE DOMAIN payment_change_status AS text CHECK (VALUE IN ('pending', 'succeeded', 'failed'));

-- A capture or a cancel of an authorized payment, made by a request under its key (the lapse
-- worker's too, under a key of its own). It outlives its key, as a payment does, and keeps the
-- client's key for late retries and the key row's id for the key's story.
CREATE TABLE payment_changes (
    id                  uuid                   NOT NULL,
    account_id          uuid                   NOT NULL REFERENCES accounts (id),
    payment_id          uuid                   NOT NULL,
    idempotency_key_id  uuid                   NOT NULL,
    idempotency_key     client_idempotency_key NOT NULL,
    kind                payment_change_kind    NOT NULL,
    -- What a capture takes (the rest of the authorization is released); none for a cancel.
    amount              minor_units,
    cancellation_reason cancellation_reason,
    status              payment_change_status  NOT NULL DEFAULT 'pending',
    -- The gateway that holds the payment's charge: the only one asked.
    gateway             gateway_identity       NOT NULL,
    failure_code        failure_code,
    failure_message     message_text,
    created_at          timestamptz            NOT NULL DEFAULT now(),
    updated_at          timestamptz            NOT NULL DEFAULT now(),
    PRIMARY KEY (account_id, id),
    CONSTRAINT payment_changes_account_id_idempotency_key_id_key UNIQUE (account_id, idempotency_key_id),
    CONSTRAINT payment_changes_account_id_idempotency_key_key UNIQUE (account_id, idempotency_key),
    CONSTRAINT payment_changes_kind_check CHECK (
        (kind = 'capture') = (amount IS NOT NULL) AND (kind = 'cancel' OR cancellation_reason IS NULL)
    ),
    CONSTRAINT payment_changes_outcome_check CHECK ((status = 'failed') = (failure_code IS NOT NULL))
);
-- The rule no key can enforce: a capture, a cancel and the lapse of one authorization may race,
-- under different keys, and exactly one wins. Each inserts its change in its first phase; this
-- index lets one stand per payment (a change the gateway refused for good, `failed`, gives the
-- payment back), so a second insert conflicts, and the database, not a check in a handler,
-- decides.
CREATE UNIQUE INDEX payment_changes_one_per_payment ON payment_changes (account_id, payment_id)
    WHERE status <> 'failed';
-- A payment's changes, failed ones too (and the foreign key's index).
CREATE INDEX payment_changes_account_id_payment_id_idx ON payment_changes (account_id, payment_id);
-- The authorizations still open, by when they lapse: the lapse worker's queue. A row is made with
-- the authorization (a manual payment's `charge_created`) and goes with the change that ends it.
-- A table of its own, not an index on `payments`: an index on a column every payment's phases
-- update (`status`) would make each of those updates a non-HOT one.
CREATE TABLE open_authorizations (
    account_id     uuid        NOT NULL,
    payment_id     uuid        NOT NULL,
    capture_before timestamptz NOT NULL,
    PRIMARY KEY (account_id, payment_id)
);
CREATE INDEX open_authorizations_capture_before_idx ON open_authorizations (capture_before);

-- On a database distributed over Citus (`payments migrate --distribute`), a table can refer to
-- `payments` only once it is distributed as `payments` is: by account, colocated. On one
-- PostgreSQL this does nothing.
DO $$
BEGIN
    -- Nested: the inner condition names a Citus catalog, which one PostgreSQL does not have.
    IF to_regclass('pg_dist_partition') IS NOT NULL THEN
        IF EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'payments'::regclass) THEN
            PERFORM create_distributed_table('payment_changes', 'account_id', colocate_with => 'payments');
            PERFORM create_distributed_table('open_authorizations', 'account_id', colocate_with => 'payments');
        END IF;
    END IF;
END
$$;
ALTER TABLE payment_changes
    ADD CONSTRAINT payment_changes_payment_fkey FOREIGN KEY (account_id, payment_id) REFERENCES payments (account_id, id);
ALTER TABLE open_authorizations
    ADD CONSTRAINT open_authorizations_payment_fkey FOREIGN KEY (account_id, payment_id)
        REFERENCES payments (account_id, id);

-- What each client key made: a capture's or a cancel's key made its change.
CREATE OR REPLACE VIEW made_by_keys AS
    SELECT account_id, idempotency_key, 'POST'::text AS request_method, '/v1/payments'::text AS request_path, id
    FROM payments
    UNION ALL
    SELECT account_id, idempotency_key, 'POST', '/v1/refunds', id
    FROM refunds
    UNION ALL
    SELECT account_id, idempotency_key, 'POST', '/v1/payments/{id}/' || kind, id
    FROM payment_changes;
