DROP TABLE unreadable_gateway_events;
