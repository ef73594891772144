-- Dead events are counted every few seconds (`fencehook_inbox_rows`) and
-- found by `replay --since`: without an index of their own each count read
-- the whole `events` table, done rows included, which grows with retention.
-- Queued and processing events already have theirs (V5).
CREATE INDEX events_dead_idx ON events (received_at) WHERE status = 'dead';
