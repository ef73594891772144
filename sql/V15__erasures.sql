-- `fencehook erase`: the record of each erasure of personal data
-- (src/store/erase.rs writes and reads this table; nothing else does).
--
-- A PSP's payload carries the payer's name, e-mail, address or card
-- holder; fencehook keeps each inbox event's body as received
-- (`events.body`) and each quarantined batch item (`quarantined_items.item`).
-- An erasure empties those of one object (a payment, with its refunds and
-- disputes) and keeps everything the money needs: the rows, their
-- fingerprints, the canonical events and the ledger. This table says that
-- it happened, when, by which database role, how much it emptied and why
-- (the operator's reason: a ticket). It holds ids, never personal data, and
-- is kept: it is the proof that a request was carried out.
--
-- Additive: one new table, nothing else changes. Binaries from before it
-- run on it unchanged; `erase` on the schema before it writes nothing and
-- says to run `fencehook migrate`.
CREATE TABLE erasures (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    erased_at timestamptz NOT NULL DEFAULT now(),
    provider text NOT NULL,
    transaction_id text NOT NULL,
    -- Event bodies and quarantined items emptied by this erasure.
    events bigint NOT NULL CONSTRAINT erasures_events_not_negative CHECK (events >= 0),
    quarantined_items bigint NOT NULL CONSTRAINT erasures_items_not_negative CHECK (quarantined_items >= 0),
    reason text,
    -- Who and where: the database role, the host's name (NULL when it could
    -- not be read) and the fencehook version.
    erased_by text NOT NULL DEFAULT current_user,
    host text,
    version text NOT NULL
);
CREATE INDEX erasures_object_idx ON erasures (provider, transaction_id);
