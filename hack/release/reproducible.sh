#!/usr/bin/env bash
# make release-check: builds the release twice from this commit, into two
# directories, and fails unless every artefact (image tarball and digest,
# chart, binaries, SBOMs, notes) is byte-identical. Prints the figures.
#   env: VERSION (make release-check: the chart's appVersion), ARCHES, IMAGE_REPOSITORY as make release.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$repo"
export VERSION=${VERSION:?make release-check sets it}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
declare -A took digest
for run in 1 2; do
	start=$SECONDS
	digest[$run]=$(DIST="$out/$run" hack/release/release.sh)
	took[$run]=$((SECONDS - start))
done
if ! diff -u "$out/1/SHA256SUMS" "$out/2/SHA256SUMS" >&2; then
	echo "RESULT release $VERSION NOT reproducible: the runs' SHA256SUMS differ (above)" >&2
	exit 1
fi
size=$(du -m "$out/1/meshlet-image-$VERSION.oci.tar" | cut -f1)
echo "RESULT release $VERSION reproducible: $(wc -l <"$out/1/SHA256SUMS") artefacts byte-identical over 2 runs" \
	"(${took[1]} s, ${took[2]} s); image index ${digest[1]}, tarball $size MiB"
sed 's/^/  /' "$out/1/SHA256SUMS"
