# The `payments` binary on a slim Debian: `docker build -t payments .`
# The image has no PostgreSQL server, so it needs DATABASE_URL (see docker-compose.yml); embedded
# mode is for running from a checkout.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock openapi.yaml ./
COPY migrations migrations
COPY crates crates
COPY src src
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin payments \
    && cp target/release/payments /usr/local/bin/payments

FROM debian:bookworm-slim
RUN useradd --system --uid 10001 payments
COPY --from=build /usr/local/bin/payments /usr/local/bin/payments
USER payments
ENV PAYMENTS_BIND=0.0.0.0:8080
EXPOSE 8080
ENTRYPOINT ["payments"]
CMD ["serve"]
