-- The payments' refund totals start at zero, so the check added NOT VALID by the last migration
-- holds for every row already there: say so, scanning under a lock that lets reads and writes
-- through (SHARE UPDATE EXCLUSIVE). The recovery points' new rule is left NOT VALID on purpose:
-- it admits every value the old, valid one did, and validating a domain's constraint holds a
-- SHARE lock, which stops writes, on every table that uses it.
SET LOCAL lock_timeout = '5s';
ALTER TABLE payments VALIDATE CONSTRAINT payments_refund_totals_check;
