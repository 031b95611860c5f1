// Package kilo holds meshlet's own, wire-compatible copy of Kilo 0.7's API:
// the Peer custom resource (kilo.squat.ai/v1alpha1) and the kilo.squat.ai/*
// node annotations. It validates and converts them into the planner's input
// types (agent/topology). Invalid input never reaches the planner: it turns
// into topology.Rejection values that the agent reports as Events and metrics.
//
// The package imports no client-go so that it stays usable from the planner's
// tests and from `meshlet plan`; only k8s.io/api and k8s.io/apimachinery.
// Kilo itself (github.com/squat/kilo) is not imported: meshlet defines its
// own types with the same JSON shape.
//
// The markers below and on the Peer types generate Peer's
// CustomResourceDefinition (manifests/crds, make generate).
//
// +groupName=kilo.squat.ai
// +versionName=v1alpha1
package kilo
