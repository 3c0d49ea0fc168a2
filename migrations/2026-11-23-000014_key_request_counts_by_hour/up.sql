-- `payments stats` reads the last N hours of every account, and the reaper deletes the hours past
-- their retention: both by `hour`, which the primary key (account_id, hour) cannot serve without
-- reading every account's rows. With this index each reads only the hours it wants.
--
-- Built online, like 000013 (see there for an interrupted build).
CREATE INDEX CONCURRENTLY key_request_counts_hour_idx ON key_request_counts (hour);
