#!/usr/bin/env bash
# Pushes a release's image index and chart (make release's dist/) to a
# registry, as the release workflow does to ghcr.io and make e2e-node does to
# its local registry:
#
#   hack/release/publish.sh DIST REGISTRY     e.g. dist ghcr.io/meshlet
#     -> REGISTRY/meshlet:$VERSION            (crane push of the OCI layout's image index)
#     -> oci://REGISTRY/charts/meshlet:$CHART (helm push)
#
# crane, helm and cosign from PATH (hack/k8s/ensure.sh tools), logged in
# beforehand (crane auth login, helm registry login; cosign uses crane's
# credentials). PLAIN_HTTP=1: a registry without TLS (the lane's). Prints the
# pushed image and chart references, by digest.
#
# SIGN=keyless (the release workflow: its OIDC identity, a Fulcio certificate,
# the signatures logged in Rekor) or SIGN=key (COSIGN_KEY: a cosign key file,
# COSIGN_PASSWORD its password; nothing logged: make e2e-node's test key)
# signs the image index and the chart, and attests the index with the
# release's provenance (provenance.json) and each platform's image with its
# binary's SBOM (CycloneDX). hack/release/verify.sh checks all of it.
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
# The layout's one image index itself (not --index, which would push
# index.json around it: a tag one level above the digest the notes name).
crane "${crane_flags[@]}" push "$layout" "$registry/meshlet:$version" >&2
digest=$(crane "${crane_flags[@]}" digest "$registry/meshlet:$version")
chart_version=$(basename "$chart_tgz" .tgz | sed 's/^meshlet-//')
helm push "$chart_tgz" "oci://$registry/charts" "${helm_flags[@]}" >&2
chart_digest=$(crane "${crane_flags[@]}" digest "$registry/charts/meshlet:$chart_version")
case "${SIGN:-}" in
"") ;;
key | keyless)
	sign_flags=(-y)
	if [ "$SIGN" = key ]; then
		[ -n "${COSIGN_KEY:-}" ] || die "SIGN=key needs COSIGN_KEY (and COSIGN_PASSWORD)"
		sign_flags+=(--key "$COSIGN_KEY" --tlog-upload=false)
	fi
	[ "${PLAIN_HTTP:-}" = 1 ] && sign_flags+=(--allow-http-registry)
	cosign sign "${sign_flags[@]}" "$registry/meshlet@$digest" >&2
	cosign sign "${sign_flags[@]}" "$registry/charts/meshlet@$chart_digest" >&2
	cosign attest "${sign_flags[@]}" --type slsaprovenance1 --predicate "$dist/provenance.json" "$registry/meshlet@$digest" >&2
	for sbom in "$dist"/meshlet-"$version"-linux-*.cdx.json; do
		arch=${sbom%.cdx.json}
		arch=${arch##*-linux-}
		platform=linux/$arch
		[ "$arch" = arm64 ] && platform=linux/arm64/v8
		arch_digest=$(crane "${crane_flags[@]}" digest --platform "$platform" "$registry/meshlet@$digest")
		cosign attest "${sign_flags[@]}" --type cyclonedx --predicate "$sbom" "$registry/meshlet@$arch_digest" >&2
	done
	;;
*) die "SIGN=$SIGN: key or keyless" ;;
esac
echo "image $registry/meshlet:$version@$digest"
echo "chart oci://$registry/charts/meshlet:$chart_version@$chart_digest"
