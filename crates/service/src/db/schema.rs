// @generated automatically by Diesel CLI.

diesel::table! {
    accounts (id) {
        id -> Uuid,
        name -> Text,
        api_key_hash -> Bytea,
        created_at -> Timestamptz,
    }
}

diesel::table! {
    audit_records (account_id, resource_type, resource_id, id) {
        id -> Int8,
        account_id -> Uuid,
        action -> Text,
        resource_type -> Text,
        resource_id -> Uuid,
        actor -> Text,
        data -> Jsonb,
        created_at -> Timestamptz,
        request_id -> Nullable<Text>,
    }
}

diesel::table! {
    events (account_id, id) {
        account_id -> Uuid,
        id -> Uuid,
        event_type -> Text,
        body -> Jsonb,
        created_at -> Timestamptz,
        created_seq -> Int8,
        fanned_out_at -> Nullable<Timestamptz>,
    }
}

diesel::table! {
    gateway_events (account_id, idempotency_key_id, event_id) {
        account_id -> Uuid,
        gateway -> Text,
        event_id -> Text,
        event_type -> Text,
        idempotency_key_id -> Uuid,
        object_id -> Text,
        created_at -> Timestamptz,
        received_at -> Timestamptz,
        outcome -> Text,
    }
}

diesel::table! {
    idempotency_keys (account_id, id) {
        id -> Uuid,
        account_id -> Uuid,
        idempotency_key -> Text,
        request_method -> Text,
        request_path -> Text,
        request_fingerprint -> Bytea,
        request_params -> Jsonb,
        recovery_point -> Text,
        locked_until -> Nullable<Timestamptz>,
        lock_token -> Nullable<Uuid>,
        last_run_at -> Timestamptz,
        created_at -> Timestamptz,
        response_status -> Nullable<Int2>,
        response_body -> Nullable<Bytea>,
        completer_attempts -> Int4,
        needs_attention_at -> Nullable<Timestamptz>,
        attention_reason -> Nullable<Text>,
        finished_at -> Nullable<Timestamptz>,
        expires_at -> Nullable<Timestamptz>,
        nudged_at -> Nullable<Timestamptz>,
        resource_id -> Nullable<Uuid>,
    }
}

diesel::table! {
    key_request_counts (account_id, hour) {
        account_id -> Uuid,
        hour -> Timestamptz,
        created -> Int8,
        resumed -> Int8,
        replayed -> Int8,
        in_flight -> Int8,
        key_reused -> Int8,
        expired -> Int8,
    }
}

diesel::table! {
    key_resources (account_id, idempotency_key) {
        account_id -> Uuid,
        idempotency_key -> Text,
        request_method -> Text,
        request_path -> Text,
        resource_id -> Uuid,
    }
}

diesel::table! {
    open_authorizations (account_id, payment_id) {
        account_id -> Uuid,
        payment_id -> Uuid,
        capture_before -> Timestamptz,
    }
}

diesel::table! {
    payment_changes (account_id, id) {
        id -> Uuid,
        account_id -> Uuid,
        payment_id -> Uuid,
        idempotency_key_id -> Uuid,
        idempotency_key -> Text,
        kind -> Text,
        amount -> Nullable<Int8>,
        cancellation_reason -> Nullable<Text>,
        status -> Text,
        gateway -> Text,
        failure_code -> Nullable<Text>,
        failure_message -> Nullable<Text>,
        created_at -> Timestamptz,
        updated_at -> Timestamptz,
    }
}

diesel::table! {
    payments (account_id, id) {
        id -> Uuid,
        account_id -> Uuid,
        idempotency_key_id -> Nullable<Uuid>,
        idempotency_key -> Text,
        amount -> Int8,
        currency -> Text,
        description -> Nullable<Text>,
        metadata -> Jsonb,
        status -> Text,
        gateway_charge_id -> Nullable<Text>,
        failure_code -> Nullable<Text>,
        failure_message -> Nullable<Text>,
        created_at -> Timestamptz,
        updated_at -> Timestamptz,
        gateway -> Nullable<Text>,
        created_seq -> Int8,
        amount_refunded -> Int8,
        amount_refund_pending -> Int8,
        capture_method -> Text,
        amount_captured -> Nullable<Int8>,
        capture_before -> Nullable<Timestamptz>,
        canceled_at -> Nullable<Timestamptz>,
        cancellation_reason -> Nullable<Text>,
    }
}

