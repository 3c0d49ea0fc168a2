-- The audit trail is read only by resource (a key's story: the records about a key row and what it
-- made, in the order they were written), never by its primary key, yet every record wrote an entry
-- to both indexes (two of the five records a payment writes, 80 bytes of WAL each). This index
-- serves the story's look-up, in order, and is unique, so the next migration makes it the primary
-- key in place of `(account_id, id)`: one index per record.
--
-- Built CONCURRENTLY (SHARE UPDATE EXCLUSIVE: records are written meanwhile), hence a migration of
-- its own, outside a transaction (`metadata.toml`), and a single statement. If it is interrupted,
-- it leaves an INVALID index of this name behind and is not marked as applied:
-- `DROP INDEX CONCURRENTLY audit_records_resource_key;` and migrate again.
CREATE UNIQUE INDEX CONCURRENTLY audit_records_resource_key
    ON audit_records (account_id, resource_type, resource_id, id);
