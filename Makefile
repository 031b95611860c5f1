# meshlet — build, test, lint, bench, e2e, demo.
#
# `make demo` runs meshlet's main job on an embedded default (a local
# two-cluster mesh in network namespaces); `make test` runs every test that
# runs on this machine (unit, integration against real kube-apiservers and
# network namespaces). Root is needed for the integration tests.

GO            ?= go
# What must be there (README.md, "Two commands"): Go of go.mod's version,
# and for the targets that run hack/install-deps.sh root on Debian. Checked
# before anything else runs (a build, ensure.sh's Kubernetes build): one
# line and exit status 2 when something is missing (hack/prereqs.sh).
ROOT_TARGETS  := test bench-scale e2e e2e-node demo image release release-check
ifeq ($(MAKELEVEL),0)
ifneq ($(filter-out clean,$(or $(MAKECMDGOALS),all)),)
PREREQS_ROOT  := $(firstword $(filter $(ROOT_TARGETS),$(MAKECMDGOALS)))
PREREQS_ERROR := $(shell GO='$(GO)' hack/prereqs.sh $(if $(PREREQS_ROOT),--root $(PREREQS_ROOT)) 2>&1 >/dev/null)
ifneq ($(PREREQS_ERROR),)
$(error $(PREREQS_ERROR))
endif
endif
endif
PKGS          ?= ./...
# make test: everything but the end-to-end suites (make e2e, make e2e-node),
# the kernel lane's guest program (make e2e-kernel) and the scale lane
# (make bench-scale).
TEST_PKGS     ?= $(shell $(GO) list ./... | grep -v -e '/e2e$$' -e '/e2e/kernel' -e '/e2e/cmd/' -e '/e2e/node' -e '/e2e/scale')
BIN           := bin/meshlet
# Version, commit and build date stamped into the binary (hack/version.sh):
# the release tag or v0.0.0-dev.g<commit>; the date is the commit's time,
# so the same commit builds the same bytes. make release VERSION=vX.Y.Z.
ifeq ($(origin VERSION),undefined)
VERSION       := $(shell hack/version.sh | sed -n 's/^VERSION=//p')
endif
COMMIT        := $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
ifeq ($(origin SOURCE_DATE_EPOCH),undefined)
SOURCE_DATE_EPOCH := $(shell git log -1 --format=%ct 2>/dev/null || echo 0)
endif
BUILD_DATE    := $(shell date -u -d @$(SOURCE_DATE_EPOCH) +%Y-%m-%dT%H:%M:%SZ)
LDFLAGS       := -s -w -buildid= -X main.version=$(VERSION) -X main.commit=$(COMMIT) -X main.date=$(BUILD_DATE)
export VERSION COMMIT SOURCE_DATE_EPOCH
TEST_TIMEOUT  ?= 30m
# Real kube-apiserver, kubectl and etcd, built once and cached.
K8S_BIN       ?= $(shell hack/k8s/ensure.sh)
# staticcheck, kustomize, helm, crane (hack/tools), golangci-lint, cyclonedx-gomod
# (hack/tools/lint) and actionlint (hack/tools/actionlint), pinned and cached the same way.
TOOLS_BIN     ?= $(shell hack/k8s/ensure.sh tools)
# kubelet, kube-controller-manager, kube-scheduler (hack/node), for make e2e-node.
NODE_BIN      ?= $(shell hack/k8s/ensure.sh node)

.PHONY: all build test unit lint generate bench bench-scale e2e e2e-kernel e2e-node demo image release release-check clean

all: build

build:
	CGO_ENABLED=0 $(GO) build -trimpath -buildvcs=false -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/meshlet

# Unit + integration tests (fuzz seed corpora run as plain tests).
test: build
	hack/install-deps.sh test
	MESHLET_K8S_BIN=$(K8S_BIN) MESHLET_TOOLS_BIN=$(TOOLS_BIN) $(GO) test -count=1 -timeout $(TEST_TIMEOUT) $(TEST_PKGS)

# Unit tests only: no root, no API server.
unit:
	$(GO) test -short -count=1 $(TEST_PKGS)

# gofmt over every Go file (the nested modules too); golangci-lint
# (.golangci.yml: govet, staticcheck, errcheck, ineffassign, unused, misspell,
# bodyclose, nolintlint); actionlint on .github/workflows; helm lint --strict
# of the chart with its defaults, with every value set, and with a
# clusterMesh in each of kilo-clustermesh-operator's forms.
# DeepCopy of the kilo.squat.ai types (Peer, ClusterMesh) from their
# +k8s:deepcopy-gen markers, by k8s.io/code-generator, and their CRDs from
# their +kubebuilder markers, by controller-gen (both tools of go.mod).
GENERATED_PKGS := ./agent/core/kilo ./agent/core/clustermesh
GENERATED_FILES := '*zz_generated.deepcopy.go' 'manifests/crds/*.kilo.squat.ai.yaml' 'manifests/chart/crds/*.kilo.squat.ai.yaml'
generate:
	$(GO) tool deepcopy-gen --go-header-file hack/gen/boilerplate.go.txt --output-file zz_generated.deepcopy.go $(GENERATED_PKGS)
	GO="$(GO)" hack/gen/crds.sh

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt:"; echo "$$out"; exit 1; fi
	@$(MAKE) --no-print-directory generate >/dev/null
	@git diff --exit-code --stat -- $(GENERATED_FILES) || { echo "generated code is stale: run make generate and commit it"; exit 1; }
	$(TOOLS_BIN)/golangci-lint run $(PKGS)
	$(TOOLS_BIN)/actionlint
	$(TOOLS_BIN)/helm lint --strict manifests/chart
	$(TOOLS_BIN)/helm lint --strict manifests/chart -f manifests/testdata/values/everything.yaml
	$(TOOLS_BIN)/helm lint --strict manifests/chart -f manifests/testdata/values/clustermesh-operator.yaml
	$(TOOLS_BIN)/helm lint --strict manifests/chart -f manifests/testdata/values/clustermesh-meshlet.yaml

