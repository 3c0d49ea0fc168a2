DROP TABLE key_request_counts;
