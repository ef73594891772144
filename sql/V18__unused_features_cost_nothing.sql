-- What sync mode without a console does not use costs its bookings nothing.
--
-- 1. The inbox's wake-up trigger (V11, V13). `payments_wake_waiting` runs a
--    PL/pgSQL function and an UPDATE of `events` for every payment booked
--    `succeeded`, in either mode. On a database no inbox uses, nothing ever
--    waits, and it was about a seventh of PostgreSQL's CPU per booking (make
--    bench, one instance at k = 1: 249-253 µs of PostgreSQL CPU a delivery
--    with it, 215-219 without; the rate 0.91x). So it is switched off here
--    unless the database has held an event, and the first accept of an
--    inbox-mode instance switches it on again before its event is stored
--    (`Store::switch_on_payment_wakes`): from then on every booking wakes what
--    waits, whoever books it (a sync instance beside inbox ones included).
--
-- 2. The console's two indexes of `payments` (V12): two more index entries
--    for every payment written (pgbench on the booking's statements: 0.95x
--    with them). Dropped here from a database that has no payment yet (a new
--    one); an instance that serves the console builds them, CONCURRENTLY, at
--    its start (`store::console::build_indexes`). A database with payments
--    keeps them: a console may be reading them.
--
-- Additive in effect: a binary from before this one in inbox mode, on a
-- database that has held no event, does not switch the trigger on (its
-- waiting events then wait for their pause, at most a minute, as on the
-- schema before V11); one serving the console on a new database searches
-- without the indexes (reading more rows) until this release's console
-- builds them.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM events) THEN
        ALTER TABLE payments DISABLE TRIGGER payments_wake_waiting;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM payments) THEN
        DROP INDEX IF EXISTS payments_console_status_idx;
        DROP INDEX IF EXISTS payments_console_transaction_idx;
    END IF;
END;
$$;
