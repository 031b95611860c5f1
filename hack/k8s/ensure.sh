#!/usr/bin/env bash
# Builds (once) and prints the directory holding the test binaries.
#
#   hack/k8s/ensure.sh          -> dir with kube-apiserver, kubectl, etcd
#   hack/k8s/ensure.sh tools    -> dir with staticcheck, kustomize, helm, crane (hack/tools) and
#                                  golangci-lint, cyclonedx-gomod (hack/tools/lint), actionlint
#                                  (hack/tools/actionlint), cosign (hack/tools/cosign)
#   hack/k8s/ensure.sh node     -> dir with kubelet, kube-controller-manager, kube-scheduler
#                                  (hack/node: make e2e-node)
#   hack/k8s/ensure.sh all      -> builds k8s and tools, prints the k8s dir then the tools dir
#   eval "$(hack/k8s/ensure.sh --export)"  -> exports MESHLET_K8S_BIN (and MESHLET_TOOLS_BIN)
#
# Only the directory is printed on stdout; progress goes to stderr.
#
# Cache: ${XDG_CACHE_HOME:-$HOME/.cache}/meshlet/
#   k8s-<kubernetes version>-<sha256 of hack/k8s/go.sum + hack/k8s/etcd/go.sum, 12 hex>/
#   tools-<sha256 of hack/tools/go.sum + hack/tools/{lint,actionlint,cosign}/go.sum, 12 hex>/
#   node-<kubernetes version>-<sha256 of hack/node/go.sum, 12 hex>/
# A changed go.sum gives a new directory, so a stale binary is never reused.
# Each directory is built into a temporary sibling and renamed into place, so
# a killed build never leaves a half-filled directory behind; concurrent callers
# (parallel test packages) serialise on a lock file and the losers reuse the
# winner's result.
#
# Cold build of kube-apiserver: 7-12 min on 2 cores, ~2.8 GB peak memory.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
cache_root=${XDG_CACHE_HOME:-$HOME/.cache}/meshlet
mkdir -p "$cache_root"

export GOFLAGS="${GOFLAGS:-} -buildvcs=false -mod=readonly"

