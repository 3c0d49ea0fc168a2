-- The audit trail's primary key becomes `(account_id, resource_type, resource_id, id)`, built by
-- the migration before, and the two indexes it replaces go: each record now writes one index entry
-- where it wrote two. `id` is an identity, unique by itself, so the key is as unique as before;
-- it still includes the account (a table distributed by account needs that), and still identifies
-- a row for logical replication. A key's story reads the records of a resource in order from it.
--
-- Online: the new key's columns are all NOT NULL already, so it is taken over without a scan;
-- dropping the old key and index changes the catalog only. Together they hold ACCESS EXCLUSIVE on
-- the audit trail for an instant, and read no row; the lock is waited for at most 5 s.
SET LOCAL lock_timeout = '5s';
ALTER TABLE audit_records
    DROP CONSTRAINT audit_records_pkey,
    ADD CONSTRAINT audit_records_pkey PRIMARY KEY USING INDEX audit_records_resource_key;
DROP INDEX audit_records_resource_idx;
