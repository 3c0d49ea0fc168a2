#!/bin/bash
# WAL per new payment, and where it goes (docs/performance.md, "WAL per payment").
#
#   tests/perf/wal.sh BINARY      # as root
#
# A throwaway durable cluster with PostgreSQL's defaults, migrated by BINARY, with its own
# `payments gateway` and `payments serve` (workers in-process, events delivered to the log); a
# warm-up and ANALYZE; then `payments bench --url ... --scenarios new` (10 s, 32 clients) and the
# outbox's drain. Prints the LSN difference over that range per payment made, and pg_waldump's
# records over the same range by relation and kind. Nothing needs to be running; ports 55432,
# 18080 and 18081 must be free.
set -euo pipefail
BIN=$(realpath "$1")
HERE=$(dirname "$(realpath "$0")")
PG=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
DIR=$(mktemp -d /tmp/payments-wal.XXXXXX); chmod 755 "$DIR"; chown postgres "$DIR"
as_postgres() { su postgres -c "$*"; }
cleanup() {
    kill "${SERVE:-}" "${GATEWAY:-}" 2>/dev/null || true
    as_postgres "$PG/pg_ctl -D $DIR/data -m fast stop" >/dev/null 2>&1 || true
    rm -rf "$DIR"
}
trap cleanup EXIT

as_postgres "$PG/initdb -D $DIR/data -A trust -U postgres" >/dev/null
as_postgres "$PG/pg_ctl -D $DIR/data -l $DIR/log -w -o \"-k $DIR -p 55432 -c listen_addresses='' -c max_connections=200\" start" >/dev/null
psql() { "$PG/psql" -h "$DIR" -p 55432 -U postgres -qAt "$@"; }
sql() { psql -c "$1" payments; }
psql -c "CREATE DATABASE payments" postgres
export DATABASE_URL="postgres://postgres@${DIR//\//%2F}:55432/payments"
"$BIN" migrate >/dev/null 2>&1
KEY=$("$BIN" accounts create wal 2>/dev/null | tail -1)
"$BIN" gateway --bind 127.0.0.1:18081 >"$DIR/gateway.log" 2>&1 & GATEWAY=$!
GATEWAY_URL=http://127.0.0.1:18081 PAYMENTS_BIND=127.0.0.1:18080 PAYMENTS_METRICS_BIND=127.0.0.1:0 RUST_LOG=warn \
    "$BIN" serve >"$DIR/serve.log" 2>&1 & SERVE=$!
until curl -sf http://127.0.0.1:18080/readyz >/dev/null; do sleep 0.2; done

bench() { "$BIN" bench --url http://127.0.0.1:18080 --api-key "$KEY" --scenarios new --duration "$1" >/dev/null 2>&1; }
drained() { until [ "$(sql 'SELECT count(*) FROM staged_jobs WHERE dead_at IS NULL')" = 0 ]; do sleep 0.5; done; }
made() { sql "SELECT count(*) FROM payments"; }
bench 2s; drained; sql "ANALYZE"
FROM=$(sql "SELECT pg_current_wal_lsn()"); BEFORE=$(made)
bench 10s; drained
TO=$(sql "SELECT pg_current_wal_lsn()"); MADE=$(( $(made) - BEFORE ))
echo "$MADE payments made, $(( $(sql "SELECT pg_wal_lsn_diff('$TO', '$FROM')::bigint") / MADE )) WAL bytes each by LSN"
sql "SELECT pg_relation_filenode(oid) || ' ' || relname FROM pg_class WHERE pg_relation_filenode(oid) IS NOT NULL" >"$DIR/relations"
as_postgres "$PG/pg_waldump -p $DIR/data/pg_wal -s $FROM -e $TO" 2>/dev/null >"$DIR/records" || true
python3 "$HERE/wal_by_relation.py" "$DIR/records" "$DIR/relations" "$MADE"
