#!/usr/bin/env bash
# bench.sh - `make bench`: fencehook's throughput measured on this machine, in one run.
#
#   (a) the PostgreSQL ceiling: pgbench running fencehook's own per-delivery SQL (the fast-path
#       lookup and the one-statement fenced claim + ledger entry), durable commits, prepared
#       statements, at 1..32 clients; the best client count counts;
#   (b) one `fencehook serve` with Redis leases, and (c) one with the PostgreSQL lease backend,
#       each driven by `fencehook load` at k = 1, 4 and 16 copies per transaction.
#
# Writes docs/benchmarks.md (machine, commands, one table) and docs/benchmarks.svg (throughput
# and p99 by k for both backends). Raw outputs stay in target/bench/.
#
# Environment (optional): BENCH_DURATION (s per fencehook run, default 15), BENCH_PGBENCH_SECS
# (s per pgbench run, default 8), BENCH_CONCURRENCY (load concurrency, default 32), PG_URL,
# REDIS_URL, CARGO, CARGO_TARGET_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${BENCH_DURATION:-15}
PGBENCH_SECS=${BENCH_PGBENCH_SECS:-8}
CONCURRENCY=${BENCH_CONCURRENCY:-32}
PG_URL=${PG_URL:-postgres://postgres@127.0.0.1:5432/postgres}
REDIS_URL=${REDIS_URL:-redis://127.0.0.1:6379}
SECRET=whsec_ZmVuY2Vob29rLWRldi1zZWNyZXQtZG8tbm90LXVzZQ==
CARGO=${CARGO:-cargo}
BIN=${CARGO_TARGET_DIR:-target}/release/fencehook
OUT=target/bench
STAMP=$(date +%Y%m%d_%H%M%S)_$$
DB=fencehook_bench_$STAMP

say() { printf '%s\n' "$*" >&2; }
die() { say "bench: $*"; exit 1; }
for tool in pgbench psql curl python3 redis-cli; do
  command -v "$tool" >/dev/null 2>&1 || die "$tool is needed (apt-get install -y postgresql-client redis-tools curl python3)"
done

mkdir -p "$OUT" docs
say "== make bench: building release =="
"$CARGO" build --locked --release >&2

eval "$(DATABASE_URL="$PG_URL" REDIS_URL="$REDIS_URL" scripts/services.sh env)"
ADMIN_DB_URL=$DATABASE_URL
DB_URL="${ADMIN_DB_URL%/*}/$DB"

SERVER_PID=
cleanup() {
  local rc=$?
  if [[ -n $SERVER_PID ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -TERM "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
  fi
  psql "$ADMIN_DB_URL" -qc "DROP DATABASE IF EXISTS \"$DB\" WITH (FORCE)" >/dev/null 2>&1 || true
  redis-cli -u "$REDIS_URL" --scan --pattern "bench-$STAMP-*" 2>/dev/null | xargs -r redis-cli -u "$REDIS_URL" del >/dev/null 2>&1 || true
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

"$BIN" migrate --create-database --database-url "$DB_URL" >&2

# ---------------------------------------------------------------- (a) the PostgreSQL ceiling
# scripts/bench-delivery.sql is the SQL the store sends for a new payment (k = 1, inline path),
# with pgbench variables for the parameters; a unit test in src/store keeps it in step.
say "== (a) pgbench ceiling: ${PGBENCH_SECS}s per client count =="
: >"$OUT/pgbench.txt"
for c in 1 2 4 8 16 32; do
  tps=$(pgbench -n -M prepared -c "$c" -j "$((c < 2 ? c : 2))" -T "$PGBENCH_SECS" -f scripts/bench-delivery.sql "$DB_URL" 2>/dev/null |
    sed -nE 's/^tps = ([0-9.]+) \(without initial connection time\)/\1/p')
  say "   clients $c: $tps tps"
  echo "$c $tps" >>"$OUT/pgbench.txt"
done

# ---------------------------------------------------------------- (b), (c) fencehook
# shellcheck source=scripts/instance.sh
. scripts/instance.sh
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }   # utime + stime, in clock ticks
hwm_kb() { awk '/^VmHWM/ {print $2}' "/proc/$1/status"; }

run_one() {   # backend k
  local backend=$1 k=$2 log="$OUT/serve-$1-k$2.log"
  FENCEHOOK_LISTEN=127.0.0.1:0 FENCEHOOK_ADMIN_LISTEN=127.0.0.1:0 FENCEHOOK_LOG_FORMAT=json \
    FENCEHOOK_LOG=warn,fencehook=info,fencehook::http::webhook=warn \
    FENCEHOOK_MIGRATE_ON_START=false FENCEHOOK_GENERIC_SECRET=$SECRET \
    FENCEHOOK_LEASE_BACKEND=$backend FENCEHOOK_REDIS_KEY_PREFIX="bench-$STAMP-$backend-$k" \
    DATABASE_URL=$DB_URL REDIS_URL=$REDIS_URL "$BIN" serve 2>"$log" &
  SERVER_PID=$!
  wait_instance "$SERVER_PID" "$log" $((SECONDS + 30)) || die "the $backend instance did not come up"
  local port=$INSTANCE_PORT
  local t0 t1
  t0=$(ticks "$SERVER_PID")
  "$BIN" load --target "http://127.0.0.1:$port" --secret "$SECRET" --duration "${DURATION}s" \
    --duplicates "$k" --concurrency "$CONCURRENCY" --failed-share 0 --json >"$OUT/load-$backend-k$k.json" 2>/dev/null || true
  t1=$(ticks "$SERVER_PID")
  echo "{\"cpu_ticks\": $((t1 - t0)), \"clk_tck\": $(getconf CLK_TCK), \"peak_rss_kb\": $(hwm_kb "$SERVER_PID")}" \
    >"$OUT/proc-$backend-k$k.json"
  kill -TERM "$SERVER_PID"
  wait "$SERVER_PID" || true
  SERVER_PID=
}

for backend in redis postgres; do
  for k in 1 4 16; do
    say "== fencehook, $backend leases, k=$k: ${DURATION}s at concurrency $CONCURRENCY =="
    run_one "$backend" "$k"
  done
done

# ---------------------------------------------------------------- report
MACHINE="$(nproc) cores ($(sed -nE 's/^model name\s*: (.*)/\1/p' /proc/cpuinfo | head -1)), $(free -g | awk '/^Mem:/ {print $2}') GiB"
VERSIONS="PostgreSQL $(psql "$ADMIN_DB_URL" -Atc 'SHOW server_version' | cut -d' ' -f1), Redis $(redis-cli -u "$REDIS_URL" info server | sed -nE 's/^redis_version:(.*)\r?$/\1/p' | tr -d '\r')"
python3 scripts/bench_report.py "$OUT" "$MACHINE" "$VERSIONS" "$DURATION" "$PGBENCH_SECS" "$CONCURRENCY" \
  "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
say "== wrote docs/benchmarks.md and docs/benchmarks.svg =="
