ALTER DOMAIN recovery_point ADD CONSTRAINT recovery_point_with_changes
    CHECK (VALUE IN ('started', 'charge_created', 'refund_created', 'capture_created', 'cancel_created', 'finished'))
    NOT VALID;
ALTER DOMAIN recovery_point DROP CONSTRAINT recovery_point_named;

CREATE OR REPLACE VIEW made_by_keys AS
    SELECT account_id, idempotency_key, 'POST'::text AS request_method, '/v1/payments'::text AS request_path, id
    FROM payments
    UNION ALL
    SELECT account_id, idempotency_key, 'POST', '/v1/refunds', id
    FROM refunds
    UNION ALL
    SELECT account_id, idempotency_key, 'POST', '/v1/payments/{id}/' || kind, id
    FROM payment_changes;

DROP TABLE key_resources;
