-- The whole life of a payment: refunds and disputes as rows of their own,
-- linked to the payment they take money from, with the money taken kept on
-- the payment so the cap is checked and booked in one locked update.

ALTER TABLE payments
    ADD COLUMN kind text NOT NULL DEFAULT 'payment'
        CHECK (kind IN ('payment', 'refund', 'dispute')),
    -- Refunds and disputes: the payment's transaction_id. NULL for payments,
    -- and for refunds booked before this migration (they named no payment).
    ADD COLUMN parent_transaction_id text
        CHECK (length(parent_transaction_id) BETWEEN 1 AND 255),
    -- Payments: refunds and disputes booked against it, net of reversals.
    ADD COLUMN amount_out_minor bigint NOT NULL DEFAULT 0,
    ADD CONSTRAINT payments_payment_has_no_parent
        CHECK (kind <> 'payment' OR parent_transaction_id IS NULL),
    ADD CONSTRAINT payments_amount_out_within_amount
        CHECK (amount_out_minor >= 0 AND amount_out_minor <= amount_minor),
    ADD CONSTRAINT payments_only_payments_pay_out
        CHECK (kind = 'payment' OR amount_out_minor = 0);

UPDATE payments SET kind = 'refund' WHERE event_type = 'refund.succeeded';

ALTER TABLE payments DROP CONSTRAINT payments_event_type_check;
ALTER TABLE payments ADD CONSTRAINT payments_event_type_check CHECK (event_type IN (
    'payment.succeeded', 'payment.failed',
    'refund.succeeded', 'refund.failed',
    'dispute.funds_withdrawn', 'dispute.funds_reinstated'));

-- The fingerprint now covers what the object is, not its state: provider,
-- transaction id, kind, amount, currency, parent (see domain.rs), joined by
-- the unit separator (chr(31)); recomputed here for every existing row.
UPDATE payments SET fingerprint = encode(sha256(convert_to(concat_ws(chr(31),
    'v2', provider, transaction_id, kind, amount_minor::text, currency,
    coalesce(parent_transaction_id, '')), 'UTF8')), 'hex');

-- A refund's or dispute's children are found by their parent.
CREATE INDEX payments_parent_idx ON payments (provider, parent_transaction_id)
    WHERE parent_transaction_id IS NOT NULL;

ALTER TABLE ledger_entries DROP CONSTRAINT ledger_entries_effect_check;
ALTER TABLE ledger_entries ADD CONSTRAINT ledger_entries_effect_check CHECK (effect IN (
    'credit', 'debit', 'refund_reversal', 'dispute', 'dispute_reversal'));
ALTER TABLE ledger_entries DROP CONSTRAINT ledger_entries_check;
-- Money in is positive, money out negative.
ALTER TABLE ledger_entries ADD CONSTRAINT ledger_entries_sign_fits_effect CHECK (
    (effect IN ('credit', 'refund_reversal', 'dispute_reversal')) = (amount_minor > 0));

-- Items of a batch that were well signed but could not be booked (unmappable,
-- or refused by the lifecycle rules): kept with their reason so an operator
-- can act, counted once per distinct item however often the PSP re-sends it.
CREATE TABLE quarantined_items (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    provider       text        NOT NULL,
    transaction_id text,
    reason         text        NOT NULL,
    item           text        NOT NULL,
    item_sha256    text        NOT NULL,
    first_seen_at  timestamptz NOT NULL DEFAULT now(),
    last_seen_at   timestamptz NOT NULL DEFAULT now(),
    times_seen     bigint      NOT NULL DEFAULT 1,
    CONSTRAINT quarantined_items_provider_item_key UNIQUE (provider, item_sha256)
);
