//! The fenced write's SQL, every statement in one place: the fast-path
//! lookup, the one-statement fenced upsert (`fenced_upsert!`) with the
//! ledger entry it feeds, the claim and finalize of the downstream route,
//! the parent's money moved under its row lock, and quarantine. Each write
//! is conditioned on the lease's token; the store runs them
//! ([`super::Connection`]).

pub(super) const SELECT_PAYMENT: &str =
    "SELECT id, kind, status, fingerprint, fence FROM payments \
     WHERE provider = $1 AND transaction_id = $2";

/// The fenced upsert. No function in its conflict clause: `updated_at` comes
/// from the proposed row's default (`EXCLUDED`), the same transaction time
/// `now()` gives, so a sharded engine that refuses functions there (Citus)
/// takes it unchanged (docs/scaling.md). Parameters: $1 provider, $2 transaction_id, $3 kind,
/// $4 parent_transaction_id, $5 event_type, $6 amount_minor, $7 currency,
/// $8 fingerprint, $9 status of a new row, $10 token, $11 occurred_at,
/// $12 the statuses the row may have (text[]), $13 the status an existing
/// row moves to (NULL: keep it — a claim), $14 its event type (NULL: keep it).
/// The proposed row is `$rows`: [`proposed_row!`], or, with the lease taken
/// inside the write, the same parameters fenced with the lease's token
/// ([`APPLY_LEASED`]).
/// The fingerprint must be the row's, with two exceptions, where the row takes
/// the event's fields and fingerprint (the same values otherwise): a
/// payment's event while no success has settled it (a failure moved no
/// money, booked or not, so a success's amount and currency stand, and a
/// failure's are as good as the last one's; see
/// [`domain::payment_event_matches`](crate::domain::payment_event_matches)),
/// and a refund left unsettled by a release before refunds
/// named their payment (migration V4 fingerprinted it with an empty parent):
/// it gets its parent now, and its money is taken from it. A settled one
/// keeps no parent (its debit never moved its payment's money): the
/// processor sends its later events without one.
/// A parameter stored in a column whose type is a domain (V8) is cast to
/// the domain's base type: tokio-postgres binds `&str` to text and `i64` to
/// bigint, not to a domain over them.
macro_rules! fenced_upsert {
    ($rows:expr $(, $returning:literal)?) => {
        concat!("INSERT INTO payments (provider, transaction_id, kind, parent_transaction_id, event_type, amount_minor, currency, fingerprint, status, fence, occurred_at)
", $rows, "
ON CONFLICT ON CONSTRAINT payments_provider_transaction_id_key DO UPDATE
   SET fence = EXCLUDED.fence,
       status = COALESCE($13::text, payments.status),
       event_type = COALESCE($14::text, payments.event_type),
       amount_minor = EXCLUDED.amount_minor,
       currency = EXCLUDED.currency,
       parent_transaction_id = EXCLUDED.parent_transaction_id,
       fingerprint = EXCLUDED.fingerprint,
       updated_at = EXCLUDED.updated_at
 WHERE payments.status = ANY($12::text[])
   AND payments.fence < EXCLUDED.fence
   AND (payments.fingerprint = EXCLUDED.fingerprint
        OR (payments.kind = 'payment' AND EXCLUDED.kind = 'payment'
            AND (payments.status <> 'succeeded' OR EXCLUDED.event_type = 'payment.failed'))
        OR (payments.kind = 'refund' AND payments.parent_transaction_id IS NULL
            AND payments.status IN ('queued', 'processing', 'dead')
            AND payments.fingerprint = encode(sha256(convert_to(concat_ws(chr(31), 'v2',
                EXCLUDED.provider, EXCLUDED.transaction_id, 'refund', EXCLUDED.amount_minor::text,
                EXCLUDED.currency, ''), 'UTF8')), 'hex')))
RETURNING id, amount_minor, currency, occurred_at" $(, $returning)?)
    };
}

/// The proposed row of [`fenced_upsert!`], from its parameters.
macro_rules! proposed_row {
    () => {
        "VALUES ($1, $2::text, $3::text, $4::text, $5::text, $6::int8, $7::text, $8, $9::text, $10::int8, $11)"
    };
}

/// The ledger insert fed by the upsert `claim` of an inline write: effect
/// `$15`, sign `$16`, at fence `$fence` (none when `$15` is NULL), only for
/// a row the upsert wrote.
macro_rules! ledger_entry {
    ($fence:literal) => {
        concat!(
            "entry AS (
    INSERT INTO ledger_entries (payment_id, effect, amount_minor, currency, fence)
    SELECT id, $15::text, amount_minor * $16, currency, ",
            $fence,
            " FROM claim WHERE $15::text IS NOT NULL
    RETURNING payment_id)"
        )
    };
}

/// The claim of the downstream path; also says whether the row holds its
/// money already (`reserved`, migration V10: the downstream path needs it,
/// the inline path runs on the schema before it).
pub(super) const CLAIM: &str = fenced_upsert!(proposed_row!(), ", reserved");

/// The one-statement write of the inline path: the upsert writes the final
/// status and feeds the ledger insert, only for a row the upsert wrote.
pub(super) const APPLY: &str = concat!(
    "WITH claim AS (",
    fenced_upsert!(proposed_row!()),
    "),
",
    ledger_entry!("$10"),
    "
SELECT id FROM claim"
);

