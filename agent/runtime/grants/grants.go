// Package grants finds out which of meshlet's features the agent's RBAC
// and the cluster's CRDs allow. kg's ClusterRole (nodes list, watch,
// patch; peers list, watch) is enough to mesh a cluster with Kilo's rules;
// Lease failover, Events and ClusterMeshes each need a grant more
// (docs/dropin.md#grants). The agent asks once at start with
// SelfSubjectAccessReviews (which every authenticated user may create),
// turns off what it may not do, says so once in its log, in `meshlet
// status` and through `meshlet diagnose`, and asks again now and then
// while something is off.
package grants

import (
	"context"
	"fmt"
	"slices"
	"strings"

	authorizationv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Feature names: stable, shown by meshlet status and diagnose.
const (
	// Mesh is the mesh itself (Nodes and Peers): required.
	Mesh = "mesh"
	// LeaderElection is the per-location Lease (docs/failover.md).
	LeaderElection = "leader-election"
	// Events are Kubernetes Events for rejected input.
	Events = "events"
	// ClusterMesh is joining the remote clusters of ClusterMesh objects.
	ClusterMesh = "clustermesh"
	// ClusterMeshStatus is writing the ClusterMesh objects' status.
	ClusterMeshStatus = "clustermesh-status"
	// ClusterMeshStatusSchema is writing the status fields the installed
	// ClusterMesh CRD keeps, which the writer reads from the CRD (get, as
	// kg's ClusterRole grants); off, it writes the fields every ClusterMesh
	// CRD has (docs/clustermesh.md#status).
	ClusterMeshStatusSchema = "clustermesh-status-schema"
	// Lifecycle is telling an uninstall from a rolling update when the
	// agent stops with kg's --clean-up: it reads its own pod and DaemonSet
	// (docs/dropin.md#clean-up).
	Lifecycle = "lifecycle"
)

// Feature is one feature and whether the agent may use it.
type Feature struct {
	Name string `json:"name"`
	On   bool   `json:"on"`
	// Missing says what it lacks: the grants (as "verb resource in
	// namespace"), or the CRD.
	Missing []string `json:"missing,omitempty"`
}

// Set is every feature, in a fixed order.
type Set []Feature

// On reports whether the feature is on (unknown names are off).
func (s Set) On(name string) bool {
	for _, f := range s {
		if f.Name == name {
			return f.On
		}
	}
	return false
}

// Off returns the features that are off.
func (s Set) Off() []Feature {
	var out []Feature
	for _, f := range s {
		if !f.On {
			out = append(out, f)
		}
	}
	return out
}

// All is every feature on: what the agent assumes when it cannot ask.
func All() Set {
	return Set{{Name: Mesh, On: true}, {Name: LeaderElection, On: true}, {Name: Events, On: true},
		{Name: ClusterMesh, On: true}, {Name: ClusterMeshStatus, On: true}, {Name: ClusterMeshStatusSchema, On: true}, {Name: Lifecycle, On: true}}
}

// rule is one grant a feature needs.
type rule struct {
	verb, group, resource, subresource string
	namespaced                         bool
}

func (r rule) String(namespace string) string {
	res := r.resource
	if r.subresource != "" {
		res += "/" + r.subresource
	}
	if r.group != "" {
		res += "." + r.group
	}
	if r.namespaced {
		return fmt.Sprintf("%s %s in %s", r.verb, res, namespace)
	}
	return r.verb + " " + res
}

func rules(verbs []string, group, resource, sub string, namespaced bool) []rule {
	out := make([]rule, len(verbs))
	for i, v := range verbs {
		out[i] = rule{v, group, resource, sub, namespaced}
	}
	return out
}

// needs is what each feature needs, besides CRDs.
var needs = map[string][]rule{
	Mesh: append(rules([]string{"list", "watch", "patch"}, "", "nodes", "", false),
		rules([]string{"list", "watch"}, "kilo.squat.ai", "peers", "", false)...),
	LeaderElection: rules([]string{"get", "list", "watch", "create", "update"}, "coordination.k8s.io", "leases", "", true),
	// Events about Nodes and Peers go to "default" (cluster-scoped
	// objects), about ClusterMeshes to their namespace; create is checked
	// in "default", where kg's grants never reach.
	Events:      {{"create", "", "events", "", false}, {"patch", "", "events", "", false}},
	ClusterMesh: rules([]string{"list", "watch"}, "kilo.squat.ai", "clustermeshes", "", true),
	// The writer is named by the plan (docs/clustermesh.md#status-writer):
	// no Lease of its own.
	ClusterMeshStatus:       rules([]string{"patch"}, "kilo.squat.ai", "clustermeshes", "status", true),
	ClusterMeshStatusSchema: {{"get", "apiextensions.k8s.io", "customresourcedefinitions", "", false}},
	Lifecycle:               {{"list", "", "pods", "", true}, {"get", "apps", "daemonsets", "", true}},
}

// order is the Set's order.
var order = []string{Mesh, LeaderElection, Events, ClusterMesh, ClusterMeshStatus, ClusterMeshStatusSchema, Lifecycle}

// Check asks the API server what the agent may do in namespace (where
// ClusterMeshes, their Secrets and the Leases are), and whether Kilo's
// CRDs exist. An error means it could not ask (the API is unreachable):
// the caller decides what to assume.
func Check(ctx context.Context, client kubernetes.Interface, namespace string) (Set, error) {
	crds, err := kiloResources(client)
	if err != nil {
		return nil, err
	}
	cache := map[rule]bool{}
	allowed := func(r rule) (bool, error) {
		if v, ok := cache[r]; ok {
			return v, nil
		}
		ra := &authorizationv1.ResourceAttributes{Verb: r.verb, Group: r.group, Resource: r.resource, Subresource: r.subresource}
		if r.namespaced {
			ra.Namespace = namespace
		} else if r.resource == "events" {
			ra.Namespace = metav1.NamespaceDefault
		}
		rev, err := client.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx,
			&authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: ra}}, metav1.CreateOptions{})
		if err != nil {
			return false, fmt.Errorf("asking whether the agent may %s: %w", r.String(namespace), err)
		}
		cache[r] = rev.Status.Allowed
		return rev.Status.Allowed, nil
	}
	var out Set
	for _, name := range order {
		f := Feature{Name: name, On: true}
		switch name {
		case Mesh:
			if !crds["peers"] {
				f.Missing = append(f.Missing, "the CRD peers.kilo.squat.ai (Kilo's)")
			}
		case ClusterMesh, ClusterMeshStatus:
			if !crds["clustermeshes"] {
				f.Missing = append(f.Missing, "the CRD clustermeshes.kilo.squat.ai (manifests/crds)")
			}
		}
		for _, r := range needs[name] {
			ok, err := allowed(r)
			if err != nil {
				return nil, err
			}
			if !ok {
				f.Missing = append(f.Missing, r.String(namespace))
			}
		}
		f.On = len(f.Missing) == 0
		out = append(out, f)
	}
	return out, nil
}