bench:
	MESHLET_K8S_BIN=$(K8S_BIN) $(GO) test -count=1 -run '^$$' -bench . -benchmem -timeout $(TEST_TIMEOUT) $(TEST_PKGS)

# The scale lane (e2e/scale, root): remote clusters of kubelet-sized Nodes
# with heartbeats, one meshlet leader; ~15 min at the default 10 × 1,000.
# Size and durations from SCALE_* (e2e/scale/scale_test.go), e.g.
# `make bench-scale SCALE_CLUSTERS=3 SCALE_NODES=100`. Figures in
# scale-report.txt (RESULT lines).
bench-scale: build
	hack/install-deps.sh
	bash -o pipefail -c 'MESHLET_SCALE=1 MESHLET_K8S_BIN=$(K8S_BIN) MESHLET_BIN=$(CURDIR)/$(BIN) $(GO) test -count=1 -timeout 90m -v -run TestScale ./e2e/scale/ 2>&1 | tee scale-report.txt'
	@grep -h 'RESULT' scale-report.txt | sed 's/^ *[a-z_]*\.go:[0-9]*: //' || true

# Needs root and: iproute2 nftables conntrack iputils-ping.
# pipefail: a failing test must fail make, not be hidden behind tee's status.
e2e: build
	hack/install-deps.sh
	bash -o pipefail -c 'MESHLET_K8S_BIN=$(K8S_BIN) MESHLET_BIN=$(CURDIR)/$(BIN) $(GO) test -count=1 -timeout 40m -v ./e2e/ 2>&1 | tee e2e-report.txt'
	@grep -h 'RESULT' e2e-report.txt | sed 's/^ *[a-z_]*\.go:[0-9]*: //' || true

# Real kubelets + containerd register Ready nodes; this tree's release (make
# release into bin/e2e-node-dist) and the previous one (hack/release/previous.sh,
# cached) are published to a registry and installed from it as OCI charts:
# N-1 -> N -> N-1 -> N under pings, helm test (e2e/node/README.md). Root.
E2E_NODE_DIST ?= bin/e2e-node-dist
E2E_NODE_PREV ?= bin/e2e-node-previous
e2e-node: build
	hack/install-deps.sh node
	DIST=$(E2E_NODE_DIST) ALLOW_DIRTY=1 hack/release/release.sh >/dev/null
	hack/release/previous.sh $(E2E_NODE_PREV)
	bash -o pipefail -c 'MESHLET_K8S_BIN=$(K8S_BIN) MESHLET_TOOLS_BIN=$(TOOLS_BIN) MESHLET_NODE_BIN=$(NODE_BIN) MESHLET_BIN=$(CURDIR)/$(BIN) MESHLET_DIST=$(CURDIR)/$(E2E_NODE_DIST) MESHLET_PREVIOUS=$(CURDIR)/$(E2E_NODE_PREV) $(GO) test -count=1 -timeout 30m -v ./e2e/node/ 2>&1 | tee e2e-node-report.txt'
	@grep -h 'RESULT' e2e-node-report.txt | sed 's/^ *[a-z_]*\.go:[0-9]*: //' || true

e2e-kernel: build
	MESHLET_BIN=$(CURDIR)/$(BIN) hack/kernel/run.sh

# A local two-cluster mesh (root); Ctrl-C tears it down. DEMO_ARGS=--once
# prints and exits. Built, not `go run`, so the demo's own exit status and
# signal handling reach make.
demo: build
	hack/install-deps.sh demo
	$(GO) build -o bin/demo ./e2e/cmd/demo
	MESHLET_K8S_BIN=$(K8S_BIN) bin/demo --meshlet $(CURDIR)/$(BIN) $(DEMO_ARGS)

# The multi-arch (linux/amd64, linux/arm64) OCI image as a tarball, without a
# Docker engine: hack/image/README.md.
IMAGE_TAR     ?= bin/meshlet-image.tar
image:
	hack/install-deps.sh image
	hack/image/build.sh $(IMAGE_TAR)

# A release's artefacts in dist/ (image, chart, binaries, SBOMs, notes,
# checksums): make release VERSION=v0.1.0 (docs/releasing.md). Root (the
# image's smoke test chroots).
release:
	hack/install-deps.sh image
	VERSION=$(VERSION) hack/release/release.sh

# The release built twice from this commit must give the same bytes: as the
# release this tree is (the chart's appVersion) unless RELEASE_VERSION says.
release-check:
	hack/install-deps.sh image
	VERSION=$(or $(RELEASE_VERSION),$(shell awk '$$1 == "appVersion:" { gsub(/"/, "", $$2); print $$2 }' manifests/chart/Chart.yaml)) hack/release/reproducible.sh

clean:
	rm -rf bin dist e2e-report.txt e2e-node-report.txt scale-report.txt
