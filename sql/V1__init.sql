-- fencehook schema, version 1.
--
-- The fencing rule lives here as much as in the code: every write of a
-- processing attempt carries its token, and a write whose token is lower than
-- payments.fence changes nothing. The constraints below make the invariants of
-- SPEC §6 impossible to break even by a buggy writer.

CREATE TABLE payments (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    provider       text        NOT NULL,
    transaction_id text        NOT NULL CHECK (length(transaction_id) BETWEEN 1 AND 255),
    event_type     text        NOT NULL CHECK (event_type IN ('payment.succeeded', 'payment.failed', 'refund.succeeded')),
    amount_minor   bigint      NOT NULL CHECK (amount_minor > 0),
    currency       text        NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    fingerprint    text        NOT NULL,
    status         text        NOT NULL CHECK (status IN ('processing', 'succeeded', 'failed')),
    -- Highest fencing token that has claimed this payment.
    fence          bigint      NOT NULL CHECK (fence > 0),
    occurred_at    timestamptz,
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    -- The code matches this name: only a violation of it can mean "duplicate".
    CONSTRAINT payments_provider_transaction_id_key UNIQUE (provider, transaction_id)
);

CREATE TABLE ledger_entries (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    payment_id   bigint      NOT NULL REFERENCES payments (id),
    effect       text        NOT NULL CHECK (effect IN ('credit', 'debit')),
    -- Signed: credits positive, debits negative.
    amount_minor bigint      NOT NULL CHECK (amount_minor <> 0),
    currency     text        NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    -- Token of the holder whose finalize wrote this entry.
    fence        bigint      NOT NULL CHECK (fence > 0),
    created_at   timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT ledger_entries_payment_effect_key UNIQUE (payment_id, effect),
    CHECK ((effect = 'credit') = (amount_minor > 0))
);
