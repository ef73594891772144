#!/usr/bin/env bash
# services.sh - PostgreSQL and Redis for fencehook: private ones for a developer, the machine's own for CI.
#
# Usage:
#   eval "$(scripts/services.sh env)"   print `export DATABASE_URL=... REDIS_URL=...` lines
#   . scripts/services.sh               (from bash) the same, exported into the current shell
#   scripts/services.sh machine         CI: make sure the machine's own services answer
#   scripts/services.sh stop            stop the private instances this script started
#   scripts/services.sh clean           stop them and delete their data directory
#
# Environment:
#   DATABASE_URL       default postgres://postgres@127.0.0.1:5432/postgres
#   REDIS_URL          default redis://127.0.0.1:6379
#   FENCEHOOK_DEV_DIR  where private instances live (default $PWD/target/dev-services)
#   PG_BINDIR          directory with initdb/pg_ctl (default: newest /usr/lib/postgresql/*/bin)
#
#   FENCEHOOK_SERVICE_TIMEOUT  `machine`: seconds to wait for a service it started (default 30)
#
# `env`: a service that answers at its URL is used as is.  For one that does not answer, a
# private throwaway instance is started from the installed binaries on a free 127.0.0.1 port
# (PostgreSQL from 55432 up, Redis from 56379 up) under FENCEHOOK_DEV_DIR, or reused if an
# earlier call already started it; the printed URL then points at it.  Messages go to
# stderr; only the export lines go to stdout.  On failure stdout carries `false`, so that
# `eval "$(scripts/services.sh env)"` fails too instead of silently doing nothing.
# `env`, `stop` and `clean` never start or stop the machine's own services.
#
# `machine`: for each service that does not answer, if its URL is the machine's default local
# address (127.0.0.1:5432 / 127.0.0.1:6379; localhost and ::1 count too), run the machine's
# start command for it and wait; a URL that points anywhere else is never "fixed" by starting
# something. One line per service on stdout ("<service>: ok (already running)" / "<service>:
# started"), errors on stderr; exit 0 when both answer, 1 if not.

# Sourced: run as a child process and eval its output, so set -e / exit never hit the caller.
if [[ ${BASH_SOURCE[0]} != "$0" ]]; then
  if __fencehook_env=$(bash "${BASH_SOURCE[0]}" env); then
    eval "$__fencehook_env"
    unset __fencehook_env
    return 0
  fi
  unset __fencehook_env
  return 1
fi

set -euo pipefail

DEFAULT_DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres
DEFAULT_REDIS_URL=redis://127.0.0.1:6379
DATABASE_URL=${DATABASE_URL:-$DEFAULT_DATABASE_URL}
REDIS_URL=${REDIS_URL:-$DEFAULT_REDIS_URL}

DEV_DIR=${FENCEHOOK_DEV_DIR:-$PWD/target/dev-services}
[[ $DEV_DIR == /* ]] || DEV_DIR=$PWD/$DEV_DIR
PG_DIR=$DEV_DIR/postgres   # owned by the postgres user when we run as root
PG_DATA=$PG_DIR/data
REDIS_DIR=$DEV_DIR/redis
PG_FIRST_PORT=55432
REDIS_FIRST_PORT=56379
PORT_TRIES=200
PG_OS_USER=postgres        # PostgreSQL refuses to run as root; this user runs it then

SELF=$0
INSTALL_CMD="apt-get install -y postgresql redis-server"
[[ $(id -u) == 0 ]] || INSTALL_CMD="sudo $INSTALL_CMD"

say() { printf '%s\n' "$*" >&2; }
die() { say "fencehook: $*"; exit 1; }

need_install() { # WHAT
  say "fencehook: $1"
  say "fencehook: install PostgreSQL and Redis with:"
  say "    $INSTALL_CMD"
  exit 1
}

# URL with any password replaced by ***, for messages.
redact() { sed -E 's#^([a-zA-Z][a-zA-Z0-9+.-]*://[^:/@]*):[^@/]*@#\1:***@#' <<<"$1"; }

# Single-quote for sh (the export lines, and pg_ctl -o which goes through /bin/sh).
sq() { printf "'%s'" "${1//\'/\'\\\'\'}"; }

run_with_timeout() { # SECONDS CMD...
  if command -v timeout >/dev/null 2>&1; then timeout "$@"; else shift; "$@"; fi
}

# The part of a URL after host[:port] (path, query), e.g. "/postgres" or "/0".
url_tail() {
  local rest=${1#*://} authority
  authority=${rest%%[/?#]*}
  printf '%s' "${rest#"$authority"}"
}

# ---------------------------------------------------------------- tool lookup

pg_bindir() {
  local d
  if [[ -n ${PG_BINDIR:-} ]]; then printf '%s\n' "$PG_BINDIR"; return 0; fi
  while IFS= read -r d; do
    [[ -x $d/initdb && -x $d/pg_ctl ]] && { printf '%s\n' "$d"; return 0; }
  done < <(printf '%s\n' /usr/lib/postgresql/*/bin | sort -rV)
  if command -v initdb >/dev/null 2>&1; then dirname "$(command -v initdb)"; return 0; fi
  return 1
}

