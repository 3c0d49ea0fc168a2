-- The payments' new checks, added NOT VALID by the last migration, hold for every row already
-- there (each is `automatic`, with no captured amount, lapse or cancel, and refunds within its
-- amount): say so, scanning under a lock that lets reads and writes through (SHARE UPDATE
-- EXCLUSIVE). The domains' new rules stay NOT VALID, as 000018 explains.
SET LOCAL lock_timeout = '5s';
ALTER TABLE payments VALIDATE CONSTRAINT payments_capture_check;
ALTER TABLE payments VALIDATE CONSTRAINT payments_refunds_within_captured_check;
