#!/usr/bin/env bash
# Times every migration's up.sql on a populated database, as "Upgrading" (docs/operating.md)
# reports them, and says what each one locks, rewrites and reads.
#
#   tests/api/migrations/measure.sh [PAYMENTS] [RUNS]      (defaults: 1000000 and 3)
#
# It starts a throwaway PostgreSQL cluster with PostgreSQL's own defaults, which are durable (fsync,
# synchronous_commit and full_page_writes on, shared_buffers 128MB, max_wal_size 1GB), under a
# directory of its own that it removes at the end. The database is populated by populate.sql at
# 000004 (the payments, their key rows and audit trail); the states before 000002..000004 are that
# database with later migrations reverted, and each later state is the one before with its migration
# applied (and the outbox's pending events added once it exists), then VACUUM ANALYZE, as autovacuum
# would leave it. Each migration is applied RUNS times, each on a fresh copy of the state before it,
# in one transaction with psql's \timing; its time is the sum of its statements' and the COMMIT's.
# Before the COMMIT it reads its own locks (pg_locks) and what it read and wrote
# (pg_stat_xact_user_tables); after, which tables have new data files (pg_relation_filenode).
# 000011 is measured twice: with every key row kept, and with every key reaped before it ran (its
# backfill then updates every payment).
set -euo pipefail

payments=${1:-1000000}
runs=${2:-3}
accounts=1000
pending_events=$((payments / 1000))
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
bin=$(find /usr/lib/postgresql -maxdepth 2 -name bin -type d 2>/dev/null | sort -V | tail -1)
bin=${bin:-$(dirname "$(command -v postgres)")}

dir=$(mktemp -d /tmp/measure-migrations.XXXXXX)
chmod 755 "$dir"
as_owner=()
if [ "$(id -u)" = 0 ]; then as_owner=(runuser -u postgres --); fi
install -d -m 700 "$dir/data" "$dir/run" && chmod 755 "$dir/run"
if [ "$(id -u)" = 0 ]; then chown postgres: "$dir/data" "$dir/run"; fi
(cd / && "${as_owner[@]}" "$bin/initdb" -D "$dir/data" -A trust -U postgres -E UTF8 --locale=C.UTF-8 >/dev/null)
"${as_owner[@]}" "$bin/pg_ctl" -D "$dir/data" -l "$dir/run/log" -w -o "-k $dir/run -c listen_addresses=" start >/dev/null
trap '"${as_owner[@]}" "$bin/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null; rm -rf "$dir"' EXIT

psql_in() { local db=$1; shift; psql -X -q -v ON_ERROR_STOP=1 -h "$dir/run" -U postgres -d "$db" "$@"; }
copy() { psql_in postgres -c "CREATE DATABASE $2 TEMPLATE $1 STRATEGY FILE_COPY"; }
drop() { psql_in postgres -c "DROP DATABASE $1"; }
settle() { psql_in "$1" -c 'VACUUM ANALYZE' -c 'CHECKPOINT'; }
mapfile -t migrations < <(find "$repo/migrations" -mindepth 1 -maxdepth 1 -type d | sort)
name() { basename "${migrations[$1 - 1]}"; }
up() { psql_in "$1" -1 -f "${migrations[$2 - 1]}/up.sql" >/dev/null; }
down() { psql_in "$1" -1 -f "${migrations[$2 - 1]}/down.sql" >/dev/null; }

# One timed application of migration $2 to database $1. Prints "ms <total>", then the pre-existing
# tables it locked ("lock <table> <strongest mode>"), read or wrote ("rows <table> <read> <inserted>
# <updated> <deleted>") and gave new data files ("rewrote <table>").
timed() {
    psql_in "$1" -At <<SQL | awk '
        /^@@timed/ { timed = 1; next } /^@@untimed/ { timed = 0; next }
        /^Time: / { if (timed) total += $2; next }
        { print }
        END { printf "ms %.0f\n", total }'
CREATE TEMP TABLE before AS
    SELECT oid, relname::text, pg_relation_filenode(oid) AS filenode
    FROM pg_class WHERE relnamespace = 'public'::regnamespace AND relkind = 'r';
\timing on
\echo @@timed
BEGIN;
\i ${migrations[$2 - 1]}/up.sql
\echo @@untimed
SELECT 'lock', b.relname,
       (array_agg(l.mode ORDER BY array_position(ARRAY['AccessShareLock', 'RowShareLock', 'RowExclusiveLock',
            'ShareUpdateExclusiveLock', 'ShareLock', 'ShareRowExclusiveLock', 'ExclusiveLock',
            'AccessExclusiveLock'], l.mode) DESC))[1]
FROM pg_locks l JOIN before b ON b.oid = l.relation
WHERE l.pid = pg_backend_pid() AND l.locktype = 'relation' AND b.relname <> '__diesel_schema_migrations'
GROUP BY b.relname ORDER BY b.relname;
SELECT 'rows', s.relname, s.seq_tup_read + coalesce(s.idx_tup_fetch, 0), s.n_tup_ins, s.n_tup_upd, s.n_tup_del
FROM pg_stat_xact_user_tables s JOIN before b ON b.oid = s.relid
WHERE s.seq_tup_read + coalesce(s.idx_tup_fetch, 0) + s.n_tup_ins + s.n_tup_upd + s.n_tup_del > 0
ORDER BY s.relname;
\echo @@timed
COMMIT;
\echo @@untimed
SELECT 'rewrote', b.relname FROM before b JOIN pg_class c ON c.oid = b.oid
WHERE pg_relation_filenode(c.oid) <> b.filenode ORDER BY b.relname;
SQL
}

