DROP TABLE webhook_endpoints;
DROP DOMAIN enabled_events;
DROP DOMAIN webhook_secret;
DROP DOMAIN webhook_disabled_reason;
DROP DOMAIN webhook_endpoint_status;
DROP DOMAIN webhook_url;
