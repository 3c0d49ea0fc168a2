DROP TABLE audit_records;