/// [`APPLY`] with the lease taken inside it (the inline path of a lease
/// backend that offers it, see [`Connection::apply_leased`]): the lease
/// backend's fragment comes first (`take_inside!` in `lease::postgres`, a
/// CTE `lease`), and the payment row and its entry are written only from the
/// token it took (`FROM lease`). Returns the token (NULL: held by someone
/// else), the payment id (NULL: not written) and, when held, the
/// milliseconds left on the holder's lease. The same parameters as
/// [`APPLY`], `$10` the floor of the token; the parameters are cast because
/// a `SELECT` list does not take its types from the columns it feeds, as
/// `VALUES` does.
pub(super) const APPLY_LEASED: &str = concat!(
    "WITH ",
    crate::lease::postgres::take_inside!(),
    ",
claim AS (",
    fenced_upsert!(
        "SELECT $1::text, $2::text, $3::text, $4::text, $5::text, $6::int8, $7::text, $8::text, $9::text, token, $11::timestamptz FROM lease",
        ", fence"
    ),
    "),
",
    ledger_entry!("fence"),
    "
SELECT (SELECT token FROM lease), (SELECT id FROM claim),
       CASE WHEN NOT EXISTS (SELECT FROM lease) THEN (",
    crate::lease::postgres::remaining_ms!(),
    ") END"
);

/// Status, event type and ledger entry in one statement, conditioned on the
/// token; a reservation the claim made is now the entry's. $1 id, $2 token,
/// $3 status, $4 event type, $5 statuses it may have, $6 effect (NULL:
/// none), $7 sign.
pub(super) const FINALIZE: &str = "\
WITH upd AS (
    UPDATE payments SET status = $3::text, event_type = $4::text, reserved = false, updated_at = now()
     WHERE id = $1 AND fence = $2 AND status = ANY($5::text[])
    RETURNING id, amount_minor, currency),
entry AS (
    INSERT INTO ledger_entries (payment_id, effect, amount_minor, currency, fence)
    SELECT id, $6::text, amount_minor * $7, currency, $2 FROM upd WHERE $6::text IS NOT NULL
    RETURNING payment_id)
SELECT id FROM upd";

/// The money a payment's disputes hold of its `amount_out_minor`: each
/// dispute booked and not reinstated (`succeeded`), or whose claim reserved
/// it (`reserved`, V10; read through `to_jsonb`, so that the statement runs
/// on the schemas before V10 the inline path books on, where no row is
/// reserved). $1 provider, $2 the payment's transaction id. Read after the
/// payment row is locked ([`LOCK_PARENT`]): every dispute moves its money
/// under that lock, in the transaction that writes its own row, so a
/// snapshot taken after the lock sees each dispute and its money together.
macro_rules! disputes_out {
    () => {
        "(SELECT coalesce(sum(d.amount_minor), 0)::int8 FROM payments d
   WHERE d.provider = $1 AND d.parent_transaction_id = $2 AND d.kind = 'dispute'
     AND (d.status = 'succeeded' OR coalesce((to_jsonb(d) ->> 'reserved')::boolean, false)))"
    };
}

/// Locks a refund's or dispute's payment row ($1 provider, $2 its
/// transaction id), or fails at once (SQLSTATE 55P03) when another
/// transaction holds it; `NO KEY` so as not to wait for entries that merely
/// reference the row. Its own statement, before [`MOVE_PARENT_MONEY`]: that
/// one's snapshot then sees every committed move of the payment's money
/// (none can commit while the lock is ours).
pub(super) const LOCK_PARENT: &str = "\
SELECT id FROM payments WHERE provider = $1 AND transaction_id = $2 FOR NO KEY UPDATE NOWAIT";

/// Moves money out of (positive $4) or back into (negative) a succeeded
/// payment of the same currency, locked by [`LOCK_PARENT`]: never below
/// zero, and a refund never so that the refunds (net of reversals) exceed
/// its amount; a dispute (`$5`: money already gone) is not capped, nor are
/// the refunds and disputes together. Returns whether this move took the
/// payment (further) past its amount: more has gone out than came in.
pub(super) const MOVE_PARENT_MONEY: &str = concat!(
    "\
UPDATE payments SET amount_out_minor = amount_out_minor + $4, updated_at = now()
 WHERE provider = $1 AND transaction_id = $2
   AND kind = 'payment' AND status = 'succeeded' AND currency = $3
   AND amount_out_minor + $4 >= 0
   AND ($4 < 0 OR $5::bool OR amount_out_minor + $4 - ",
    disputes_out!(),
    " <= amount_minor)
RETURNING $4 > 0 AND amount_out_minor > amount_minor"
);

/// Marks a claimed row as holding its money (taken by the claim). $1 id.
pub(super) const RESERVE: &str = "UPDATE payments SET reserved = true WHERE id = $1";

/// Clears the reservation of a row still ours ($1 id, $2 token).
pub(super) const RELEASE: &str = "\
UPDATE payments SET reserved = false, updated_at = now()
 WHERE id = $1 AND fence = $2 AND reserved
RETURNING id";

/// What the payment a refund or dispute names looks like, to say why it refused.
pub(super) const SELECT_PARENT: &str = concat!(
    "\
SELECT kind, status, currency, amount_minor, amount_out_minor, ",
    disputes_out!(),
    " FROM payments
 WHERE provider = $1 AND transaction_id = $2"
);

/// One row per (provider, key): `item_sha256` is the SHA-256 of the item's
/// key — for an Adyen item the fields its signature covers — not of its
/// bytes, which anyone holding a captured item can vary at will (V9).
pub(super) const QUARANTINE: &str = "\
INSERT INTO quarantined_items (provider, transaction_id, reason, item, item_sha256)
VALUES ($1, $2, $3, $4, encode(sha256(convert_to($5, 'UTF8')), 'hex'))
ON CONFLICT ON CONSTRAINT quarantined_items_provider_item_key DO UPDATE
   SET times_seen = quarantined_items.times_seen + 1, last_seen_at = EXCLUDED.last_seen_at,
       reason = EXCLUDED.reason
RETURNING times_seen";
