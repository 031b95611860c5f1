package events

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/agent/runtime/metrics"
)

func TestReportOncePerRejection(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset()
	m := metrics.NewAgent(prometheus.NewRegistry())
	resolver := func(c string) (string, string, bool) { return "kilo-system", "prod", c == "cluster-b" }
	a := &Sink{Client: client, Node: "node-a", Metrics: m, Meshes: resolver}
	b := &Sink{Client: client, Node: "node-b", Metrics: m, Meshes: resolver}
	bad := topology.Rejection{Object: topology.ObjectRef{Kind: "Peer", Name: "laptop"}, Field: "spec.publicKey", Reason: topology.ReasonInvalidKey, Message: "not base64"}
	remote := topology.Rejection{Object: topology.ObjectRef{Kind: "Node", Cluster: "cluster-b", Name: "b-1"}, Field: "podCIDRs", Reason: topology.ReasonDefaultRoute, Message: "0.0.0.0/0 is a default route"}

	for i := 0; i < 5; i++ { // five resyncs
		a.Report(ctx, []topology.Rejection{bad, remote})
	}
	b.Report(ctx, []topology.Rejection{bad}) // another node sees the same
	evs, err := client.CoreV1().Events("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(evs.Items) != 2 {
		t.Fatalf("events = %d, want 2 (one per rejection, shared by nodes)", len(evs.Items))
	}
	for _, e := range evs.Items {
		switch e.InvolvedObject.Kind {
		case "Peer":
			if e.Namespace != "default" || e.Reason != "InvalidKey" || e.Type != "Warning" || e.InvolvedObject.Name != "laptop" {
				t.Errorf("peer event = %+v", e)
			}
		case "ClusterMesh":
			if e.Namespace != "kilo-system" || e.InvolvedObject.Name != "prod" || e.Message == "" {
				t.Errorf("remote event = %+v", e)
			}
		default:
			t.Errorf("unexpected event on %+v", e.InvolvedObject)
		}
	}
	if got := testutil.ToFloat64(m.Rejections.WithLabelValues("InvalidKey")); got != 2 {
		t.Errorf("InvalidKey counted %v times, want 2 (once per node)", got)
	}
	// Fixed, then broken again: reported again.
	a.Report(ctx, nil)
	if a.Active() != 0 {
		t.Fatal("fixed rejection still active")
	}
	a.Report(ctx, []topology.Rejection{bad})
	if got := testutil.ToFloat64(m.Rejections.WithLabelValues("InvalidKey")); got != 3 {
		t.Errorf("InvalidKey counted %v times, want 3", got)
	}
}

func TestEventNameIsStableAndValid(t *testing.T) {
	r := topology.Rejection{Object: topology.ObjectRef{Kind: "Node", Name: "Node-1"}, Reason: topology.ReasonInvalidCIDR, Message: "x"}
	again := r
	if EventName(r) != EventName(again) || EventName(r)[:7] != "node-1." {
		t.Fatalf("name = %s", EventName(r))
	}
	r2 := r
	r2.Message = "y"
	if EventName(r) == EventName(r2) {
		t.Fatal("different rejections share a name")
	}
}

func TestTransientDuplicatesSettleFirst(t *testing.T) {
	ctx := context.Background()
	clock := time.Unix(1_800_000_000, 0)
	m := metrics.NewAgent(prometheus.NewRegistry())
	s := &Sink{Node: "a", Metrics: m, Now: func() time.Time { return clock }}
	dup := topology.Rejection{Object: topology.ObjectRef{Kind: "Node", Cluster: "b", Name: "b-2"}, Reason: topology.ReasonDuplicateWireGuardIP, Message: "x"}
	count := func() float64 {
		return testutil.ToFloat64(m.Rejections.WithLabelValues(string(topology.ReasonDuplicateWireGuardIP)))
	}
	s.Report(ctx, []topology.Rejection{dup})
	clock = clock.Add(10 * time.Second)
	s.Report(ctx, []topology.Rejection{dup})
	if count() != 0 {
		t.Fatal("a start-up race was reported before it had a chance to settle")
	}
	s.Report(ctx, nil) // it settled
	clock = clock.Add(time.Minute)
	s.Report(ctx, []topology.Rejection{dup})
	clock = clock.Add(31 * time.Second)
	s.Report(ctx, []topology.Rejection{dup})
	s.Report(ctx, []topology.Rejection{dup})
	if count() != 1 {
		t.Fatalf("a lasting duplicate counted %v times, want 1", count())
	}
}
