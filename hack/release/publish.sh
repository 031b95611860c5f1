#!/usr/bin/env bash
# Pushes a release's image index and chart (make release's dist/) to a
# registry, as the release workflow does to ghcr.io and make e2e-node does to
# its local registry:
#
#   hack/release/publish.sh DIST REGISTRY     e.g. dist ghcr.io/meshlet
#     -> REGISTRY/meshlet:$VERSION            (crane push --index of the OCI layout)
#     -> oci://REGISTRY/charts/meshlet:$CHART (helm push)
#
# crane and helm from PATH (hack/k8s/ensure.sh tools), logged in beforehand
# (crane auth login, helm registry login). PLAIN_HTTP=1: a registry without
# TLS (the lane's). Prints the pushed image digest and chart reference.
set -euo pipefail
dist=${1:?usage: publish.sh DIST REGISTRY}
registry=${2:?usage: publish.sh DIST REGISTRY}
die() { echo "publish: $*" >&2; exit 1; }
image_tar=$(find "$dist" -maxdepth 1 -name 'meshlet-image-v*.oci.tar' | head -1)
chart_tgz=$(find "$dist" -maxdepth 1 -name 'meshlet-[0-9]*.tgz' | head -1)
[ -n "$image_tar" ] && [ -n "$chart_tgz" ] || die "no image tarball or chart in $dist (make release)"
version=${image_tar##*/meshlet-image-}
version=${version%.oci.tar}
(cd "$dist" && sha256sum --quiet -c SHA256SUMS) || die "$dist/SHA256SUMS does not match"
crane_flags=() helm_flags=()
if [ "${PLAIN_HTTP:-}" = 1 ]; then
	crane_flags=(--insecure)
	helm_flags=(--plain-http)
fi
layout=$(mktemp -d)
trap 'rm -rf "$layout"' EXIT
tar -xf "$image_tar" -C "$layout"
crane "${crane_flags[@]}" push --index "$layout" "$registry/meshlet:$version" >&2
digest=$(crane "${crane_flags[@]}" digest "$registry/meshlet:$version")
helm push "$chart_tgz" "oci://$registry/charts" "${helm_flags[@]}" >&2
echo "image $registry/meshlet:$version@$digest"
echo "chart oci://$registry/charts/meshlet $(basename "$chart_tgz" .tgz | sed 's/^meshlet-//')"
