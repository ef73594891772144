-- The inbox's wake-up trigger (V11, V13) costs nothing where no inbox is used.
--
-- `payments_wake_waiting` runs a PL/pgSQL function and an UPDATE of `events`
-- for every payment booked `succeeded`, in either mode. On a database that
-- only sync instances use, no event ever waits, and that was about a third of
-- PostgreSQL's CPU per booking on top of the booking itself (make bench: 216
-- µs of PostgreSQL CPU a delivery without it, 249-253 with it; one instance's
-- rate 0.91x). So it is switched off here unless the database has held an
-- event, and the first accept of an inbox-mode instance switches it on again
-- (`Store::switch_on_payment_wakes`, once per process) before its event is
-- stored: from then on every booking wakes what waits, whoever books it (a
-- sync instance beside inbox ones included), as before.
--
-- Additive in effect: a binary from before this one in inbox mode, on a
-- database that has held no event, does not switch it on; its waiting events
-- then fall back to their pause (at most a minute), as on the schema before
-- V11. A database that has held events keeps the trigger as it was.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM events) THEN
        ALTER TABLE payments DISABLE TRIGGER payments_wake_waiting;
    END IF;
END;
$$;
