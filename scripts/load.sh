#!/usr/bin/env bash
# load.sh - `make load`: three `fencehook serve` instances on a fresh database and a fresh
# Redis key prefix, `fencehook load` across them with k copies of every transaction, then
# `fencehook audit --answers`, and one report.
#
# Environment (all optional):
#   LOAD_MODE         sync (default) or inbox: the instances run with FENCEHOOK_MODE=inbox
#                     (FENCEHOOK_WORKERS workers each, default 4), the load runs with
#                     --inbox and waits for the drain, and the report gives the accept
#                     rate, the drain rate and the lag percentiles
#   LOAD_DRAIN_TIMEOUT  inbox mode: longest wait for the drain after the load, s (default 60)
#   LOAD_SCHEME       standard (default: the built-in generic provider), or wechatpay, alipay,
#                     paypal: a throwaway RSA key (openssl) plays the PSP, the instances and
#                     the load read one providers file naming its public half, and for paypal
#                     the load serves the certificate on LOAD_CERT_PORT (default 18099); or
#                     paddle, square, checkout, razorpay: a throwaway HMAC secret (openssl rand)
#                     in that one file
#   LOAD_DURATION     seconds of load (default 30)
#   LOAD_DUPLICATES   copies of each transaction, k (default 4)
#   LOAD_CONCURRENCY  HTTP requests in flight (default 32)
#   LOAD_KEEP_DB=1    keep the load database afterwards, to dig into it
#   PG_URL, REDIS_URL server-level URLs where PostgreSQL and Redis are looked for (as in the
#                     Makefile); scripts/services.sh starts private ones when none answer
#   FENCEHOOK_GENERIC_SECRET  signing secret (default: the documented development secret;
#                     the instances run with FENCEHOOK_ALLOW_PUBLISHED_SECRETS=true, as `make run`)
#   CARGO, CARGO_TARGET_DIR   as for cargo
#
# Exit status: 0 when the load run and the audit are clean, 1 otherwise, 130/143 when
# interrupted. Whatever the cause of the exit, every process this script started is stopped
# (SIGTERM, then a bounded wait, then SIGKILL), the load database is dropped and the run's
# Redis keys are deleted. Instance logs, the answers file and the report are in target/load/.

set -euo pipefail
cd "$(dirname "$0")/.."

INSTANCES=3
MODE=${LOAD_MODE:-sync}
SCHEME=${LOAD_SCHEME:-standard}
CERT_PORT=${LOAD_CERT_PORT:-18099}
DRAIN_TIMEOUT=${LOAD_DRAIN_TIMEOUT:-60}
DURATION=${LOAD_DURATION:-30}
DUPLICATES=${LOAD_DUPLICATES:-4}
CONCURRENCY=${LOAD_CONCURRENCY:-32}
PG_URL=${PG_URL:-postgres://postgres@127.0.0.1:5432/postgres}
REDIS_URL=${REDIS_URL:-redis://127.0.0.1:6379}
DEV_SECRET=${DEV_SECRET:-whsec_ZmVuY2Vob29rLWRldi1zZWNyZXQtZG8tbm90LXVzZQ==}
SECRET=${FENCEHOOK_GENERIC_SECRET:-$DEV_SECRET}
CARGO=${CARGO:-cargo}
BIN=${CARGO_TARGET_DIR:-target}/release/fencehook
LOG_DIR=target/load
ANSWERS=$LOG_DIR/answers.jsonl
PSP_DIR=$LOG_DIR/psp   # LOAD_SCHEME's key, certificate and providers file, for one run
STOP_WAIT_SECS=20   # above the instances' default FENCEHOOK_SHUTDOWN_TIMEOUT_MS (10 s)
START_WAIT_SECS=30

# One name for the database and the Redis key prefix; the pid keeps two runs started in the
# same second apart.
STAMP=$(date +%Y%m%d_%H%M%S)_$$
RUN=fencehook_load_$STAMP

say() { printf '%s\n' "$*" >&2; }
die() { say "load: $*"; exit 1; }

for v in DURATION DUPLICATES CONCURRENCY DRAIN_TIMEOUT CERT_PORT; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "LOAD_$v must be a positive integer (got '${!v}')"
done
case $MODE in
  sync | inbox) ;;
  *) die "LOAD_MODE must be sync or inbox (got '$MODE')" ;;
