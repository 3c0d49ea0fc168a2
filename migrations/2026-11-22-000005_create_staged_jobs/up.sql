-- The transactional outbox: a job is staged in the same transaction that finishes a request, so it
-- exists if and only if that request finished. A worker delivers and deletes it.
CREATE TABLE staged_jobs (
    id         bigint      GENERATED ALWAYS AS IDENTITY,
    account_id uuid        NOT NULL REFERENCES accounts (id),
    job_name   text        NOT NULL CHECK (char_length(job_name) BETWEEN 1 AND 100),
    job_args   jsonb       NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    -- When the job is next due: now for a new job, later after a failed attempt.
    run_at     timestamptz NOT NULL DEFAULT now(),
    attempts   integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    last_error text        CHECK (char_length(last_error) <= 1000),
    PRIMARY KEY (account_id, id)
);

-- The delivery worker's scan: due jobs, oldest first.
CREATE INDEX staged_jobs_run_at_idx ON staged_jobs (run_at);
