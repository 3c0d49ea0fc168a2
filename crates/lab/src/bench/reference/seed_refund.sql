-- What refunds add to the reference schema: the payments' running totals, held within the amount by a CHECK
-- (refund.sql reserves on them), and the refunds table, again with no index beyond its key and no foreign key.
-- Adding columns with a constant default rewrites nothing.
ALTER TABLE payments
    ADD COLUMN amount_refunded bigint NOT NULL DEFAULT 0,
    ADD COLUMN amount_refund_pending bigint NOT NULL DEFAULT 0,
    ADD CHECK (amount_refunded + amount_refund_pending <= amount);
CREATE TABLE refunds (
    id                 uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    account_id         bigint,
    payment_id         uuid,
    idempotency_key_id bigint,
    amount             bigint,
    currency           text,
    status             text,
    gateway_refund_id  text,
    created_at         timestamptz DEFAULT now(),
    updated_at         timestamptz
);
-- 100k succeeded payments that refund.sql refunds: id = md5('refund-' || n)::uuid, account_id = n % 1000 + 1,
-- each with far more than its refunds take back.
INSERT INTO payments (id, account_id, idempotency_key_id, amount, currency, status, gateway_charge_id, updated_at)
SELECT md5('refund-' || n)::uuid, n % 1000 + 1, 1000000 + n, 1000000000, 'usd', 'succeeded', 'ch_refund_' || n, now()
FROM generate_series(1, 100000) AS n;
VACUUM ANALYZE;