esac
case $SCHEME in
  standard) ;;
  wechatpay | alipay | paypal | paddle | square | checkout | razorpay)
    command -v openssl >/dev/null 2>&1 || die "openssl is needed to make LOAD_SCHEME=$SCHEME's key" ;;
  *) die "LOAD_SCHEME must be standard, wechatpay, alipay, paypal, paddle, square, checkout or razorpay (got '$SCHEME')" ;;
esac
command -v curl >/dev/null 2>&1 || die "curl is needed to probe /readyz and /metrics (apt-get install -y curl)"

# ---------------------------------------------------------------- process bookkeeping

PIDS=()       # the fencehook serve instances
PORTS=()      # their public ports
ADMIN_PORTS=()
INSTANCE_RC=()
CHILD_PID=    # the one foreground-like child running now (cargo, migrate, load, audit)
DB_CREATED=0
ADMIN_URL=
LOAD_URL=

# Runs a command in the background and waits for it, so that a signal interrupts the wait at
# once (bash runs traps only between commands) and the EXIT trap can stop the child.
run_child() {
  local rc=0
  "$@" 8>&- &
  CHILD_PID=$!
  wait "$CHILD_PID" || rc=$?
  CHILD_PID=
  return "$rc"
}

alive() { kill -0 "$1" 2>/dev/null; }

# SIGTERM to every pid given, then wait (bounded) for each; SIGKILL what is left.
# Sets STOPPED_RC[pid] to each exit status.
declare -A STOPPED_RC=()
stop_pids() {
  local pid deadline=$((SECONDS + STOP_WAIT_SECS)) rc
  for pid in "$@"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "$@"; do
    while alive "$pid" && ((SECONDS < deadline)); do sleep 0.1; done
    if alive "$pid"; then
      say "load: pid $pid did not stop within ${STOP_WAIT_SECS}s of SIGTERM; sending SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
    fi
    rc=0
    wait "$pid" 2>/dev/null || rc=$?
    STOPPED_RC[$pid]=$rc
  done
}

