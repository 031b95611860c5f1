#!/usr/bin/env bash
# Verifies a published release before it is installed (docs/releasing.md#verify):
#
#   hack/release/verify.sh REGISTRY VERSION     e.g. ghcr.io/meshlet v0.1.0
#
# The image REGISTRY/meshlet:VERSION and the chart
# oci://REGISTRY/charts/meshlet:VERSION-without-v must be signed by the
# release's identity, and the image attested with its provenance (SLSA v1)
# and each platform's SBOM (CycloneDX), all by that identity. Prints what to
# install, by digest — the digests the signatures are for:
#
#   image REGISTRY/meshlet@sha256:…
#   chart oci://REGISTRY/charts/meshlet@sha256:…
#
# and exits non-zero, naming what failed, if anything does not verify.
#
# The identity: COSIGN_PUBLIC_KEY=FILE (a key pair's public half: make
# e2e-node's test key; nothing is looked up in Rekor), or by default the
# release workflow's keyless certificate: CERT_IDENTITY (default
# https://github.com/meshlet/meshlet/.github/workflows/release.yaml@refs/tags/VERSION;
# a fork sets its own) issued to CERT_OIDC_ISSUER (default GitHub Actions'),
# its signatures logged in Rekor. PLAIN_HTTP=1: a registry without TLS.
# cosign and crane from PATH (hack/k8s/ensure.sh tools).
set -euo pipefail
registry=${1:?usage: verify.sh REGISTRY VERSION}
version=${2:?usage: verify.sh REGISTRY VERSION}
die() { echo "verify: $*" >&2; exit 1; }
chart_version=${version#v}
flags=() crane_flags=()
if [ -n "${COSIGN_PUBLIC_KEY:-}" ]; then
	flags+=(--key "$COSIGN_PUBLIC_KEY" --insecure-ignore-tlog)
else
	flags+=(--certificate-identity "${CERT_IDENTITY:-https://github.com/meshlet/meshlet/.github/workflows/release.yaml@refs/tags/$version}"
		--certificate-oidc-issuer "${CERT_OIDC_ISSUER:-https://token.actions.githubusercontent.com}")
fi
if [ "${PLAIN_HTTP:-}" = 1 ]; then
	flags+=(--allow-http-registry)
	crane_flags+=(--insecure)
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
# check WHAT CMD...: runs a cosign check; a failure names WHAT and cosign's
# error (not its warnings: with a key it still tries Sigstore's TUF root).
check() {
	local what=$1
	shift
	"$@" >"$log" 2>&1 || die "$what does not verify: $(grep -v -e '^$' -e '^WARNING' "$log" | tail -2 | tr '\n' ' ')"
}
# Resolved once: every check below is of these digests, and they are what
# to install, so a tag moved in between cannot slip another object in.
image_digest=$(crane "${crane_flags[@]}" digest "$registry/meshlet:$version") || die "no image $registry/meshlet:$version"
chart_digest=$(crane "${crane_flags[@]}" digest "$registry/charts/meshlet:$chart_version") ||
	die "no chart $registry/charts/meshlet:$chart_version"
image=$registry/meshlet@$image_digest
chart=$registry/charts/meshlet@$chart_digest
check "image $registry/meshlet:$version ($image_digest): signature" cosign verify "${flags[@]}" "$image"
check "chart $registry/charts/meshlet:$chart_version ($chart_digest): signature" cosign verify "${flags[@]}" "$chart"
check "image $registry/meshlet:$version: provenance" cosign verify-attestation "${flags[@]}" --type slsaprovenance1 "$image"
for platform in linux/amd64 linux/arm64/v8; do
	d=$(crane "${crane_flags[@]}" digest --platform "$platform" "$image") || die "image $image has no $platform"
	check "image $registry/meshlet:$version $platform: SBOM" cosign verify-attestation "${flags[@]}" --type cyclonedx \
		"$registry/meshlet@$d"
done
echo "image $image"
echo "chart oci://$chart"
