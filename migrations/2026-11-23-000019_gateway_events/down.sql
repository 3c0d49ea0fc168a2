DROP TABLE gateway_events;
DROP DOMAIN gateway_event_outcome;
DROP DOMAIN gateway_event_id;
ALTER TABLE idempotency_keys DROP COLUMN nudged_at;
