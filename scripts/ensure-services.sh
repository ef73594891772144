#!/usr/bin/env bash
# ensure-services.sh - make sure PostgreSQL and Redis answer before CI runs fencehook's tests.
#
# Usage:
#   scripts/ensure-services.sh
#
# Environment:
#   DATABASE_URL               default postgres://postgres@127.0.0.1:5432/postgres
#   REDIS_URL                  default redis://127.0.0.1:6379
#   FENCEHOOK_SERVICE_TIMEOUT  seconds to wait for a service after starting it (default 30)
#
# For each service that does not answer: if its URL is the machine's default local
# address (127.0.0.1:5432 / 127.0.0.1:6379; localhost and ::1 count too) and the
# machine's start command is available, run that command and wait for the service.
# A URL that points anywhere else is never "fixed" by starting something: it fails.
#
# Prints one line per service ("<service>: ok (already running)" / "<service>: started"
# on stdout, or "<service>: ERROR: ..." on stderr).  Exit status 0 when both answer, 1 if not.
set -euo pipefail

DATABASE_URL=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}
REDIS_URL=${REDIS_URL:-redis://127.0.0.1:6379}
TIMEOUT=${FENCEHOOK_SERVICE_TIMEOUT:-30}

err() { printf '%s\n' "$*" >&2; }

# URL with any password replaced by ***, for messages.
redact() { sed -E 's#^([a-zA-Z][a-zA-Z0-9+.-]*://[^:/@]*):[^@/]*@#\1:***@#' <<<"$1"; }

# Indent a multi-line command output for an error message.
indent() { printf '    %s\n' "${1//$'\n'/$'\n'    }"; }

run_with_timeout() { # SECONDS CMD...
  if command -v timeout >/dev/null 2>&1; then timeout "$@"; else shift; "$@"; fi
}

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

# A PostgreSQL client tool: from PATH, else from the newest /usr/lib/postgresql/*/bin.
pg_tool() {
  local d
  if command -v "$1" >/dev/null 2>&1; then command -v "$1"; return 0; fi
  while IFS= read -r d; do
    [[ -x $d/$1 ]] && { printf '%s\n' "$d/$1"; return 0; }
  done < <(printf '%s\n' /usr/lib/postgresql/*/bin | sort -rV)
  return 1
}

# Checks set CHECK_MSG and return 0 = answers, 1 = not answering, 2 = answers but unusable.
CHECK_MSG=

check_postgres() {
  local out rc=0
  out=$("$PG_ISREADY" -d "$DATABASE_URL" -t 5 2>&1 </dev/null) || rc=$?
  CHECK_MSG=$out
  case $rc in
    0) ;;
    3) return 2 ;; # no attempt made: the URL itself is unusable
    *) return 1 ;; # 1 = rejecting connections (starting/stopping), 2 = no response
  esac
  rc=0
  out=$(PGCONNECT_TIMEOUT=5 "$PSQL" "$DATABASE_URL" -X -w -q -t -A -c 'select 1' 2>&1 </dev/null) || rc=$?
  CHECK_MSG=$out
  ((rc == 0)) || return 2
}

check_redis() {
  local out rc=0
  out=$(run_with_timeout 5 redis-cli --no-auth-warning -u "$REDIS_URL" ping 2>&1 </dev/null) || rc=$?
  CHECK_MSG=$out
  if [[ $out == PONG ]]; then return 0; fi
  if ((rc == 124)) || [[ -z $out || $out == *"Could not connect"* || $out == LOADING* ]]; then
    [[ -n $out ]] || CHECK_MSG="no answer within 5 s"
    return 1
  fi
  return 2
}

# wait_until CHECK_FUNCTION SECONDS: poll until the check says 0 or 2, or time runs out.
wait_until() {
  local deadline=$((SECONDS + $2)) rc
  while :; do
    rc=0
    "$1" || rc=$?
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

# ensure NAME URL DEFAULT_PORT CHECK_FUNCTION START_FUNCTION
ensure() {
  local name=$1 url=$2 default_port=$3 check=$4 start=$5 shown rc=0
  shown=$(redact "$url")

  "$check" || rc=$?
  case $rc in
    0) printf '%s: ok (already running)\n' "$name"; return 0 ;;
    2) err "$name: ERROR: something answers at $shown but it is not usable:"
       err "$(indent "$CHECK_MSG")"
       return 1 ;;
  esac

  if ! is_default_local "$url" "$default_port"; then
    err "$name: ERROR: nothing answers at $shown:"
    err "$(indent "$CHECK_MSG")"
    err "$name: that is not the machine's default 127.0.0.1:$default_port, so nothing was started;"
    err "$name: start the service at that address or fix the URL."
    return 1
  fi

  local START_DESC='' START_OUT='' START_RC=0
  "$start" || return 1 # sets START_DESC / START_OUT / START_RC; returns 1 if it cannot start

  # If the start command itself failed, give the service only a short grace period.
  rc=0
  if ((START_RC == 0)); then wait_until "$check" "$TIMEOUT" || rc=$?
  else wait_until "$check" 5 || rc=$?
  fi
  if ((rc == 0)); then printf '%s: started\n' "$name"; return 0; fi

  if ((rc == 2)); then
    err "$name: ERROR: started it, and now something answers at $shown but it is not usable:"
  elif ((START_RC != 0)); then
    err "$name: ERROR: not answering at $shown, and starting it failed (exit $START_RC): $START_DESC"
  else
    err "$name: ERROR: ran \`$START_DESC\`, but still nothing answers at $shown after ${TIMEOUT} s:"
  fi
  err "$(indent "$CHECK_MSG")"
  [[ -z $START_OUT ]] || { err "$name: output of the start command:"; err "$(indent "$START_OUT")"; }
  return 1
}

start_postgres() {
  local version
  if ! command -v pg_ctlcluster >/dev/null 2>&1; then
    err "postgres: ERROR: nothing answers at $(redact "$DATABASE_URL") ($CHECK_MSG),"
    err "postgres: and pg_ctlcluster is not installed, so the machine's PostgreSQL cannot be started."
    return 1
  fi
  if ! version=$(pg_cluster_version); then
    err "postgres: ERROR: nothing answers at $(redact "$DATABASE_URL") ($CHECK_MSG),"
    err "postgres: and /etc/postgresql has no (unambiguous) 'main' cluster to start."
    return 1
  fi
  START_DESC="pg_ctlcluster --skip-systemctl-redirect $version main start"
  START_OUT=$(pg_ctlcluster --skip-systemctl-redirect "$version" main start 2>&1 </dev/null) || START_RC=$?
}

start_redis() {
  if ! command -v redis-server >/dev/null 2>&1; then
    err "redis: ERROR: nothing answers at $(redact "$REDIS_URL") ($CHECK_MSG),"
    err "redis: and redis-server is not installed, so the machine's Redis cannot be started."
    return 1
  fi
  START_DESC='redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log'
  START_OUT=$(redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log 2>&1 </dev/null) || START_RC=$?
}

main() {
  local failed=0
  if [[ $# -gt 0 ]]; then
    err "usage: $0   (configure with DATABASE_URL, REDIS_URL, FENCEHOOK_SERVICE_TIMEOUT)"
    exit 2
  fi

  if PG_ISREADY=$(pg_tool pg_isready) && PSQL=$(pg_tool psql); then
    ensure postgres "$DATABASE_URL" 5432 check_postgres start_postgres || failed=1
  else
    err "postgres: ERROR: cannot check $(redact "$DATABASE_URL"): pg_isready/psql are not installed (apt-get install -y postgresql-client)."
    failed=1
  fi

  if command -v redis-cli >/dev/null 2>&1; then
    ensure redis "$REDIS_URL" 6379 check_redis start_redis || failed=1
  else
    err "redis: ERROR: cannot check $(redact "$REDIS_URL"): redis-cli is not installed (apt-get install -y redis-tools)."
    failed=1
  fi

  return "$failed"
}

main "$@"