diesel::table! {
    refunds (account_id, id) {
        id -> Uuid,
        account_id -> Uuid,
        payment_id -> Uuid,
        idempotency_key_id -> Uuid,
        idempotency_key -> Text,
        amount -> Int8,
        currency -> Text,
        reason -> Nullable<Text>,
        metadata -> Jsonb,
        status -> Text,
        gateway -> Text,
        gateway_refund_id -> Nullable<Text>,
        failure_code -> Nullable<Text>,
        failure_message -> Nullable<Text>,
        created_at -> Timestamptz,
        updated_at -> Timestamptz,
        settle_at -> Nullable<Timestamptz>,
        settle_attempts -> Int4,
        created_seq -> Int8,
    }
}

diesel::table! {
    staged_jobs (account_id, id) {
        id -> Int8,
        account_id -> Uuid,
        job_name -> Text,
        job_args -> Jsonb,
        created_at -> Timestamptz,
        run_at -> Timestamptz,
        attempts -> Int4,
        last_error -> Nullable<Text>,
        dead_at -> Nullable<Timestamptz>,
        leased_until -> Nullable<Timestamptz>,
    }
}

diesel::table! {
    unreadable_gateway_events (id) {
        id -> Int8,
        account_id -> Nullable<Uuid>,
        idempotency_key_id -> Nullable<Uuid>,
        body -> Bytea,
        body_bytes -> Int4,
        reason -> Text,
        received_at -> Timestamptz,
        request_id -> Nullable<Text>,
    }
}

diesel::table! {
    webhook_attempts (account_id, id) {
        account_id -> Uuid,
        id -> Int8,
        delivery_id -> Uuid,
        endpoint_id -> Uuid,
        event_id -> Uuid,
        event_type -> Text,
        attempt -> Int4,
        status_code -> Nullable<Int2>,
        error -> Nullable<Text>,
        response_body -> Text,
        duration_ms -> Int4,
        attempted_at -> Timestamptz,
        next_attempt_at -> Nullable<Timestamptz>,
    }
}

diesel::table! {
    webhook_deliveries (account_id, id) {
        account_id -> Uuid,
        id -> Uuid,
        event_id -> Uuid,
        endpoint_id -> Uuid,
        status -> Text,
        attempts -> Int4,
        next_attempt_at -> Nullable<Timestamptz>,
        leased_until -> Nullable<Timestamptz>,
        created_at -> Timestamptz,
        ended_at -> Nullable<Timestamptz>,
    }
}

diesel::table! {
    webhook_endpoints (account_id, id) {
        account_id -> Uuid,
        id -> Uuid,
        url -> Text,
        enabled_events -> Array<Nullable<Text>>,
        description -> Nullable<Text>,
        status -> Text,
        disabled_reason -> Nullable<Text>,
        secret -> Text,
        previous_secret -> Nullable<Text>,
        previous_secret_expires_at -> Nullable<Timestamptz>,
        idempotency_key_id -> Uuid,
        idempotency_key -> Text,
        created_at -> Timestamptz,
        updated_at -> Timestamptz,
        created_seq -> Int8,
        failing_since -> Nullable<Timestamptz>,
    }
}

diesel::joinable!(audit_records -> accounts (account_id));
diesel::joinable!(gateway_events -> accounts (account_id));
diesel::joinable!(idempotency_keys -> accounts (account_id));
diesel::joinable!(payment_changes -> accounts (account_id));
diesel::joinable!(payments -> accounts (account_id));
diesel::joinable!(refunds -> accounts (account_id));
diesel::joinable!(staged_jobs -> accounts (account_id));
diesel::joinable!(unreadable_gateway_events -> accounts (account_id));

diesel::allow_tables_to_appear_in_same_query!(
    accounts,
    audit_records,
    events,
    gateway_events,
    idempotency_keys,
    key_request_counts,
    key_resources,
    open_authorizations,
    payment_changes,
    payments,
    refunds,
    staged_jobs,
    unreadable_gateway_events,
    webhook_attempts,
    webhook_deliveries,
    webhook_endpoints,
);
