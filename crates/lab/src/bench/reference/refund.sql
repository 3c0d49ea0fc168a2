-- One REFUND = its atomic phases = three separate transactions, as new_payment.sql has them: the claim commits
-- with `started`, which takes the payment's row lock and reserves the amount on it (the money rule, held by
-- the payment's CHECK) in the transaction that creates the pending refund; then, after the gateway call,
-- `refund_created` moves the amount from pending to refunded; then `finished` stages the event and stores the
-- answer. pgbench "tps" for this script = refunds/s; "latency average" = time for all 3 transactions.
-- The payment: one of the 100k seed_refund.sql made, picked at random; 1 (minor unit) of it refunded.
\set n random(1, 100000)
\set acct :n % 1000 + 1
\set k random(1, 9000000000000000)

-- T1: upsert the idempotency key (lock it); lock the payment's row and reserve the amount on it; create the
-- pending refund; write the audit record
BEGIN;
INSERT INTO idempotency_keys (account_id, idempotency_key, last_run_at, locked_at,
        request_method, request_path, request_fingerprint, request_params, recovery_point)
    VALUES (:acct::bigint, 'r-' || :client_id::text || '-' || :k::text, now(), now(),
        'POST', '/refunds', md5(:client_id::text || '-' || :k::text),
        jsonb_build_object('payment', md5('refund-' || :n::text), 'amount', 1),
        'started')
    ON CONFLICT (account_id, idempotency_key)
    DO UPDATE SET last_run_at = now(), locked_at = now()
    RETURNING id AS ik_id \gset
UPDATE payments SET amount_refund_pending = amount_refund_pending + 1, updated_at = now()
    WHERE id = md5('refund-' || :n::text)::uuid AND amount - amount_refunded - amount_refund_pending >= 1
    RETURNING currency, gateway_charge_id \gset
INSERT INTO refunds (account_id, payment_id, idempotency_key_id, amount, currency, status)
    VALUES (:acct::bigint, md5('refund-' || :n::text)::uuid, :ik_id::bigint, 1, :currency, 'pending')
    RETURNING id AS refund_id \gset
INSERT INTO audit_records (account_id, action, data)
    VALUES (:acct::bigint, 'refund.created',
        jsonb_build_object('refund_id', :refund_id::text, 'idempotency_key_id', :ik_id::bigint, 'amount', 1));
COMMIT;

-- T2: (after the gateway call) record the refund, move its amount from pending to refunded, advance the key
BEGIN;
UPDATE refunds SET status = 'succeeded', gateway_refund_id = 're_' || :k::text, updated_at = now()
    WHERE id = :refund_id::uuid;
UPDATE payments SET amount_refund_pending = amount_refund_pending - 1, amount_refunded = amount_refunded + 1,
        updated_at = now()
    WHERE id = md5('refund-' || :n::text)::uuid;
UPDATE idempotency_keys SET recovery_point = 'refund_created', last_run_at = now()
    WHERE id = :ik_id::bigint;
COMMIT;

-- T3: enqueue the refund's event, finish the key with the stored response, unlock
BEGIN;
INSERT INTO staged_jobs (job_name, job_args)
    VALUES ('refund.succeeded', jsonb_build_object('refund_id', :refund_id::text));
UPDATE idempotency_keys SET recovery_point = 'finished', response_code = 201,
        response_body = jsonb_build_object('id', :refund_id::text, 'object', 'refund',
            'payment', md5('refund-' || :n::text), 'amount', 1, 'currency', :currency::text,
            'status', 'succeeded', 'gateway_refund_id', 're_' || :k::text),
        locked_at = NULL, last_run_at = now()
    WHERE id = :ik_id::bigint;
COMMIT;
