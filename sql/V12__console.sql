-- The operator console's payment search (src/store/console.rs): an index
-- behind every filter, so that a search reads a bounded number of rows on a
-- table of millions (docs/operations.md shows the plans on a million payments).
--
-- 1. Newest first, by provider and status, from a time or a page's cursor:
--    the search runs one range scan per (provider, status) pair it asks
--    about, each stopping after a page of rows, and merges them.
-- 2. A transaction id or a prefix of it, whatever the database's collation:
--    text_pattern_ops orders by bytes, so every id with a given prefix is one
--    range of the index (the UNIQUE (provider, transaction_id) index follows
--    the collation, where a prefix need not be contiguous).
--
-- Additive: two indexes, no column. Binaries from before it run on it
-- unchanged, and the console runs on the schema before it (its searches
-- then read more). The cost: each insert and status change of a payments
-- row writes two more index entries.
--
-- On a large table build them without blocking writes before migrating, by
-- hand (IF NOT EXISTS then makes this a no-op):
--   CREATE INDEX CONCURRENTLY payments_console_status_idx
--       ON payments (provider, status, created_at, id);
--   CREATE INDEX CONCURRENTLY payments_console_transaction_idx
--       ON payments (transaction_id text_pattern_ops);
CREATE INDEX IF NOT EXISTS payments_console_status_idx
    ON payments (provider, status, created_at, id);
CREATE INDEX IF NOT EXISTS payments_console_transaction_idx
    ON payments (transaction_id text_pattern_ops);