# A PostgreSQL client tool: from PATH, else from the server's bin directory.
pg_client() {
  local d
  if command -v "$1" >/dev/null 2>&1; then command -v "$1"; return 0; fi
  d=$(pg_bindir) && [[ -x $d/$1 ]] && { printf '%s\n' "$d/$1"; return 0; }
  return 1
}

# ---------------------------------------------------------------- checks

# Checks set CHECK_MSG and return 0 = answers, 1 = not answering, 2 = answers but unusable.
CHECK_MSG=

check_postgres() { # URL
  local out rc=0
  out=$("$PG_ISREADY" -d "$1" -t 5 2>&1 </dev/null) || rc=$?
  CHECK_MSG=$out
  case $rc in
    0) ;;
    3) return 2 ;; # no attempt made: the URL itself is unusable
    *) return 1 ;;
  esac
  rc=0
  out=$(PGCONNECT_TIMEOUT=5 "$PSQL" "$1" -X -w -q -t -A -c 'select 1' 2>&1 </dev/null) || rc=$?
  CHECK_MSG=$out
  ((rc == 0)) || return 2
}

check_redis() { # URL
  local out rc=0
  out=$(run_with_timeout 5 redis-cli --no-auth-warning -u "$1" ping 2>&1 </dev/null) || rc=$?
  CHECK_MSG=$out
  if [[ $out == PONG ]]; then return 0; fi
  if ((rc == 124)) || [[ -z $out || $out == *"Could not connect"* || $out == LOADING* ]]; then
    return 1
  fi
  return 2
}

port_in_use() { # PORT
  local out
  if command -v ss >/dev/null 2>&1 && out=$(ss -Hltn "sport = :$1" 2>/dev/null); then
    [[ -n $out ]]
  else
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
  fi
}

pick_port() { # FIRST_PORT [PREFERRED_PORT]
  local p
  if [[ ${2:-} =~ ^[0-9]+$ ]] && ! port_in_use "$2"; then printf '%s\n' "$2"; return 0; fi
  for ((p = $1; p < $1 + PORT_TRIES; p++)); do
    port_in_use "$p" || { printf '%s\n' "$p"; return 0; }
  done
  die "no free port in $1-$(($1 + PORT_TRIES - 1)) on 127.0.0.1"
}

read_port() { # FILE
  local p=
  [[ -f $1 ]] && p=$(<"$1")
  [[ $p =~ ^[0-9]+$ ]] && printf '%s\n' "$p"
  return 0
}

# ---------------------------------------------------------------- private PostgreSQL

# Run a command as the user that owns the private cluster (ourselves, or postgres if root).
as_pg() {
  if [[ $(id -u) != 0 ]]; then
    (cd "$PG_DIR" && "$@")
  elif command -v runuser >/dev/null 2>&1; then
    (cd "$PG_DIR" && runuser -u "$PG_OS_USER" -- "$@")
  else
    (cd "$PG_DIR" && su -s /bin/bash "$PG_OS_USER" -c "$(printf '%q ' "$@")")
  fi
}

# Port of our running private cluster, if there is one.
private_pg_port() {
  local port pid pidport
  port=$(read_port "$PG_DIR/port")
  [[ -n $port && -f $PG_DATA/postmaster.pid ]] || return 1
  pid=$(sed -n 1p "$PG_DATA/postmaster.pid")
  pidport=$(sed -n 4p "$PG_DATA/postmaster.pid")
  [[ $pid =~ ^[0-9]+$ && $pidport == "$port" ]] || return 1
  kill -0 "$pid" 2>/dev/null || return 1
  "$PG_ISREADY" -h 127.0.0.1 -p "$port" -t 3 >/dev/null 2>&1 || return 1
  printf '%s\n' "$port"
}

