# syntax=docker/dockerfile:1
#
# One image with the three services: gateway, expiry-listener and
# guide-consumer, in /usr/local/bin. Each Kubernetes Deployment picks its
# binary with `command`; there is no ENTRYPOINT. Build it with
#
#   docker build -t ghcr.io/stillthere/stillthere:$(git describe --tags --always) .
#
# (docker buildx build --platform linux/amd64,linux/arm64 ... for both.)

ARG GO_VERSION=1.26.8

FROM --platform=$BUILDPLATFORM golang:${GO_VERSION}-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
ARG TARGETOS=linux
ARG TARGETARCH=amd64
# Static (no cgo), reproducible (-trimpath, no VCS stamp: .git is not in the
# context), stripped.
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -buildvcs=false -ldflags="-s -w" \
        -o /out/usr/local/bin/ ./gateway ./expiry-listener ./guide-consumer \
    && mkdir -p /out/var/lib/stillthere/spool

# distroless/static: CA certificates, tzdata, /etc/passwd with nonroot
# (65532), nothing else: no shell, no package manager.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/usr/local/bin/ /usr/local/bin/
# The listener's default spool directory, writable when no volume is
# mounted there (the chart mounts one).
COPY --from=build --chown=65532:65532 /out/var/lib/stillthere/ /var/lib/stillthere/
USER 65532:65532
# gateway: 8080 public, 8081 internal; expiry-listener: 8082; guide-consumer:
# 8083. The services listen on 127.0.0.1 unless told otherwise
# (STILLTHERE_GATEWAY_ADDR=:8080 and so on, as the chart does).
EXPOSE 8080 8081 8082 8083
CMD ["gateway"]
