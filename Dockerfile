# syntax=docker/dockerfile:1
# meshlet node agent image, for users with Docker (buildx):
#
#   docker buildx build --platform linux/amd64,linux/arm64 -t ghcr.io/meshlet/meshlet:dev .
#
# The project's own build is `make image` (hack/image/build.sh), which needs
# no Docker engine; this file builds the same content: the same static
# binary flags, and the same Debian rootfs from the same script
# (hack/image/rootfs.sh). hack/image/README.md says what is inside and why.
# Not built in CI (no Docker engine there).

# Stage 1: a static binary (CGO_ENABLED=0), cross-compiled on the build
# machine's platform for the target's architecture: no libc coupling with the
# runtime image, and the same binary the tests and e2e run.
FROM --platform=$BUILDPLATFORM golang:1.26 AS build
ARG TARGETARCH
# What make release stamps (hack/version.sh): docker buildx build
#   --build-arg VERSION=v0.1.0 --build-arg COMMIT=$(git rev-parse HEAD) \
#   --build-arg BUILD_DATE=$(date -u -d @$(git log -1 --format=%ct) +%Y-%m-%dT%H:%M:%SZ)
ARG VERSION=dev
ARG COMMIT=unknown
ARG BUILD_DATE=unknown
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 GOOS=linux GOARCH=${TARGETARCH} go build -trimpath -buildvcs=false \
        -ldflags "-s -w -buildid= -X main.version=${VERSION} -X main.commit=${COMMIT} -X main.date=${BUILD_DATE}" -o /out/meshlet ./cmd/meshlet
# The CNI plugins Kilo's install-cni init container copies from the kilo
# image's /opt/cni/bin (kg's default --cni=true), pinned in hack/tools/cni.
RUN cd hack/tools/cni && CGO_ENABLED=0 GOOS=linux GOARCH=${TARGETARCH} go build -trimpath -ldflags "-s -w -buildid=" -o /out/cni/ \
        github.com/containernetworking/plugins/plugins/main/bridge \
        github.com/containernetworking/plugins/plugins/ipam/host-local \
        github.com/containernetworking/plugins/plugins/main/loopback \
        github.com/containernetworking/plugins/plugins/meta/portmap

# Stage 2: the Debian rootfs (iptables with both backends, ca-certificates,
# and the shell and tools Kilo's manifests' init containers run in the kilo
# image: dash, coreutils, sed),
# unpacked by mmdebstrap for the target's architecture without emulation.
# Not distroless/static: go-iptables executes the iptables binaries.
FROM --platform=$BUILDPLATFORM debian:bookworm AS rootfs
ARG TARGETARCH
RUN apt-get update \
    && apt-get install -y --no-install-recommends mmdebstrap ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY hack/image/rootfs.sh hack/image/customize.sh /build/
RUN /build/rootfs.sh "${TARGETARCH}" /rootfs.tar && mkdir /rootfs && tar -xf /rootfs.tar -C /rootfs

FROM scratch
COPY --from=rootfs /rootfs/ /
COPY --from=build /out/meshlet /usr/local/bin/meshlet
COPY --from=build /out/cni/ /opt/cni/bin/
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
# Runs as root: configuring kilo0, routes, rules and iptables in the host's
# network namespace needs CAP_NET_ADMIN (and CAP_NET_RAW for iptables-legacy)
# in the init user namespace, and iptables refuses to run as a non-root user
# even with file capabilities. The DaemonSet runs it privileged, as Kilo's kg,
# because writing sysctls (ip_forward, rp_filter) needs a writable /proc/sys,
# with a read-only root filesystem (see manifests/base/daemonset.yaml).
USER 0:0
# meshlet itself, as kg is kg's: Kilo's manifests give the kilo container
# kg's flags and no command, and meshlet runs them as kg's (docs/dropin.md).
# It picks the host's iptables backend at start (--iptables-backend=auto).
ENTRYPOINT ["/usr/local/bin/meshlet"]
CMD ["run"]
