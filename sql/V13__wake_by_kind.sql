-- Inbox mode: a booking looks only for the events that can wait for it.
--
-- Additive: the function of V11's trigger is replaced; no table, column or
-- index changes. Binaries from before it run beside it unchanged, and this
-- release runs on the schema before it (its bookings then make both
-- look-ups of V11).
--
-- V11's function looked up, for every row becoming `succeeded`, both the
-- events naming it as their parent (the refunds and disputes of a payment)
-- and its dispute reinstatement. Only a dispute has a reinstatement (the
-- reinstatement is an event of the dispute's own transaction, and its row
-- is the dispute's), so the second look-up now runs for disputes alone:
-- one statement fewer in the commit of every payment and refund booked.
-- (A reinstatement whose transaction id some payment or refund also has
-- is a payload mismatch whatever wakes it: it now reaches that end after
-- its pause instead of at once.) The first look-up stays for every kind:
-- a refund naming a refund or a dispute as its parent waits for that row,
-- and is refused (`not_a_payment`) once it is booked.
CREATE OR REPLACE FUNCTION events_wake_waiting() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    queued bigint;
    woken bigint := 0;
BEGIN
    IF TG_OP = 'UPDATE' AND OLD.status = 'succeeded' THEN
        RETURN NULL;
    END IF;
    -- Its children, queued or being attempted, by their own index (V11): a
    -- queued one made due now, one being attempted stamped with the wall
    -- clock.
    UPDATE events
       SET next_attempt_at = CASE WHEN status = 'queued' THEN now() ELSE clock_timestamp() END
     WHERE provider = NEW.provider AND parent_transaction_id = NEW.transaction_id
       AND (status = 'processing' OR (status = 'queued' AND next_attempt_at > now()));
    GET DIAGNOSTICS queued = ROW_COUNT;
    -- The reinstatement of this dispute, by the unique key (V7).
    IF NEW.kind = 'dispute' THEN
        UPDATE events
           SET next_attempt_at = CASE WHEN status = 'queued' THEN now() ELSE clock_timestamp() END
         WHERE provider = NEW.provider AND transaction_id = NEW.transaction_id
           AND event_type = 'dispute.funds_reinstated'
           AND (status = 'processing' OR (status = 'queued' AND next_attempt_at > now()));
        GET DIAGNOSTICS woken = ROW_COUNT;
    END IF;
    IF queued + woken > 0 THEN
        PERFORM pg_notify('fencehook_inbox', '');
    END IF;
    RETURN NULL;
END;
$$;
