#!/usr/bin/env bash
# podman.sh - podman with the options fencehook's image build, its container test and `make image`
# need on a host like the project's CI machine, given on the command line (never written into
# /etc/containers or ~/.config/containers: a user's own podman setup is left alone).
#
# Usage: scripts/podman.sh <podman arguments>      e.g. scripts/podman.sh run --rm localhost/fencehook:0.1.0 --version
#
# What it adds, and why:
#   --runtime runc               Debian's crun, which podman prefers when both are installed, refuses
#                                a host with hybrid cgroups (v1 controllers beside a v2 mount);
#                                runc runs there.
#   --cgroup-manager cgroupfs    no systemd to ask for cgroups (PID 1 is not systemd here), and
#   --events-backend file        no journal to log events to.
#   run/create: --ulimit nofile=H:H --ulimit nproc=N:N
#                                podman asks runc for its own defaults (1048576 open files, 4194304
#                                processes), above the host's hard limits, and runc's setrlimit is
#                                refused ("error setting rlimits ... operation not permitted").
#                                H is this shell's hard open-file limit; N the hard process limit,
#                                at most kernel.pid_max (runc was refused above it here).
# Storage is podman's default (overlay under /var/lib/containers as root), so images built here are
# the ones a plain `podman images` lists.
set -euo pipefail

command -v podman >/dev/null || { echo "podman is not installed: make tools (or scripts/tools.sh install image)" >&2; exit 127; }

global=(--runtime runc --cgroup-manager cgroupfs --events-backend file)

case "${1:-}" in
  run | create)
    command=$1
    shift
    nofile=$(ulimit -Hn)
    nproc=$(ulimit -Hu)
    pid_max=$(cat /proc/sys/kernel/pid_max)
    [[ $nproc == unlimited || $nproc -gt $pid_max ]] && nproc=$pid_max
    [[ $nofile == unlimited ]] && nofile=1048576
    exec podman "${global[@]}" "$command" --ulimit "nofile=$nofile:$nofile" --ulimit "nproc=$nproc:$nproc" "$@"
    ;;
  *)
    exec podman "${global[@]}" "$@"
    ;;
esac
