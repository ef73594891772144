-- Inbox mode: what waits for a payment is woken when the payment is booked,
-- whoever books it.
--
-- Additive: a function and a trigger on `payments`, an index on `events`, no
-- column. Binaries from
-- before it run beside it unchanged (their bookings fire the trigger too),
-- and this release runs on the schema before it (its waiting events then
-- fall back to their pause).
--
-- When a payments row becomes `succeeded`, in either mode (a sync instance's
-- booking included), the events waiting for it are woken: the refunds and
-- disputes of a payment, and a dispute's reinstatement waiting for its
-- withdrawal.
--
-- - A queued one is made due now and the workers are notified. Only then: a
--   NOTIFY in a transaction serializes its commit behind a global lock, and
--   most bookings wake nothing.
-- - One a worker holds (`processing`: the worker looked before the booking
--   and will re-queue it to wait) gets `next_attempt_at` = the wall clock,
--   which is past the moment it was taken; its re-queue sees that and makes
--   it due at once instead of after its pause.
--
-- A re-queue concurrent with the booking is caught either way: whichever of
-- the two updates of the event's row comes second waits for the first and
-- sees what it wrote.
CREATE FUNCTION events_wake_waiting() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    queued bigint;
    woken bigint;
BEGIN
    IF TG_OP = 'UPDATE' AND OLD.status = 'succeeded' THEN
        RETURN NULL;
    END IF;
    -- Its children, queued or being attempted, by their own index (below): a
    -- queued one made due now, one being attempted stamped with the wall
    -- clock. (An index on `processing` rows cannot serve this: every drained
    -- event passes through `processing`, and its dead index entries made the
    -- lookup read thousands of them per booking.)
    UPDATE events
       SET next_attempt_at = CASE WHEN status = 'queued' THEN now() ELSE clock_timestamp() END
     WHERE provider = NEW.provider AND parent_transaction_id = NEW.transaction_id
       AND (status = 'processing' OR (status = 'queued' AND next_attempt_at > now()));
    GET DIAGNOSTICS queued = ROW_COUNT;
    -- The reinstatement of this dispute, by the unique key (V7).
    UPDATE events
       SET next_attempt_at = CASE WHEN status = 'queued' THEN now() ELSE clock_timestamp() END
     WHERE provider = NEW.provider AND transaction_id = NEW.transaction_id
       AND event_type = 'dispute.funds_reinstated'
       AND (status = 'processing' OR (status = 'queued' AND next_attempt_at > now()));
    GET DIAGNOSTICS woken = ROW_COUNT;
    IF queued + woken > 0 THEN
        PERFORM pg_notify('fencehook_inbox', '');
    END IF;
    RETURN NULL;
END;
$$;

-- The refunds and disputes of a payment, whatever their status: only events
-- that name a parent are in it (payments are not).
CREATE INDEX events_children_idx ON events (provider, parent_transaction_id)
    WHERE parent_transaction_id IS NOT NULL;

CREATE TRIGGER payments_wake_waiting
    AFTER INSERT OR UPDATE OF status ON payments
    FOR EACH ROW WHEN (NEW.status = 'succeeded')
    EXECUTE FUNCTION events_wake_waiting();
