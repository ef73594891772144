# bench-ref.sh - sourced by bench.sh and bench-instructions.sh: the release binary of another
# commit, to run beside this tree's, built in a git worktree of its own and cached by commit.
# shellcheck shell=bash disable=SC2034  # REF_* are read by the sourcing script
#
# The worktree is target/bench-ref/src-<commit>, built into this tree's own target directory (the
# dependencies both builds share are compiled once), and its binary is kept as
# target/bench-ref/fencehook-<commit>: a commit's build never changes, so the second run of a
# benchmark against the same commit builds nothing. Build it before this tree's own build: both
# leave their binary at target/release/fencehook.

# The commit docs/benchmarks.md names as the last measured release (its line
# "The last measured release: `<commit>`"), the default baseline of a comparison.
baseline_default() {
  # shellcheck disable=SC2016  # the backquotes are Markdown's, not the shell's
  sed -nE 's/^The last measured release: `([0-9a-f]{7,40})`.*/\1/p' docs/benchmarks.md | head -n1
}

# ref_build REF: sets REF_SHA (short) and REF_BIN (the release binary of REF's commit), building it
# first when no cached one exists. Cargo's output goes to stderr.
ref_build() {
  local ref=$1 sha dir target root
  sha=$(git rev-parse --verify --quiet "$ref^{commit}") || { printf 'bench: %s is no commit here\n' "$ref" >&2; return 1; }
  REF_SHA=$(git rev-parse --short=9 "$sha")
  root=$(pwd)
  target=${CARGO_TARGET_DIR:-$root/target}
  [[ $target == /* ]] || target=$root/$target
  REF_BIN=$root/target/bench-ref/fencehook-$REF_SHA
  [[ -x $REF_BIN ]] && return 0
  mkdir -p "$root/target/bench-ref"
  dir=$root/target/bench-ref/src-$REF_SHA
  if [[ ! -e $dir/Cargo.toml ]]; then
    rm -rf "$dir"
    git worktree prune
    git worktree add --detach "$dir" "$sha" >&2
  fi
  printf '== building %s (%s) in %s ==\n' "$ref" "$REF_SHA" "$dir" >&2
  (cd "$dir" && CARGO_TARGET_DIR=$target "${CARGO:-cargo}" build --locked --release >&2)
  cp -f "$target/release/fencehook" "$REF_BIN.tmp"
  mv -f "$REF_BIN.tmp" "$REF_BIN"
}
