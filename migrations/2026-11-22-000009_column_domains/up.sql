-- Every single-column rule becomes a domain, the type of the columns it governs. The rules are the
-- same; what changes is their cost. PostgreSQL re-reads and re-plans every CHECK constraint of a
-- table for every statement that writes the table (`ExecRelCheck`), which was about a quarter of
-- its work on a payment. A domain's check comes from the type cache and is compiled into the
-- statement's plan. Only rules that tie several columns together stay table CHECKs.
CREATE DOMAIN client_idempotency_key AS text CHECK (VALUE ~ '^[ -~]{1,255}$');
CREATE DOMAIN http_method AS text CHECK (char_length(VALUE) BETWEEN 1 AND 10);
CREATE DOMAIN http_path AS text CHECK (char_length(VALUE) BETWEEN 1 AND 100);
CREATE DOMAIN sha256_digest AS bytea CHECK (octet_length(VALUE) = 32);
CREATE DOMAIN recovery_point AS text CHECK (VALUE IN ('started', 'charge_created', 'finished'));
CREATE DOMAIN http_status AS smallint CHECK (VALUE BETWEEN 100 AND 599);
CREATE DOMAIN stored_body AS bytea CHECK (octet_length(VALUE) <= 65536);
CREATE DOMAIN attempt_count AS integer CHECK (VALUE >= 0);
CREATE DOMAIN error_text AS text CHECK (char_length(VALUE) <= 1000);
CREATE DOMAIN minor_units AS bigint CHECK (VALUE BETWEEN 1 AND 99999999);
CREATE DOMAIN currency_code AS text CHECK (VALUE ~ '^[a-z]{3}$');
CREATE DOMAIN message_text AS text CHECK (char_length(VALUE) <= 500);
CREATE DOMAIN json_object AS jsonb CHECK (jsonb_typeof(VALUE) = 'object');
CREATE DOMAIN payment_status AS text CHECK (VALUE IN ('pending', 'succeeded', 'failed'));
CREATE DOMAIN gateway_charge_id AS text CHECK (char_length(VALUE) BETWEEN 1 AND 255);
CREATE DOMAIN failure_code AS text CHECK (char_length(VALUE) BETWEEN 1 AND 100);
CREATE DOMAIN gateway_identity AS text CHECK (char_length(VALUE) BETWEEN 1 AND 500);
CREATE DOMAIN audit_label AS text CHECK (char_length(VALUE) BETWEEN 1 AND 50);
CREATE DOMAIN job_name AS text CHECK (char_length(VALUE) BETWEEN 1 AND 100);

ALTER TABLE idempotency_keys
    DROP CONSTRAINT idempotency_keys_idempotency_key_check,
    DROP CONSTRAINT idempotency_keys_request_method_check,
    DROP CONSTRAINT idempotency_keys_request_path_check,
    DROP CONSTRAINT idempotency_keys_request_fingerprint_check,
    DROP CONSTRAINT idempotency_keys_recovery_point_check,
    DROP CONSTRAINT idempotency_keys_response_status_check,
    DROP CONSTRAINT idempotency_keys_response_body_check,
    DROP CONSTRAINT idempotency_keys_completer_attempts_check,
    DROP CONSTRAINT idempotency_keys_attention_reason_check,
    ALTER COLUMN idempotency_key TYPE client_idempotency_key,
    ALTER COLUMN request_method TYPE http_method,
    ALTER COLUMN request_path TYPE http_path,
    ALTER COLUMN request_fingerprint TYPE sha256_digest,
    ALTER COLUMN recovery_point TYPE recovery_point,
    ALTER COLUMN response_status TYPE http_status,
    ALTER COLUMN response_body TYPE stored_body,
    ALTER COLUMN completer_attempts TYPE attempt_count,
    ALTER COLUMN attention_reason TYPE error_text;

ALTER TABLE payments
    DROP CONSTRAINT payments_idempotency_key_check,
    DROP CONSTRAINT payments_amount_check,
    DROP CONSTRAINT payments_currency_check,
    DROP CONSTRAINT payments_description_check,
    DROP CONSTRAINT payments_metadata_check,
    DROP CONSTRAINT payments_status_check,
    DROP CONSTRAINT payments_gateway_charge_id_check,
    DROP CONSTRAINT payments_failure_code_check,
    DROP CONSTRAINT payments_failure_message_check,
    DROP CONSTRAINT payments_gateway_check,
    ALTER COLUMN idempotency_key TYPE client_idempotency_key,
    ALTER COLUMN amount TYPE minor_units,
    ALTER COLUMN currency TYPE currency_code,
    ALTER COLUMN description TYPE message_text,
    ALTER COLUMN metadata TYPE json_object,
    ALTER COLUMN status TYPE payment_status,
    ALTER COLUMN gateway_charge_id TYPE gateway_charge_id,
    ALTER COLUMN failure_code TYPE failure_code,
    ALTER COLUMN failure_message TYPE message_text,
    ALTER COLUMN gateway TYPE gateway_identity;

ALTER TABLE audit_records
    DROP CONSTRAINT audit_records_action_check,
    DROP CONSTRAINT audit_records_resource_type_check,
    DROP CONSTRAINT audit_records_actor_check,
    ALTER COLUMN action TYPE audit_label,
    ALTER COLUMN resource_type TYPE audit_label,
    ALTER COLUMN actor TYPE audit_label;

ALTER TABLE staged_jobs
    DROP CONSTRAINT staged_jobs_job_name_check,
    DROP CONSTRAINT staged_jobs_attempts_check,
    DROP CONSTRAINT staged_jobs_last_error_check,
    ALTER COLUMN job_name TYPE job_name,
    ALTER COLUMN attempts TYPE attempt_count,
    ALTER COLUMN last_error TYPE error_text;
