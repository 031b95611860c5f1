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
	# Kilo's install-cni init container copies the CNI plugins from the
	# kilo image's /opt/cni/bin to the host (kg's default --cni=true):
	# bridge, host-local, loopback, portmap (hack/tools/cni, pinned),
	# appended to a copy of the cached rootfs.
	t=$SECONDS
	mkdir -p "$work/cni-$arch/opt/cni/bin"
	(cd "$here/../tools/cni" && CGO_ENABLED=0 GOOS=linux GOARCH=$arch go build -trimpath -ldflags "-s -w -buildid=" \
		-o "$work/cni-$arch/opt/cni/bin/" \
		github.com/containernetworking/plugins/plugins/main/bridge \
		github.com/containernetworking/plugins/plugins/ipam/host-local \
		github.com/containernetworking/plugins/plugins/main/loopback \
		github.com/containernetworking/plugins/plugins/meta/portmap)
	cp "$rootfs" "$work/rootfs-$arch.tar"
	tar --append -f "$work/rootfs-$arch.tar" -C "$work/cni-$arch" --sort=name --owner=0 --group=0 --numeric-owner \
		--mtime="@$SOURCE_DATE_EPOCH" --mode=go-w ./opt
	echo "image: CNI plugins linux/$arch built in $((SECONDS - t))s" >&2
	args+=(--platform "linux/$arch=$work/rootfs-$arch.tar,$work/meshlet-$arch")
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
	tar -xf "$work/rootfs-$host_arch.tar" -C "$work/smoke"
	install -D -m 0755 "$work/meshlet-$host_arch" "$work/smoke/usr/local/bin/meshlet"
	chroot "$work/smoke" /usr/local/bin/meshlet version >&2
	# What Kilo's manifests' init containers run in the kilo image
	# (install-cni: sh, cp, echo, rm, mv; k3s's generate-kubeconfig: cat,
	# sed), and the CNI plugins they copy.
	chroot "$work/smoke" /bin/sh -c 'for t in cp echo rm mv cat sed; do command -v $t || exit 1; done' >/dev/null ||
		{ echo "image: the rootfs lacks a tool Kilo's init containers run" >&2; exit 1; }
	for p in bridge host-local loopback portmap; do
		chroot "$work/smoke" /usr/bin/env CNI_COMMAND=VERSION /opt/cni/bin/$p </dev/null >/dev/null ||
			{ echo "image: /opt/cni/bin/$p does not run" >&2; exit 1; }
	done
	chroot "$work/smoke" /usr/lib/meshlet/xtables/nft/iptables --version >&2
	chroot "$work/smoke" /usr/lib/meshlet/xtables/legacy/ip6tables-save --version >&2
	rm -rf "$work/smoke"
fi
(cd "$here" && go build -o "$work/mkimage" .)
"$work/mkimage" --out "$out" --name "$IMAGE" --created "$SOURCE_DATE_EPOCH" \
	--version "$VERSION" --revision "$revision" "${args[@]}"
echo "image: $out ($(du -h "$out" | cut -f1)) in $((SECONDS - start))s" >&2
