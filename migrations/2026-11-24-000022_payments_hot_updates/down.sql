ALTER TABLE payments RESET (fillfactor);
