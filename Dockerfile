# syntax=docker/dockerfile:1
#
# One image for both processes: the controller manager (/manager) and the listener. The
# controller starts listener pods from its own image (CONTROLLER_MANAGER_CONTAINER_IMAGE), so
# the two always come from the same build.
#
#   docker build -t ghcr.io/arc-rs/arc-rs:0.1.0 .
#
# A .dockerignore excluding target/ keeps the build context small.

ARG RUST_VERSION=1.95

FROM docker.io/library/rust:${RUST_VERSION}-bookworm AS builder
WORKDIR /src
# The whole workspace is needed: cargo loads every member's manifest, tests included.
COPY . .
# Cache mounts keep the registry and build artefacts between builds; the binaries are copied
# out of the cached target directory in the same step. The listener goes to /ghalistener, the
# upstream listener entrypoint the controller uses by default, with /listener as a plain alias.
# The `dist` profile (Cargo.toml) optimises the whole program at once: less code to keep resident.
# e2e-bench builds the two binaries with this same command (tests/harness/src/binaries.rs), so
# its figures are this image's.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --profile dist --locked -p controller --bin manager -p listener --bin listener \
    && mkdir -p /out \
    && cp target/dist/manager /out/manager \
    && cp target/dist/listener /out/ghalistener \
    && ln -s ghalistener /out/listener

# glibc and libgcc only, no shell, no package manager; runs as the distroless nonroot user.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=builder /out/ /
USER 65532:65532
ENTRYPOINT ["/manager"]
