#!/bin/sh
# Regenerates hack/node/go.mod: hack/k8s's module set (same kubernetes release,
# same staging replaces) plus the node binaries make e2e-node runs: kubelet,
# kube-controller-manager and kube-scheduler. A module of its own, so adding
# the kubelet-only dependencies (cadvisor, CSI, cgroups, ...) never changes
# hack/k8s/go.sum and with it the cached kube-apiserver build.
#
# Usage: hack/node/gen-gomod.sh   (after hack/k8s/gen-gomod.sh; then commit)
set -eu
cd "$(dirname "$0")"
K8S_VERSION=$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" { print $3 }' ../k8s/go.mod)
sed -e 's|^module github.com/meshlet/meshlet/hack/k8s$|module github.com/meshlet/meshlet/hack/node|' \
	-e 's|builds kube-apiserver and kubectl for tests|builds kubelet, kube-controller-manager and kube-scheduler for make e2e-node|' \
	../k8s/go.mod >go.mod
cp ../k8s/go.sum go.sum
go get -tool "k8s.io/kubernetes/cmd/kubelet@$K8S_VERSION" \
	"k8s.io/kubernetes/cmd/kube-controller-manager@$K8S_VERSION" \
	"k8s.io/kubernetes/cmd/kube-scheduler@$K8S_VERSION"
go mod tidy
