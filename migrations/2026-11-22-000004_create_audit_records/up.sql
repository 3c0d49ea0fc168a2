-- What happened to which resource, written in the same transaction as the change it describes.
CREATE TABLE audit_records (
    id            bigint      GENERATED ALWAYS AS IDENTITY,
    account_id    uuid        NOT NULL REFERENCES accounts (id),
    action        text        NOT NULL CHECK (char_length(action) BETWEEN 1 AND 50),
    resource_type text        NOT NULL CHECK (char_length(resource_type) BETWEEN 1 AND 50),
    resource_id   uuid        NOT NULL,
    -- Who acted: the API on a client's behalf, or a background worker.
    actor         text        NOT NULL CHECK (char_length(actor) BETWEEN 1 AND 50),
    data          jsonb       NOT NULL DEFAULT '{}',
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (account_id, id)
);

CREATE INDEX audit_records_resource_idx ON audit_records (account_id, resource_type, resource_id);
