#!/usr/bin/env bash
# Prints meshlet's version, commit and build date as shell assignments, for
# make build, hack/image/build.sh and make release (docs/releasing.md):
#
#   eval "$(hack/version.sh)"   -> VERSION, COMMIT, SOURCE_DATE_EPOCH, BUILD_DATE
#
# VERSION: $VERSION when set (make release VERSION=v0.1.0); else the nearest
# release tag (git describe --tags --match 'v[0-9]*': v0.1.0 on the tag,
# v0.1.0-3-g1a2b3c4d5e6f after it); else, with no tag in the clone (a fresh
# CI clone has none), v0.0.0-dev.g<12 hex of the commit>. A tree with
# uncommitted changes gets ".dirty" (or git's "-dirty"). Every form is a
# semver Helm accepts as a chart version once the "v" is dropped.
# SOURCE_DATE_EPOCH: the commit's time (the same commit builds the same
# bytes), unless set; BUILD_DATE is it in RFC 3339, UTC.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)
epoch=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}
if [ -n "${VERSION:-}" ]; then
	version=$VERSION
elif v=$(git describe --tags --match 'v[0-9]*' --abbrev=12 --dirty 2>/dev/null); then
	version=$v
elif [ "$commit" != unknown ]; then
	version=v0.0.0-dev.g${commit:0:12}
	git diff --quiet HEAD 2>/dev/null || version=$version.dirty
else
	version=v0.0.0-dev
fi
printf 'VERSION=%s\nCOMMIT=%s\nSOURCE_DATE_EPOCH=%s\nBUILD_DATE=%s\n' \
	"$version" "$commit" "$epoch" "$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)"
