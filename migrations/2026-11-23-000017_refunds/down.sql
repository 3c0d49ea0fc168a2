DROP VIEW made_by_keys;
DROP TABLE refunds;
DROP DOMAIN refund_reason;
DROP DOMAIN refund_status;
ALTER TABLE payments DROP CONSTRAINT payments_refund_totals_check,
    DROP COLUMN amount_refunded, DROP COLUMN amount_refund_pending;
ALTER DOMAIN recovery_point ADD CONSTRAINT recovery_point_check
    CHECK (VALUE IN ('started', 'charge_created', 'finished')) NOT VALID;
ALTER DOMAIN recovery_point DROP CONSTRAINT recovery_point_with_refunds;
