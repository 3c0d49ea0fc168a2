-- The audit trail and the outbox name their account without holding on to it. An audit record is
-- evidence that outlives what it records, and an event in the outbox is on its way out; neither
-- needs the account to exist, nor to keep it from being deleted. And each such foreign key made
-- every audited write lock the account's one row (`FOR KEY SHARE`): every request of an account
-- contended on it, through a MultiXact once two held it at once. Key rows and payments keep
-- theirs: nothing may be claimed or paid for an account that does not exist.
ALTER TABLE audit_records DROP CONSTRAINT audit_records_account_id_fkey;
ALTER TABLE staged_jobs DROP CONSTRAINT staged_jobs_account_id_fkey;
