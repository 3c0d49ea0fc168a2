ALTER TABLE webhook_endpoints DROP COLUMN failing_since;
DROP TABLE webhook_attempts;
DROP TABLE webhook_deliveries;
DROP DOMAIN answer_excerpt;
DROP DOMAIN delivery_status;
