#!/usr/bin/env bash
# bench-instructions.sh - `make bench-instructions` (and part of `make bench`): what one delivery
# costs the service in instructions, for this tree's build and a baseline commit's, counted by
# valgrind's callgrind. Unlike a rate, the count does not move with the machine's load: the same
# binary given the same deliveries executes the same instructions within about 1 % (the deliveries
# in flight interleave differently, the timers run as long as the run takes), so two builds can be
# compared on a busy machine, and a regression shows as a count that grew.
#
# For each build: `fencehook serve` (Redis leases, tracing and the console off: the defaults; the
# log settings of make bench) under `valgrind --tool=callgrind` on a fresh
# database and Redis prefix; BENCH_INSTR_WARMUP new payments sent by `fencehook load` (k = 1,
# connections opened, pools filled, caches warm), the counters zeroed (callgrind_control -z),
# BENCH_INSTR_DELIVERIES more new payments, the counters dumped (callgrind_control -d). Instructions
# per delivery are the dump's total over the deliveries (user space only: what the kernel does for
# the process is not counted). Both builds are driven by this tree's `fencehook load` with the same
# flags.
#
# Prints one line per build and writes target/bench-instructions/instructions.json; the dumps stay
# there (callgrind.<build>.out.*) for `callgrind_annotate --inclusive=yes`.
#
# Environment (optional): BENCH_BASELINE (a git ref; default: the commit docs/benchmarks.md names as
# the last measured release; "none" to count this tree's build alone), BENCH_INSTR_WARMUP (default
# 300), BENCH_INSTR_DELIVERIES (default 2000), BENCH_INSTR_CONCURRENCY (default 4), BENCH_INSTR_BIN
# (a fencehook binary to count instead of building this tree; BENCH_INSTR_LABEL names it),
# BENCH_INSTR_SERVE_ENV (VAR=VALUE words added to both instances' environment, e.g. an OTLP endpoint
# and OTEL_TRACES_SAMPLER=always_on to count what tracing costs), PG_URL, REDIS_URL, CARGO,
# CARGO_TARGET_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=scripts/bench-ref.sh
. scripts/bench-ref.sh
# shellcheck source=scripts/instance.sh
. scripts/instance.sh

