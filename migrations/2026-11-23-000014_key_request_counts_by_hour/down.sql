DROP INDEX CONCURRENTLY IF EXISTS key_request_counts_hour_idx;
