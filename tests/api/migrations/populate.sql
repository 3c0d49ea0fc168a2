-- What a database holds after `payments` has made many payments, as SQL that works at any migration
-- from 000001 on: each table and column is filled only if it exists yet. Used by the migration tests
-- (tests/api/migrations.rs) and by measure.sh, which timed the migrations for Upgrading
-- (docs/operating.md).
--
-- SELECT pg_temp.populate(payments, accounts, pending_events, reaped_share [, tables]) fills, for
-- payment g: its account (g % accounts), its key row (finished: 201, or 402 for every tenth,
-- declined), the payment, the audit records the phases write (claimed, created, charge_recorded,
-- finished) and the outbox's `event.delivered`, and the account's hourly tally. The newest
-- `pending_events` events are still in the outbox instead (a tenth of them dead letters), and the
-- oldest `reaped_share` of the keys have been reaped: no key row, a `reaped` audit record, and,
-- while the payment's foreign key to its key row existed (before 000011), a payment whose key id was
-- set to NULL. Payments are two seconds apart from 2026-10-01. Call it once per table (`tables`, an
-- array of names; NULL: all of them), then VACUUM ANALYZE.
--
-- A migration that adds a table adds it here, with the rows the service would write: the migration
-- test watches each later migration on a database where every table holds rows, and says so when
-- one has none.

-- INSERT INTO tab (...) SELECT ... FROM source, with only the (column, expression) pairs whose
-- column exists; nothing if the table does not exist yet, or is not one of `tables` (NULL: all).
CREATE FUNCTION pg_temp.fill(tables text[], tab text, source text, columns text[]) RETURNS void
    LANGUAGE plpgsql AS $$
DECLARE
    names text[] := '{}';
    exprs text[] := '{}';
BEGIN
    IF to_regclass(tab) IS NULL OR tab <> ALL (coalesce(tables, ARRAY[tab])) THEN
        RETURN;
    END IF;
    FOR i IN 1 .. array_length(columns, 1) LOOP
        IF EXISTS (SELECT FROM pg_attribute
                   WHERE attrelid = tab::regclass AND attname = columns[i][1] AND attnum > 0 AND NOT attisdropped) THEN
            names := names || quote_ident(columns[i][1]);
            exprs := exprs || columns[i][2];
        END IF;
    END LOOP;
    EXECUTE format('INSERT INTO %I (%s) SELECT %s FROM %s', tab, array_to_string(names, ', '),
                   array_to_string(exprs, ', '), source);
END
$$;

CREATE FUNCTION pg_temp.populate(payments bigint, accounts integer, pending_events bigint, reaped_share float8,
                                 tables text[] DEFAULT NULL)
    RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    -- Before 000011 a reaped key's payment lost the key's id (ON DELETE SET NULL).
    ids_kept boolean := NOT EXISTS (SELECT FROM pg_constraint WHERE conname = 'payments_idempotency_key_fkey');
    -- One row per payment, with what every table derives from it.
    p text := format($q$(
        SELECT g, md5('account:' || (g %% %1$s + 1))::uuid AS account_id, md5('key:' || g)::uuid AS key_id,
               md5('payment:' || g)::uuid AS payment_id, md5('event:' || g)::uuid AS event_id,
               'order-' || g AS client_key, 1000 + g %% 5000 AS amount, g %% 10 = 0 AS failed,
               timestamptz '2026-10-01 00:00:00+00' + g * interval '2 seconds' AS at,
               g <= %2$s AS reaped, g > %3$s AS pending, g > %3$s AND g %% 10 = 0 AS dead,
               'req_' || md5('request:' || g) AS request_id
        FROM generate_series(1, %4$s) g) p$q$,
        accounts, floor(payments * reaped_share)::bigint, payments - pending_events, payments);
    -- The payment as the API shows it: in its key's stored response and in its event.
    payment_json text := $q$jsonb_build_object(
        'id', p.payment_id, 'object', 'payment', 'amount', p.amount, 'currency', 'usd',
        'status', CASE WHEN p.failed THEN 'failed' ELSE 'succeeded' END, 'description', 'Order ' || p.g,
        'metadata', jsonb_build_object('order_id', p.g::text),
        'gateway_charge_id', CASE WHEN NOT p.failed THEN 'ch_' || md5('charge:' || p.g) END,
        'failure_code', CASE WHEN p.failed THEN 'card_declined' END,
        'failure_message', CASE WHEN p.failed THEN 'Your card was declined.' END,
        'created_at', p.at)$q$;
