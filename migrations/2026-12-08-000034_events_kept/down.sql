DROP TABLE events;
DROP DOMAIN event_type;
