-- The indexes of `events`, after measuring them (docs/benchmarks.md).
--
-- An event is deduplicated by (provider, transaction id, event type). One
-- unique index on those three serves both the deduplication and every
-- lookup by transaction (the duplicate check, `events`, `inspect`), so it
-- replaces the unique key on `delivery_id` (the same transaction id and
-- event type joined by ':') and the index on (provider, transaction_id):
-- one index entry fewer for each write of an event (accepted, taken,
-- recorded done), and no two indexes for the planner to choose between.
ALTER TABLE events
    ADD CONSTRAINT events_provider_transaction_id_event_type_key
    UNIQUE (provider, transaction_id, event_type);
ALTER TABLE events DROP CONSTRAINT events_provider_delivery_id_key;
DROP INDEX events_transaction_idx;

-- Dead events are counted every few seconds (`fencehook_inbox_rows`) and
-- found by `replay --since`: without an index of their own each count read
-- the whole table, done rows included, which grows with retention. Queued
-- and processing events already have theirs (V5).
CREATE INDEX events_dead_idx ON events (received_at) WHERE status = 'dead';
