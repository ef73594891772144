-- The results of `fencehook audit`, for the operator console's overview
-- (src/store/audit.rs writes and reads this table; nothing else does).
--
-- Each run of the audit adds one row and, in the same transaction, deletes
-- every row but the newest 100: the table stays a few kilobytes however
-- often a timer runs the audit. A row is what the audit printed, counted:
-- whether it was clean, each check with how many offenders it found, the
-- two warnings, and the totals it read.
--
-- Additive: one new table, nothing else changes. Binaries from before it
-- run on it unchanged (they never record), and this release's audit runs
-- on the schema before it: it checks and prints as before and says it did
-- not record (the console then says no run is recorded).
CREATE TABLE audit_runs (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- When the audit finished, by the database's clock (the console ages it
    -- by the same clock), and how long its reads took.
    finished_at timestamptz NOT NULL DEFAULT now(),
    duration_ms bigint NOT NULL CONSTRAINT audit_runs_duration_not_negative CHECK (duration_ms >= 0),
    -- No check violated (warnings do not count).
    clean boolean NOT NULL,
    -- Every check run, in the order printed: [{"name": "one_row_per_transaction",
    -- "violations": 0, "at_least": false}, …]. `at_least`: the check stopped
    -- counting at the offenders the audit lists (20), so there may be more.
    checks jsonb NOT NULL CONSTRAINT audit_runs_checks_are_a_list CHECK (jsonb_typeof(checks) = 'array'),
    -- The warnings: payments that gave back more than came in (disputes past
    -- the amount), and refunds from before refunds named their payment.
    over_returned_payments bigint NOT NULL CONSTRAINT audit_runs_over_returned_not_negative CHECK (over_returned_payments >= 0),
    legacy_refunds bigint NOT NULL CONSTRAINT audit_runs_legacy_refunds_not_negative CHECK (legacy_refunds >= 0),
    -- What the audit read.
    payments bigint NOT NULL,
    ledger_entries bigint NOT NULL,
    -- Where it ran: the host's name (NULL when it could not be read) and the
    -- fencehook version.
    host text,
    version text NOT NULL,
    -- `fencehook audit --answers FILE`: the run also checked a load run's answers.
    with_answers boolean NOT NULL DEFAULT false
);
