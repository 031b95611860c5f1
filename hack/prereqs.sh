#!/usr/bin/env bash
# Checks what make needs before anything runs, and says what is missing in
# one line on stderr, exit status 2 (README.md, "Two commands"):
#
#   hack/prereqs.sh [--root TARGET]
#
# Go: $GO (default go) in PATH, at least go.mod's go version — the version
# the go command runs here, after any toolchain switch GOTOOLCHAIN allows.
# --root TARGET: root (network namespaces, nftables, WireGuard devices and
# apt-get need it) on Debian (hack/install-deps.sh installs with apt-get).
# Prints nothing and exits 0 when everything is there. The Makefile runs it
# before it reads anything else, so that no build starts first.
#
# Only shell builtins besides id and $GO: the test (hack/prereqs_test.go)
# runs it with a PATH of its own.
set -uo pipefail
here=.
case ${BASH_SOURCE[0]} in */*) here=${BASH_SOURCE[0]%/*} ;; esac
cd "$here/.." || exit 2

GO=${GO:-go}
fail() {
	echo "$*" >&2
	exit 2
}

# sudo resets PATH to its secure_path, which seldom holds Go's directory.
sudo_hint=""
if [ -n "${SUDO_USER:-}" ]; then
	sudo_hint=" (sudo resets PATH: sudo env PATH=\"\$PATH\" make ...)"
fi

# want: go.mod's "go 1.x.y" line.
want=""
while read -r word version _; do
	if [ "$word" = go ]; then
		want=$version
		break
	fi
done <go.mod
[ -n "$want" ] || fail "hack/prereqs.sh: no go line in go.mod"

# atleast A B: version A (1.26.8, 1.27rc1) is B or later.
atleast() {
	local -a a b
	IFS=. read -r -a a <<<"${1%%[!0-9.]*}"
	IFS=. read -r -a b <<<"$2"
	local i
	for i in 0 1 2; do
		if ((10#${a[i]:-0} != 10#${b[i]:-0})); then
			((10#${a[i]:-0} > 10#${b[i]:-0}))
			return
		fi
	done
	return 0
}

if [ "${1:-}" = --root ]; then
	target=${2:-}
	if [ "$(id -u)" != 0 ]; then
		fail "make $target needs root (network namespaces, nftables, WireGuard devices, apt-get): sudo env PATH=\"\$PATH\" make $target"
	fi
	if ! command -v apt-get >/dev/null || ! command -v dpkg-query >/dev/null; then
		fail "make $target needs Debian (or a derivative with apt-get and dpkg): hack/install-deps.sh installs its packages with them"
	fi
fi

gobin=$(command -v "$GO") ||
	fail "meshlet needs Go $want or later (go.mod) and finds no $GO in PATH: install it from https://go.dev/dl/ and add its bin directory (e.g. /usr/local/go/bin) to PATH$sudo_hint"
# Run here, the go command switches to go.mod's toolchain where GOTOOLCHAIN
# lets it (its "go: downloading" on stderr); its last line says why not.
if ! have=$("$GO" env GOVERSION 2>/dev/null); then
	err=$("$GO" env GOVERSION 2>&1 >/dev/null)
	fail "meshlet needs Go $want or later (go.mod); $gobin cannot run it: ${err##*$'\n'}"
fi
case $have in
go[0-9]*)
	atleast "${have#go}" "$want" ||
		fail "meshlet needs Go $want or later (go.mod); $gobin is $have: install a newer one from https://go.dev/dl/$sudo_hint"
	;;
esac
exit 0
