#!/usr/bin/env bash
# mmdebstrap extract hook of rootfs.sh (the extract variant runs no customize hooks): $1 is the unpacked rootfs, $2 the
# architecture. Does what the skipped maintainer scripts would have done
# that meshlet needs, and sets up the iptables backend directories.
set -euo pipefail
root=$1
arch=$2

# The package list, for scanners and for people (no dpkg database: the
# packages were unpacked, not installed).
mkdir -p "$root/usr/share/meshlet"
for deb in "$root"/var/cache/apt/archives/*.deb; do
	dpkg-deb --show --showformat='${Package} ${Version} ${Architecture}\n' "$deb"
done | sort >"$root/usr/share/meshlet/packages.txt"

# ca-certificates' postinst (update-ca-certificates): one bundle of the
# Mozilla set, where Go's crypto/x509 looks first.
mkdir -p "$root/etc/ssl/certs"
find "$root/usr/share/ca-certificates/mozilla" -name '*.crt' | LC_ALL=C sort | xargs cat \
	>"$root/etc/ssl/certs/ca-certificates.crt"

# iptables' postinst (update-alternatives) makes iptables the nft backend,
# Debian's default; meshlet run replaces that choice by the host's backend
# at start (--iptables-backend=auto): it puts /usr/lib/meshlet/xtables/<backend>
# first in PATH, whose iptables and ip6tables (and -save/-restore) are the
# multi-call binary of that backend under the plain names.
for b in nft legacy; do
	d="$root/usr/lib/meshlet/xtables/$b"
	mkdir -p "$d"
	for t in iptables ip6tables; do
		for s in "" -save -restore; do
			ln -sf "/usr/sbin/xtables-$b-multi" "$d/$t$s"
		done
	done
done
for t in iptables ip6tables; do
	for s in "" -save -restore; do
		ln -sf "xtables-nft-multi" "$root/usr/sbin/$t$s"
	done
done

# What base-files would provide and a container needs: /tmp, /run (and
# /var/run pointing at it, where WireGuard's UAPI sockets live), mount
# points, and root in passwd/group for tools that look names up.
install -d -m 1777 "$root/tmp"
install -d -m 0755 "$root/run" "$root/proc" "$root/sys" "$root/var/lib/meshlet"
ln -sfn ../run "$root/var/run"
printf 'root:x:0:0:root:/root:/usr/sbin/nologin\n' >"$root/etc/passwd"
printf 'root:x:0:\n' >"$root/etc/group"

# The docs are not needed at run time (mmdebstrap itself empties apt's
# cache and lists afterwards).
rm -rf "$root/usr/share/doc" "$root/usr/share/man" "$root/usr/share/info" "$root/usr/share/locale" \
	"$root/usr/share/lintian"
echo "customize.sh: $arch rootfs: $(wc -l <"$root/usr/share/meshlet/packages.txt") packages" >&2
