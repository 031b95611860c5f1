#!/usr/bin/env bash
# make image: meshlet's multi-arch OCI image as a tarball, without a Docker
# engine or a registry, from this repository and Debian's packages alone.
#
#   hack/image/build.sh [OUT.tar]     (default bin/meshlet-image.tar)
#   env: VERSION (hack/version.sh), IMAGE (ghcr.io/meshlet/meshlet:$VERSION),
#        ARCHES ("amd64 arm64"), SOURCE_DATE_EPOCH (the commit time),
#        BIN_OUT (a directory: keep each platform's binary there as meshlet-<arch>
#        and its rootfs's Debian package list as packages-<arch>.txt; make release)
#
# Per architecture: the static binary (CGO_ENABLED=0, GOARCH) and the Debian
# rootfs (rootfs.sh; cached, see below); then mkimage (main.go) writes both
# platforms under one OCI index. hack/image/README.md says what is inside.
#
# Cache: ${XDG_CACHE_HOME:-$HOME/.cache}/meshlet/image-rootfs-<arch>-<12 hex of
# sha256(rootfs.sh + customize.sh)>.tar, built into a temporary file and
# renamed, as hack/k8s/ensure.sh does. A changed script gives a new file;
# remove the files to pick up Debian point releases.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
cd "$repo"
out=${1:-bin/meshlet-image.tar}
# VERSION, COMMIT, SOURCE_DATE_EPOCH (the commit's time: the same commit
# gives the same image bytes) and BUILD_DATE, unless set.
eval "$("$repo/hack/version.sh")"
export VERSION SOURCE_DATE_EPOCH
IMAGE=${IMAGE:-ghcr.io/meshlet/meshlet:$VERSION}
ARCHES=${ARCHES:-amd64 arm64}
revision=$COMMIT
[ "$revision" = unknown ] && revision=
cache_root=${XDG_CACHE_HOME:-$HOME/.cache}/meshlet
mkdir -p "$cache_root" "$(dirname "$out")"
export GOFLAGS="${GOFLAGS:-} -buildvcs=false"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
start=$SECONDS

rootfs_key=$(cat "$here/rootfs.sh" "$here/customize.sh" | sha256sum | cut -c1-12)
args=()
for arch in $ARCHES; do
	t=$SECONDS
	CGO_ENABLED=0 GOOS=linux GOARCH=$arch go build -trimpath \
		-ldflags "-s -w -buildid= -X main.version=$VERSION -X main.commit=$COMMIT -X main.date=$BUILD_DATE" \
		-o "$work/meshlet-$arch" ./cmd/meshlet
	echo "image: meshlet $VERSION linux/$arch built in $((SECONDS - t))s" >&2
	rootfs=$cache_root/image-rootfs-$arch-$rootfs_key.tar
	if [ ! -f "$rootfs" ]; then
		t=$SECONDS
		exec {lockfd}>"$rootfs.lock"
		flock "$lockfd"
		if [ ! -f "$rootfs" ]; then
			# mmdebstrap wants a new file whose name ends in .tar.
			tmp=$(mktemp -d "$rootfs.tmp.XXXXXX")
			"$here/rootfs.sh" "$arch" "$tmp/rootfs.tar" || { rm -rf "$tmp"; exit 1; }
			mv -f "$tmp/rootfs.tar" "$rootfs"
			rm -rf "$tmp"
			echo "image: Debian rootfs linux/$arch built in $((SECONDS - t))s: $rootfs" >&2
		fi
		exec {lockfd}>&-
	fi
	args+=(--platform "linux/$arch=$rootfs,$work/meshlet-$arch")
	if [ -n "${BIN_OUT:-}" ]; then
		mkdir -p "$BIN_OUT"
		cp "$work/meshlet-$arch" "$BIN_OUT/meshlet-$arch"
		tar -xOf "$rootfs" ./usr/share/meshlet/packages.txt >"$BIN_OUT/packages-$arch.txt"
	fi
done
# Smoke test where the machine can run it: the host's architecture's rootfs
# with the binary, chrooted: meshlet starts and both iptables backends find
# their libraries (the extract variant resolved no library by running it).
host_arch=$(go env GOARCH)
if [ "$(id -u)" = 0 ] && [[ " $ARCHES " == *" $host_arch "* ]]; then
	mkdir "$work/smoke"
	tar -xf "$cache_root/image-rootfs-$host_arch-$rootfs_key.tar" -C "$work/smoke"
	install -D -m 0755 "$work/meshlet-$host_arch" "$work/smoke/usr/local/bin/meshlet"
	chroot "$work/smoke" /usr/local/bin/meshlet version >&2
	chroot "$work/smoke" /usr/lib/meshlet/xtables/nft/iptables --version >&2
	chroot "$work/smoke" /usr/lib/meshlet/xtables/legacy/ip6tables-save --version >&2
	rm -rf "$work/smoke"
fi
(cd "$here" && go build -o "$work/mkimage" .)
"$work/mkimage" --out "$out" --name "$IMAGE" --created "$SOURCE_DATE_EPOCH" \
	--version "$VERSION" --revision "$revision" "${args[@]}"
echo "image: $out ($(du -h "$out" | cut -f1)) in $((SECONDS - start))s" >&2
