#!/usr/bin/env bash
# The PSPs' own SDKs for the interop tests, in a virtualenv of their own (target/psp-sdks), installed
# from PyPI at the versions pinned in tests/psp-sdks/requirements.txt. Idempotent: a venv whose stamp
# matches the requirements file is kept. Prints the venv's python on its last line.
#
# The venv is made without pip (Debian's python3 has no ensurepip unless python3-venv is installed)
# and filled by the machine's own pip (`pip --python`). Test processes that ask at once wait for
# each other (flock), so none uses a venv another is rebuilding.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=target/psp-sdks
requirements=tests/psp-sdks/requirements.txt
stamp=$venv/.requirements

mkdir -p target
exec 9>target/psp-sdks.lock
flock 9

if [[ -x $venv/bin/python ]] && cmp -s "$requirements" "$stamp"; then
    echo "$PWD/$venv/bin/python"
    exit 0
fi

echo "fencehook: the PSP SDK interop tests need the PSPs' own Python SDKs ($requirements), so they are installed now into $venv (PyPI)" >&2
rm -rf "$venv"
python3 -m venv --without-pip "$venv"
python3 -m pip --python "$venv/bin/python" install --quiet --disable-pip-version-check -r "$requirements" >&2
cp "$requirements" "$stamp"
echo "$PWD/$venv/bin/python"
