-- PayPal deliveries already seen, by transmission id, for as long as their
-- transmission time is inside the provider's window.
--
-- PayPal signs `transmission_id|transmission_time|webhook_id|CRC32(body)`,
-- and CRC-32 is linear: any body can be padded to the CRC of a captured one,
-- so one genuine set of headers verifies any number of forged bodies. The
-- headers are bound to the first body seen with them: the SHA-256 of that
-- body is kept here, and a later delivery with the same transmission id and
-- another body is refused (401). Shared by every instance behind the load
-- balancer, which is why it is a table and not process memory.
--
-- A row is needed only until its transmission time leaves the window (after
-- that the delivery is refused on its time alone): `expires_at`. Rows past
-- it are pruned a few at a time by the statement that records new ones.
--
-- Additive: a new table that no earlier binary reads or writes.
CREATE TABLE paypal_transmissions (
    provider        text        NOT NULL,
    transmission_id text        NOT NULL,
    body_sha256     text        NOT NULL,
    first_seen_at   timestamptz NOT NULL DEFAULT now(),
    expires_at      timestamptz NOT NULL,
    -- confirm = "api": when PayPal's API confirmed the event (NULL: not yet,
    -- or the provider does not ask).
    confirmed_at    timestamptz,
    CONSTRAINT paypal_transmissions_pkey PRIMARY KEY (provider, transmission_id)
);
CREATE INDEX paypal_transmissions_expires_idx ON paypal_transmissions (expires_at);

-- A quarantined batch item is one row per (provider, key), where the key is
-- what the item's signature covers (for Adyen: pspReference,
-- originalReference, merchantAccountCode, merchantReference, value,
-- currency, eventCode, success), no longer the item's bytes: the unsigned
-- fields of a captured item (eventDate, additionalData, …) can be varied
-- at will, and each variant made a row of its own. No change of schema:
-- `item_sha256` now holds the SHA-256 of that key; rows written before keep
-- theirs (an item seen before and after the upgrade may have two rows).
COMMENT ON COLUMN quarantined_items.item_sha256 IS
    'SHA-256 (hex) of the item''s key: the fields its signature covers (V9); before V9, of the item as received';
