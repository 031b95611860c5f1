#!/usr/bin/env bash
# make release VERSION=vX.Y.Z[-pre]: every artefact of a release in dist/,
# from this commit, reproducibly (docs/releasing.md):
#
#   meshlet-image-$VERSION.oci.tar         the multi-arch image (OCI layout tarball, as make image)
#   meshlet-$CHART.tgz                      the chart (helm package; CHART = VERSION without the v)
#   meshlet-$VERSION-linux-<arch>           the static binaries inside the image (meshlet diagnose on a workstation)
#   meshlet-$VERSION-linux-<arch>.cdx.json  SBOM of each binary's Go modules (CycloneDX, cyclonedx-gomod)
#   debian-packages-linux-<arch>.txt        the image's Debian packages (name version arch)
#   RELEASE_NOTES.md                        CHANGELOG.md's section of the version, the image digest, how to install
#                                           and how to verify
#   provenance.json                         SLSA v1 provenance predicate of the image and chart (publish.sh
#                                           attests the image with it)
#   SHA256SUMS                              of every file above
#
# env: VERSION (required), IMAGE_REPOSITORY (ghcr.io/meshlet/meshlet: the
# image's name, and the chart's default image.repository), ARCHES
# ("amd64 arm64"), DIST (dist), RELEASE_STRICT=1 (the release workflow: the
# tree must be clean, its Chart.yaml must name VERSION and CHANGELOG.md must
# have its section), ALLOW_DIRTY=1 (build from uncommitted changes anyway).
# The date stamped everywhere is the commit's (SOURCE_DATE_EPOCH), so two
# runs on the same commit give the same bytes (hack/release/reproducible.sh).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$repo"
die() { echo "release: $*" >&2; exit 1; }
: "${VERSION:?make release VERSION=vX.Y.Z[-pre]}"
[[ $VERSION =~ ^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?$ ]] ||
	die "VERSION=$VERSION is not a semver tag vX.Y.Z[-pre]"
