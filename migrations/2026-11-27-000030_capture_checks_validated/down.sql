-- Validation cannot be undone, and needs no undoing.
SELECT 1;
