# syntax=docker/dockerfile:1
#
# One image for both processes: the controller manager (/manager) and the listener. The
# controller starts listener pods from its own image (CONTROLLER_MANAGER_CONTAINER_IMAGE), so
# the two always come from the same build.
#
#   docker build -t ghcr.io/arc-rs/arc-rs:0.1.0 .
#   docker buildx build --platform linux/amd64,linux/arm64 -t ghcr.io/arc-rs/arc-rs:0.1.0 .
#
# Every platform is cross-compiled on the build machine's own (no emulation): the builder stage runs on
# $BUILDPLATFORM and builds for $TARGETPLATFORM with Rust's target and Debian's cross C toolchain (aws-lc, the TLS
# library, has C parts).
#
# A .dockerignore excluding target/ keeps the build context small.

ARG RUST_VERSION=1.95

FROM --platform=$BUILDPLATFORM docker.io/library/rust:${RUST_VERSION}-bookworm AS builder
ARG TARGETARCH
WORKDIR /src
RUN case "$TARGETARCH" in \
      amd64) echo x86_64-unknown-linux-gnu ;; \
      arm64) echo aarch64-unknown-linux-gnu ;; \
      *) echo "unsupported architecture: $TARGETARCH" >&2; exit 1 ;; \
    esac > /target-triple \
    && rustup target add "$(cat /target-triple)" \
    && if [ "$TARGETARCH" = arm64 ] && [ "$(uname -m)" != aarch64 ]; then \
      apt-get update && apt-get install -y --no-install-recommends gcc-aarch64-linux-gnu libc6-dev-arm64-cross \
      && rm -rf /var/lib/apt/lists/*; \
    fi
ENV CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
    CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc \
    AR_aarch64_unknown_linux_gnu=aarch64-linux-gnu-ar
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
      --target "$(cat /target-triple)" \
    && mkdir -p /out \
    && cp "target/$(cat /target-triple)/dist/manager" /out/manager \
    && cp "target/$(cat /target-triple)/dist/listener" /out/ghalistener \
    && ln -s ghalistener /out/listener

# glibc and libgcc only, no shell, no package manager; runs as the distroless nonroot user.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=builder /out/ /
USER 65532:65532
ENTRYPOINT ["/manager"]
