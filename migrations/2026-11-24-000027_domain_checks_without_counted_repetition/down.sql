-- The old checks, NOT VALID as the new ones were (validating a domain's check locks every table
-- that uses it against writes while it reads them); every stored value passes them.
SET LOCAL lock_timeout = '5s';
ALTER DOMAIN request_id DROP CONSTRAINT request_id_check;
ALTER DOMAIN request_id ADD CONSTRAINT request_id_check CHECK (VALUE ~ '^[A-Za-z0-9._:+/=-]{1,128}$') NOT VALID;
ALTER DOMAIN client_idempotency_key DROP CONSTRAINT client_idempotency_key_check;
ALTER DOMAIN client_idempotency_key ADD CONSTRAINT client_idempotency_key_check CHECK (VALUE ~ '^[ -~]{1,255}$') NOT VALID;
