#!/usr/bin/env bash
# tools.sh - the programs fencehook's tests and lints run, installed from Debian's packages
# where missing, so that `make test` passes on a fresh machine without a separate step.
#
# Usage:
#   scripts/tools.sh list [test|lint|image|all]     one line per program: program package groups why
#   scripts/tools.sh missing [test|lint|image|all]  the packages whose program is missing (one line; empty: none)
#   scripts/tools.sh install [test|lint|image|all]  install those (one apt-get run, after fetching the package
#                                             lists), saying first what is missing and why; silent when
#                                             nothing is. Exit 1 when a program is still missing after it.
#
# test: what the integration tests run (tests/api/deploy.rs, console_browser.rs, patroni.rs,
# container.rs); lint: what `make lint` runs besides cargo's own subcommands (those `make tools`
# installs with cargo) and PyPI's hadolint; image: what `make image` runs. A program may be in several
# groups (`test,image`).
#
# Environment:
#   TOOLS_PATH     where programs are looked for (default: $PATH plus the sbin directories a
#                  non-root PATH lacks: nginx is /usr/sbin/nginx)
#   TOOLS_APT_GET  the apt-get to run (default: apt-get as root, `sudo -n apt-get` otherwise)
#
# RUNLEVEL=1 keeps the packages from starting a system nginx, etcd or Patroni: the tests run
# their own, on ports of their own.
set -euo pipefail

# program package groups why
TOOLS="\
nginx nginx test tests/api/deploy.rs runs deploy/nginx.conf in front of fencehook
systemd-analyze systemd test tests/api/deploy.rs verifies the systemd units
chromium chromium test the console's browser tests (tests/api/console_browser.rs)
chromedriver chromium-driver test the console's browser tests drive Chromium through it
patroni patroni test tests/api/patroni.rs runs deploy/patroni/patroni.yml as a three-node cluster
etcd etcd-server test Patroni's store in tests/api/patroni.rs
promtool prometheus test tests/api/deploy.rs runs the unit tests of deploy/alerts.yml
podman podman test,image make image builds the image with it, tests/api/container.rs runs it
runc runc test,image the runtime scripts/podman.sh names (crun, which podman brings alone, refuses hybrid cgroups)
shellcheck shellcheck lint make lint checks the shell scripts"

group=${2:-all}
case $group in
  test | lint | image | all) ;;
  *) echo "tools.sh: unknown group \`$group\` (test, lint, image or all)" >&2; exit 2 ;;
esac

lookup_path=${TOOLS_PATH:-$PATH:/usr/local/sbin:/usr/sbin:/sbin}

# The lines of TOOLS in the group asked for.
listed() {
  local program package g why
  while read -r program package g why; do
    if [[ $group == all || ,$g, == *,"$group",* ]]; then
      echo "$program $package $g $why"
    fi
  done <<<"$TOOLS"
}

found() {
  PATH=$lookup_path command -v "$1" >/dev/null 2>&1
}

# The lines of the programs not found.
absent() {
  local program rest
  listed | while read -r program rest; do
    found "$program" || echo "$program $rest"
  done
}

packages() {
  local program package rest
  absent | while read -r program package rest; do echo "$package"; done | sort -u | tr '\n' ' ' | sed 's/ $//'
}

apt_get() {
  if [[ -n ${TOOLS_APT_GET:-} ]]; then
    # shellcheck disable=SC2086 # a command and its words, e.g. `sudo apt-get`
    $TOOLS_APT_GET "$@"
  elif [[ $(id -u) == 0 ]]; then
    apt-get "$@"
  elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    sudo -n apt-get "$@"
  else
    echo "tools.sh: not root and no password-less sudo: run \`sudo make tools\`" >&2
    return 1
  fi
}

install() {
  local missing program package g why
  missing=$(packages)
  [[ -z $missing ]] && return 0
  echo "fencehook: these programs are missing, so they are installed now (Debian's packages: $missing):"
  absent | while read -r program package g why; do
    echo "  $program ($package): $why"
  done
  # Another install under way (another checkout's `make tools`) holds dpkg's lock: wait for it.
  local wait=(-o DPkg::Lock::Timeout=600)
  # shellcheck disable=SC2086 # one word per package
  if ! apt_get "${wait[@]}" update -qq ||
    ! DEBIAN_FRONTEND=noninteractive RUNLEVEL=1 \
      apt_get "${wait[@]}" install -y --no-install-recommends $missing; then
    echo "fencehook: installing $missing failed; the tests that need them fail naming \`make tools\`" >&2
    return 1
  fi
  missing=$(packages)
  if [[ -n $missing ]]; then
    echo "fencehook: still missing after the install: $missing" >&2
    return 1
  fi
  echo "fencehook: installed; every program the tests and lints run is there"
}

case ${1:-} in
  list) listed ;;
  missing) packages; echo ;;
  install) install ;;
  *) sed -n '2,20p' "$0" >&2; exit 2 ;;
esac
