-- Leases for FENCEHOOK_LEASE_BACKEND=postgres: the same lease, token and
-- fence semantics as the Redis backend, kept in the database.
--
-- One row per transaction ever leased. `token` is the fence counter: it only
-- grows (acquire and resync raise it, release never lowers or deletes it).
-- The lease is held while owner IS NOT NULL AND expires_at > clock_timestamp().
CREATE TABLE leases (
    provider       text        NOT NULL,
    transaction_id text        NOT NULL,
    owner          uuid,
    token          bigint      NOT NULL CHECK (token > 0),
    expires_at     timestamptz,
    PRIMARY KEY (provider, transaction_id)
);
