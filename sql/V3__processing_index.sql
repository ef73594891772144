-- Payments claimed but not finalised are few; this partial index lets the
-- service count the ones stuck in `processing` without scanning the table.
CREATE INDEX payments_processing_updated_at_idx ON payments (updated_at) WHERE status = 'processing';
