#!/usr/bin/env bash
# image.sh - the fencehook OCI image, FROM scratch, from a built binary and this host's files:
# nothing is pulled from a registry.
#
# Usage: scripts/image.sh BINARY TAG [MAX_BYTES]
#   BINARY     the fencehook binary (`make image` gives target/release/fencehook)
#   TAG        the image's name, e.g. localhost/fencehook:0.1.0
#   MAX_BYTES  fail when the image is larger (`make image`: 40 MB); no bound when absent
#
# The image holds exactly what the binary needs, laid out in a scratch directory and added as one
# layer by scripts/image.Containerfile (which also sets the user, entrypoint, ports and labels):
#   /usr/local/bin/fencehook          the binary, its debug sections removed
#   its shared libraries              every path `ldd` names (glibc's loader, libc, libm, libgcc_s),
#                                     copied from this host; glibc since 2.34 resolves `files` and
#                                     `dns` without loading an NSS module, so none is needed
#   /etc/nsswitch.conf                hosts from /etc/hosts, then DNS (the runtime mounts both files)
#   /etc/ssl/certs/ca-certificates.crt   the host's CA bundle, for `sslrootcert=` of a database
#                                     whose certificate a public CA signed (fencehook's HTTPS
#                                     clients carry their own roots and read no system store)
#   /etc/passwd, /etc/group           root, and the unprivileged `fencehook` user (65532, the uid
#                                     distroless's `nonroot` has, so either image runs under one
#                                     securityContext)
#   /var/lib/dpkg/status.d/<package>  the Debian packages those files came from, as distroless
#                                     records them, so an image scanner sees which glibc it carries
# and nothing else: no shell, no package manager, no /tmp (the process writes no file).
# The version label is Cargo.toml's, the revision `git describe`'s; the image's timestamps are the
# commit's, so the same binary built again gives the same image.
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "image.sh: $*" >&2; exit 1; }

[[ $# -ge 2 ]] || die "usage: scripts/image.sh BINARY TAG [MAX_BYTES]"
binary=$1
tag=$2
max_bytes=${3:-}
[[ -x $binary ]] || die "$binary is not an executable (make build)"
for tool in ldd objcopy dpkg-query git; do
  command -v "$tool" >/dev/null || die "$tool is needed"
done
bundle=/etc/ssl/certs/ca-certificates.crt
[[ -s $bundle ]] || die "$bundle is missing: apt-get install ca-certificates"

context=$(mktemp -d "${TMPDIR:-/tmp}/fencehook-image.XXXXXX")
trap 'rm -rf "$context"' EXIT
root=$context/rootfs

# Without its debug sections (the release profile's line tables: 84 MB of the binary's 106 MB);
# the symbol table stays, so a panic's backtrace still names functions. target/release/fencehook
# keeps the line tables, for symbolizing an address from the image's binary.
install -D -m 0755 "$binary" "$root/usr/local/bin/fencehook"
objcopy --strip-debug "$root/usr/local/bin/fencehook"

# `ldd` lines: `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)`, the loader as a bare path,
# and the vDSO with no file. A library ldd cannot find stops the build.
if ldd "$binary" | grep -q 'not found'; then
  die "$(ldd "$binary" | grep 'not found')"
fi
libraries=()
while read -r path; do
  libraries+=("$path")
  install -D -m 0755 "$(readlink -f "$path")" "$root$path"
done < <(ldd "$binary" | grep -o '/[^ ]*' | sort -u)
[[ ${#libraries[@]} -gt 0 ]] || die "ldd named no library: $binary is static? this script copies a dynamic binary's"

install -D -m 0644 "$bundle" "$root$bundle"
install -d -m 0755 "$root/etc"
printf 'passwd: files\ngroup: files\nhosts: files dns\n' >"$root/etc/nsswitch.conf"
printf 'root:x:0:0:root:/root:/sbin/nologin\nfencehook:x:65532:65532:fencehook:/nonexistent:/sbin/nologin\n' >"$root/etc/passwd"
printf 'root:x:0:\nfencehook:x:65532:\n' >"$root/etc/group"

# The packages the copied files belong to (the bundle is generated from ca-certificates).
packages=(ca-certificates)
for path in "${libraries[@]}"; do
  owner=$(dpkg-query -S "$path" 2>/dev/null | head -n1 | cut -d: -f1) ||
    die "$path belongs to no Debian package: cannot record where it came from"
  packages+=("$owner")
done
install -d -m 0755 "$root/var/lib/dpkg/status.d"
for package in $(printf '%s\n' "${packages[@]}" | sort -u); do
  dpkg-query -s "$package" >"$root/var/lib/dpkg/status.d/$package"
done

version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n1)
revision=$(git describe --always --dirty --abbrev=40 2>/dev/null || echo unknown)
epoch=$(git log -1 --format=%ct 2>/dev/null || echo 0)

scripts/podman.sh build --quiet --timestamp "$epoch" \
  --build-arg "VERSION=$version" --build-arg "REVISION=$revision" \
  -f scripts/image.Containerfile -t "$tag" "$context" >/dev/null

size=$(scripts/podman.sh image inspect --format '{{.Size}}' "$tag")
echo "image.sh: $tag built: $size bytes (fencehook $version, revision $revision; libraries: ${libraries[*]})"
if [[ -n $max_bytes && $size -gt $max_bytes ]]; then
  die "$tag is $size bytes, over the bound of $max_bytes"
fi
