ALTER TABLE staged_jobs DROP COLUMN leased_until;
