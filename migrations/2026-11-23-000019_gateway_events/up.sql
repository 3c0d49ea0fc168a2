-- The gateway's events: an inbox that makes each one count once, and a way for one to wake its key.
SET LOCAL lock_timeout = '5s';

-- When a gateway event last said something about a key still unfinished: the completer takes a
-- key nudged since its last run at once, whatever its backoff. (No domain, no default: the
-- column is only a catalog change.)
ALTER TABLE idempotency_keys ADD COLUMN nudged_at timestamptz;

-- Every event received and verified, once: its id is the gateway's, unique per gateway, so a
-- delivery that comes again (at least once means twice, sometimes) finds its row and changes
-- nothing. Inserted in the transaction that applies the event. It is keyed by what the event is
-- about, the key row our downstream key names (with its account), and the event's own id: both
-- come from the event, so every delivery of it finds the same row, whatever the service recorded
-- meanwhile (a payment's gateway may move to the one that answered its charge). The gateway that
-- holds what the event is about is recorded beside.
CREATE DOMAIN gateway_event_id AS text CHECK (char_length(VALUE) BETWEEN 1 AND 255);
CREATE DOMAIN gateway_event_outcome AS text
    CHECK (VALUE IN ('applied', 'stale', 'disagreement', 'nudged'));
CREATE TABLE gateway_events (
    account_id         uuid                  NOT NULL REFERENCES accounts (id),
    gateway            gateway_identity      NOT NULL,
    event_id           gateway_event_id      NOT NULL,
    event_type         audit_label           NOT NULL,
    -- The key row whose request caused the event (kept after the key is reaped, like a payment's).
    idempotency_key_id uuid                  NOT NULL,
    object_id          gateway_charge_id     NOT NULL,
    -- The event's own time, as the gateway stamped it.
    created_at         timestamptz           NOT NULL,
    received_at        timestamptz           NOT NULL DEFAULT now(),
    outcome            gateway_event_outcome NOT NULL,
    PRIMARY KEY (account_id, idempotency_key_id, event_id)
);
