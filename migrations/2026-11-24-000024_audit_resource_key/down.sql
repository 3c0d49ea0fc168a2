DROP INDEX CONCURRENTLY IF EXISTS audit_records_resource_key;
