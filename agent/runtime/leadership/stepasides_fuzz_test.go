package leadership

import (
	"bytes"
	"encoding/json"
	"os"
	"reflect"
	"slices"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshlet/meshlet/agent/core/failover"
	"github.com/meshlet/meshlet/agent/core/planner"
	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/agent/runtime/cluster"
)

// FuzzStepAsides: a location's Lease is written by every agent of the
// location (and whoever else may update Leases), so its
// meshlet.io/step-asides annotation is outside input. Reading it never
// panics; what it reads is what setStepAsides writes back (less the
// entries cooled down); and the planner, given it as the Lease's
// step-asides with any holder where the Lease governs, never panics,
// elects in every segment one of the segment's nodes, and takes no node
// cooling down after a step-aside for a candidate.
//
//	go test -run='^$' -fuzz='^FuzzStepAsides$' -parallel=1 ./agent/runtime/leadership/
func FuzzStepAsides(f *testing.F) {
	at := time.Unix(1_800_000_000, 0).UTC()
	b, _ := json.Marshal(map[string]topology.StepAside{"a-1": {Reason: "underlay unreachable", At: at}})
	f.Add(string(b), "a-1", int64(10))
	b, _ = json.Marshal(map[string]topology.StepAside{"a-1": {Reason: "x", At: at}, "a-2": {Reason: "handshakes stale", At: at.Add(-time.Hour)}})
	f.Add(string(b), "a-2", int64(-5))
	f.Add(`{"a-3":{"reason":"","at":"0001-01-01T00:00:00Z"}}`, "", int64(0))
	f.Add(`{"":{}}`, "nobody", int64(1e12))
	f.Add(`[]`, "a-1", int64(0))
	f.Add(`null`, "a-1", int64(0))

	data, err := os.ReadFile("../../../cmd/meshlet/testdata/cluster-a.yaml")
	if err != nil {
		f.Fatal(err)
	}
	objs, err := cluster.ReadObjects(bytes.NewReader(data))
	if err != nil {
		f.Fatal(err)
	}
	base := cluster.Snapshot(objs, nil, "")
	base.Settings = topology.Settings{Interface: "kilo0", Granularity: topology.GranularityLocation, Port: 51820, Local: true}
	base.Now = at
	// Every node runs meshlet and nobody chose a leader by hand: the
	// Lease governs (failover.Governance), so its step-asides count.
	for i := range base.Nodes {
		base.Nodes[i].MeshletVersion = "v0.3.0"
		base.Nodes[i].Leader, base.Nodes[i].LeaderMark = false, false
	}

	f.Fuzz(func(t *testing.T, annotation, holder string, offset int64) {
		l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "meshlet-fsn1", Annotations: map[string]string{AnnotationStepAsides: annotation}}}
		m := stepAsides(l)
		now := at.Add(time.Duration(offset) * time.Second)
		setStepAsides(l, now, nil)
		kept := stepAsides(l)
		for k, v := range kept {
			if w, ok := m[k]; !ok || !reflect.DeepEqual(jsonOf(t, v), jsonOf(t, w)) || !now.Before(v.At.Add(failover.StepAsideCoolDown)) {
				t.Fatalf("rewritten %q: %+v, read %+v at %v", k, v, w, now)
			}
		}
		for k, v := range m {
			if _, ok := kept[k]; !ok && now.Before(v.At.Add(failover.StepAsideCoolDown)) {
				t.Fatalf("%q dropped while cooling down", k)
			}
		}
		for _, n := range base.Nodes {
			snap := base
			snap.Now = now
			snap.Lease = &topology.LeaseState{Name: failover.LeaseName(topology.NodeLocation(n, topology.Defaults(base.Settings))), Exists: true,
				Holder: holder, Duration: 15 * time.Second, Fresh: now, StepAsides: m}
			self := topology.Self{Name: n.Name, PublicKey: n.PublicKey, Version: n.MeshletVersion}
			if n.InternalIP.IsValid() {
				self.Addresses = []topology.HostAddress{{Interface: "eth0", Prefix: n.InternalIP}}
			}
			plan := planner.Compute(snap, self)
			if plan.Leadership == nil {
				t.Fatalf("%s: no leadership with a Lease", n.Name)
			}
			// A node that stepped aside is no candidate while it cools down.
			for _, c := range plan.Leadership.Candidates {
				if sa, ok := m[c]; ok && now.Before(sa.At.Add(failover.StepAsideCoolDown)) {
					t.Fatalf("%s: %s is a candidate while cooling down (%+v)", n.Name, c, sa)
				}
			}
			for _, s := range plan.Segments {
				if !slices.Contains(s.Nodes, s.Leader) {
					t.Fatalf("segment %s elects %q, not one of %v", s.Name, s.Leader, s.Nodes)
				}
			}
		}
	})
}

func jsonOf(t *testing.T, v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
