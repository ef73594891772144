-- The delivery history: one row per item of a delivery that reached the
-- fenced path (booked by the processor in sync mode, stored for the workers
-- in inbox mode), with the answer it was given. It is what the console's
-- payment page and `fencehook inspect` show of a payment's deliveries in
-- both modes: a refund refused with 422 appears on the payment it names.
--
-- Written off the delivery path, in batches (src/store/history.rs); kept
-- for FENCEHOOK_EVENT_RETENTION_DAYS and deleted by the same prune as the
-- inbox's finished events. It holds ids and answers, never a body or a
-- header: nothing here is personal data, and `fencehook erase` has nothing
-- to empty in it.
--
-- Additive: one new table. Binaries from before it run on it unchanged.
CREATE TABLE delivery_history (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- When the answer was given (the service's clock).
    answered_at timestamptz NOT NULL,
    provider text NOT NULL,
    transaction_id text NOT NULL,
    -- The payment a refund or dispute names.
    parent_transaction_id text,
    event_type text NOT NULL,
    -- The PSP's own id of the delivery, where it has one.
    psp_event_id text,
    -- The answer: its `result`, HTTP status and `reason` (a refused refund's why).
    result text NOT NULL,
    status smallint NOT NULL,
    reason text
);
CREATE INDEX delivery_history_transaction_idx ON delivery_history (provider, transaction_id);
CREATE INDEX delivery_history_parent_idx ON delivery_history (provider, parent_transaction_id)
    WHERE parent_transaction_id IS NOT NULL;
CREATE INDEX delivery_history_answered_idx ON delivery_history (answered_at);
