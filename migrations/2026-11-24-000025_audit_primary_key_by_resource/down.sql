CREATE INDEX audit_records_resource_idx ON audit_records (account_id, resource_type, resource_id);
ALTER TABLE audit_records
    DROP CONSTRAINT audit_records_pkey,
    ADD CONSTRAINT audit_records_pkey PRIMARY KEY (account_id, id);
