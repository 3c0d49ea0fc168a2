CREATE OR REPLACE VIEW made_by_keys AS
    SELECT account_id, idempotency_key, 'POST'::text AS request_method, '/v1/payments'::text AS request_path, id
    FROM payments
    UNION ALL
    SELECT account_id, idempotency_key, 'POST', '/v1/refunds', id
    FROM refunds;
DROP TABLE open_authorizations;
DROP TABLE payment_changes;
DROP DOMAIN payment_change_status;
DROP DOMAIN payment_change_kind;
ALTER TABLE payments DROP CONSTRAINT payments_refunds_within_captured_check,
    DROP CONSTRAINT payments_capture_check,
    DROP COLUMN cancellation_reason, DROP COLUMN canceled_at, DROP COLUMN capture_before,
    DROP COLUMN amount_captured, DROP COLUMN capture_method;
DROP DOMAIN cancellation_reason;
ALTER DOMAIN payment_status ADD CONSTRAINT payment_status_check
    CHECK (VALUE IN ('pending', 'succeeded', 'failed')) NOT VALID;
ALTER DOMAIN payment_status DROP CONSTRAINT payment_status_with_captures;
ALTER DOMAIN recovery_point ADD CONSTRAINT recovery_point_with_refunds
    CHECK (VALUE IN ('started', 'charge_created', 'refund_created', 'finished')) NOT VALID;
ALTER DOMAIN recovery_point DROP CONSTRAINT recovery_point_with_changes;