chart_version=${VERSION#v}
strict=${RELEASE_STRICT:-}
if [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then
	[ "${ALLOW_DIRTY:-}" = 1 ] && [ -z "$strict" ] || die "uncommitted changes: commit them, or ALLOW_DIRTY=1 for a trial build"
fi
eval "$(VERSION=$VERSION hack/version.sh)" # COMMIT, SOURCE_DATE_EPOCH, BUILD_DATE
export VERSION SOURCE_DATE_EPOCH
if tag=$(git rev-parse -q --verify "refs/tags/$VERSION^{commit}" 2>/dev/null); then
	[ "$tag" = "$COMMIT" ] || die "tag $VERSION is $tag, not this commit $COMMIT"
fi
tree_chart=$(awk '$1 == "version:" { print $2 }' manifests/chart/Chart.yaml)
if [ "$tree_chart" != "$chart_version" ]; then
	[ -z "$strict" ] || die "manifests/chart/Chart.yaml has version $tree_chart, the tag $VERSION: the release commit sets it (docs/releasing.md)"
	echo "release: Chart.yaml says $tree_chart; packaging as $chart_version (appVersion $VERSION)" >&2
fi
if ! grep -q "^## \[$chart_version\]" CHANGELOG.md; then
	[ -z "$strict" ] || die "CHANGELOG.md has no section ## [$chart_version]"
fi
IMAGE_REPOSITORY=${IMAGE_REPOSITORY:-ghcr.io/meshlet/meshlet}
export ARCHES=${ARCHES:-amd64 arm64}
dist=${DIST:-dist}
tools=$(hack/k8s/ensure.sh tools)
start=$SECONDS
rm -rf "$dist"
mkdir -p "$dist"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The image, and what is inside it.
image_tar=meshlet-image-$VERSION.oci.tar
IMAGE="$IMAGE_REPOSITORY:$VERSION" BIN_OUT="$work/bin" hack/image/build.sh "$dist/$image_tar" >"$work/mkimage.out"
digest=$(awk '{ print $3 }' "$work/mkimage.out")
[[ $digest == sha256:* ]] || die "mkimage printed no digest: $(cat "$work/mkimage.out")"
for arch in $ARCHES; do
	bin=$dist/meshlet-$VERSION-linux-$arch
	install -m 0755 "$work/bin/meshlet-$arch" "$bin"
	# go version -m reads the modules the binary was built with.
	"$tools/cyclonedx-gomod" bin -json -noserial -notimestamp -version "$VERSION" -output "$bin.cdx.json" "$bin" 2>"$work/sbom.log" ||
		die "cyclonedx-gomod: $(cat "$work/sbom.log")"
	cp "$work/bin/packages-$arch.txt" "$dist/debian-packages-linux-$arch.txt"
done

# The chart: version and appVersion from VERSION, the image repository of
# this release; packed again with fixed times and owners (helm package stamps
# the wall clock), so the same commit gives the same bytes.
cp -r manifests/chart "$work/chart"
if [ "$IMAGE_REPOSITORY" != ghcr.io/meshlet/meshlet ]; then
	sed -i "s|^  repository: ghcr.io/meshlet/meshlet$|  repository: $IMAGE_REPOSITORY|" "$work/chart/values.yaml"
	grep -q "^  repository: $IMAGE_REPOSITORY$" "$work/chart/values.yaml" || die "could not set image.repository in the chart"
fi
"$tools/helm" lint --strict "$work/chart" >"$work/lint.log" 2>&1 || die "helm lint --strict: $(cat "$work/lint.log")"
"$tools/helm" package "$work/chart" --version "$chart_version" --app-version "$VERSION" -d "$work/pkg" >/dev/null
mkdir "$work/pkgx"
tar -xzf "$work/pkg/meshlet-$chart_version.tgz" -C "$work/pkgx"
chart_tgz=meshlet-$chart_version.tgz
tar --sort=name --mtime="@$SOURCE_DATE_EPOCH" --owner=0 --group=0 --numeric-owner --mode=u+rw,go+r,go-w --format=ustar \
	-C "$work/pkgx" -cf - meshlet | gzip -9n >"$dist/$chart_tgz"
"$tools/helm" show chart "$dist/$chart_tgz" | grep -q "^version: $chart_version$" || die "packaged chart has the wrong version"

# Provenance (SLSA v1's predicate, https://slsa.dev/provenance/v1): what
# was built from what, by whom. Only the commit's facts, so it is the same
# bytes on every run; BUILDER_ID names the builder (the release workflow
# sets its run's URL), "make release" by default.
cat >"$dist/provenance.json" <<EOF
{
  "buildDefinition": {
    "buildType": "https://github.com/meshlet/meshlet/blob/main/docs/releasing.md#provenance",
    "externalParameters": {"version": "$VERSION", "imageRepository": "$IMAGE_REPOSITORY", "arches": "$ARCHES",
      "source": "git+https://github.com/meshlet/meshlet@refs/tags/$VERSION"},
    "internalParameters": {"sourceDateEpoch": $SOURCE_DATE_EPOCH},
    "resolvedDependencies": [{"uri": "git+https://github.com/meshlet/meshlet", "digest": {"gitCommit": "$COMMIT"}}]
  },
  "runDetails": {
    "builder": {"id": "${BUILDER_ID:-make release}"},
    "byproducts": [
      {"name": "$IMAGE_REPOSITORY:$VERSION", "digest": {"sha256": "${digest#sha256:}"}, "annotations": {"kind": "image index"}},
      {"name": "$chart_tgz", "digest": {"sha256": "$(sha256sum "$dist/$chart_tgz" | cut -d' ' -f1)"}, "annotations": {"kind": "chart"}}
    ]
  }
}
EOF

# Release notes: CHANGELOG.md's section of this version (else Unreleased).
{
	echo "# meshlet $VERSION"
	echo
	section=$(awk -v v="$chart_version" '
		/^## \[/ { on = (index($0, "## [" v "]") == 1); next }
		on' CHANGELOG.md)
	if [ -z "$section" ]; then
		echo "_CHANGELOG.md has no section for $chart_version yet; its Unreleased changes:_"
		section=$(awk '/^## \[/ { on = (index($0, "## [Unreleased]") == 1); next } on' CHANGELOG.md)
	fi
	printf '%s\n' "$section" | sed -e '/^\[.*\]: /d' | sed -e :a -e '/^\n*$/{$d;N;ba' -e '}'
	echo
	echo "## Install"
	echo
	echo '```sh'
	echo "kubectl apply --server-side -k https://github.com/meshlet/meshlet//manifests/namespace?ref=$VERSION"
	echo "helm install meshlet oci://${IMAGE_REPOSITORY%/meshlet}/charts/meshlet --version $chart_version -n kilo-system"
	echo '```'
	echo
	echo "Image \`$IMAGE_REPOSITORY:$VERSION\` (linux/${ARCHES// /, linux/}), index digest \`$digest\`;"
	echo "pin it with \`--set image.digest=$digest\`. Commit \`$COMMIT\`, built $BUILD_DATE (the commit's time)."
	echo "SBOMs: \`meshlet-$VERSION-linux-<arch>.cdx.json\` (Go modules), \`debian-packages-linux-<arch>.txt\` (the image's Debian packages)."
	echo
	echo "## Verify"
	echo
	echo "The image and the chart are signed with the release workflow's identity (cosign, keyless), the image attested"
	echo "with its provenance and each platform's SBOM (docs/releasing.md#verify):"
	echo
	echo '```sh'
	echo "hack/release/verify.sh ${IMAGE_REPOSITORY%/meshlet} $VERSION   # from a clone of the tag; or by hand:"
	echo "cosign verify $IMAGE_REPOSITORY:$VERSION \\"
	echo "  --certificate-identity https://github.com/meshlet/meshlet/.github/workflows/release.yaml@refs/tags/$VERSION \\"
	echo "  --certificate-oidc-issuer https://token.actions.githubusercontent.com"
	echo '```'
} >"$dist/RELEASE_NOTES.md"

(cd "$dist" && find . -maxdepth 1 -type f ! -name SHA256SUMS -printf '%P\n' | LC_ALL=C sort | xargs sha256sum >SHA256SUMS)
echo "release: $VERSION in $dist/ in $((SECONDS - start))s; image $IMAGE_REPOSITORY:$VERSION $digest" >&2
echo "$digest"
