ALTER TABLE staged_jobs
    ALTER COLUMN job_name TYPE text, ALTER COLUMN attempts TYPE integer, ALTER COLUMN last_error TYPE text,
    ADD CONSTRAINT staged_jobs_job_name_check CHECK (char_length(job_name) BETWEEN 1 AND 100),
    ADD CONSTRAINT staged_jobs_attempts_check CHECK (attempts >= 0),
    ADD CONSTRAINT staged_jobs_last_error_check CHECK (char_length(last_error) <= 1000);

ALTER TABLE audit_records
    ALTER COLUMN action TYPE text, ALTER COLUMN resource_type TYPE text, ALTER COLUMN actor TYPE text,
    ADD CONSTRAINT audit_records_action_check CHECK (char_length(action) BETWEEN 1 AND 50),
    ADD CONSTRAINT audit_records_resource_type_check CHECK (char_length(resource_type) BETWEEN 1 AND 50),
    ADD CONSTRAINT audit_records_actor_check CHECK (char_length(actor) BETWEEN 1 AND 50);

ALTER TABLE payments
    ALTER COLUMN idempotency_key TYPE text, ALTER COLUMN amount TYPE bigint, ALTER COLUMN currency TYPE text,
    ALTER COLUMN description TYPE text, ALTER COLUMN metadata TYPE jsonb, ALTER COLUMN status TYPE text,
    ALTER COLUMN gateway_charge_id TYPE text, ALTER COLUMN failure_code TYPE text,
    ALTER COLUMN failure_message TYPE text, ALTER COLUMN gateway TYPE text,
    ADD CONSTRAINT payments_idempotency_key_check CHECK (idempotency_key ~ '^[ -~]{1,255}$'),
    ADD CONSTRAINT payments_amount_check CHECK (amount BETWEEN 1 AND 99999999),
    ADD CONSTRAINT payments_currency_check CHECK (currency ~ '^[a-z]{3}$'),
    ADD CONSTRAINT payments_description_check CHECK (char_length(description) <= 500),
    ADD CONSTRAINT payments_metadata_check CHECK (jsonb_typeof(metadata) = 'object'),
    ADD CONSTRAINT payments_status_check CHECK (status IN ('pending', 'succeeded', 'failed')),
    ADD CONSTRAINT payments_gateway_charge_id_check CHECK (char_length(gateway_charge_id) BETWEEN 1 AND 255),
    ADD CONSTRAINT payments_failure_code_check CHECK (char_length(failure_code) BETWEEN 1 AND 100),
    ADD CONSTRAINT payments_failure_message_check CHECK (char_length(failure_message) <= 500),
    ADD CONSTRAINT payments_gateway_check CHECK (char_length(gateway) BETWEEN 1 AND 500);

ALTER TABLE idempotency_keys
    ALTER COLUMN idempotency_key TYPE text, ALTER COLUMN request_method TYPE text,
    ALTER COLUMN request_path TYPE text, ALTER COLUMN request_fingerprint TYPE bytea,
    ALTER COLUMN recovery_point TYPE text, ALTER COLUMN response_status TYPE smallint,
    ALTER COLUMN response_body TYPE bytea, ALTER COLUMN completer_attempts TYPE integer,
    ALTER COLUMN attention_reason TYPE text,
    ADD CONSTRAINT idempotency_keys_idempotency_key_check CHECK (idempotency_key ~ '^[ -~]{1,255}$'),
    ADD CONSTRAINT idempotency_keys_request_method_check CHECK (char_length(request_method) BETWEEN 1 AND 10),
    ADD CONSTRAINT idempotency_keys_request_path_check CHECK (char_length(request_path) BETWEEN 1 AND 100),
    ADD CONSTRAINT idempotency_keys_request_fingerprint_check CHECK (octet_length(request_fingerprint) = 32),
    ADD CONSTRAINT idempotency_keys_recovery_point_check CHECK (recovery_point IN ('started', 'charge_created', 'finished')),
    ADD CONSTRAINT idempotency_keys_response_status_check CHECK (response_status BETWEEN 100 AND 599),
    ADD CONSTRAINT idempotency_keys_response_body_check CHECK (octet_length(response_body) <= 65536),
    ADD CONSTRAINT idempotency_keys_completer_attempts_check CHECK (completer_attempts >= 0),
    ADD CONSTRAINT idempotency_keys_attention_reason_check CHECK (char_length(attention_reason) <= 1000);

DROP DOMAIN client_idempotency_key, http_method, http_path, sha256_digest, recovery_point, http_status,
    stored_body, attempt_count, error_text, minor_units, currency_code, message_text, json_object,
    payment_status, gateway_charge_id, failure_code, gateway_identity, audit_label, job_name;
