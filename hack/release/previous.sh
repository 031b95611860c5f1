#!/usr/bin/env bash
# The previous release (N-1) for make e2e-node's upgrade steps: its image
# (OCI layout tarball, amd64) and its chart package, built from git history:
#
#   hack/release/previous.sh OUTDIR    -> OUTDIR/{image.oci.tar,chart.tgz,env}
#
# Which revision: the newest release tag (v*) that is an ancestor of HEAD and
# not on HEAD itself; with no tag (none exists before v0.1.0-rc.1, and a
# fresh CI clone has none), the commit pinned in hack/release/previous: the
# last commit before the release machinery (the merge-base of main with it).
# PREVIOUS_REV=<rev> overrides both. Its version: the tag, else
# v0.0.0-prev.g<12 hex>; its chart is that commit's manifests/chart packaged
# with that version (before v0.1.0-rc.1 its image default was :latest).
#
# Built with that commit's own hack/image/build.sh from `git archive` (the
# work tree is not touched) and cached under
# ${XDG_CACHE_HOME:-$HOME/.cache}/meshlet/previous-<40 hex>-<arches>/, so the
# cost is paid once per machine (figures: e2e/node/README.md). OUTDIR/env:
# PREVIOUS_REV, PREVIOUS_VERSION, PREVIOUS_CHART_VERSION, PREVIOUS_FROM (tag|pinned).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$repo"
out=${1:?usage: previous.sh OUTDIR}
die() { echo "previous: $*" >&2; exit 1; }
arches=${PREVIOUS_ARCHES:-amd64}
head=$(git rev-parse HEAD)
from=override
rev=${PREVIOUS_REV:-}
if [ -z "$rev" ]; then
	from=tag
	rev=$(git tag --list 'v[0-9]*' --merged HEAD --sort=-creatordate | while read -r t; do
		[ "$(git rev-parse "$t^{commit}")" != "$head" ] && { echo "$t"; break; }
	done)
fi
if [ -z "$rev" ]; then
	from=pinned
	rev=$(tr -d ' \n' <hack/release/previous)
fi
commit=$(git rev-parse -q --verify "$rev^{commit}") ||
	die "revision $rev is not in this clone (a shallow clone? fetch the history: git fetch --unshallow)"
if [ "$from" = tag ]; then
	version=$rev
else
	version=v0.0.0-prev.g${commit:0:12}
fi
chart_version=${version#v}
cache=${XDG_CACHE_HOME:-$HOME/.cache}/meshlet/previous-$commit-${arches// /-}
tools=$(hack/k8s/ensure.sh tools)
if [ ! -d "$cache" ]; then
	exec {lockfd}>"$cache.lock"
	flock "$lockfd"
	if [ ! -d "$cache" ]; then
		start=$SECONDS
		tmp=$(mktemp -d "$cache.tmp.XXXXXX")
		trap 'rm -rf "$tmp"' EXIT
		mkdir "$tmp/src"
		git archive "$commit" | tar -x -C "$tmp/src"
		echo "previous: building $version ($from, $commit) with its own hack/image/build.sh ..." >&2
		(cd "$tmp/src" && VERSION=$version ARCHES=$arches IMAGE=ghcr.io/meshlet/meshlet:$version \
			SOURCE_DATE_EPOCH=$(git -C "$repo" log -1 --format=%ct "$commit") \
			hack/image/build.sh "$tmp/image.oci.tar" >&2)
		"$tools/helm" package "$tmp/src/manifests/chart" --version "$chart_version" --app-version "$version" -d "$tmp" >&2
		mv "$tmp/meshlet-$chart_version.tgz" "$tmp/chart.tgz"
		rm -rf "$tmp/src"
		chmod 755 "$tmp"
		mv -T "$tmp" "$cache"
		trap - EXIT
		echo "previous: built $cache in $((SECONDS - start))s" >&2
	fi
	exec {lockfd}>&-
fi
mkdir -p "$out"
cp "$cache/image.oci.tar" "$cache/chart.tgz" "$out/"
printf 'PREVIOUS_REV=%s\nPREVIOUS_VERSION=%s\nPREVIOUS_CHART_VERSION=%s\nPREVIOUS_FROM=%s\n' \
	"$commit" "$version" "$chart_version" "$from" >"$out/env"
cat "$out/env" >&2
