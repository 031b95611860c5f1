// Package manifests holds meshlet's Kubernetes manifests (kustomize build
// manifests/) and the tests that check them against a real kube-apiserver,
// kustomize and promtool. It has no Go API.
package manifests
