ALTER TABLE refunds ADD CONSTRAINT refunds_account_id_gateway_refund_id_key UNIQUE (account_id, gateway_refund_id);
