ALTER TABLE payments ADD CONSTRAINT payments_account_id_gateway_charge_id_key UNIQUE (account_id, gateway_charge_id);
