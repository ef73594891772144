# instance.sh - sourced by load.sh and bench.sh: wait for a `fencehook serve` started with
# FENCEHOOK_LISTEN=127.0.0.1:0, FENCEHOOK_ADMIN_LISTEN=127.0.0.1:0 and FENCEHOOK_LOG_FORMAT=json
# to log its ports and answer /readyz. Each instance binds port 0 for both listeners and logs
# the ports the kernel gave it: free ports without the race of probing a port and binding it later.
# shellcheck shell=bash disable=SC2034  # INSTANCE_* are read by the sourcing script

# wait_instance PID LOG DEADLINE: sets INSTANCE_PORT and INSTANCE_ADMIN_PORT, or prints why
# not on stderr and returns 1. DEADLINE is a value of $SECONDS. LOG must be new or emptied by
# the caller before the instance starts (a `2>LOG &` redirection empties it in the child, maybe
# after this has read an earlier run's ports from it).
wait_instance() {
  local pid=$1 log=$2 deadline=$3 line
  until line=$(grep -m1 '"fencehook serving"' "$log" 2>/dev/null); do
    kill -0 "$pid" 2>/dev/null || { printf 'instance exited at start; see %s: %s\n' "$log" "$(tail -n 5 "$log")" >&2; return 1; }
    ((SECONDS < deadline)) || { printf 'instance did not start in time; see %s\n' "$log" >&2; return 1; }
    sleep 0.1
  done
  [[ $line =~ \"port\":([0-9]+) ]] && INSTANCE_PORT=${BASH_REMATCH[1]}
  [[ $line =~ \"admin_port\":([0-9]+) ]] && INSTANCE_ADMIN_PORT=${BASH_REMATCH[1]}
  until [[ $(curl -s -o /dev/null -m 2 -w '%{http_code}' "http://127.0.0.1:$INSTANCE_ADMIN_PORT/readyz") == 200 ]]; do
    kill -0 "$pid" 2>/dev/null || { printf 'instance exited before it was ready; see %s: %s\n' "$log" "$(tail -n 5 "$log")" >&2; return 1; }
    ((SECONDS < deadline)) || { printf 'instance not ready in time: %s\n' "$(curl -s -m 2 "http://127.0.0.1:$INSTANCE_ADMIN_PORT/readyz")" >&2; return 1; }
    sleep 0.1
  done
}