stop_instances() {
  local i
  ((${#PIDS[@]} > 0)) || return 0
  stop_pids "${PIDS[@]}"
  for i in "${!PIDS[@]}"; do INSTANCE_RC[i]=${STOPPED_RC[${PIDS[i]}]:-?}; done
  PIDS=()
}

psql_admin() { psql "$ADMIN_URL" -X -q -w -v ON_ERROR_STOP=1 "$@" </dev/null; }

cleanup() {
  local rc=$? leftover keys
  trap - EXIT INT TERM
  set +e
  [[ -n $CHILD_PID ]] && stop_pids "$CHILD_PID"
  stop_instances
  # Anything else this shell started (a start interrupted between `&` and the bookkeeping).
  leftover=$(jobs -p)
  # shellcheck disable=SC2086
  [[ -n $leftover ]] && stop_pids $leftover
  if ((DB_CREATED)); then
    if [[ ${LOAD_KEEP_DB:-0} == 1 ]]; then
      say "load: kept the database $RUN (LOAD_KEEP_DB=1): $LOAD_URL"
    elif psql_admin -c "DROP DATABASE IF EXISTS \"$RUN\"" 2>"$LOG_DIR/drop.log"; then
      say "load: dropped the database $RUN"
    else
      say "load: could not drop the database $RUN: $(cat "$LOG_DIR/drop.log")"
      say "load:   drop it with: psql '$ADMIN_URL' -c 'DROP DATABASE \"$RUN\"'"
      ((rc != 0)) || rc=1
    fi
  fi
  # The fence keys outlive the run by a day (the shortest TTL the server accepts); they are
  # ours alone by their prefix.
  rm -rf "$PSP_DIR"
  if [[ ${LOAD_KEEP_DB:-0} != 1 ]] && redis-cli --no-auth-warning -u "$REDIS_URL" ping >/dev/null 2>&1; then
    keys=$(redis-cli --no-auth-warning -u "$REDIS_URL" --scan --pattern "$RUN:*" | tee "$LOG_DIR/redis-keys.txt" | wc -l)
    xargs -r -n 1000 redis-cli --no-auth-warning -u "$REDIS_URL" unlink <"$LOG_DIR/redis-keys.txt" >/dev/null
    rm -f "$LOG_DIR/redis-keys.txt"
    ((keys == 0)) || say "load: deleted the run's $keys Redis keys ($RUN:*)"
  fi
  case $rc in
    130 | 143) say "load: interrupted; every process it started is stopped" ;;
  esac
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

mkdir -p "$LOG_DIR"
# One run at a time: a second one would overwrite this one's answers file before its audit.
# fd 8 is closed for the children (`8>&-`), so only this shell holds the lock.
if command -v flock >/dev/null 2>&1; then
  exec 8>"$LOG_DIR/.lock"
  flock -n 8 || die "another make load is running (lock $LOG_DIR/.lock)"
fi
rm -f "$LOG_DIR"/instance-*.log "$LOG_DIR"/instance-*.metrics "$ANSWERS" \
  "$LOG_DIR"/load-report.txt "$LOG_DIR"/audit.txt "$LOG_DIR"/report.txt
rm -rf "$PSP_DIR"

# ---------------------------------------------------------------- the PSP

# The instances and the load read the same providers file; the built-in `generic` provider
# is used, whatever FENCEHOOK_PROVIDERS says, when LOAD_SCHEME is standard, so that the
# secret matches.
PROVIDERS_ENV=(-u FENCEHOOK_PROVIDERS)
PSP_ARGS=()
if [[ $SCHEME == paddle || $SCHEME == square || $SCHEME == checkout || $SCHEME == razorpay ]]; then
  # A throwaway HMAC secret for this run only, in the providers file the instances and the load
  # both read; the EXIT trap deletes it.
  mkdir -p "$PSP_DIR"
  secret=$(openssl rand -hex 24)
  case $SCHEME in
    paddle)
      printf '[providers.psp]\nscheme = "paddle"\nsecrets = ["pdl_ntf_load_%s"]\n' "$secret" >"$PSP_DIR/providers.toml"
      ;;
    square)
      printf '[providers.psp]\nscheme = "square"\nsecrets = ["%s"]\nnotification_url = "https://fencehook.invalid/webhooks/psp"\n' \
        "$secret" >"$PSP_DIR/providers.toml"
      ;;
    checkout | razorpay)
      printf '[providers.psp]\nscheme = "%s"\nsecrets = ["%s"]\n' "$SCHEME" "$secret" >"$PSP_DIR/providers.toml"
      ;;
  esac
  PSP_ARGS=(--providers "$PSP_DIR/providers.toml" --provider psp)
  PROVIDERS_ENV=(FENCEHOOK_PROVIDERS="$PSP_DIR/providers.toml")
elif [[ $SCHEME != standard ]]; then
  # A throwaway key for this run only: the providers file names its public half, the load
  # signs with it, the EXIT trap deletes it.
  mkdir -p "$PSP_DIR"
  openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$PSP_DIR/psp.key" 2>/dev/null ||
    die "openssl could not make a key"
  openssl pkey -in "$PSP_DIR/psp.key" -pubout -out "$PSP_DIR/psp.pub.pem"
  PSP_ARGS=(--providers "$PSP_DIR/providers.toml" --provider psp --private-key "$PSP_DIR/psp.key")
  case $SCHEME in
    wechatpay)
      serial=PUB_KEY_ID_0000000000000000000000000000000000
      printf '[providers.psp]\nscheme = "wechatpay"\nsecrets = ["%s"]\nplatform_keys = { "%s" = "psp.pub.pem" }\n' \
        "$(openssl rand -hex 16)" "$serial" >"$PSP_DIR/providers.toml"
      PSP_ARGS+=(--serial "$serial")
      ;;
    alipay)
      printf '[providers.psp]\nscheme = "alipay"\napp_id = "2021000000000000"\npublic_keys = ["psp.pub.pem"]\n' \
        >"$PSP_DIR/providers.toml"
      ;;
    paypal)
      openssl req -x509 -new -key "$PSP_DIR/psp.key" -subj /CN=messageverificationcerts.paypal.com \
        -days 1 -out "$PSP_DIR/psp.crt" 2>/dev/null || die "openssl could not make a certificate"
      printf '[providers.psp]\nscheme = "paypal"\nwebhook_id = "WH-LOAD"\ncert_url_prefixes = ["http://127.0.0.1:%s/"]\n' \
        "$CERT_PORT" >"$PSP_DIR/providers.toml"
      PSP_ARGS+=(--cert-url "http://127.0.0.1:$CERT_PORT/certs/psp.crt" --serve-cert "$PSP_DIR/psp.crt")
      ;;
  esac
  PROVIDERS_ENV=(FENCEHOOK_PROVIDERS="$PSP_DIR/providers.toml")