BEGIN
    PERFORM pg_temp.fill(tables, 'accounts', format('generate_series(1, %s) a', accounts), ARRAY[
        ['id', $q$md5('account:' || a)::uuid$q$],
        ['name', $q$'account ' || a$q$],
        ['api_key_hash', $q$sha256(('sk_test_' || a)::bytea)$q$],
        ['created_at', $q$timestamptz '2026-09-01 00:00:00+00'$q$]]);

    PERFORM pg_temp.fill(tables, 'idempotency_keys', p || ' WHERE NOT p.reaped', ARRAY[
        ['id', 'p.key_id'],
        ['account_id', 'p.account_id'],
        ['idempotency_key', 'p.client_key'],
        ['request_method', $q$'POST'$q$],
        ['request_path', $q$'/v1/payments'$q$],
        ['request_fingerprint', $q$sha256(('fingerprint:' || p.g)::bytea)$q$],
        ['request_params', $q$jsonb_build_object('amount', p.amount, 'currency', 'usd', 'description', 'Order ' || p.g,
            'metadata', jsonb_build_object('order_id', p.g::text),
            'source', CASE WHEN p.failed THEN 'tok_chargeDeclined' ELSE 'tok_visa' END)$q$],
        ['recovery_point', $q$'finished'$q$],
        ['last_run_at', $q$p.at + interval '300 ms'$q$],
        ['created_at', 'p.at'],
        ['response_status', 'CASE WHEN p.failed THEN 402 ELSE 201 END'],
        ['response_body', format('convert_to((%s)::text, %L)', payment_json, 'UTF8')],
        ['finished_at', $q$p.at + interval '300 ms'$q$]]);

    PERFORM pg_temp.fill(tables, 'payments', p, ARRAY[
        ['id', 'p.payment_id'],
        ['account_id', 'p.account_id'],
        ['idempotency_key_id', format('CASE WHEN %L OR NOT p.reaped THEN p.key_id END', ids_kept)],
        ['idempotency_key', 'p.client_key'],
        ['amount', 'p.amount'],
        ['currency', $q$'usd'$q$],
        ['description', $q$'Order ' || p.g$q$],
        ['metadata', $q$jsonb_build_object('order_id', p.g::text)$q$],
        ['status', $q$CASE WHEN p.failed THEN 'failed' ELSE 'succeeded' END$q$],
        ['gateway_charge_id', $q$CASE WHEN NOT p.failed THEN 'ch_' || md5('charge:' || p.g) END$q$],
        ['failure_code', $q$CASE WHEN p.failed THEN 'card_declined' END$q$],
        ['failure_message', $q$CASE WHEN p.failed THEN 'Your card was declined.' END$q$],
        ['created_at', 'p.at'],
        ['updated_at', $q$p.at + interval '250 ms'$q$],
        ['gateway', $q$'acct_4f1b2c3d4e5f6a7b'$q$]]);

    -- Step 1 is the key's claim, 2 to 4 the payment's phases, 5 the event's delivery, 6 the reaping.
    PERFORM pg_temp.fill(tables, 'audit_records',
        p || ' CROSS JOIN generate_series(1, 6) s (step) WHERE s.step < 5 OR (s.step = 5 AND NOT p.pending)'
          || ' OR (s.step = 6 AND p.reaped)', ARRAY[
        ['account_id', 'p.account_id'],
        ['action', $q$(ARRAY['idempotency_key.claimed', 'payment.created', 'payment.charge_recorded', 'payment.finished',
                            'event.delivered', 'idempotency_key.reaped'])[s.step]$q$],
        ['resource_type', $q$(ARRAY['idempotency_key', 'payment', 'payment', 'payment', 'event',
                                   'idempotency_key'])[s.step]$q$],
        ['resource_id', $q$CASE s.step WHEN 1 THEN p.key_id WHEN 5 THEN p.event_id WHEN 6 THEN p.key_id
                            ELSE p.payment_id END$q$],
        ['actor', $q$CASE s.step WHEN 5 THEN 'outbox' WHEN 6 THEN 'reaper' ELSE 'api' END$q$],
        ['data', $q$CASE s.step
            WHEN 1 THEN '{}'::jsonb
            WHEN 2 THEN jsonb_build_object('recovery_point', 'started', 'amount', p.amount, 'currency', 'usd',
                                           'gateway', 'acct_4f1b2c3d4e5f6a7b')
            WHEN 3 THEN jsonb_build_object('recovery_point', 'charge_created',
                                           'status', CASE WHEN p.failed THEN 'failed' ELSE 'succeeded' END,
                                           'gateway_charge_id', CASE WHEN NOT p.failed THEN 'ch_' || md5('charge:' || p.g) END,
                                           'failure_code', CASE WHEN p.failed THEN 'card_declined' END,
                                           'answered_by', 'charge')
            WHEN 4 THEN jsonb_build_object('recovery_point', 'finished',
                                           'response_status', CASE WHEN p.failed THEN 402 ELSE 201 END)
            WHEN 5 THEN jsonb_build_object('type', CASE WHEN p.failed THEN 'payment.failed' ELSE 'payment.succeeded' END,
                                           'attempts', 1)
            ELSE jsonb_build_object('idempotency_key', p.client_key,
                                    'response_status', CASE WHEN p.failed THEN 402 ELSE 201 END)
            END$q$],
        ['created_at', $q$p.at + CASE WHEN s.step = 6 THEN interval '1 day' ELSE s.step * interval '100 ms' END$q$],
        ['request_id', 'CASE WHEN s.step < 5 THEN p.request_id END']]);

    PERFORM pg_temp.fill(tables, 'staged_jobs', p || ' WHERE p.pending', ARRAY[
        ['account_id', 'p.account_id'],
        ['job_name', $q$CASE WHEN p.failed THEN 'payment.failed' ELSE 'payment.succeeded' END$q$],
        ['job_args', format($q$jsonb_build_object('id', p.event_id,
            'type', CASE WHEN p.failed THEN 'payment.failed' ELSE 'payment.succeeded' END,
            'data', jsonb_build_object('object', %s))$q$, payment_json)],
        ['created_at', $q$p.at + interval '300 ms'$q$],
        ['run_at', $q$p.at + CASE WHEN p.dead THEN interval '1 hour' ELSE interval '300 ms' END$q$],
        ['attempts', 'CASE WHEN p.dead THEN 10 ELSE 0 END'],
        ['last_error', $q$CASE WHEN p.dead THEN 'webhook answered 503 Service Unavailable' END$q$],
        ['dead_at', $q$CASE WHEN p.dead THEN p.at + interval '1 hour' END$q$]]);

    PERFORM pg_temp.fill(tables, 'key_request_counts',
        format($q$(SELECT p.account_id, date_trunc('hour', p.at, 'UTC') AS hour, count(*) AS n FROM %s
                   GROUP BY 1, 2) c$q$, p), ARRAY[
        ['account_id', 'c.account_id'],
        ['hour', 'c.hour'],
        ['created', 'c.n'],
        ['resumed', 'c.n / 20'],
        ['replayed', 'c.n / 10']]);

    -- Every fifth succeeded payment has had 300 refunded, under a key of its own.
    PERFORM pg_temp.fill(tables, 'refunds', p || ' WHERE NOT p.failed AND p.g % 5 = 0', ARRAY[
        ['id', $q$md5('refund:' || p.g)::uuid$q$],
        ['account_id', 'p.account_id'],
        ['payment_id', 'p.payment_id'],
        ['idempotency_key_id', $q$md5('refund key:' || p.g)::uuid$q$],
        ['idempotency_key', $q$'refund-' || p.g$q$],
        ['amount', '300'],
        ['currency', $q$'usd'$q$],
        ['reason', $q$'requested_by_customer'$q$],
        ['status', $q$'succeeded'$q$],
        ['gateway', $q$'acct_4f1b2c3d4e5f6a7b'$q$],
        ['gateway_refund_id', $q$'re_' || md5('refund:' || p.g)$q$],
        ['created_at', $q$p.at + interval '1 hour'$q$],
        ['updated_at', $q$p.at + interval '1 hour'$q$]]);

    -- The gateway told of every charge once.
    PERFORM pg_temp.fill(tables, 'gateway_events', p || ' WHERE NOT p.reaped', ARRAY[
        ['account_id', 'p.account_id'],
        ['gateway', $q$'acct_4f1b2c3d4e5f6a7b'$q$],
        ['event_id', $q$'evt_' || md5('gateway event:' || p.g)$q$],
        ['event_type', $q$CASE WHEN p.failed THEN 'charge.failed' ELSE 'charge.succeeded' END$q$],
        ['idempotency_key_id', 'p.key_id'],
        ['object_id', $q$'ch_' || md5('charge:' || p.g)$q$],
        ['created_at', $q$p.at + interval '200 ms'$q$],
        ['outcome', $q$'applied'$q$]]);

    -- Now and then an event the service could verify but not read.
    PERFORM pg_temp.fill(tables, 'unreadable_gateway_events', p || ' WHERE p.g % 1000 = 0', ARRAY[
        ['account_id', 'p.account_id'],
        ['idempotency_key_id', 'p.key_id'],
        ['body', $q$convert_to('{"id": "evt_' || md5('unreadable:' || p.g) || '", "type": "charge.mystery"}', 'UTF8')$q$],
        ['body_bytes', '200'],
        ['reason', $q$'an event type the service does not know'$q$],
        ['received_at', $q$p.at + interval '200 ms'$q$]]);

    -- Every fiftieth succeeded payment was captured by a request of its own; the payments after
    -- them are authorizations still open.
    PERFORM pg_temp.fill(tables, 'payment_changes', p || ' WHERE NOT p.failed AND p.g % 50 = 5', ARRAY[
        ['id', $q$md5('change:' || p.g)::uuid$q$],
        ['account_id', 'p.account_id'],
        ['payment_id', 'p.payment_id'],
        ['idempotency_key_id', $q$md5('capture key:' || p.g)::uuid$q$],
        ['idempotency_key', $q$'capture-' || p.g$q$],
        ['kind', $q$'capture'$q$],
        ['amount', 'p.amount'],
        ['status', $q$'succeeded'$q$],
        ['gateway', $q$'acct_4f1b2c3d4e5f6a7b'$q$],
        ['created_at', $q$p.at + interval '1 day'$q$],
        ['updated_at', $q$p.at + interval '1 day'$q$]]);
    PERFORM pg_temp.fill(tables, 'open_authorizations', p || ' WHERE NOT p.failed AND p.g % 50 = 6', ARRAY[
        ['account_id', 'p.account_id'],
        ['payment_id', 'p.payment_id'],
        ['capture_before', $q$p.at + interval '7 days'$q$]]);

    -- What the reaper kept of each reaped key (000033).
    PERFORM pg_temp.fill(tables, 'key_resources', p || ' WHERE p.reaped', ARRAY[
        ['account_id', 'p.account_id'],
        ['idempotency_key', 'p.client_key'],
        ['request_method', $q$'POST'$q$],
        ['request_path', $q$'/v1/payments'$q$],
        ['resource_id', 'p.payment_id']]);

    -- Every payment's event, kept (000034); the pending ones not fanned out yet.
    PERFORM pg_temp.fill(tables, 'events', p, ARRAY[
        ['account_id', 'p.account_id'],
        ['id', 'p.event_id'],
        ['event_type', $q$CASE WHEN p.failed THEN 'payment.failed' ELSE 'payment.succeeded' END$q$],
        ['body', format($q$jsonb_build_object('id', 'evt_' || replace(p.event_id::text, '-', ''), 'object', 'event',
            'type', CASE WHEN p.failed THEN 'payment.failed' ELSE 'payment.succeeded' END,
            'created', extract(epoch FROM p.at)::bigint, 'data', jsonb_build_object('object', %s))$q$, payment_json)],
        ['created_at', $q$p.at + interval '300 ms'$q$],
        ['fanned_out_at', $q$CASE WHEN NOT p.pending THEN p.at + interval '400 ms' END$q$]]);

    -- An endpoint per account, taking every event (000035).
    PERFORM pg_temp.fill(tables, 'webhook_endpoints', format('generate_series(1, %s) a', accounts), ARRAY[
        ['account_id', $q$md5('account:' || a)::uuid$q$],
        ['id', $q$md5('endpoint:' || a)::uuid$q$],
        ['url', $q$'https://shop-' || a || '.example/webhooks'$q$],
        ['enabled_events', $q$ARRAY['*']$q$],
        ['secret', $q$'whsec_' || encode(sha256(('secret:' || a)::bytea), 'base64')$q$],
        ['idempotency_key_id', $q$md5('endpoint key:' || a)::uuid$q$],
        ['idempotency_key', $q$'endpoint-' || a$q$],
        ['created_at', $q$timestamptz '2026-09-01 00:00:00+00'$q$]]);
END
$$;
