package manifests_test

import (
	"testing"

	"github.com/meshlet/meshlet/agent/core/kilo"
	"github.com/meshlet/meshlet/agent/core/topology"
)

// TestExamplesCoherent checks that the examples agree with the DaemonSet and
// with the annotation formats meshlet parses: the Talos patch labels nodes
// the way the DaemonSet selects them, the Kilo patch excludes exactly those
// nodes, and every annotation value parses.
func TestExamplesCoherent(t *testing.T) {
	var talos struct {
		Machine struct {
			NodeLabels      map[string]string `json:"nodeLabels"`
			NodeAnnotations map[string]string `json:"nodeAnnotations"`
		} `json:"machine"`
	}
	mustYAML(t, "examples/talos-node-annotations.yaml", &talos)
	var ds struct {
		Spec struct {
			Template struct {
				Spec struct {
					NodeSelector map[string]string `json:"nodeSelector"`
				} `json:"spec"`
			} `json:"template"`
		} `json:"spec"`
	}
	mustYAML(t, "base/daemonset.yaml", &ds)
	sel := ds.Spec.Template.Spec.NodeSelector
	if sel["meshlet.io/agent"] != "true" {
		t.Fatalf("DaemonSet nodeSelector %v lacks meshlet.io/agent=true", sel)
	}
	if talos.Machine.NodeLabels["meshlet.io/agent"] != "true" {
		t.Errorf("Talos patch labels %v: meshlet.io/agent=true missing", talos.Machine.NodeLabels)
	}
	a := talos.Machine.NodeAnnotations
	if a[topology.AnnotationLocation] == "" {
		t.Errorf("Talos patch has no %s", topology.AnnotationLocation)
	}
	if _, err := kilo.ParseEndpoint(a[topology.AnnotationForceEndpoint]); err != nil || a[topology.AnnotationForceEndpoint] == "" {
		t.Errorf("force-endpoint %q: %v", a[topology.AnnotationForceEndpoint], err)
	}
	if n, err := kilo.ParsePersistentKeepalive(a[topology.AnnotationPersistentKeepalive]); err != nil || n <= 0 {
		t.Errorf("persistent-keepalive %q: %d, %v", a[topology.AnnotationPersistentKeepalive], n, err)
	}
	// A user's leader annotation pins the location's leader and turns Lease
	// failover off there (docs/failover.md): the example must not set it.
	if v, ok := a[topology.AnnotationLeader]; ok {
		t.Errorf("Talos patch sets %s=%q, which turns Lease failover off", topology.AnnotationLeader, v)
	}

	var kiloPatch struct {
		Spec struct {
			Template struct {
				Spec struct {
					Affinity struct {
						NodeAffinity struct {
							Required struct {
								Terms []struct {
									Exprs []struct {
										Key      string   `json:"key"`
										Operator string   `json:"operator"`
										Values   []string `json:"values"`
									} `json:"matchExpressions"`
								} `json:"nodeSelectorTerms"`
							} `json:"requiredDuringSchedulingIgnoredDuringExecution"`
						} `json:"nodeAffinity"`
					} `json:"affinity"`
				} `json:"spec"`
			} `json:"template"`
		} `json:"spec"`
	}
	mustYAML(t, "examples/kilo-daemonset-affinity.yaml", &kiloPatch)
	terms := kiloPatch.Spec.Template.Spec.Affinity.NodeAffinity.Required.Terms
	if len(terms) != 1 || len(terms[0].Exprs) != 1 {
		t.Fatalf("Kilo affinity patch: %+v", terms)
	}
	e := terms[0].Exprs[0]
	// Kilo stays off meshlet's nodes and off nodes being moved ("pending",
	// docs/migration.md), which meshlet's DaemonSet does not select either.
	if e.Key != "meshlet.io/agent" || e.Operator != "NotIn" || len(e.Values) != 2 || e.Values[0] != sel["meshlet.io/agent"] ||
		e.Values[1] != "pending" || sel["meshlet.io/agent"] == "pending" {
		t.Errorf("Kilo affinity %+v does not exclude the DaemonSet's nodes %v and the pending ones", e, sel)
	}
}