k8s_version=$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" { print $3 }' "$here/go.mod")
[ -n "$k8s_version" ] || { echo "ensure.sh: cannot read k8s.io/kubernetes version from $here/go.mod" >&2; exit 1; }
minor=${k8s_version#v1.}
minor=${minor%%.*}

hash_of() { cat "$@" | sha256sum | cut -c1-12; }

k8s_dir="$cache_root/k8s-$k8s_version-$(hash_of "$here/go.sum" "$here/etcd/go.sum")"
tools_dir="$cache_root/tools-$(hash_of "$repo/hack/tools/go.sum" "$repo/hack/tools/lint/go.sum" "$repo/hack/tools/actionlint/go.sum" "$repo/hack/tools/cosign/go.sum")"
node_dir="$cache_root/node-$k8s_version-$(hash_of "$repo/hack/node/go.sum")"

# The version kubernetes' own release build stamps into its binaries.
k8s_ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$k8s_version"
k8s_ldflags="$k8s_ldflags -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"

build_k8s() { # $1: temp dir to fill
	local out=$1 ld=$k8s_ldflags
	echo "ensure.sh: building kube-apiserver and kubectl $k8s_version (cold: 7-12 min) ..." >&2
	(cd "$here" && go build -trimpath -ldflags "$ld" -o "$out/" \
		k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kubectl)
	echo "ensure.sh: building etcd ..." >&2
	(cd "$here/etcd" && go build -trimpath -ldflags "-s -w" -o "$out/etcd" go.etcd.io/etcd/server/v3)
	"$out/kube-apiserver" --version >&2
	"$out/kubectl" version --client >&2
	"$out/etcd" --version >&2
}

build_node() { # $1: temp dir to fill
	local out=$1 ld=$k8s_ldflags
	echo "ensure.sh: building kubelet, kube-controller-manager, kube-scheduler $k8s_version (cold: 5-10 min) ..." >&2
	(cd "$repo/hack/node" && go build -trimpath -ldflags "$ld" -o "$out/" \
		k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-controller-manager \
		k8s.io/kubernetes/cmd/kube-scheduler)
	"$out/kubelet" --version >&2
}

build_tools() {
	local out=$1
	local helm_version
	helm_version=$(awk '$1 == "helm.sh/helm/v3" { print $2 }' "$repo/hack/tools/go.mod")
	echo "ensure.sh: building staticcheck, kustomize, helm $helm_version and crane ..." >&2
	(cd "$repo/hack/tools" && go build -trimpath -ldflags "-s -w" -o "$out/" \
		honnef.co/go/tools/cmd/staticcheck sigs.k8s.io/kustomize/kustomize/v5 \
		github.com/google/go-containerregistry/cmd/crane)
	# helm prints its version from an ldflag, as its own release build sets it.
	(cd "$repo/hack/tools" && go build -trimpath \
		-ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$helm_version" \
		-o "$out/" helm.sh/helm/v3/cmd/helm)
	# The lint and release tools, pinned in modules of their own
	# (hack/tools/lint, hack/tools/actionlint: their dependency graphs
	# disagree with helm's and with each other's); golangci-lint's version
	# ldflag as its own release build sets it.
	local gl_version
	gl_version=$(awk '$1 == "github.com/golangci/golangci-lint/v2" { print $2 }' "$repo/hack/tools/lint/go.mod")
	echo "ensure.sh: building golangci-lint $gl_version, actionlint and cyclonedx-gomod ..." >&2
	(cd "$repo/hack/tools/lint" && go build -trimpath -ldflags "-s -w -X main.version=${gl_version#v}" \
		-o "$out/" github.com/golangci/golangci-lint/v2/cmd/golangci-lint)
	(cd "$repo/hack/tools/lint" && go build -trimpath -ldflags "-s -w" -o "$out/" \
		github.com/CycloneDX/cyclonedx-gomod/cmd/cyclonedx-gomod)
	(cd "$repo/hack/tools/actionlint" && go build -trimpath -ldflags "-s -w" -o "$out/" \
		github.com/rhysd/actionlint/cmd/actionlint)
	# cosign signs and attests a release (publish.sh) and verifies one
	# (verify.sh); its version ldflag as its own release build sets it.
	local cosign_version
	cosign_version=$(awk '$1 == "github.com/sigstore/cosign/v2" { print $2 }' "$repo/hack/tools/cosign/go.mod")
	echo "ensure.sh: building cosign $cosign_version (cold: 4-6 min) ..." >&2
	(cd "$repo/hack/tools/cosign" && go build -trimpath \
		-ldflags "-s -w -X sigs.k8s.io/release-utils/version.gitVersion=$cosign_version" \
		-o "$out/" github.com/sigstore/cosign/v2/cmd/cosign)
	"$out/staticcheck" -version >&2
	"$out/golangci-lint" version >&2
	"$out/actionlint" -version >&2
	"$out/cyclonedx-gomod" version >&2
	"$out/kustomize" version >&2
	"$out/helm" version --short >&2
	"$out/crane" version >&2
	"$out/cosign" version 2>&1 | grep -m1 GitVersion >&2
}

ensure() { # $1: final dir, $2: build function
	local dest=$1 fn=$2 start
	[ -d "$dest" ] && { echo "$dest"; return; }
	# Serialise builders; re-check after taking the lock.
	exec {lockfd}>"$dest.lock"
	if ! flock -n "$lockfd"; then
		echo "ensure.sh: waiting for another build of $(basename "$dest") to finish ..." >&2
		flock "$lockfd"
	fi
	if [ ! -d "$dest" ]; then
		start=$(date +%s)
		# Global, not local: the EXIT trap may run outside this function.
		tmp=$(mktemp -d "$dest.tmp.XXXXXX")
		# A cold build is silent for many minutes after its downloads: say
		# every minute that it goes on, and for how long.
		(while sleep 60; do echo "ensure.sh: still building $(basename "$dest") ($((($(date +%s) - start) / 60)) min so far) ..." >&2; done) &
		ticker=$!
		trap 'kill "$ticker" 2>/dev/null; rm -rf "$tmp"' EXIT
		"$fn" "$tmp"
		kill "$ticker" 2>/dev/null || true
		wait "$ticker" 2>/dev/null || true
		chmod 755 "$tmp"     # mktemp makes it 0700
		mv -T "$tmp" "$dest" # rename(2): atomic, dest does not exist
		trap - EXIT
		echo "ensure.sh: built $dest in $(($(date +%s) - start))s" >&2
	fi
	exec {lockfd}>&-
	echo "$dest"
}

case "${1:-k8s}" in
k8s) ensure "$k8s_dir" build_k8s ;;
tools) ensure "$tools_dir" build_tools ;;
node) ensure "$node_dir" build_node ;;
all)
	ensure "$k8s_dir" build_k8s
	ensure "$tools_dir" build_tools
	;;
--export)
	echo "export MESHLET_K8S_BIN=$(ensure "$k8s_dir" build_k8s)"
	echo "export MESHLET_TOOLS_BIN=$(ensure "$tools_dir" build_tools)"
	;;
*)
	echo "usage: $0 [k8s|tools|node|all|--export]" >&2
	exit 2
	;;
esac