fi

# ---------------------------------------------------------------- build and services

say "load: building (release)"
run_child "$CARGO" build --locked --release
[[ -x $BIN ]] || die "no binary at $BIN after the build (is CARGO_TARGET_DIR set differently?)"

eval "$(DATABASE_URL=$PG_URL REDIS_URL=$REDIS_URL scripts/services.sh env)"
ADMIN_URL=$DATABASE_URL
LOAD_URL=${DATABASE_URL%/*}/$RUN
command -v psql >/dev/null 2>&1 || die "psql is needed to drop the load database"

exists=$(psql_admin -At -c "SELECT 1 FROM pg_database WHERE datname = '$RUN'")
[[ -z $exists ]] || die "a database $RUN exists already; refusing to use (and later drop) it"
# Migrated once here, before any instance starts: three instances creating and migrating the
# same new database at once would race each other.
DB_CREATED=1
run_child env DATABASE_URL="$LOAD_URL" "$BIN" migrate --create-database >"$LOG_DIR/migrate.log" 2>&1 ||
  die "migrate failed; see $LOG_DIR/migrate.log: $(tail -n 5 "$LOG_DIR/migrate.log")"

# ---------------------------------------------------------------- instances

# shellcheck source=scripts/instance.sh
. scripts/instance.sh
for ((i = 1; i <= INSTANCES; i++)); do
  # The providers of LOAD_SCHEME (above). Other FENCEHOOK_* settings in the environment (pool
  # size, TTLs, ...) are passed through. FENCEHOOK_MODE follows LOAD_MODE; in inbox mode
  # each instance runs its workers (FENCEHOOK_WORKERS, default 4, passed through when set).
  # Emptied here, not only by the redirection below, which runs in the child: wait_instance
  # could otherwise read the previous run's start line (its ports).
  : >"$LOG_DIR/instance-$i.log"
  env "${PROVIDERS_ENV[@]}" DATABASE_URL="$LOAD_URL" REDIS_URL="$REDIS_URL" \
    FENCEHOOK_MODE="$MODE" \
    FENCEHOOK_LISTEN=127.0.0.1:0 FENCEHOOK_ADMIN_LISTEN=127.0.0.1:0 \
    FENCEHOOK_REDIS_KEY_PREFIX="$RUN" FENCEHOOK_FENCE_KEY_TTL_SECS=86400 \
    FENCEHOOK_MIGRATE_ON_START=false FENCEHOOK_LOG_FORMAT=json \
    FENCEHOOK_GENERIC_SECRET="$SECRET" FENCEHOOK_ALLOW_PUBLISHED_SECRETS=true \
    "$BIN" serve >"$LOG_DIR/instance-$i.log" 2>&1 </dev/null 8>&- &
  PIDS+=("$!")
done

deadline=$((SECONDS + START_WAIT_SECS))
for ((i = 1; i <= INSTANCES; i++)); do
  log=$LOG_DIR/instance-$i.log pid=${PIDS[i - 1]}
  wait_instance "$pid" "$log" "$deadline" || die "instance $i did not come up"
  PORTS+=("$INSTANCE_PORT") ADMIN_PORTS+=("$INSTANCE_ADMIN_PORT")
  say "load: instance $i ready (pid $pid, http://127.0.0.1:$INSTANCE_PORT, admin :$INSTANCE_ADMIN_PORT, log $log)"
done

# ---------------------------------------------------------------- load, then audit

targets=()
for port in "${PORTS[@]}"; do targets+=(--target "http://127.0.0.1:$port"); done
mode_args=()
if [[ $MODE == inbox ]]; then
  # The load waits (bounded) until the workers have finished every event of the run, so the
  # audit below sees them booked, and reports the drain from the events table.
  mode_args=(--inbox --database-url "$LOAD_URL" --drain-timeout "${DRAIN_TIMEOUT}s")
fi
say "load: ${DURATION}s across $INSTANCES instances ($MODE mode, $SCHEME), k=$DUPLICATES, concurrency $CONCURRENCY"
load_rc=0
run_child env "${PROVIDERS_ENV[@]}" FENCEHOOK_GENERIC_SECRET="$SECRET" \
  "$BIN" load "${targets[@]}" "${mode_args[@]}" "${PSP_ARGS[@]}" \
  --duration "${DURATION}s" --duplicates "$DUPLICATES" --concurrency "$CONCURRENCY" \
  --run-id "$STAMP" --answers "$ANSWERS" >"$LOG_DIR/load-report.txt" || load_rc=$?

# Server-side counters, before the instances go.
for ((i = 1; i <= INSTANCES; i++)); do
  curl -s -m 5 "http://127.0.0.1:${ADMIN_PORTS[i - 1]}/metrics" >"$LOG_DIR/instance-$i.metrics" || true
done
stop_instances

audit_rc=0
run_child env DATABASE_URL="$LOAD_URL" "$BIN" audit --answers "$ANSWERS" >"$LOG_DIR/audit.txt" 2>&1 ||
  audit_rc=$?

# ---------------------------------------------------------------- report

# Sum of a counter over the instances' /metrics, optionally only the series with a label.
metric_sum() { # NAME [LABEL="VALUE"]
  cat "$LOG_DIR"/instance-*.metrics 2>/dev/null |
    awk -v name="$1" -v label="${2:-}" '
      index($1, name) == 1 && (length($1) == length(name) || substr($1, length(name) + 1, 1) == "{") &&
        (label == "" || index($1, label) > 0) { s += $NF }
      END { printf "%d", s }'
}

{
  mode_note=
  [[ $MODE == inbox ]] && mode_note=', inbox mode'
  printf '== make load: %d instances%s, scheme %s, %ss, k=%s, concurrency %s | database %s | logs %s/ ==\n\n' \
    "$INSTANCES" "$mode_note" "$SCHEME" "$DURATION" "$DUPLICATES" "$CONCURRENCY" "$RUN" "$LOG_DIR"
  cat "$LOG_DIR/load-report.txt"
  printf '\nserver side (summed over the instances)\n'
  for r in acquired held error; do
    printf '  %-48s %s\n' "fencehook_lease_acquire_total{result=\"$r\"}" \
      "$(metric_sum fencehook_lease_acquire_total "result=\"$r\"")"
  done
  for m in fencehook_lease_lost_total fencehook_fence_rejected_total fencehook_fence_resync_total; do
    printf '  %-48s %s\n' "$m" "$(metric_sum "$m")"
  done
  if [[ $MODE == inbox ]]; then
    for r in "done" retry requeued dead; do
      printf '  %-48s %s\n' "fencehook_inbox_attempts_total{result=\"$r\"}" \
        "$(metric_sum fencehook_inbox_attempts_total "result=\"$r\"")"
    done
  fi
  for ((i = 1; i <= INSTANCES; i++)); do
    log=$LOG_DIR/instance-$i.log
    printf '  instance %d: exit %s on SIGTERM, %s ERROR and %s WARN log lines (%s)\n' "$i" \
      "${INSTANCE_RC[i - 1]:-?}" "$(grep -c '"level":"ERROR"' "$log" || true)" \
      "$(grep -c '"level":"WARN"' "$log" || true)" "$log"
  done
  printf '\n'
  cat "$LOG_DIR/audit.txt"
  printf '\n'
  verdict=PASS
  ((load_rc == 0)) || { verdict=FAIL; printf 'load: fencehook load exited %d\n' "$load_rc"; }
  ((audit_rc == 0)) || { verdict=FAIL; printf 'load: fencehook audit exited %d\n' "$audit_rc"; }
  for rc in "${INSTANCE_RC[@]}"; do
    [[ $rc == 0 ]] || printf 'load: note: an instance exited %s on SIGTERM (see its log)\n' "$rc"
  done
  printf '== make load: %s ==\n' "$verdict"
} | tee "$LOG_DIR/report.txt"

((load_rc == 0 && audit_rc == 0)) || exit 1
