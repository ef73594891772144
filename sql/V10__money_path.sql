-- The money path end to end.
--
-- 1. A refund or a dispute claimed for a downstream call takes its money
--    from its payment at the claim, before the call, so a step the
--    downstream executed is never refused afterwards. `reserved` says the
--    row's amount is counted in its payment's `amount_out_minor` while the
--    row is not settled yet: a takeover of the claim does not take it
--    again, the finalize books the entry against it (and clears it), a
--    call the downstream refused gives it back.
-- 2. A dispute is money already gone (a chargeback larger than the charge,
--    or after a refund): it is booked past the payment's amount, so
--    `amount_out_minor` may exceed `amount_minor`. Refunds keep the cap,
--    which the code checks in the same locked update that books them.
--
-- Additive: a column with a constant default and a relaxed rule are both
-- changes to the catalog alone, no table is rewritten, and binaries from
-- before this migration run on it unchanged.

ALTER TABLE payments
    ADD COLUMN reserved boolean NOT NULL DEFAULT false;

ALTER TABLE payments DROP CONSTRAINT payments_amount_out_within_amount;
-- Checked without a long lock: NOT VALID takes effect for new writes at
-- once, VALIDATE reads the existing rows without blocking writers.
ALTER TABLE payments ADD CONSTRAINT payments_amount_out_not_negative
    CHECK (amount_out_minor >= 0) NOT VALID;
ALTER TABLE payments VALIDATE CONSTRAINT payments_amount_out_not_negative;
ALTER TABLE payments ADD CONSTRAINT payments_only_refunds_and_disputes_reserve
    CHECK (kind <> 'payment' OR NOT reserved) NOT VALID;
ALTER TABLE payments VALIDATE CONSTRAINT payments_only_refunds_and_disputes_reserve;
