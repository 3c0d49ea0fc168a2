ALTER TABLE audit_records ADD CONSTRAINT audit_records_account_id_fkey FOREIGN KEY (account_id) REFERENCES accounts (id);
ALTER TABLE staged_jobs ADD CONSTRAINT staged_jobs_account_id_fkey FOREIGN KEY (account_id) REFERENCES accounts (id);
