package failover

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/meshlet/meshlet/agent/core/topology"
)

// Shared by the failover tests: location x of meshlet nodes built by
// hand, the Lease as an agent sees it, one comparison.

var now = time.Unix(1_800_000_000, 0)

func key(i int) topology.Key { return topology.Key{byte(i), 0x42} }

// xnode is node x-i of location x, Ready and run by meshlet, changed by fs.
func xnode(i int, fs ...func(*topology.Node)) topology.Node {
	n := topology.Node{Name: fmt.Sprintf("x-%d", i), LocationAnnotation: "x", PublicKey: key(i),
		InternalIP: netip.MustParsePrefix(fmt.Sprintf("10.0.1.%d/24", i)), Endpoint: fmt.Sprintf("10.0.1.%d:51820", i),
		LastSeen: now.Add(-5 * time.Second), MeshletVersion: "v1"}
	for _, f := range fs {
		f(&n)
	}
	return n
}

// Changes of a node.
var (
	marked     = func(n *topology.Node) { n.Leader, n.LeaderMark = true, true }
	byHand     = func(n *topology.Node) { n.Leader = true }
	kg         = func(n *topology.Node) { n.MeshletVersion = "" }
	public     = func(n *topology.Node) { n.Endpoint = "198.51.100.9:51820" }
	unseen     = func(n *topology.Node) { n.LastSeen = time.Time{} }
	gatewayBad = func(n *topology.Node) { n.Degraded = ReasonGatewayUnreachable }
	cordoned   = func(n *topology.Node) { n.Leaving = topology.LeavingCordoned }
)

// input is what Decide reads on node self: the Ready ones of nodes make
// location x's segment (sorted by name, led by Kilo's rule).
func input(self string, nodes []topology.Node, lease *topology.LeaseState, j Judgement) Input {
	in := Input{Lease: lease, Now: now, Self: self, Nodes: nodes, Judgement: j}
	seg := &topology.Segment{Key: topology.LocationSegment("x"), Location: "x"}
	for i := range nodes {
		if n := nodes[i]; !n.LastSeen.IsZero() {
			seg.Nodes = append(seg.Nodes, &n)
		}
	}
	if len(seg.Nodes) == 0 {
		return in
	}
	seg.Leader = slices.Index(seg.Nodes, topology.KiloOrder(seg.Nodes)[0])
	for _, n := range seg.Nodes {
		if n.Name == self {
			in.SelfNode, in.Segment, in.Endpoint = n, seg, n.Endpoint
		}
	}
	return in
}

// held is location x's Lease held by holder ("" = free), renewed age ago.
func held(holder string, age time.Duration) *topology.LeaseState {
	return &topology.LeaseState{Name: "meshlet-leader-x", Exists: true, Holder: holder, Duration: 3 * time.Second, Fresh: now.Add(-age)}
}

// steppedAside is l with node name's step-aside ago.
func steppedAside(l *topology.LeaseState, name string, ago time.Duration) *topology.LeaseState {
	l.StepAsides = map[string]topology.StepAside{name: {Reason: ReasonWireGuardDegraded, At: now.Add(-ago)}}
	return l
}

// check fails the test when got is not want (both printed as JSON: a
// Decision holds a pointer).
func check(t *testing.T, what string, got, want any) {
	t.Helper()
	if reflect.DeepEqual(got, want) {
		return
	}
	g, _ := json.Marshal(got)
	w, _ := json.Marshal(want)
	t.Errorf("%s:\n got %s\nwant %s", what, g, w)
}