require_pg_server() { # sets PG_SERVER_BINDIR
  if ! PG_SERVER_BINDIR=$(pg_bindir) ||
    ! [[ -x $PG_SERVER_BINDIR/initdb && -x $PG_SERVER_BINDIR/pg_ctl && -x $PG_SERVER_BINDIR/postgres ]]; then
    need_install "no PostgreSQL answers at $(redact "$DATABASE_URL"), and the PostgreSQL server binaries (initdb, pg_ctl, postgres) to start a private one are not installed."
  fi
}

# Start (or find) the private cluster; sets PRIVATE_URL and PRIVATE_STATE (started|reused).
private_postgres() {
  local bindir=$PG_SERVER_BINDIR port version data_version dbname sockdir rc

  mkdir -p "$PG_DIR"
  if [[ $(id -u) == 0 ]]; then
    id "$PG_OS_USER" >/dev/null 2>&1 ||
      die "running as root, and there is no '$PG_OS_USER' user to run a private PostgreSQL as (PostgreSQL refuses to run as root)."
    chown -R "$PG_OS_USER:" "$PG_DIR"
    as_pg test -w "$PG_DIR" 2>/dev/null ||
      die "the '$PG_OS_USER' user cannot write $PG_DIR (a parent directory is closed to it); set FENCEHOOK_DEV_DIR to a directory it can reach, e.g. FENCEHOOK_DEV_DIR=/tmp/fencehook-dev-services"
  fi

  # Database name from the URL (created in the private cluster if it is not "postgres").
  dbname=$(url_tail "$DATABASE_URL")
  dbname=${dbname%%[?#]*}
  dbname=${dbname#/}
  [[ $dbname =~ ^[A-Za-z0-9_-]+$ ]] || dbname=postgres

  PRIVATE_STATE=reused
  if ! port=$(private_pg_port); then
    PRIVATE_STATE=started
    # (Re)initialise when there is no cluster yet or it belongs to another major version.
    version=$("$bindir/postgres" --version | sed -nE 's/^[^0-9]*([0-9]+).*/\1/p')
    data_version=
    [[ -f $PG_DATA/PG_VERSION ]] && data_version=$(<"$PG_DATA/PG_VERSION")
    if [[ $data_version != "$version" ]]; then
      rm -rf "$PG_DATA"
      as_pg "$bindir/initdb" -D "$PG_DATA" -U postgres --auth=trust -E UTF8 --no-locale --no-sync \
        </dev/null >"$PG_DIR/initdb.log" 2>&1 9>&- ||
        die "initdb failed; see $PG_DIR/initdb.log:$(printf '\n'; tail -n 20 "$PG_DIR/initdb.log")"
    fi

    port=$(pick_port "$PG_FIRST_PORT" "$(read_port "$PG_DIR/port")")
    sockdir=$PG_DIR
    # Unix socket paths are limited to ~107 bytes; without room, listen on TCP only.
    ((${#sockdir} + 20 < 104)) || sockdir=
    rc=0
    as_pg "$bindir/pg_ctl" -D "$PG_DATA" -l "$PG_DIR/postgres.log" -w -t 60 \
      -o "-p $port -c listen_addresses=127.0.0.1 -c unix_socket_directories=$(sq "$sockdir")" start \
      </dev/null >"$PG_DIR/pg_ctl.log" 2>&1 9>&- || rc=$?
    ((rc == 0)) ||
      die "starting a private PostgreSQL on port $port failed; see $PG_DIR/postgres.log:$(printf '\n'; tail -n 20 "$PG_DIR/postgres.log" 2>/dev/null)"
    printf '%s\n' "$port" >"$PG_DIR/port"
  fi

  if [[ $dbname != postgres ]]; then
    "$PSQL" -X -w -q -h 127.0.0.1 -p "$port" -U postgres -d postgres -v ON_ERROR_STOP=1 -v db="$dbname" \
      >/dev/null <<'SQL' || die "could not create database $dbname in the private PostgreSQL on port $port"
SELECT format('CREATE DATABASE %I', :'db') WHERE NOT EXISTS (SELECT 1 FROM pg_database WHERE datname = :'db')
\gexec
SQL
  fi
  PRIVATE_URL="postgres://postgres@127.0.0.1:$port/$dbname"
}

stop_private_postgres() {
  local pid bindir
  if [[ ! -f $PG_DATA/postmaster.pid ]]; then say "fencehook: no private PostgreSQL running (in $PG_DIR)"; return 0; fi
  pid=$(sed -n 1p "$PG_DATA/postmaster.pid")
  if ! [[ $pid =~ ^[0-9]+$ ]] || ! kill -0 "$pid" 2>/dev/null; then
    say "fencehook: no private PostgreSQL running (stale pid file in $PG_DATA)"
    return 0
  fi
  bindir=$(pg_bindir) || die "pg_ctl not found; cannot stop the private PostgreSQL (pid $pid)"
  as_pg "$bindir/pg_ctl" -D "$PG_DATA" -m fast -w -t 60 stop </dev/null >/dev/null 2>&1 ||
    die "pg_ctl stop failed for the private PostgreSQL in $PG_DATA (pid $pid)"
  say "fencehook: stopped the private PostgreSQL (port $(read_port "$PG_DIR/port"), pid $pid)"
}

# ---------------------------------------------------------------- private Redis

# Port of our running private Redis, if there is one (checked against its pid file).
private_redis_port() {
  local port pid info
  port=$(read_port "$REDIS_DIR/port")
  [[ -n $port && -f $REDIS_DIR/redis.pid ]] || return 1
  pid=$(<"$REDIS_DIR/redis.pid")
  info=$(run_with_timeout 5 redis-cli -h 127.0.0.1 -p "$port" info server 2>/dev/null </dev/null) || return 1
  [[ $info == *"process_id:$pid"$'\r'* ]] || return 1
  printf '%s\n' "$port"
}

require_redis_server() {
  command -v redis-server >/dev/null 2>&1 ||
    need_install "no Redis answers at $(redact "$REDIS_URL"), and redis-server to start a private one is not installed."
}

private_redis() {
  local port
  mkdir -p "$REDIS_DIR"

  PRIVATE_STATE=reused
  if ! port=$(private_redis_port); then
    PRIVATE_STATE=started
    port=$(pick_port "$REDIS_FIRST_PORT" "$(read_port "$REDIS_DIR/port")")
    rm -f "$REDIS_DIR/redis.pid"
    redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --daemonize yes \
      --pidfile "$REDIS_DIR/redis.pid" --logfile "$REDIS_DIR/redis.log" --dir "$REDIS_DIR" \
      </dev/null >"$REDIS_DIR/redis-start.log" 2>&1 9>&- ||
      die "starting a private Redis on port $port failed:$(printf '\n'; tail -n 20 "$REDIS_DIR/redis-start.log")"
    printf '%s\n' "$port" >"$REDIS_DIR/port"
    local deadline=$((SECONDS + 15))
    until check_redis "redis://127.0.0.1:$port"; do
      ((SECONDS < deadline)) ||
        die "the private Redis on port $port does not answer; see $REDIS_DIR/redis.log:$(printf '\n'; tail -n 20 "$REDIS_DIR/redis.log")"
      sleep 0.2
    done
  fi
  PRIVATE_URL="redis://127.0.0.1:$port$(url_tail "$REDIS_URL")"
}

stop_private_redis() {
  local port pid
  if ! port=$(private_redis_port); then say "fencehook: no private Redis running (in $REDIS_DIR)"; return 0; fi
  pid=$(<"$REDIS_DIR/redis.pid")
  run_with_timeout 10 redis-cli -h 127.0.0.1 -p "$port" shutdown nosave >/dev/null 2>&1 </dev/null || true
  local deadline=$((SECONDS + 15))
  while kill -0 "$pid" 2>/dev/null; do
    ((SECONDS < deadline)) || die "the private Redis (pid $pid, port $port) did not stop"
    sleep 0.2
  done
  say "fencehook: stopped the private Redis (port $port, pid $pid)"
}

# ---------------------------------------------------------------- commands

LOCKED=0
lock_dev_dir() { # serialise concurrent calls (e.g. make -j); fd 9 is closed for the daemons
  ((LOCKED == 0)) || return 0
  LOCKED=1
  mkdir -p "$DEV_DIR"
  if command -v flock >/dev/null 2>&1; then
    exec 9>"$DEV_DIR/.lock"
    flock -w 120 9 || die "timed out waiting for the lock $DEV_DIR/.lock"
  fi
}

find_client_tools() {
  if ! PG_ISREADY=$(pg_client pg_isready) || ! PSQL=$(pg_client psql); then
    need_install "pg_isready/psql are not installed, so PostgreSQL cannot be checked."
  fi
  command -v redis-cli >/dev/null 2>&1 ||
    need_install "redis-cli is not installed, so Redis cannot be checked."
}

cmd_env() {
  local db_url=$DATABASE_URL redis_url=$REDIS_URL pg_rc=0 redis_rc=0 PRIVATE_URL PRIVATE_STATE
  # On failure put `false` on stdout, so that `eval "$(... env)"` fails as well.
  trap 'if (($? != 0)); then echo "false # fencehook: services.sh env failed"; fi' EXIT
  find_client_tools

  # Check both first, and only then start anything, so a failure leaves nothing half-done.
  check_postgres "$DATABASE_URL" || pg_rc=$?
  ((pg_rc != 2)) || die "PostgreSQL answers at $(redact "$DATABASE_URL") but is not usable: $CHECK_MSG"
  check_redis "$REDIS_URL" || redis_rc=$?
  ((redis_rc != 2)) || die "Redis answers at $(redact "$REDIS_URL") but is not usable: $CHECK_MSG"
  ((pg_rc == 0)) || require_pg_server
  ((redis_rc == 0)) || require_redis_server

  if ((pg_rc == 0)); then
    say "# fencehook: using PostgreSQL at $(redact "$DATABASE_URL")"
  else
    lock_dev_dir
    private_postgres
    db_url=$PRIVATE_URL
    if [[ $PRIVATE_STATE == started ]]; then
      say "fencehook: no PostgreSQL at $(redact "$DATABASE_URL"); started a private throwaway one at $db_url (data in $PG_DIR)"
    else
      say "fencehook: no PostgreSQL at $(redact "$DATABASE_URL"); using the private throwaway one started earlier at $db_url (data in $PG_DIR)"
    fi
  fi

  if ((redis_rc == 0)); then
    say "# fencehook: using Redis at $(redact "$REDIS_URL")"
  else
    lock_dev_dir
    private_redis
    redis_url=$PRIVATE_URL
    if [[ $PRIVATE_STATE == started ]]; then
      say "fencehook: no Redis at $(redact "$REDIS_URL"); started a private throwaway one at $redis_url (data in $REDIS_DIR)"
    else
      say "fencehook: no Redis at $(redact "$REDIS_URL"); using the private throwaway one started earlier at $redis_url (data in $REDIS_DIR)"
    fi
  fi

  ((pg_rc == 0 && redis_rc == 0)) || say "fencehook: stop the private instance(s) with: $SELF stop"
  printf 'export DATABASE_URL=%s\n' "$(sq "$db_url")"
  printf 'export REDIS_URL=%s\n' "$(sq "$redis_url")"
}

cmd_stop() {
  if [[ ! -d $DEV_DIR ]]; then say "fencehook: no private instances (no $DEV_DIR)"; return 0; fi
  find_client_tools
  lock_dev_dir
  stop_private_postgres
  stop_private_redis
}

cmd_clean() {
  cmd_stop
  [[ -d $DEV_DIR ]] || return 0
  rm -rf "$PG_DIR" "$REDIS_DIR" "$DEV_DIR/.lock"
  rmdir "$DEV_DIR" 2>/dev/null || true
  say "fencehook: deleted the private instances' data in $DEV_DIR"
}

# ---------------------------------------------------------------- machine (CI)

TIMEOUT=${FENCEHOOK_SERVICE_TIMEOUT:-30}

# Indent a multi-line command output for an error message.
indent() { printf '    %s\n' "${1//$'\n'/$'\n'    }"; }

# url_host_port URL DEFAULT_PORT: sets URL_HOST and URL_PORT.
url_host_port() {
  local hostport=${1#*://}
  hostport=${hostport%%[/?#]*}
  hostport=${hostport##*@}
  if [[ $hostport == \[* ]]; then # [ipv6]:port
    URL_HOST=${hostport%%]*}
    URL_HOST=${URL_HOST#\[}
    URL_PORT=${hostport#*]}
    URL_PORT=${URL_PORT#:}
  else
    URL_HOST=${hostport%%:*}
    URL_PORT=
    [[ $hostport == *:* ]] && URL_PORT=${hostport#*:}
  fi
  URL_PORT=${URL_PORT:-$2}
}

is_default_local() { # URL DEFAULT_PORT
  url_host_port "$1" "$2"
  [[ $URL_HOST == 127.0.0.1 || $URL_HOST == localhost || $URL_HOST == ::1 ]] && [[ $URL_PORT == "$2" ]]
}

# wait_until CHECK_FUNCTION URL SECONDS: poll until the check says 0 or 2, or time runs out.
wait_until() {
  local deadline=$((SECONDS + $3)) rc
  while :; do
    rc=0
    "$1" "$2" || rc=$?
    ((rc != 1)) && return "$rc"
    ((SECONDS >= deadline)) && return 1
    sleep 1
  done
}

# The version of the machine's "main" cluster (normally the only entry of /etc/postgresql).
pg_cluster_version() {
  local d v port found=()
  for d in /etc/postgresql/*/main; do
    [[ -f $d/postgresql.conf ]] && found+=("$(basename "$(dirname "$d")")")
  done
  if ((${#found[@]} == 1)); then printf '%s\n' "${found[0]}"; return 0; fi
  for v in ${found[@]+"${found[@]}"}; do # several: take the one on port 5432
    port=$(sed -nE 's/^[[:space:]]*port[[:space:]]*=[[:space:]]*([0-9]+).*/\1/p' \
      "/etc/postgresql/$v/main/postgresql.conf" | tail -n 1)
    [[ ${port:-5432} == 5432 ]] && { printf '%s\n' "$v"; return 0; }
  done
  return 1
}

# The machine's start commands; each sets START_DESC, START_OUT and START_RC, or returns 1.
start_machine_postgres() {
  local version
  command -v pg_ctlcluster >/dev/null 2>&1 || { say "postgres: ERROR: pg_ctlcluster is not installed, so the machine's PostgreSQL cannot be started."; return 1; }
  version=$(pg_cluster_version) || { say "postgres: ERROR: /etc/postgresql has no (unambiguous) 'main' cluster to start."; return 1; }
  START_DESC="pg_ctlcluster --skip-systemctl-redirect $version main start"
  START_OUT=$(pg_ctlcluster --skip-systemctl-redirect "$version" main start 2>&1 </dev/null) || START_RC=$?
}

start_machine_redis() {
  command -v redis-server >/dev/null 2>&1 || { say "redis: ERROR: redis-server is not installed, so the machine's Redis cannot be started."; return 1; }
  START_DESC='redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log'
  START_OUT=$(redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log 2>&1 </dev/null) || START_RC=$?
}

# ensure_machine NAME URL DEFAULT_PORT CHECK_FUNCTION START_FUNCTION
ensure_machine() {
  local name=$1 url=$2 default_port=$3 check=$4 start=$5 shown rc=0
  shown=$(redact "$url")
  "$check" "$url" || rc=$?
  case $rc in
    0) printf '%s: ok (already running)\n' "$name"; return 0 ;;
    2) say "$name: ERROR: something answers at $shown but it is not usable:"
       say "$(indent "$CHECK_MSG")"
       return 1 ;;
  esac
  if ! is_default_local "$url" "$default_port"; then
    say "$name: ERROR: nothing answers at $shown:"
    say "$(indent "$CHECK_MSG")"
    say "$name: that is not the machine's default 127.0.0.1:$default_port, so nothing was started."
    return 1
  fi
  local START_DESC='' START_OUT='' START_RC=0
  "$start" || return 1
  rc=0
  if ((START_RC == 0)); then wait_until "$check" "$url" "$TIMEOUT" || rc=$?
  else wait_until "$check" "$url" 5 || rc=$?
  fi
  if ((rc == 0)); then printf '%s: started (%s)\n' "$name" "$START_DESC"; return 0; fi
  if ((rc == 2)); then
    say "$name: ERROR: started it, and now something answers at $shown but it is not usable:"
  elif ((START_RC != 0)); then
    say "$name: ERROR: not answering at $shown, and starting it failed (exit $START_RC): $START_DESC"
  else
    say "$name: ERROR: ran \`$START_DESC\`, but still nothing answers at $shown after ${TIMEOUT} s:"
  fi
  say "$(indent "$CHECK_MSG")"
  [[ -z $START_OUT ]] || { say "$name: output of the start command:"; say "$(indent "$START_OUT")"; }
  return 1
}

cmd_machine() {
  local failed=0
  find_client_tools
  ensure_machine postgres "$DATABASE_URL" 5432 check_postgres start_machine_postgres || failed=1
  ensure_machine redis "$REDIS_URL" 6379 check_redis start_machine_redis || failed=1
  return "$failed"
}

usage() {
  sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

case ${1:-} in
  env) cmd_env ;;
  machine) cmd_machine ;;
  stop) cmd_stop ;;
  clean) cmd_clean ;;
  -h | --help | help) usage ;;
  *) say "fencehook: unknown or missing command '${1:-}'"; usage ;;
esac