# Migration $2 applied $runs times to copies of database $1: one line of the report.
measure() {
    local template=$1 number=$2 label=${3:-} times=() report
    for run in $(seq "$runs"); do
        copy "$template" run_copy
        report=$(timed run_copy "$number")
        times+=("$(awk '$1 == "ms" { print $2 }' <<<"$report")")
        drop run_copy
    done
    local sorted median details
    sorted=$(printf '%s\n' "${times[@]}" | sort -n | paste -sd' ')
    median=$(printf '%s\n' "${times[@]}" | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }')
    details=$(awk -F'|' '
        $1 == "lock" { locks = locks sep_l $2 " " $3; sep_l = ", " }
        $1 == "rows" { rows = rows sep_r $2 " read " $3 " ins " $4 " upd " $5 " del " $6; sep_r = ", " }
        $1 == "rewrote" { rewrote = rewrote sep_w $2; sep_w = ", " }
        END { printf "locks: %s; rows: %s; rewrote: %s", locks ? locks : "none", rows ? rows : "none", rewrote ? rewrote : "none" }' <<<"$report")
    printf '%s%s | median %s ms (runs: %s) | %s\n' "$(name "$number")" "$label" "$median" "$sorted" "$details"
}

echo "PostgreSQL $("$bin/postgres" --version | awk '{ print $3 }'), $payments payments, $runs runs each, $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
psql_in postgres -At -c "SELECT string_agg(name || '=' || setting, ' ') FROM pg_settings
    WHERE name IN ('fsync', 'synchronous_commit', 'full_page_writes', 'shared_buffers', 'max_wal_size', 'wal_level')"

psql_in postgres -c 'CREATE DATABASE state0' -c 'CREATE DATABASE state4'
for number in 1 2 3 4; do up state4 "$number"; done
started=$SECONDS
psql_in state4 -f "$here/populate.sql" -c "SELECT pg_temp.populate($payments, $accounts, $pending_events, 0)" >/dev/null
settle state4
echo "populated at $(name 4) in $((SECONDS - started)) s: $(psql_in state4 -At -c "SELECT string_agg(relname || ' ' || n_live_tup, ', ' ORDER BY relname) FROM pg_stat_user_tables")"
for number in 4 3 2; do
    copy "state$number" "state$((number - 1))"
    down "state$((number - 1))" "$number"
    settle "state$((number - 1))"
done

for number in $(seq "${#migrations[@]}"); do
    previous=state$((number - 1))
    measure "$previous" "$number"
    if [ "$number" = 11 ]; then
        # The same, after the reaper has deleted every key row, with its own statement as it was then.
        copy "$previous" reaped
        psql_in reaped -c "WITH reaped AS (DELETE FROM idempotency_keys RETURNING account_id, id, idempotency_key, response_status)
            INSERT INTO audit_records (account_id, action, resource_type, resource_id, actor, data)
            SELECT account_id, 'idempotency_key.reaped', 'idempotency_key', id, 'reaper',
                   jsonb_build_object('idempotency_key', idempotency_key, 'response_status', response_status)
            FROM reaped" >/dev/null
        settle reaped
        measure reaped "$number" " (every key reaped)"
        drop reaped
    fi
    if [ "$number" -ge 5 ]; then
        psql_in postgres -c "ALTER DATABASE $previous RENAME TO state$number"
        up "state$number" "$number"
        if [ "$number" = 5 ]; then
            psql_in "state$number" -f "$here/populate.sql" \
                -c "SELECT pg_temp.populate($payments, $accounts, $pending_events, 0, ARRAY['staged_jobs'])" >/dev/null
        fi
        settle "state$number"
    else
        drop "$previous"
    fi
done
