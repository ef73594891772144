#!/usr/bin/env bash
# dev-console.sh - throwaway console tokens for `make run CONSOLE=1` (development only).
#
# Usage: eval "$(scripts/dev-console.sh)"
#
# Writes a fresh viewer and operator token (32 random bytes each, hex) to
# $FENCEHOOK_DEV_CONSOLE_DIR (default target/dev-console: gitignored), mode 0600 in a 0700
# directory, as the console requires of its token files; prints on stdout the two `export
# FENCEHOOK_CONSOLE_*_TOKEN_FILE=…` lines that turn the console on, and on stderr where to open
# it and how to sign in. Every run replaces both tokens: sessions of the last run end.
set -euo pipefail

dir=${FENCEHOOK_DEV_CONSOLE_DIR:-$PWD/target/dev-console}
[[ $dir == /* ]] || dir=$PWD/$dir
admin=${FENCEHOOK_ADMIN_LISTEN:-127.0.0.1:9090}

# 32 bytes from the kernel's generator as 64 hex digits: no tool beyond coreutils.
token() {
  od -An -N32 -tx1 /dev/urandom | tr -d ' \n'
}

umask 077
mkdir -p "$dir"
chmod 700 "$dir"
for role in viewer operator; do
  file=$dir/$role.token
  rm -f "$file"
  token >"$file"
  chmod 600 "$file"
done

printf 'export FENCEHOOK_CONSOLE_VIEWER_TOKEN_FILE=%q\n' "$dir/viewer.token"
printf 'export FENCEHOOK_CONSOLE_OPERATOR_TOKEN_FILE=%q\n' "$dir/operator.token"
cat >&2 <<EOF
fencehook: console on http://$admin/console (development tokens, new every run, in $dir)
  sign in there with the operator token: $(cat "$dir/operator.token")
  or read only, as the viewer:           $(cat "$dir/viewer.token")
  scripts: curl -H "Authorization: Bearer \$(cat $dir/viewer.token)" -H 'Accept: application/json' http://$admin/console
EOF
