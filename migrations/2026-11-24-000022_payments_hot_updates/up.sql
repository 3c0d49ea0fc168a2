-- `charge_created` (and a refund's reservation and settlement) update a payment moments after it
-- was inserted, changing no indexed column: a HOT update, if the new version fits on the row's
-- page. Pages packed full by inserts leave it no room, so leave a fifth of each free, as key rows
-- do (000008). Only pages filled from now on are laid out so; no row moves.
--
-- Online: a storage parameter takes SHARE UPDATE EXCLUSIVE, which lets reads and writes through.
SET LOCAL lock_timeout = '5s';
ALTER TABLE payments SET (fillfactor = 80);
