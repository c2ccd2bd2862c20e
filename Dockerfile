# dedupe-proxy's container image.
#   docker build -t dedupe-proxy:0.1.0 .
#   docker run -p 8081:8081 -p 9091:9091 -v dedupe-data:/data dedupe-proxy:0.1.0
# Mount your configuration at /etc/dedupe-proxy/config.yaml (a directory mount, so that
# edits reach the container and are reloaded).

FROM rust:1.95-slim-bookworm AS build
# jemalloc (the allocator) is built from source with make.
RUN apt-get update \
 && apt-get install -y --no-install-recommends make \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# Dependencies first, in a layer of their own that code changes do not invalidate (sled
# is built from vendor/, patched).
COPY Cargo.toml Cargo.lock ./
COPY vendor ./vendor
RUN mkdir src \
 && echo 'fn main() {}' > src/main.rs \
 && touch src/lib.rs \
 && cargo build --release --locked \
 && rm -rf src
COPY src ./src
# The sample deliveries `try --sample` sends are built in (tests/it/deploy.rs checks
# that the build stage copies every file the build reads).
COPY examples/deliveries ./examples/deliveries
RUN touch src/main.rs src/lib.rs \
 && cargo build --release --locked \
 && mkdir -p /out/data /out/etc \
 && cp target/release/dedupe-proxy /out/dedupe-proxy

# glibc, libgcc and CA certificates, no shell; runs as uid 65532 ("nonroot").
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/dedupe-proxy /usr/local/bin/dedupe-proxy
COPY --from=build --chown=65532:65532 /out/data /data
COPY config/container.yaml /etc/dedupe-proxy/config.yaml
USER 65532:65532
WORKDIR /data
VOLUME ["/data"]
# 8081: providers; 9091: health, readiness, metrics, admin API.
EXPOSE 8081 9091
# SIGTERM drains in-flight deliveries within shutdown_grace, then exits 0.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/dedupe-proxy"]
CMD ["run", "--config", "/etc/dedupe-proxy/config.yaml", "--log-format", "json"]
