-- Inbox mode: replays restart an event's age, and what waits is woken when
-- what it waits for is booked.
--
-- Additive: two columns with defaults, a flag, and a trigger on `payments`.
-- A binary from before it ignores the columns (its replays leave
-- `replayed_at` alone, so their events age from their acceptance, as
-- before), and its bookings fire the trigger like this release's: old and
-- new side by side is safe.

-- The last replay, and how many there were: an event's age
-- (FENCEHOOK_MAX_AGE_SECS) counts from its last replay, not from its
-- acceptance, so an event replayed after a long outage is not dead on its
-- first failure.
ALTER TABLE events ADD COLUMN replayed_at timestamptz;
ALTER TABLE events ADD COLUMN replays integer NOT NULL DEFAULT 0;

-- What this event waited for was booked while a worker had it (between the
-- worker's look and its re-queue): the re-queue makes it due at once instead
-- of after its pause. Cleared by each take.
ALTER TABLE events ADD COLUMN woken boolean NOT NULL DEFAULT false;

-- When a payments row becomes `succeeded`, in either mode and whoever booked
-- it, the events waiting for it are woken: the refunds and disputes of a
-- payment, and a dispute's reinstatement waiting for its withdrawal. A queued
-- one is made due now and the workers are notified (only then: a NOTIFY in a
-- transaction serializes its commit behind a global lock, and most bookings
-- wake nothing); one a worker holds is flagged, and its re-queue makes it due.
-- A waiting event re-queued concurrently is caught either way: whichever of
-- the two updates of its row comes second sees the other's.
CREATE FUNCTION events_wake_waiting() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    queued bigint;
BEGIN
    IF TG_OP = 'UPDATE' AND OLD.status = 'succeeded' THEN
        RETURN NULL;
    END IF;
    -- Queued children, by their index (V5's events_parent_idx).
    UPDATE events SET next_attempt_at = now()
     WHERE provider = NEW.provider AND parent_transaction_id = NEW.transaction_id
       AND status = 'queued' AND next_attempt_at > now();
    GET DIAGNOSTICS queued = ROW_COUNT;
    -- Children being attempted: a handful of rows at most (V5's events_locked_idx).
    UPDATE events SET woken = true
     WHERE status = 'processing' AND provider = NEW.provider
       AND parent_transaction_id = NEW.transaction_id;
    -- The reinstatement of this dispute, by the unique key (V7).
    WITH r AS (
        UPDATE events
           SET next_attempt_at = CASE WHEN status = 'queued' THEN now() ELSE next_attempt_at END,
               woken = (status = 'processing')
         WHERE provider = NEW.provider AND transaction_id = NEW.transaction_id
           AND event_type = 'dispute.funds_reinstated'
           AND (status = 'processing' OR (status = 'queued' AND next_attempt_at > now()))
        RETURNING status)
    SELECT queued + count(*) FILTER (WHERE status = 'queued') INTO queued FROM r;
    IF queued > 0 THEN
        PERFORM pg_notify('fencehook_inbox', '');
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER payments_wake_waiting
    AFTER INSERT OR UPDATE OF status ON payments
    FOR EACH ROW WHEN (NEW.status = 'succeeded')
    EXECUTE FUNCTION events_wake_waiting();
