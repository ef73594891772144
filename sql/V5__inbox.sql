-- Inbox mode: accept in one write, book asynchronously with leased workers.
--
-- The unit of work is an event: every accepted delivery item, kept as
-- received, with its own status, attempts and errors (in the manner of Oban's
-- and River's job tables). A payments row for a new object is written at
-- accept time as `queued`; events that move an existing row (a refund's
-- failure, a failed payment's success) leave the row's status alone until a
-- worker applies them. Workers take due events without blocking each other
-- (FOR UPDATE SKIP LOCKED), and every write they make is fenced like in sync
-- mode: a worker rescued after its lease expired cannot commit.

ALTER TABLE payments DROP CONSTRAINT payments_status_check;
ALTER TABLE payments ADD CONSTRAINT payments_status_check
    CHECK (status IN ('queued', 'processing', 'succeeded', 'failed', 'dead'));
-- A queued row has not been claimed by any token yet.
ALTER TABLE payments DROP CONSTRAINT payments_fence_check;
ALTER TABLE payments ADD CONSTRAINT payments_fence_check CHECK (fence >= 0);

CREATE TABLE events (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- queued: waiting for next_attempt_at; processing: a worker took it until
    -- locked_until (past it, another may); done: applied (or found already
    -- applied); dead: given up (see last_error) until replayed.
    status          text        NOT NULL DEFAULT 'queued'
        CHECK (status IN ('queued', 'processing', 'done', 'dead')),
    provider        text        NOT NULL,
    transaction_id  text        NOT NULL,
    event_type      text        NOT NULL,
    parent_transaction_id text,
    -- What deduplicates deliveries: one event per (provider, transaction,
    -- event type) — a PSP's re-send under a new envelope is the same event.
    delivery_id     text        NOT NULL,
    -- The PSP's own id of the delivery, where it has one (webhook-id, Stripe's evt_…).
    psp_event_id    text,
    fingerprint     text        NOT NULL,
    -- The canonical event the worker applies.
    canonical       jsonb       NOT NULL,
    -- The delivery's body, as received.
    body            text        NOT NULL,
    received_at     timestamptz NOT NULL DEFAULT now(),
    attempts        integer     NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    locked_until    timestamptz,
    last_error      text,
    -- Every failed attempt: [{at, attempt, error}], oldest first.
    errors          jsonb       NOT NULL DEFAULT '[]',
    finished_at     timestamptz,
    CONSTRAINT events_provider_delivery_id_key UNIQUE (provider, delivery_id)
);

-- What workers take: due queued events, and processing ones whose worker's
-- lock ran out.
CREATE INDEX events_due_idx ON events (next_attempt_at) WHERE status = 'queued';
CREATE INDEX events_locked_idx ON events (locked_until) WHERE status = 'processing';
-- Refunds and disputes waiting for their payment are woken when it is booked.
CREATE INDEX events_parent_idx ON events (provider, parent_transaction_id)
    WHERE status = 'queued' AND parent_transaction_id IS NOT NULL;
-- inspect / events / prune.
CREATE INDEX events_transaction_idx ON events (provider, transaction_id);
CREATE INDEX events_received_idx ON events (received_at);
