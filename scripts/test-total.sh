#!/usr/bin/env bash
# test-total.sh - the grand total of one or more `cargo test` runs.
#
# Usage: cargo test ... 2>&1 | tee log; scripts/test-total.sh < log
#
# Sums the "test result: ... N passed; M failed; ..." lines of every test binary on stdin and
# prints one line, `N passed, M failed`: `make test` ends with it, so that the unit and the
# integration runs' counts are not added up by eye across several screens of output.
set -euo pipefail

awk '
/^test result: / {
    for (i = 2; i <= NF; i++) {
        if ($i ~ /^passed;?$/) passed += $(i - 1)
        if ($i ~ /^failed;?$/) failed += $(i - 1)
    }
}
END { printf "%d passed, %d failed\n", passed, failed }
'
