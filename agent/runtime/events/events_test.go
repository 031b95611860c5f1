package events

import (
	"context"
	"strings"
	"testing"
	"time"

	testingclock "k8s.io/utils/clock/testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"

	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/agent/runtime/metrics"
)

func plan(rs ...topology.Rejection) topology.Plan {
	return topology.Plan{
		Segments:   []topology.SegmentInfo{{Name: "location:y", Leader: "node-b"}, {Name: "location:x", Leader: "node-a"}},
		Remotes:    []topology.RemoteInfo{{Cluster: "cluster-b", Mesh: "kilo-system/prod"}},
		Rejections: rs,
	}
}

func drain(r *record.FakeRecorder) []string {
	var out []string
	for {
		select {
		case e := <-r.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

func TestReportOncePerRejection(t *testing.T) {
	ctx := context.Background()
	m := metrics.NewAgent(prometheus.NewRegistry())
	uids := func(kind, ns, name string) (types.UID, bool) { return types.UID(kind + "/" + ns + "/" + name), true }
	rec := record.NewFakeRecorder(100)
	rec.IncludeObject = true
	a := &Sink{Recorder: rec, UIDs: uids, Node: "node-a", Metrics: m}
	bad := topology.Rejection{Object: topology.ObjectRef{Kind: "Peer", Name: "laptop"}, Field: "spec.publicKey", Reason: topology.ReasonInvalidKey, Message: "not base64", Reporter: "node-a"}
	remote := topology.Rejection{Object: topology.ObjectRef{Kind: "Node", Cluster: "cluster-b", Name: "b-1"}, Field: "podCIDRs", Reason: topology.ReasonDefaultRoute, Message: "0.0.0.0/0 is a default route", Reporter: "node-a"}

	for i := 0; i < 5; i++ { // five resyncs
		a.Report(ctx, plan(bad, remote))
	}
	evs := drain(rec)
	if len(evs) != 2 {
		t.Fatalf("events = %q, want 2 (one per rejection)", evs)
	}
	for _, want := range []string{
		"Warning InvalidKey spec.publicKey: not base64 involvedObject{kind=Peer,apiVersion=kilo.squat.ai/v1alpha1}",
		"Warning DefaultRoute cluster cluster-b: Node b-1: podCIDRs: 0.0.0.0/0 is a default route involvedObject{kind=ClusterMesh,apiVersion=kilo.squat.ai/v1alpha1}",
	} {
		found := false
		for _, e := range evs {
			found = found || e == want
		}
		if !found {
			t.Errorf("no event %q in %q", want, evs)
		}
	}
	if got := testutil.ToFloat64(m.Rejections.WithLabelValues("InvalidKey")); got != 1 {
		t.Errorf("InvalidKey counted %v times, want 1", got)
	}
	// Fixed, then broken again: reported again.
	a.Report(ctx, plan())
	if a.Active() != 0 {
		t.Fatal("fixed rejection still active")
	}
	a.Report(ctx, plan(bad))
	if got := testutil.ToFloat64(m.Rejections.WithLabelValues("InvalidKey")); got != 2 {
		t.Errorf("InvalidKey counted %v times, want 2", got)
	}
	if evs := drain(rec); len(evs) != 1 {
		t.Errorf("events after the rejection came back = %q, want 1", evs)
	}
}

// TestOnlyTheReporterWritesTheEvent: every node logs and counts a
// rejection; only the node the planner names as its Reporter writes the
// Event.
func TestOnlyTheReporterWritesTheEvent(t *testing.T) {
	ctx := context.Background()
	own := topology.Rejection{Object: topology.ObjectRef{Kind: "Node", Name: "node-c"}, Field: "kilo.squat.ai/force-endpoint", Reason: topology.ReasonInvalidEndpoint, Message: "x", Reporter: "node-c"}
	peer := topology.Rejection{Object: topology.ObjectRef{Kind: "Peer", Name: "laptop"}, Reason: topology.ReasonInvalidKey, Message: "y", Reporter: "node-a"}
	written := map[string][]string{}
	for _, node := range []string{"node-a", "node-b", "node-c"} {
		rec := record.NewFakeRecorder(10)
		m := metrics.NewAgent(prometheus.NewRegistry())
		(&Sink{Recorder: rec, Node: node, Metrics: m}).Report(ctx, plan(own, peer))
		for _, e := range drain(rec) {
			written[strings.Fields(e)[1]] = append(written[strings.Fields(e)[1]], node)
		}
		if got := testutil.ToFloat64(m.Rejections.WithLabelValues("InvalidKey")); got != 1 {
			t.Errorf("%s counted InvalidKey %v times, want 1 (every node logs and counts)", node, got)
		}
	}
	if w := written["InvalidEndpoint"]; len(w) != 1 || w[0] != "node-c" {
		t.Errorf("the node's own rejection written by %v, want node-c", w)
	}
	if w := written["InvalidKey"]; len(w) != 1 || w[0] != "node-a" {
		t.Errorf("the Peer's rejection written by %v, want node-a", w)
	}
}

func TestTransientDuplicatesSettleFirst(t *testing.T) {
	ctx := context.Background()
	clk := testingclock.NewFakePassiveClock(time.Unix(1_800_000_000, 0))
	m := metrics.NewAgent(prometheus.NewRegistry())
	s := &Sink{Node: "a", Metrics: m, Clock: clk}
	dup := topology.Rejection{Object: topology.ObjectRef{Kind: "Node", Cluster: "b", Name: "b-2"}, Reason: topology.ReasonDuplicateWireGuardIP, Message: "x"}
	count := func() float64 {
		return testutil.ToFloat64(m.Rejections.WithLabelValues(string(topology.ReasonDuplicateWireGuardIP)))
	}
	s.Report(ctx, plan(dup))
	clk.SetTime(clk.Now().Add(10 * time.Second))
	s.Report(ctx, plan(dup))
	if count() != 0 {
		t.Fatal("a start-up race was reported before it had a chance to settle")
	}
	s.Report(ctx, plan()) // it settled
	clk.SetTime(clk.Now().Add(time.Minute))
	s.Report(ctx, plan(dup))
	clk.SetTime(clk.Now().Add(31 * time.Second))
	s.Report(ctx, plan(dup))
	s.Report(ctx, plan(dup))
	if count() != 1 {
		t.Fatalf("a lasting duplicate counted %v times, want 1", count())
	}
}

// TestRejectionsActive: meshlet_rejections_active counts the reported
// rejections in force by reason and kind, follows each plan (a fixed input
// leaves, a vanished label set is deleted, not left at 0), and, like the
// Events, leaves out a start-up race until it has outlasted settleTime.
func TestRejectionsActive(t *testing.T) {
	ctx := context.Background()
	clk := testingclock.NewFakePassiveClock(time.Unix(1_800_000_000, 0))
	reg := prometheus.NewPedanticRegistry()
	s := &Sink{Node: "a", Metrics: metrics.NewAgent(reg), Clock: clk}
	key1 := topology.Rejection{Object: topology.ObjectRef{Kind: "Peer", Name: "p1"}, Reason: topology.ReasonInvalidKey, Message: "x"}
	key2 := topology.Rejection{Object: topology.ObjectRef{Kind: "Peer", Name: "p2"}, Reason: topology.ReasonInvalidKey, Message: "x"}
	route := topology.Rejection{Object: topology.ObjectRef{Kind: "Node", Cluster: "b", Name: "b-1"}, Reason: topology.ReasonDefaultRoute, Message: "x"}
	dup := topology.Rejection{Object: topology.ObjectRef{Kind: "Node", Cluster: "b", Name: "b-2"}, Reason: topology.ReasonDuplicateWireGuardIP, Message: "x"}
	const head = "# HELP meshlet_rejections_active Rejections in force in the current plan (reported: Event written or due), by reason and kind of object (Node, Peer, ClusterMesh).\n# TYPE meshlet_rejections_active gauge\n"
	tests := []struct {
		name  string
		after time.Duration
		in    []topology.Rejection
		want  string // series, "" = none
	}{
		{"two bad keys and a default route", 0, []topology.Rejection{key1, key2, route},
			"meshlet_rejections_active{kind=\"Node\",reason=\"DefaultRoute\"} 1\nmeshlet_rejections_active{kind=\"Peer\",reason=\"InvalidKey\"} 2\n"},
		{"one key fixed, a duplicate WireGuard IP appears (settling)", 5 * time.Second, []topology.Rejection{key2, route, dup},
			"meshlet_rejections_active{kind=\"Node\",reason=\"DefaultRoute\"} 1\nmeshlet_rejections_active{kind=\"Peer\",reason=\"InvalidKey\"} 1\n"},
		{"the duplicate outlasts the settle time", 31 * time.Second, []topology.Rejection{key2, route, dup},
			"meshlet_rejections_active{kind=\"Node\",reason=\"DefaultRoute\"} 1\nmeshlet_rejections_active{kind=\"Node\",reason=\"DuplicateWireGuardIP\"} 1\nmeshlet_rejections_active{kind=\"Peer\",reason=\"InvalidKey\"} 1\n"},
		{"keys fixed: the InvalidKey series is gone", time.Second, []topology.Rejection{route, dup},
			"meshlet_rejections_active{kind=\"Node\",reason=\"DefaultRoute\"} 1\nmeshlet_rejections_active{kind=\"Node\",reason=\"DuplicateWireGuardIP\"} 1\n"},
		{"everything fixed", time.Second, nil, ""},
	}
	for _, tt := range tests {
		clk.SetTime(clk.Now().Add(tt.after))
		s.Report(ctx, plan(tt.in...))
		want := ""
		if tt.want != "" {
			want = head + tt.want
		}
		if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "meshlet_rejections_active"); err != nil {
			t.Errorf("%s: %v", tt.name, err)
		}
	}
}
