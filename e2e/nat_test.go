package e2e

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/e2e/harness"
)

// Scenario 3: a remote cluster behind NAT (no public endpoint) with
// persistentKeepalive in its ClusterMesh entry. It dials out; the local
// leader learns its NAT address, publishes it in discovered-endpoints, and
// meshlet never writes the configured (unreachable) endpoint back.
func TestNATedRemoteCluster(t *testing.T) {
	env, ctx := newEnv(t)
	r, err := env.AddRouter(ctx, "r1")
	must(t, err)
	l := harness.Small(1)
	l.Clusters[1].Keepalive = 1
	l.Clusters[1].Nodes = []harness.NodeSpec{{Name: "b-n1", Location: "n", Behind: r}}
	must(t, env.Build(ctx, l))
	a1, n1 := env.Node("a-x1"), env.Node("b-n1")
	nKey, err := n1.PublicKey(ctx)
	must(t, err)

	took, err := a1.WaitReachable(ctx, n1.PodIP, 30*time.Second)
	must(t, err)
	dev, err := a1.Device()
	must(t, err)
	p := dev.Peers[nKey]
	ep := p.EndpointAddr()
	if ep.Addr() != r.WAN.Addr() {
		t.Fatalf("a-x1's endpoint for b-n1 = %q, want the router's WAN address %s (configured: %s)", p.Endpoint, r.WAN.Addr(), n1.IP.Addr())
	}
	if p.Keepalive != 1 {
		t.Errorf("a-x1's keepalive for b-n1 = %d, want 1 (cluster-b's ClusterMesh entry)", p.Keepalive)
	}
	nDev, err := n1.Device()
	must(t, err)
	aKey, err := a1.PublicKey(ctx)
	must(t, err)
	if k := nDev.Peers[aKey].Keepalive; k != 1 {
		t.Errorf("b-n1's keepalive for a-x1 = %d, want 1 (its own entry's persistentKeepalive)", k)
	}

	// discovered-endpoints on a-x1's Node, in Kilo's format.
	var disc map[string]struct {
		IP   string
		Port int
	}
	must(t, harness.Poll(ctx, 20*time.Second, 100*time.Millisecond, "discovered-endpoints on a-x1", func() (bool, error) {
		ann, err := a1.Cluster.Annotations(ctx, a1.Name)
		if err != nil {
			return false, err
		}
		disc = nil
		if err := json.Unmarshal([]byte(ann[topology.AnnotationDiscoveredEndpoints]), &disc); err != nil {
			return false, err
		}
		d, ok := disc[nKey]
		return ok && d.IP == ep.Addr().String() && d.Port == int(ep.Port()), fmt.Errorf("%v", disc)
	}))

	// Across three resyncs (5 s each) the device keeps the learned address.
	m0, err := a1.Metrics(ctx)
	must(t, err)
	rec0, _ := m0.Value("meshlet_reconciles_total")
	deadline := time.Now().Add(16 * time.Second)
	samples := 0
	for time.Now().Before(deadline) {
		d, err := a1.Device()
		must(t, err)
		if got := d.Peers[nKey].EndpointAddr(); got.Addr() != r.WAN.Addr() {
			t.Fatalf("endpoint rewritten to %v after %d samples", got, samples)
		}
		samples++
		pace(ctx, 250*time.Millisecond)
	}
	m1, err := a1.Metrics(ctx)
	must(t, err)
	rec1, _ := m1.Value("meshlet_reconciles_total")
	if rec1-rec0 < 3 {
		t.Errorf("only %v reconciles in 16 s; the check wanted several resyncs", rec1-rec0)
	}
	_, err = a1.WaitReachable(ctx, n1.PodIP, 5*time.Second)
	must(t, err)
	report(t, "NATed b-n1 reachable after %v; a-x1 learned %s (router WAN), published in discovered-endpoints; endpoint kept over %d samples / %v reconciles in 16 s",
		took.Round(time.Millisecond), ep, samples, rec1-rec0)
}
