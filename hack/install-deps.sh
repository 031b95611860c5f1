#!/usr/bin/env bash
# Installs the Debian packages meshlet's tests, e2e suite and demo use, when
# missing (root). Idempotent and quick when everything is there.
#   hack/install-deps.sh [test|all]   (default: what the e2e suite and demo need)
#   iproute2, iptables, nftables, conntrack, iputils-ping, procps: nodes as
#     network namespaces, NAT router, meshlet's own iptables chains
#   prometheus: promtool for the shipped alert rules
#   qemu-system-x86, busybox-static, kmod, cpio: the kernel lane
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
need=(iproute2 iptables nftables conntrack iputils-ping procps)
case "${1:-}" in
test) need+=(prometheus) ;;
all) need+=(prometheus qemu-system-x86 busybox-static kmod cpio) ;;
esac
missing=()
for p in "${need[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "== apt-get install ${missing[*]}" >&2
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  # Debian's prometheus package starts a server; only promtool is used.
  systemctl stop prometheus prometheus-node-exporter 2>/dev/null || true
fi
mkdir -p /run/wireguard
