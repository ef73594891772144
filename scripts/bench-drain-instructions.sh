#!/usr/bin/env bash
# bench-drain-instructions.sh - what the inbox drain costs the service per event, in instructions,
# beside what a sync delivery costs (scripts/bench-instructions.sh), for one fencehook binary.
#
# An instance in inbox mode with no workers accepts BENCH_DRAIN_WARMUP + BENCH_DRAIN_EVENTS new
# payments (fencehook load --inbox, k = 1); it stops, and `fencehook work` (BENCH_DRAIN_WORKERS
# workers, Redis leases, the log settings of make bench) drains them under
# `valgrind --tool=callgrind`. Once BENCH_DRAIN_WARMUP events are done the counters are zeroed;
# once every event is done they are dumped. Instructions per drained event are the dump's total
# over the events done in between (read from the database at both moments; the events in flight
# at each moment make that exact to about a percent).
#
# Prints one line; the dump stays in target/bench-drain-instructions/ for callgrind_annotate.
#
# Environment (optional): BENCH_DRAIN_BIN (default target/release/fencehook, not built here),
# BENCH_DRAIN_WARMUP (default 300), BENCH_DRAIN_EVENTS (default 2000), BENCH_DRAIN_WORKERS
# (default 8, as make bench's drain row), PG_URL, REDIS_URL.
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=scripts/instance.sh
. scripts/instance.sh

BIN=${BENCH_DRAIN_BIN:-target/release/fencehook}
WARMUP=${BENCH_DRAIN_WARMUP:-300}
EVENTS=${BENCH_DRAIN_EVENTS:-2000}
WORKERS=${BENCH_DRAIN_WORKERS:-8}
PG_URL=${PG_URL:-postgres://postgres@127.0.0.1:5432/postgres}
REDIS_URL=${REDIS_URL:-redis://127.0.0.1:6379}
SECRET=whsec_ZmVuY2Vob29rLWRldi1zZWNyZXQtZG8tbm90LXVzZQ==
OUT=target/bench-drain-instructions
STAMP=$(date +%Y%m%d_%H%M%S)_$$
DB=fencehook_drain_$STAMP

say() { printf '%s\n' "$*" >&2; }
die() { say "bench-drain-instructions: $*"; exit 1; }
for tool in valgrind callgrind_control psql curl redis-cli; do
  command -v "$tool" >/dev/null 2>&1 || die "$tool is needed (apt-get install -y valgrind postgresql-client redis-tools curl)"
done
[[ -x $BIN ]] || die "no binary at $BIN (cargo build --release, or set BENCH_DRAIN_BIN)"
for v in WARMUP EVENTS WORKERS; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "BENCH_DRAIN_$v must be a positive integer (got '${!v}')"
done
mkdir -p "$OUT"
rm -f "$OUT"/callgrind.* "$OUT"/*.log "$OUT"/*.json

DB_URL="${PG_URL%/*}/$DB"
PIDS=()
cleanup() {
  local rc=$? pid
  for pid in "${PIDS[@]}"; do
    kill -TERM "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  psql "$PG_URL" -qc "DROP DATABASE IF EXISTS \"$DB\" WITH (FORCE)" >/dev/null 2>&1 || true
  redis-cli -u "$REDIS_URL" --scan --pattern "drain-$STAMP*" 2>/dev/null | xargs -r redis-cli -u "$REDIS_URL" del >/dev/null 2>&1 || true
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

"$BIN" migrate --create-database --database-url "$DB_URL" >"$OUT/migrate.log" 2>&1 ||
  die "migrate: $(tail -n 3 "$OUT/migrate.log")"
common=(FENCEHOOK_LOG_FORMAT=json "FENCEHOOK_LOG=warn,fencehook=info,fencehook::http::webhook=warn"
  FENCEHOOK_MIGRATE_ON_START=false FENCEHOOK_MODE=inbox FENCEHOOK_REDIS_KEY_PREFIX="drain-$STAMP"
  DATABASE_URL="$DB_URL" REDIS_URL="$REDIS_URL")

say "== accepting $((WARMUP + EVENTS)) events (inbox mode, no workers) =="
: >"$OUT/serve.log"
env "${common[@]}" FENCEHOOK_LISTEN=127.0.0.1:0 FENCEHOOK_ADMIN_LISTEN=127.0.0.1:0 FENCEHOOK_WORKERS=0 \
  FENCEHOOK_GENERIC_SECRET=$SECRET FENCEHOOK_ALLOW_PUBLISHED_SECRETS=true "$BIN" serve 2>"$OUT/serve.log" &
SERVER_PID=$!
PIDS+=("$SERVER_PID")
wait_instance "$SERVER_PID" "$OUT/serve.log" $((SECONDS + 60)) || die "the accepting instance did not come up"
"$BIN" load --target "http://127.0.0.1:$INSTANCE_PORT" --secret "$SECRET" --duration 1h \
  --transactions $((WARMUP + EVENTS)) --duplicates 1 --concurrency 16 --failed-share 0 --inbox \
  --run-id "drain-$STAMP" --request-timeout 60s --json >"$OUT/load.json" 2>"$OUT/load.err" ||
  die "load failed: $(tail -n 3 "$OUT/load.err")"
kill -TERM "$SERVER_PID"
wait "$SERVER_PID" || true

done_now() { psql "$DB_URL" -Atc "SELECT count(*) FROM events WHERE status IN ('done', 'dead')"; }
queued=$(psql "$DB_URL" -Atc "SELECT count(*) FROM events WHERE status = 'queued'")
say "== draining $queued events: fencehook work ($WORKERS workers) under callgrind =="
env "${common[@]}" FENCEHOOK_WORKERS="$WORKERS" \
  valgrind --tool=callgrind --callgrind-out-file="$OUT/callgrind.drain.out" "$BIN" work 2>"$OUT/work.log" &
WORK_PID=$!
PIDS+=("$WORK_PID")
deadline=$((SECONDS + 900))
until (($(done_now) >= WARMUP)); do
  kill -0 "$WORK_PID" 2>/dev/null || die "fencehook work exited: $(tail -n 5 "$OUT/work.log")"
  ((SECONDS < deadline)) || die "the warm-up events were not drained in time"
  sleep 0.2
done
callgrind_control -z "$WORK_PID" >/dev/null 2>&1 || die "callgrind_control -z failed"
from=$(done_now)
until (($(psql "$DB_URL" -Atc "SELECT count(*) FROM events WHERE status IN ('queued', 'processing')") == 0)); do
  ((SECONDS < deadline)) || die "the events were not drained in time"
  sleep 0.2
done
callgrind_control -d "$WORK_PID" >/dev/null 2>&1 || die "callgrind_control -d failed"
to=$(done_now)
kill -TERM "$WORK_PID"
wait "$WORK_PID" || true
dump=$OUT/callgrind.drain.out.1
[[ -s $dump ]] || die "no callgrind dump"
ir=$(awk '/^summary:/ {print $2; exit}' "$dump")
dead=$(psql "$DB_URL" -Atc "SELECT count(*) FROM events WHERE status = 'dead'")
((dead == 0)) || die "$dead events went dead (see $OUT/work.log)"
count=$((to - from))
echo "{\"workers\": $WORKERS, \"events\": $count, \"instructions\": $ir, \"instructions_per_event\": $((ir / count))}" >"$OUT/drain.json"
say "   $((ir / count)) instructions per drained event ($ir over $count events)"
echo "instructions per drained event: $((ir / count))"
