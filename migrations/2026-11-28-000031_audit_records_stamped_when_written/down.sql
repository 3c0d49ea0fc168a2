ALTER TABLE audit_records ALTER COLUMN created_at SET DEFAULT now();
