#!/usr/bin/env bash
# Builds the Debian rootfs of meshlet's image for one architecture, as a
# tarball, with mmdebstrap (Debian package; no Docker engine, no emulation).
#
#   hack/image/rootfs.sh ARCH OUT.tar
#
# The extract variant unpacks the packages (and what they depend on) without
# running their maintainer scripts, so a foreign architecture (arm64 on an
# amd64 machine) needs no qemu: the few things those scripts would do are
# done by customize.sh. What is in it and why: hack/image/README.md.
# A fixed SOURCE_DATE_EPOCH makes mmdebstrap's tarball reproducible: the same
# package versions give the same bytes.
set -euo pipefail
arch=${1:?usage: rootfs.sh ARCH OUT.tar}
out=${2:?usage: rootfs.sh ARCH OUT.tar}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
suite=${DEBIAN_SUITE:-bookworm}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
security=${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
export SOURCE_DATE_EPOCH=${ROOTFS_EPOCH:-1735689600} # 2025-01-01T00:00:00Z
# The packages are the suite's and its security pocket's as the mirrors have
# them when the rootfs is built; build.sh caches it under a key of this file
# and customize.sh, so the same machine builds the same bytes. A rebuild
# picks up Debian's newer security updates when this line changes (the
# date of the last refresh; docs/releasing.md#debian):
# refreshed: 2026-12-07

command -v mmdebstrap >/dev/null || { echo "rootfs.sh: mmdebstrap missing (apt-get install mmdebstrap)" >&2; exit 1; }
# ./dev is left out: the container runtime provides /dev, and device nodes
# in a layer need CAP_MKNOD wherever the layer is unpacked.
mmdebstrap --quiet --variant=extract --architectures="$arch" \
	--include=iptables,ca-certificates,dash,coreutils,sed \
	--skip=output/dev \
	--extract-hook="$here/customize.sh \"\$1\" $arch" \
	"$suite" "$out" "deb $mirror $suite main" "deb $security $suite-security main"
