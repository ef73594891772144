\set tx random(1, 1000000000000)
\set amount random(1, 100000)
SELECT id, kind, status, fingerprint, fence FROM payments WHERE provider = 'pgbench' AND transaction_id = 'pg-' || :tx;
WITH claim AS (INSERT INTO payments (provider, transaction_id, kind, parent_transaction_id, event_type, amount_minor, currency, fingerprint, status, fence, occurred_at)
VALUES ('pgbench', 'pg-' || :tx::text, 'payment'::text, NULL::text, 'payment.succeeded'::text, :amount::int8, 'EUR'::text, md5('pg-' || :tx), 'succeeded'::text, 1::int8, NULL)
ON CONFLICT ON CONSTRAINT payments_provider_transaction_id_key DO UPDATE
   SET fence = EXCLUDED.fence,
       status = COALESCE('succeeded'::text, payments.status),
       event_type = COALESCE('payment.succeeded'::text, payments.event_type),
       amount_minor = EXCLUDED.amount_minor,
       currency = EXCLUDED.currency,
       parent_transaction_id = EXCLUDED.parent_transaction_id,
       fingerprint = EXCLUDED.fingerprint,
       updated_at = EXCLUDED.updated_at
 WHERE payments.status = ANY('{processing}'::text[])
   AND payments.fence < EXCLUDED.fence
   AND (payments.fingerprint = EXCLUDED.fingerprint
        OR (payments.kind = 'payment' AND EXCLUDED.kind = 'payment'
            AND (payments.status <> 'succeeded' OR EXCLUDED.event_type = 'payment.failed'))
        OR (payments.kind = 'refund' AND payments.parent_transaction_id IS NULL
            AND payments.status IN ('queued', 'processing', 'dead')
            AND payments.fingerprint = encode(sha256(convert_to(concat_ws(chr(31), 'v2',
                EXCLUDED.provider, EXCLUDED.transaction_id, 'refund', EXCLUDED.amount_minor::text,
                EXCLUDED.currency, ''), 'UTF8')), 'hex')))
RETURNING id, amount_minor, currency, occurred_at),
entry AS (
    INSERT INTO ledger_entries (payment_id, effect, amount_minor, currency, fence)
    SELECT id, 'credit'::text, amount_minor * 1, currency, 1 FROM claim WHERE 'credit'::text IS NOT NULL
    RETURNING payment_id)
SELECT id FROM claim;
