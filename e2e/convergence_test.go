package e2e

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/e2e/harness"
)

// Scenario 4: remote changes (a remote leader's endpoint, remote nodes
// added and deleted) reach the local leader's device; measured from the
// API write to the change on the device, over 20 changes.
func TestRemoteChangeConvergence(t *testing.T) {
	env, ctx := newEnv(t)
	must(t, env.Build(ctx, harness.Small(1, "z")))
	a1 := env.Node("a-x1")
	b := env.Cluster("cluster-b")
	// A remote location whose leader is a node as kg would publish it.
	v1, err := b.AddFakeNode(ctx, harness.FakeNode{Name: "b-v1", Location: "v",
		Endpoint: "172.20.0.200:51820", WireGuardIP: "100.66.1.9/24"})
	must(t, err)
	peerOf := func() (harness.WGPeer, bool) {
		d, err := a1.Device()
		if err != nil || d == nil {
			return harness.WGPeer{}, false
		}
		p, ok := d.Peers[v1.PublicKey]
		return p, ok
	}
	must(t, harness.Poll(ctx, 30*time.Second, 20*time.Millisecond, "b-v1 on a-x1", func() (bool, error) {
		_, ok := peerOf()
		return ok, nil
	}))
	before, err := a1.Metrics(ctx)
	must(t, err)
	convBefore, _ := before.Value("meshlet_convergence_seconds")

	type change struct {
		what  string
		write func() error
		seen  func(harness.WGPeer, bool) bool
	}
	var changes []change
	for i := 0; i < 14; i++ {
		ep := fmt.Sprintf("172.20.0.%d:51820", 100+i)
		changes = append(changes, change{"endpoint " + ep,
			func() error {
				return b.PatchNodeAnnotations(ctx, "b-v1", map[string]*string{topology.AnnotationClusterMeshEndpoint: &ep})
			},
			func(p harness.WGPeer, ok bool) bool { return ok && p.Endpoint == ep }})
	}
	for i := 2; i <= 4; i++ {
		name := fmt.Sprintf("b-v%d", i)
		pod := netip.MustParsePrefix(fmt.Sprintf("10.2.%d.0/24", 100+i))
		changes = append(changes, change{"add " + name,
			func() error {
				_, err := b.AddFakeNode(ctx, harness.FakeNode{Name: name, Location: "v", PodCIDR: pod,
					Endpoint: fmt.Sprintf("172.20.0.%d:51820", 210+i)})
				return err
			},
			func(p harness.WGPeer, ok bool) bool { return ok && contains(p.AllowedIPs, pod.String()) }})
		changes = append(changes, change{"delete " + name,
			func() error { return b.DeleteNode(ctx, name) },
			func(p harness.WGPeer, ok bool) bool { return ok && !contains(p.AllowedIPs, pod.String()) }})
	}
	var lat []time.Duration
	for _, c := range changes {
		start := time.Now()
		must(t, c.write())
		err := harness.Poll(ctx, 10*time.Second, 5*time.Millisecond, c.what, func() (bool, error) {
			p, ok := peerOf()
			return c.seen(p, ok), nil
		})
		if err != nil {
			t.Fatalf("change %q never reached a-x1's device: %v", c.what, err)
		}
		lat = append(lat, time.Since(start))
	}
	after, err := a1.Metrics(ctx)
	must(t, err)
	convAfter, _ := after.Value("meshlet_convergence_seconds")
	var p50m, p99m float64
	if sa, sb := after.Series("meshlet_convergence_seconds"), before.Series("meshlet_convergence_seconds"); len(sa) == 1 && len(sb) == 1 {
		d := harness.HistogramDelta(sb[0], sa[0])
		p50m, p99m = harness.HistogramQuantile(d, 0.5), harness.HistogramQuantile(d, 0.99)
	}
	report(t, "%d remote changes, API write → a-x1 device: p50 %v, p99 %v, max %v; meshlet_convergence_seconds: +%v observations, p50≈%.3fs p99≈%.3fs (bucket estimates over these changes)",
		len(lat), percentile(lat, 0.5).Round(time.Millisecond), percentile(lat, 0.99).Round(time.Millisecond),
		percentile(lat, 1).Round(time.Millisecond), convAfter-convBefore, p50m, p99m)
	if convAfter <= convBefore {
		t.Errorf("meshlet_convergence_seconds recorded nothing (%v → %v)", convBefore, convAfter)
	}
}
