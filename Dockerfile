# One image with both binaries: /webhook (the chart's Deployment runs it) and /reporter (the webhook injects
# it with command ["/reporter"]). Static, non-root, distroless.
#
#   docker build --build-arg VERSION=v0.2.0 -t ghcr.io/addon-heartbeat/addon-heartbeat:v0.2.0 .
#
# Builds for the platform of the build (or --platform) with BuildKit's TARGETOS/TARGETARCH.

FROM --platform=$BUILDPLATFORM golang:1.26 AS build
ARG TARGETOS=linux
ARG TARGETARCH=amd64
# The release the binaries report (--version, addon_heartbeat_build_info); make release stamps it the same way.
ARG VERSION=""
WORKDIR /src
# Dependencies first, so that a source change does not download them again.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY cmd/ cmd/
COPY internal/ internal/
COPY pkg/ pkg/
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -ldflags="-s -w ${VERSION:+-X github.com/addon-heartbeat/addon-heartbeat/internal/version.version=$VERSION}" \
    -o /out/ ./cmd/webhook ./cmd/reporter

# distroless static: no shell, no package manager; "nonroot" is UID/GID 65532, which the chart and the
# injected container also set explicitly.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/webhook /webhook
COPY --from=build /out/reporter /reporter
USER 65532:65532
ENTRYPOINT ["/webhook"]
