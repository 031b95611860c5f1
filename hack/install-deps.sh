#!/usr/bin/env bash
# Installs the Debian packages meshlet's tests, e2e suite and demo use, when
# missing (root). Idempotent and quick when everything is there.
#   hack/install-deps.sh [demo|test|image|node|all]   (default: what the e2e suite needs)
#   iproute2, iptables, nftables, conntrack, iputils-ping, procps: nodes as
#     network namespaces, NAT router, meshlet's own iptables chains
#   wireguard-tools: `wg show` of a node's device, a next step the demo prints
#     (make demo, make e2e's TestDemoOnce runs it)
#   prometheus: promtool for the shipped alert rules (make test), and the real
#     Prometheus that make e2e runs the alerts and the dashboard's queries on
#   qemu-system-x86, busybox-static, kmod, cpio: the kernel lane
#   mmdebstrap: the image's Debian rootfs (make image)
#   containerd, runc, containernetworking-plugins, busybox-static: the real-node lane
#     (make e2e-node; busybox is the ping pods' image)
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
need=(iproute2 iptables nftables conntrack iputils-ping procps)
case "${1:-}" in
demo) need+=(wireguard-tools) ;;
"") need+=(prometheus wireguard-tools) ;;
test) need+=(prometheus) ;;
image) need+=(mmdebstrap) ;;
node) need+=(mmdebstrap containerd runc containernetworking-plugins busybox-static) ;;
all) need+=(prometheus wireguard-tools qemu-system-x86 busybox-static kmod cpio mmdebstrap containerd runc containernetworking-plugins) ;;
esac
missing=()
for p in "${need[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "== apt-get install ${missing[*]}" >&2
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  # Debian's prometheus and containerd packages start servers where systemd
  # runs; the tests start their own Prometheus and containerd.
  systemctl stop prometheus prometheus-node-exporter containerd 2>/dev/null || true
fi
mkdir -p /run/wireguard /run/meshlet