// kiloResources lists the resources of kilo.squat.ai/v1alpha1 the API
// server serves (none when the group is absent).
func kiloResources(client kubernetes.Interface) (map[string]bool, error) {
	out := map[string]bool{}
	list, err := client.Discovery().ServerResourcesForGroupVersion("kilo.squat.ai/v1alpha1")
	if apierrors.IsNotFound(err) {
		return out, nil
	}
	if err != nil {
		return nil, fmt.Errorf("discovering kilo.squat.ai/v1alpha1: %w", err)
	}
	for _, r := range list.APIResources {
		if !strings.Contains(r.Name, "/") {
			out[r.Name] = true
		}
	}
	return out, nil
}

// Changed reports whether a feature is on in now that was off in before
// (grants added: the agent restarts to use them).
func Changed(before, now Set) []string {
	var on []string
	for _, f := range now {
		if f.On && !before.On(f.Name) && slices.ContainsFunc(before, func(b Feature) bool { return b.Name == f.Name }) {
			on = append(on, f.Name)
		}
	}
	return on
}

// SecretAccess returns a check whether the agent may watch the Secret of
// namespace called name: its grant may list Secret names (resourceNames),
// so it is asked per Secret (cluster.SecretWatch).
func SecretAccess(client kubernetes.Interface, namespace string) func(ctx context.Context, name string) (bool, error) {
	return func(ctx context.Context, name string) (bool, error) {
		for _, verb := range []string{"list", "watch"} {
			rev, err := client.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
				Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
					Verb: verb, Resource: "secrets", Namespace: namespace, Name: name}}}, metav1.CreateOptions{})
			if err != nil {
				return false, fmt.Errorf("asking whether the agent may %s Secret %s/%s: %w", verb, namespace, name, err)
			}
			if !rev.Status.Allowed {
				return false, nil
			}
		}
		return true, nil
	}
}