WARMUP=${BENCH_INSTR_WARMUP:-300}
DELIVERIES=${BENCH_INSTR_DELIVERIES:-2000}
CONCURRENCY=${BENCH_INSTR_CONCURRENCY:-4}
read -ra SERVE_ENV <<<"${BENCH_INSTR_SERVE_ENV:-}"
BASELINE=${BENCH_BASELINE:-$(baseline_default)}
PG_URL=${PG_URL:-postgres://postgres@127.0.0.1:5432/postgres}
REDIS_URL=${REDIS_URL:-redis://127.0.0.1:6379}
SECRET=whsec_ZmVuY2Vob29rLWRldi1zZWNyZXQtZG8tbm90LXVzZQ==
CARGO=${CARGO:-cargo}
RELEASE=${CARGO_TARGET_DIR:-target}/release/fencehook
OUT=target/bench-instructions
STAMP=$(date +%Y%m%d_%H%M%S)_$$
DB_PREFIX=fencehook_instr_$STAMP

say() { printf '%s\n' "$*" >&2; }
die() { say "bench-instructions: $*"; exit 1; }
for tool in valgrind callgrind_control psql curl redis-cli; do
  command -v "$tool" >/dev/null 2>&1 || die "$tool is needed (apt-get install -y valgrind postgresql-client redis-tools curl)"
done
for v in WARMUP DELIVERIES CONCURRENCY; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "BENCH_INSTR_$v must be a positive integer (got '${!v}')"
done

mkdir -p "$OUT"
rm -f "$OUT"/callgrind.* "$OUT"/*.json "$OUT"/*.log

# The baseline first: both builds leave their binary at target/release/fencehook.
names=(head)
if [[ $BASELINE != none ]]; then
  [[ -n $BASELINE ]] || die "no baseline: set BENCH_BASELINE (or BENCH_BASELINE=none)"
  ref_build "$BASELINE"
  cp -f "$REF_BIN" "$OUT/fencehook-baseline"
  names=(baseline head)
fi
if [[ -n ${BENCH_INSTR_BIN:-} ]]; then
  cp -f "$BENCH_INSTR_BIN" "$OUT/fencehook-head"
  head_commit=${BENCH_INSTR_LABEL:-$(basename "$BENCH_INSTR_BIN")}
else
  say "== bench-instructions: building this tree (release) =="
  "$CARGO" build --locked --release >&2
  cp -f "$RELEASE" "$OUT/fencehook-head"
  head_commit="$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src Cargo.toml Cargo.lock 2>/dev/null || echo '+changes')"
fi

eval "$(DATABASE_URL="$PG_URL" REDIS_URL="$REDIS_URL" scripts/services.sh env)"
ADMIN_DB_URL=$DATABASE_URL
db_url() { printf '%s/%s_%s' "${ADMIN_DB_URL%/*}" "$DB_PREFIX" "$1"; }

SERVER_PID=
cleanup() {
  local rc=$?
  if [[ -n $SERVER_PID ]]; then
    kill -TERM "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
  fi
  for db in $(psql "$ADMIN_DB_URL" -Atc "SELECT datname FROM pg_database WHERE datname LIKE '${DB_PREFIX}_%'" 2>/dev/null); do
    psql "$ADMIN_DB_URL" -qc "DROP DATABASE IF EXISTS \"$db\" WITH (FORCE)" >/dev/null 2>&1 || true
  done
  redis-cli -u "$REDIS_URL" --scan --pattern "instr-$STAMP-*" 2>/dev/null | xargs -r redis-cli -u "$REDIS_URL" del >/dev/null 2>&1 || true
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# The count of one event in a dump: "events:" names them, "summary:" counts them.
dump_event() { # FILE EVENT
  awk -v want="$2" '
    /^events:/ { for (i = 2; i <= NF; i++) col[$i] = i - 1 }
    /^summary:/ { for (e in col) if (e == want) { print $(col[e] + 1); exit } }' "$1"
}

# load RUN_ID TRANSACTIONS: new payments, k = 1, against PORT; the JSON report on stdout.
load() {
  "$OUT/fencehook-head" load --target "http://127.0.0.1:$PORT" --secret "$SECRET" --duration 1h \
    --transactions "$2" --duplicates 1 --concurrency "$CONCURRENCY" --failed-share 0 \
    --run-id "$1" --request-timeout 60s --json
}

results=()
for name in "${names[@]}"; do
  bin=$OUT/fencehook-$name
  log=$OUT/serve-$name.log
  commit=$head_commit
  [[ $name == baseline ]] && commit=$REF_SHA
  "$bin" migrate --create-database --database-url "$(db_url "$name")" >"$OUT/migrate-$name.log" 2>&1 ||
    die "migrate ($name): $(tail -n 3 "$OUT/migrate-$name.log")"
  say "== $name ($commit): serve under callgrind; $WARMUP deliveries of warm-up, then $DELIVERIES counted =="
  : >"$log"
  env FENCEHOOK_LISTEN=127.0.0.1:0 FENCEHOOK_ADMIN_LISTEN=127.0.0.1:0 FENCEHOOK_LOG_FORMAT=json \
    FENCEHOOK_LOG=warn,fencehook=info,fencehook::http::webhook=warn \
    FENCEHOOK_MIGRATE_ON_START=false FENCEHOOK_GENERIC_SECRET=$SECRET FENCEHOOK_ALLOW_PUBLISHED_SECRETS=true \
    FENCEHOOK_LEASE_BACKEND=redis FENCEHOOK_REDIS_KEY_PREFIX="instr-$STAMP-$name" \
    DATABASE_URL="$(db_url "$name")" REDIS_URL="$REDIS_URL" "${SERVE_ENV[@]}" \
    valgrind --tool=callgrind --callgrind-out-file="$OUT/callgrind.$name.out" \
    "$bin" serve 2>"$log" &
  SERVER_PID=$!
  wait_instance "$SERVER_PID" "$log" $((SECONDS + 300)) || die "the $name instance did not come up under valgrind"
  PORT=$INSTANCE_PORT
  load "warm-$STAMP-$name" "$WARMUP" >"$OUT/load-warm-$name.json" 2>"$OUT/load-warm-$name.err" ||
    die "warm-up load ($name) failed: $(tail -n 3 "$OUT/load-warm-$name.err")"
  callgrind_control -z "$SERVER_PID" >/dev/null 2>&1 || die "callgrind_control -z failed ($name)"
  load "count-$STAMP-$name" "$DELIVERIES" >"$OUT/load-$name.json" 2>"$OUT/load-$name.err" ||
    die "counted load ($name) failed: $(tail -n 3 "$OUT/load-$name.err")"
  callgrind_control -d "$SERVER_PID" >/dev/null 2>&1 || die "callgrind_control -d failed ($name)"
  kill -TERM "$SERVER_PID"
  wait "$SERVER_PID" || true
  SERVER_PID=
  psql "$ADMIN_DB_URL" -qc "DROP DATABASE IF EXISTS \"${DB_PREFIX}_$name\" WITH (FORCE)" >/dev/null 2>&1 || true
  dump=$OUT/callgrind.$name.out.1   # the first dump (-d) of that run
  [[ -s $dump ]] || die "no callgrind dump for $name"
  ir=$(dump_event "$dump" Ir)
  delivered=$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(r["deliveries"], r["transactions_without_200"])' "$OUT/load-$name.json")
  read -r count without <<<"$delivered"
  ((without == 0)) || die "$name: $without transactions were not answered 200 (see $OUT/load-$name.json)"
  per=$((ir / count))
  say "   $name ($commit): $per instructions per delivery ($ir over $count deliveries)"
  results+=("{\"build\": \"$name\", \"commit\": \"$commit\", \"deliveries\": $count, \"instructions\": $ir, \"instructions_per_delivery\": $per}")
done

{
  printf '{"warmup": %s, "concurrency": %s, "builds": [' "$WARMUP" "$CONCURRENCY"
  (IFS=,; printf '%s' "${results[*]}")
  printf ']}\n'
} >"$OUT/instructions.json"
if [[ ${#results[@]} == 2 ]]; then
  python3 - "$OUT/instructions.json" <<'EOF'
import json, sys
b = {r["build"]: r for r in json.load(open(sys.argv[1]))["builds"]}
base, head = b["baseline"], b["head"]
print(f"instructions per delivery: {head['commit']} {head['instructions_per_delivery']:,}, "
      f"baseline {base['commit']} {base['instructions_per_delivery']:,}: "
      f"{head['instructions_per_delivery'] / base['instructions_per_delivery']:.3f} x")
EOF
else
  python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))["builds"][0]; print("instructions per delivery: %s %s" % (r["commit"], format(r["instructions_per_delivery"], ",")))' "$OUT/instructions.json"
fi
