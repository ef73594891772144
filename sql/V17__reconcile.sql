-- Reconciliation: the PSP's events listed through its API and booked by the
-- same fenced path as their webhooks (`fencehook reconcile`, and the
-- scheduled runs of `serve` and `work`). Owned by src/store/reconcile.rs.
--
-- Additive: three new tables. Binaries from before it run on it unchanged.

-- One row per provider: where the scheduled runs have reached, and when a
-- run of it last completed (divergences included).
CREATE TABLE reconcile_cursors (
    provider text PRIMARY KEY,
    -- The end of the last window a scheduled run completed; the next one
    -- starts there minus the overlap. NULL until a scheduled run completes
    -- (a CLI run never moves it).
    cursor_at timestamptz,
    -- When a run (scheduled or CLI) last completed.
    last_success_at timestamptz
);

-- One row per run that was not a dry run: its window, its counts, and the
-- error that ended it, if one did.
CREATE TABLE reconcile_runs (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    provider text NOT NULL,
    -- `scheduled` (serve, work) or `cli` (fencehook reconcile).
    trigger text NOT NULL CHECK (trigger IN ('scheduled', 'cli')),
    started_at timestamptz NOT NULL,
    finished_at timestamptz NOT NULL,
    window_since timestamptz NOT NULL,
    window_until timestamptz NOT NULL,
    listed integer NOT NULL,
    known integer NOT NULL,
    recovered integer NOT NULL,
    ignored integer NOT NULL,
    stale integer NOT NULL,
    refused integer NOT NULL,
    divergent integer NOT NULL,
    -- Why the run did not complete (the PSP's API, the database); NULL when it did.
    error text
);
CREATE INDEX reconcile_runs_provider_idx ON reconcile_runs (provider, started_at DESC);

-- What a run found worth a person's look: each event booked by it (its
-- webhook never arrived), each divergence (written nothing), each refusal.
CREATE TABLE reconcile_findings (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id bigint NOT NULL REFERENCES reconcile_runs (id) ON DELETE CASCADE,
    provider text NOT NULL,
    psp_event_id text NOT NULL,
    transaction_id text,
    result text NOT NULL CHECK (result IN ('recovered', 'divergent', 'refused')),
    -- A divergence's or a refusal's why (`payload_mismatch`, `refund_rejected: …`).
    reason text,
    found_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX reconcile_findings_run_idx ON reconcile_findings (run_id);
CREATE INDEX reconcile_findings_provider_idx ON reconcile_findings (provider, found_at DESC);
