# syntax=docker/dockerfile:1
# meshlet node agent image.
#
#   docker build -t ghcr.io/meshlet/meshlet:dev .
#
# Stage 1: a static binary (CGO_ENABLED=0): no libc coupling with the runtime
# image, and the same binary the tests and e2e run.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" \
        -o /out/meshlet ./cmd/meshlet

# Stage 2: NOT distroless/static, on purpose. meshlet manages its NAT chains
# with go-iptables, which executes the iptables/ip6tables(-restore) binaries;
# distroless has no iptables and no way to add it. debian-slim is the smallest
# base that ships both backends (iptables-nft and iptables-legacy): meshlet
# must use the backend the host's kube-proxy/Cilium use, or its rules land in
# tables nobody evaluates. Nothing else is installed (no shell tools are
# needed: links, routes, rules and WireGuard go through netlink/wgctrl).
FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends iptables ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/meshlet /usr/local/bin/meshlet
# Runs as root: configuring kilo0, routes, rules and iptables in the host's
# network namespace needs CAP_NET_ADMIN (and CAP_NET_RAW for iptables-legacy)
# in the init user namespace, and iptables refuses to run as a non-root user
# even with file capabilities. The DaemonSet runs it privileged, as Kilo's kg,
# because writing sysctls (ip_forward, rp_filter) needs a writable /proc/sys,
# with a read-only root filesystem (see manifests/daemonset.yaml).
USER 0:0
ENTRYPOINT ["/usr/local/bin/meshlet"]
CMD ["run"]
