-- The single-column rules as domains instead of table CHECK constraints
-- (docs/benchmarks.md).
--
-- PostgreSQL reads a table's CHECK constraints from the catalog and plans
-- them again for every INSERT and UPDATE statement, and evaluates all of
-- them on every row the statement writes, whichever columns it changes:
-- `payments` had eleven, `ledger_entries` five. A domain's constraints are
-- read once per connection and cached, and are evaluated only when a value
-- is stored in a column of that type. The rules and the values allowed are
-- the same as before; reads see plain text and bigint columns. What still
-- ties two columns together stays a table CHECK.
--
-- No table is rewritten: the domains start without constraints (a change of
-- type PostgreSQL can make in the catalog alone), and each constraint is
-- added afterwards, which checks the existing rows with one read of each
-- table that uses the domain.
--
-- Not additive for older binaries: a binary from before this migration binds
-- text and bigint parameters where PostgreSQL now expects the domains, and
-- its writes fail (503, nothing written). The binary that brings it casts
-- its parameters and runs on the schema before it too, so replace the
-- instances first, then migrate (docs/operations.md).

CREATE DOMAIN psp_transaction_id AS text;
CREATE DOMAIN payment_kind AS text;
CREATE DOMAIN payment_event_type AS text;
CREATE DOMAIN payment_status AS text;
CREATE DOMAIN currency_code AS text;
CREATE DOMAIN positive_amount AS bigint;
CREATE DOMAIN payment_fence AS bigint;
CREATE DOMAIN ledger_effect AS text;
CREATE DOMAIN signed_amount AS bigint;
CREATE DOMAIN fencing_token AS bigint;
CREATE DOMAIN event_status AS text;

ALTER TABLE payments
    DROP CONSTRAINT payments_transaction_id_check,
    DROP CONSTRAINT payments_parent_transaction_id_check,
    DROP CONSTRAINT payments_kind_check,
    DROP CONSTRAINT payments_event_type_check,
    DROP CONSTRAINT payments_status_check,
    DROP CONSTRAINT payments_currency_check,
    DROP CONSTRAINT payments_amount_minor_check,
    DROP CONSTRAINT payments_fence_check,
    ALTER COLUMN transaction_id TYPE psp_transaction_id,
    ALTER COLUMN parent_transaction_id TYPE psp_transaction_id,
    ALTER COLUMN kind TYPE payment_kind,
    ALTER COLUMN event_type TYPE payment_event_type,
    ALTER COLUMN status TYPE payment_status,
    ALTER COLUMN currency TYPE currency_code,
    ALTER COLUMN amount_minor TYPE positive_amount,
    ALTER COLUMN fence TYPE payment_fence;

ALTER TABLE ledger_entries
    DROP CONSTRAINT ledger_entries_effect_check,
    DROP CONSTRAINT ledger_entries_amount_minor_check,
    DROP CONSTRAINT ledger_entries_currency_check,
    DROP CONSTRAINT ledger_entries_fence_check,
    ALTER COLUMN effect TYPE ledger_effect,
    ALTER COLUMN amount_minor TYPE signed_amount,
    ALTER COLUMN currency TYPE currency_code,
    ALTER COLUMN fence TYPE fencing_token;

ALTER TABLE leases
    DROP CONSTRAINT leases_token_check,
    ALTER COLUMN token TYPE fencing_token;

ALTER TABLE events
    DROP CONSTRAINT events_status_check,
    ALTER COLUMN status TYPE event_status;

ALTER DOMAIN psp_transaction_id ADD CONSTRAINT psp_transaction_id_length
    CHECK (length(VALUE) BETWEEN 1 AND 255);
ALTER DOMAIN payment_kind ADD CONSTRAINT payment_kind_known
    CHECK (VALUE IN ('payment', 'refund', 'dispute'));
ALTER DOMAIN payment_event_type ADD CONSTRAINT payment_event_type_known
    CHECK (VALUE IN ('payment.succeeded', 'payment.failed',
                     'refund.succeeded', 'refund.failed',
                     'dispute.funds_withdrawn', 'dispute.funds_reinstated'));
ALTER DOMAIN payment_status ADD CONSTRAINT payment_status_known
    CHECK (VALUE IN ('queued', 'processing', 'succeeded', 'failed', 'dead'));
ALTER DOMAIN currency_code ADD CONSTRAINT currency_code_iso_4217
    CHECK (VALUE ~ '^[A-Z]{3}$');
ALTER DOMAIN positive_amount ADD CONSTRAINT positive_amount_above_zero
    CHECK (VALUE > 0);
-- A queued row has not been claimed by any token yet (0).
ALTER DOMAIN payment_fence ADD CONSTRAINT payment_fence_not_negative
    CHECK (VALUE >= 0);
ALTER DOMAIN ledger_effect ADD CONSTRAINT ledger_effect_known
    CHECK (VALUE IN ('credit', 'debit', 'refund_reversal', 'dispute', 'dispute_reversal'));
-- Credits positive, debits negative (the sign is matched to the effect by
-- ledger_entries_sign_fits_effect).
ALTER DOMAIN signed_amount ADD CONSTRAINT signed_amount_not_zero
    CHECK (VALUE <> 0);
ALTER DOMAIN fencing_token ADD CONSTRAINT fencing_token_above_zero
    CHECK (VALUE > 0);
ALTER DOMAIN event_status ADD CONSTRAINT event_status_known
    CHECK (VALUE IN ('queued', 'processing', 'done', 'dead'));
