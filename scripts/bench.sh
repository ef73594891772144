#!/usr/bin/env bash
# bench.sh - `make bench`: fencehook's throughput measured on this machine, in one run.
#
#   (a) PostgreSQL ceilings, pgbench at 8 and 16 clients (durable commits, prepared statements):
#       - the 4-round-trip reference: the lookup, a stand-in round trip (SELECT 1) where the
#         service acquires its lease, the one-statement claim, a stand-in where it releases it;
#         the best of 8 and 16 clients is "the ceiling" every service row is divided by;
#       - the service's own SQL alone (lookup + claim: 2 round trips);
#       - the claim alone (1 round trip: the same work as one statement).
#   (b) one `fencehook serve` per row, driven by `fencehook load` at k = 1, 4, 16 copies per
#       transaction: Redis leases, PostgreSQL leases, and the "UNIQUE constraint only" baseline
#       (no lease at all; a build with the bench-baseline feature);
#   (c) inbox mode: accepting with no workers (the accept rate), then `fencehook work` (8
#       workers) draining what was accepted (the drain rate); and, at a steady 500 deliveries/s
#       with serve's own 4 workers, how long from accept to booked (the lag percentiles);
#   (d) memory per idle keep-alive connection: 1,000 of them opened on one instance;
#   (e) what tracing costs: Redis leases at k = 1 with OpenTelemetry tracing off and on (every
#       trace sampled, exported over OTLP/HTTP to a local sink that discards it), interleaved in
#       pairs as (f) (off on, on off, ...): both rates, their ratio, both CPU per delivery;
#   (f) against a baseline commit (BENCH_BASELINE): its release build, from a git worktree of its
#       own (cached by commit, scripts/bench-ref.sh), and this one, Redis leases at k = 1,
#       interleaved A B B A B A … in the same minutes (each pair in the other order than the one
#       before, so that a machine slowing or speeding up through the run favours neither build):
#       both rates, their ratio and both CPU per delivery;
#       a regression is a ratio below 1 whatever the machine's disk does;
#   (g) instructions per delivery of both builds, counted by callgrind
#       (scripts/bench-instructions.sh): a figure that does not move with the machine at all.
#
# Each run gets its own database (no run slows another with its rows) and Redis key prefix.
# Writes docs/benchmarks.md (machine, commands, tables, targets) and docs/benchmarks.svg; raw
# outputs stay in target/bench/.
#
# Environment (optional): BENCH_DURATION (s per fencehook run, default 15), BENCH_PGBENCH_SECS
# (s per pgbench run, default 8), BENCH_CONCURRENCY (load concurrency, default 32), BENCH_BASELINE
# (a git ref; default: the commit docs/benchmarks.md names as the last measured release; "none"
# leaves out (f) and (g)), BENCH_AB_PAIRS (A B pairs in (f), default 2), BENCH_TRACE_PAIRS (off/on
# pairs in (e), default BENCH_AB_PAIRS), BENCH_INSTR_* (see
# scripts/bench-instructions.sh), PG_URL, REDIS_URL, CARGO, CARGO_TARGET_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${BENCH_DURATION:-15}
AB_PAIRS=${BENCH_AB_PAIRS:-2}
TRACE_PAIRS=${BENCH_TRACE_PAIRS:-$AB_PAIRS}
PGBENCH_SECS=${BENCH_PGBENCH_SECS:-8}
CONCURRENCY=${BENCH_CONCURRENCY:-32}
DRAIN_WORKERS=8    # fencehook work draining the accepted backlog (each up to 16 events in flight)
LAG_RATE=500       # deliveries/s of the accept -> booked latency run
PG_URL=${PG_URL:-postgres://postgres@127.0.0.1:5432/postgres}
REDIS_URL=${REDIS_URL:-redis://127.0.0.1:6379}
SECRET=whsec_ZmVuY2Vob29rLWRldi1zZWNyZXQtZG8tbm90LXVzZQ==
CARGO=${CARGO:-cargo}
RELEASE=${CARGO_TARGET_DIR:-target}/release/fencehook
OUT=target/bench
BIN=$OUT/fencehook
BASELINE_BIN=$OUT/fencehook-baseline
REF_OUT_BIN=$OUT/fencehook-ref
STAMP=$(date +%Y%m%d_%H%M%S)_$$
DB_PREFIX=fencehook_bench_$STAMP

say() { printf '%s\n' "$*" >&2; }
die() { say "bench: $*"; exit 1; }
for tool in pgbench psql curl python3 redis-cli; do
  command -v "$tool" >/dev/null 2>&1 || die "$tool is needed (apt-get install -y postgresql-client redis-tools curl python3)"
done

mkdir -p "$OUT" docs
rm -f "$OUT"/*.json "$OUT"/*.txt
# shellcheck source=scripts/bench-ref.sh
. scripts/bench-ref.sh
BASELINE=${BENCH_BASELINE:-$(baseline_default)}
[[ -n $BASELINE ]] || die "no baseline commit: set BENCH_BASELINE (a git ref, or none)"
[[ $AB_PAIRS =~ ^[1-9][0-9]*$ ]] || die "BENCH_AB_PAIRS must be a positive integer (got '$AB_PAIRS')"
[[ $TRACE_PAIRS =~ ^[1-9][0-9]*$ ]] || die "BENCH_TRACE_PAIRS must be a positive integer (got '$TRACE_PAIRS')"
# The other builds first: the service build is the one left in target/release.
if [[ $BASELINE != none ]]; then
  ref_build "$BASELINE"
  cp -f "$REF_BIN" "$REF_OUT_BIN"
fi
say "== make bench: building release (the bench-baseline feature's build, then the service) =="
"$CARGO" build --locked --release --features bench-baseline >&2
cp -f "$RELEASE" "$BASELINE_BIN"
"$CARGO" build --locked --release >&2
cp -f "$RELEASE" "$BIN"

eval "$(DATABASE_URL="$PG_URL" REDIS_URL="$REDIS_URL" scripts/services.sh env)"
ADMIN_DB_URL=$DATABASE_URL
db_url() { printf '%s/%s_%s' "${ADMIN_DB_URL%/*}" "$DB_PREFIX" "$1"; }

PIDS=()
cleanup() {
  local rc=$? pid
  for pid in "${PIDS[@]}"; do
    kill -TERM "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  for db in $(psql "$ADMIN_DB_URL" -Atc "SELECT datname FROM pg_database WHERE datname LIKE '${DB_PREFIX}_%'" 2>/dev/null); do
    psql "$ADMIN_DB_URL" -qc "DROP DATABASE IF EXISTS \"$db\" WITH (FORCE)" >/dev/null 2>&1 || true
  done
  redis-cli -u "$REDIS_URL" --scan --pattern "bench-$STAMP-*" 2>/dev/null | xargs -r redis-cli -u "$REDIS_URL" del >/dev/null 2>&1 || true
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Every measured run starts right after a CHECKPOINT: otherwise one run can pay for flushing
# the dirty pages of the run before it (measured: inbox accepts at 900/s instead of 5,600/s).
# (CHECKPOINT needs a superuser or pg_checkpoint; without it the runs just go unprotected.)
checkpoint() { psql "$ADMIN_DB_URL" -qc CHECKPOINT >/dev/null 2>&1 || true; }
# new_db NAME [BINARY]: a database migrated by BINARY (default: this build), for one run.
new_db() {
  "${2:-$BIN}" migrate --create-database --database-url "$(db_url "$1")" >"$OUT/migrate-$1.log" 2>&1 ||
    die "migrate $1: $(tail -n 3 "$OUT/migrate-$1.log")"
  checkpoint
}
# A finished run's database is dropped at once: left behind, autovacuum works through its rows
# while the next runs are measured.
drop_db() { psql "$ADMIN_DB_URL" -qc "DROP DATABASE IF EXISTS \"${DB_PREFIX}_$1\" WITH (FORCE)" >/dev/null 2>&1 || true; }

# ---------------------------------------------------------------- (a) the PostgreSQL ceilings
# scripts/bench-delivery.sql is the SQL the store sends for a new payment (k = 1, inline path),
# with pgbench variables for the parameters; a unit test in src/store keeps it in step. The
# reference and the claim alone are derived from it here.
LOOKUP_LINE=3
awk -v l=$LOOKUP_LINE 'NR == l {print; print "SELECT 1;"; next} {print} END {print "SELECT 1;"}' \
  scripts/bench-delivery.sql >"$OUT/reference.sql"
awk -v l=$LOOKUP_LINE 'NR != l' scripts/bench-delivery.sql >"$OUT/claim.sql"
cp scripts/bench-delivery.sql "$OUT/service.sql"
grep -q '^SELECT id, kind, status' <(sed -n ${LOOKUP_LINE}p scripts/bench-delivery.sql) ||
  die "scripts/bench-delivery.sql: line $LOOKUP_LINE is no longer the lookup; fix LOOKUP_LINE"
new_db pgbench
for script in reference service claim; do
  for c in 8 16; do
    checkpoint
    tps=$(pgbench -n -M prepared -c "$c" -j 2 -T "$PGBENCH_SECS" -f "$OUT/$script.sql" "$(db_url pgbench)" 2>/dev/null |
      sed -nE 's/^tps = ([0-9.]+) \(without initial connection time\)/\1/p')
    say "== (a) pgbench $script, $c clients: $tps tps"
    echo "$script $c $tps" >>"$OUT/pgbench.txt"
  done
done
drop_db pgbench

# ---------------------------------------------------------------- (b), (c), (d) fencehook
# shellcheck source=scripts/instance.sh
. scripts/instance.sh
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }   # utime + stime, in clock ticks
hwm_kb() { awk '/^VmHWM/ {print $2}' "/proc/$1/status"; }
rss_kb() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }

# start_serve NAME BINARY BACKEND [VAR=VALUE...]: sets SERVER_PID and PORT.
start_serve() {
  local name=$1 bin=$2 backend=$3 log="$OUT/serve-$1.log"
  shift 3
  new_db "$name" "$bin"
  # Emptied here, not by the redirection below: that one runs in the child, and wait_instance
  # could read the previous run's start line (its ports) before the child truncates the file.
  : >"$log"
  env FENCEHOOK_LISTEN=127.0.0.1:0 FENCEHOOK_ADMIN_LISTEN=127.0.0.1:0 FENCEHOOK_LOG_FORMAT=json \
    FENCEHOOK_LOG=warn,fencehook=info,fencehook::http::webhook=warn \
    FENCEHOOK_MIGRATE_ON_START=false FENCEHOOK_GENERIC_SECRET=$SECRET FENCEHOOK_ALLOW_PUBLISHED_SECRETS=true \
    FENCEHOOK_LEASE_BACKEND="$backend" FENCEHOOK_REDIS_KEY_PREFIX="bench-$STAMP-$name" \
    DATABASE_URL="$(db_url "$name")" REDIS_URL="$REDIS_URL" "$@" "$bin" serve 2>"$log" &
  SERVER_PID=$!
  PIDS+=("$SERVER_PID")
  wait_instance "$SERVER_PID" "$log" $((SECONDS + 30)) || die "the $name instance did not come up"
  PORT=$INSTANCE_PORT
}

stop_serve() {
  kill -TERM "$SERVER_PID"
  wait "$SERVER_PID" || true
}

# drive NAME K [load flags...]: one load run against PORT, with the server's CPU and peak RSS.
drive() {
  local name=$1 k=$2 t0 t1
  shift 2
  t0=$(ticks "$SERVER_PID")
  "$BIN" load --target "http://127.0.0.1:$PORT" --secret "$SECRET" --duration "${DURATION}s" \
    --duplicates "$k" --concurrency "$CONCURRENCY" --failed-share 0 --json "$@" \
    >"$OUT/load-$name.json" 2>"$OUT/load-$name.err" || true
  t1=$(ticks "$SERVER_PID")
  echo "{\"cpu_ticks\": $((t1 - t0)), \"clk_tck\": $(getconf CLK_TCK), \"peak_rss_kb\": $(hwm_kb "$SERVER_PID")}" \
    >"$OUT/proc-$name.json"
}

for backend in redis postgres unique-only; do
  bin=$BIN
  [[ $backend == unique-only ]] && bin=$BASELINE_BIN
  for k in 1 4 16; do
    say "== (b) fencehook, $backend, k=$k: ${DURATION}s at concurrency $CONCURRENCY =="
    start_serve "$backend-k$k" "$bin" "$backend"
    drive "$backend-k$k" "$k"
    stop_serve
    drop_db "$backend-k$k"
  done
done

if [[ $BASELINE != none ]]; then
  say "== (f) against $BASELINE ($REF_SHA): Redis leases, k=1, ${DURATION}s each, $AB_PAIRS interleaved pairs =="
  for ((pair = 1; pair <= AB_PAIRS; pair++)); do
    order=(ref head)
    ((pair % 2)) || order=(head ref)
    for build in "${order[@]}"; do
      bin=$BIN
      [[ $build == ref ]] && bin=$REF_OUT_BIN
      start_serve "ab-$build-$pair" "$bin" redis
      drive "ab-$build-$pair" 1
      stop_serve
      drop_db "ab-$build-$pair"
    done
  done
  python3 scripts/bench_report.py --ab "$OUT" "$AB_PAIRS" "$REF_SHA" >"$OUT/ab.txt"
  while read -r line; do say "   $line"; done <"$OUT/ab.txt"
fi

say "== (e) tracing: Redis leases, k=1, off and on (100 % sampled, to a local sink that discards), $TRACE_PAIRS interleaved pairs =="
# The sink: an OTLP/HTTP endpoint that reads each export and answers 200 (keep-alive), as a
# collector that keeps up would. Its port is the first line it prints. The file is emptied here,
# not by the redirection (that runs in the child): a run after another read the earlier run's
# port, or an empty line, before the child truncated it, and exported to nothing.
: >"$OUT/otlp-sink.port"
python3 - >>"$OUT/otlp-sink.port" 2>"$OUT/otlp-sink.log" <<'EOF' &
import http.server
class Sink(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *args):
        pass
server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Sink)
print(server.server_address[1], flush=True)
server.serve_forever()
EOF
SINK_PID=$!
PIDS+=("$SINK_PID")
deadline=$((SECONDS + 10))
until [[ $(head -n1 "$OUT/otlp-sink.port") =~ ^[0-9]+$ ]]; do
  ((SECONDS < deadline)) || die "the OTLP sink did not start: $(cat "$OUT/otlp-sink.log")"
  sleep 0.1
done
SINK_PORT=$(head -n1 "$OUT/otlp-sink.port")
for ((pair = 1; pair <= TRACE_PAIRS; pair++)); do
  order=(off on)
  ((pair % 2)) || order=(on off)
  for tracing in "${order[@]}"; do
    extra=()
    [[ $tracing == on ]] && extra=(OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:$SINK_PORT" OTEL_TRACES_SAMPLER=always_on)
    start_serve "traces-$tracing-$pair" "$BIN" redis "${extra[@]}"
    drive "traces-$tracing-$pair" 1
    dropped=$(curl -s "http://127.0.0.1:$INSTANCE_ADMIN_PORT/metrics" |
      awk '/^fencehook_trace_spans_dropped_total/ {n += $2} END {print n + 0}')
    echo "{\"spans_dropped\": $dropped}" >"$OUT/traces-$tracing-$pair.json"
    stop_serve
    drop_db "traces-$tracing-$pair"
  done
done
python3 scripts/bench_report.py --traces "$OUT" "$TRACE_PAIRS" >"$OUT/traces.txt"
while read -r line; do say "   $line"; done <"$OUT/traces.txt"
kill -TERM "$SINK_PID" 2>/dev/null || true

say "== (c) inbox: accepting ${DURATION}s with no workers, then fencehook work draining =="
start_serve inbox "$BIN" redis FENCEHOOK_MODE=inbox FENCEHOOK_WORKERS=0
drive inbox 1 --inbox
stop_serve
queued=$(psql "$(db_url inbox)" -Atc "SELECT count(*) FROM events WHERE status = 'queued'")
checkpoint
env FENCEHOOK_LOG_FORMAT=json FENCEHOOK_LOG=warn FENCEHOOK_MIGRATE_ON_START=false FENCEHOOK_MODE=inbox \
  FENCEHOOK_WORKERS=$DRAIN_WORKERS FENCEHOOK_REDIS_KEY_PREFIX="bench-$STAMP-inbox" \
  DATABASE_URL="$(db_url inbox)" REDIS_URL="$REDIS_URL" "$BIN" work 2>"$OUT/work-inbox.log" &
WORK_PID=$!
PIDS+=("$WORK_PID")
deadline=$((SECONDS + 300))
# Whether anything is left, through the partial indexes of queued and of processing events: a
# count of them read every row of the table twice a second (a parallel scan with its workers),
# which took from the drain it was waiting for the CPU the sync rows never shared with a poller.
until [[ $(psql "$(db_url inbox)" -Atc "SELECT EXISTS (SELECT FROM events WHERE status = 'queued')
            OR EXISTS (SELECT FROM events WHERE status = 'processing')") == f ]]; do
  ((SECONDS < deadline)) || die "the inbox did not drain in 300 s"
  sleep 0.5
done
kill -TERM "$WORK_PID"
wait "$WORK_PID" || true
psql "$(db_url inbox)" -Atc "SELECT json_build_object('queued_at_start', $queued, 'workers', $DRAIN_WORKERS,
    'done', count(*) FILTER (WHERE status = 'done'), 'dead', count(*) FILTER (WHERE status = 'dead'),
    'span_secs', extract(epoch FROM max(finished_at) - min(finished_at)))
  FROM events" >"$OUT/drain-inbox.json"
say "   $(cat "$OUT/drain-inbox.json")"

say "== (c) inbox: accept -> booked at $LAG_RATE deliveries/s with the default 4 workers in serve =="
start_serve inbox-lag "$BIN" redis FENCEHOOK_MODE=inbox
drive inbox-lag 1 --inbox --rate "$LAG_RATE" --database-url "$(db_url inbox-lag)"
stop_serve

say "== (d) memory per idle keep-alive connection =="
start_serve idle "$BIN" redis FENCEHOOK_MAX_CONNECTIONS=2000 FENCEHOOK_MAX_CONNECTIONS_PER_PEER=2000
python3 - "$PORT" "$SERVER_PID" >"$OUT/idle-connections.json" <<'EOF'
import json, socket, sys, time
port, pid = int(sys.argv[1]), sys.argv[2]
def rss_kb():
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
request = (b"POST /webhooks/none HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
           b"Content-Length: 2\r\n\r\n{}")
def open_idle(n):
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(request)
        s.recv(4096)            # the 404: the connection is now an idle keep-alive one
        socks.append(s)
    return socks
warm = open_idle(50)             # allocator and runtime warmed up
time.sleep(0.5)
before = rss_kb()
socks = open_idle(1000)
time.sleep(0.5)
after = rss_kb()
print(json.dumps({"connections": 1000, "rss_before_kb": before, "rss_after_kb": after,
                  "per_connection_bytes": (after - before) * 1024 / 1000}))
for s in socks + warm:
    s.close()
EOF
stop_serve
say "   $(cat "$OUT/idle-connections.json")"

# ---------------------------------------------------------------- (g) instructions
if [[ $BASELINE != none ]]; then
  say "== (g) instructions per delivery under callgrind: $BASELINE and this build =="
  if BENCH_BASELINE=$BASELINE PG_URL=$PG_URL REDIS_URL=$REDIS_URL CARGO=$CARGO scripts/bench-instructions.sh >"$OUT/instructions.txt"; then
    cp -f target/bench-instructions/instructions.json "$OUT/instructions.json"
    say "   $(cat "$OUT/instructions.txt")"
  else
    say "   (not measured: scripts/bench-instructions.sh failed)"
  fi
fi

# ---------------------------------------------------------------- report
MACHINE="$(nproc) cores ($(sed -nE 's/^model name\s*: (.*)/\1/p' /proc/cpuinfo | head -1)), $(free -g | awk '/^Mem:/ {print $2}') GiB"
VERSIONS="PostgreSQL $(psql "$ADMIN_DB_URL" -Atc 'SHOW server_version' | cut -d' ' -f1), Redis $(redis-cli -u "$REDIS_URL" info server | sed -nE 's/^redis_version:(.*)\r?$/\1/p' | tr -d '\r')"
BENCH_REF=${REF_SHA:-} BENCH_AB_PAIRS=$AB_PAIRS BENCH_TRACE_PAIRS=$TRACE_PAIRS \
  python3 scripts/bench_report.py "$OUT" "$MACHINE" "$VERSIONS" "$DURATION" "$PGBENCH_SECS" "$CONCURRENCY" \
  "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD -- . ':!docs/benchmarks.md' ':!docs/benchmarks.svg' 2>/dev/null || echo '+changes')"
say "== wrote docs/benchmarks.md and docs/benchmarks.svg =="
