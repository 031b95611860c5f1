package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/e2e/harness"
)

// Scenario: a dual-stack mesh (docs/dual-stack.md) — two clusters, three
// locations, IPv4 and IPv6 pod CIDRs on every node, meshlet with
// --dual-stack-subnet. Every pod reaches every other pod in both families,
// across locations and clusters, through the leaders (non-leaders send
// IPv6 to their leader on the underlay: IPIP carries IPv4 alone). Then a
// Peer with allowed IPs of both families is added: only that peer and its
// routes change on the leaders, every other session keeps its handshake.
// Run once with WireGuard over the IPv4 underlay (the nodes' discovered
// endpoints) and once over the IPv6 underlay (force-endpoint on each
// node's IPv6 address).
func TestDualStackMesh(t *testing.T) {
	for _, underlay := range []string{"IPv4", "IPv6"} {
		t.Run(underlay+"-underlay", func(t *testing.T) {
			env, ctx := newEnv(t)
			start := time.Now()
			must(t, buildDualStack(ctx, env, underlay == "IPv6"))
			report(t, "dual-stack mesh over the %s underlay built and converged in %v", underlay, time.Since(start).Round(time.Millisecond))
			checkDualStack(t, ctx, env, underlay)
		})
	}
}

// buildDualStack is env.Build(harness.DualStack()), with the nodes'
// endpoints on their IPv6 underlay addresses when v6 is set (the
// force-endpoint a user would set), before any meshlet starts.
func buildDualStack(ctx context.Context, env *harness.Env, v6 bool) error {
	l := harness.DualStack()
	var clusters []*harness.Cluster
	for _, cl := range l.Clusters {
		c, err := env.AddCluster(ctx, cl.ClusterSpec)
		if err != nil {
			return err
		}
		clusters = append(clusters, c)
	}
	if err := env.ApplyMesh(ctx, "mesh", clusters...); err != nil {
		return err
	}
	var nodes []*harness.Node
	for i, cl := range l.Clusters {
		for _, spec := range cl.Nodes {
			n, err := clusters[i].AddNode(ctx, spec)
			if err != nil {
				return err
			}
			if v6 {
				ep := netip.AddrPortFrom(n.IP6.Addr(), 51820).String()
				if err := n.Cluster.PatchNodeAnnotations(ctx, n.Name, map[string]*string{topology.AnnotationForceEndpoint: &ep}); err != nil {
					return err
				}
			}
			nodes = append(nodes, n)
		}
	}
	if err := harness.StartAll(ctx, nodes...); err != nil {
		return err
	}
	return env.WaitConverged(ctx, 60*time.Second)
}

func checkDualStack(t *testing.T, ctx context.Context, env *harness.Env, underlay string) {
	nodes := env.Nodes()
	reachAll(t, ctx, nodes, 60*time.Second)

	// The leaders: kilo0 carries a WireGuard IP of each family, each
	// other leader's peer both families' pod CIDRs, and the endpoints are
	// of the underlay's family.
	var leaders []*harness.Node
	byLoc := map[string][]*harness.Node{}
	for _, n := range nodes {
		byLoc[n.Cluster.Name+"/"+n.Location] = append(byLoc[n.Cluster.Name+"/"+n.Location], n)
	}
	for _, ns := range byLoc {
		leaders = append(leaders, leaderOf(t, ctx, ns...))
	}
	sort.Slice(leaders, func(i, j int) bool { return leaders[i].Name < leaders[j].Name })
	keys := map[string]*harness.Node{}
	for _, l := range leaders {
		k, err := l.PublicKey(ctx)
		must(t, err)
		keys[k] = l
		ann, err := l.Cluster.Annotations(ctx, l.Name)
		must(t, err)
		if ann[topology.AnnotationDualStackWireGuardIP] == "" || ann[topology.AnnotationDualStackInternalIP] != l.IP6.String() {
			t.Errorf("leader %s publishes dual-stack-wireguard-ip %q, dual-stack-internal-ip %q (want %s)", l.Name,
				ann[topology.AnnotationDualStackWireGuardIP], ann[topology.AnnotationDualStackInternalIP], l.IP6)
		}
		out, err := l.Exec(ctx, "ip", "-6", "addr", "show", "dev", harness.Iface)
		must(t, err)
		if wg6 := ann[topology.AnnotationDualStackWireGuardIP]; wg6 == "" || !strings.Contains(out, wg6) {
			t.Errorf("leader %s: kilo0 lacks its IPv6 WireGuard IP %q:\n%s", l.Name, wg6, out)
		}
		// What an operator sees: meshlet status names both WireGuard IPs,
		// the metrics count routes of both families.
		out, err = l.Exec(ctx, os.Getenv("MESHLET_BIN"), "status")
		must(t, err)
		if wg6 := ann[topology.AnnotationDualStackWireGuardIP]; !strings.Contains(out, " and "+wg6) || !strings.Contains(out, " and "+l.IP6.String()) {
			t.Errorf("leader %s: meshlet status names neither its IPv6 WireGuard IP %s nor its IPv6 private IP %s:\n%s", l.Name, wg6, l.IP6, out)
		}
	}
	for _, n := range nodes {
		m, err := n.Metrics(ctx)
		must(t, err)
		v4, _ := m.Value("meshlet_routes", "family", "ipv4")
		v6, _ := m.Value("meshlet_routes", "family", "ipv6")
		if v4 == 0 || v6 == 0 {
			t.Errorf("%s: meshlet_routes ipv4 %v, ipv6 %v: want routes of both families", n.Name, v4, v6)
		}
	}
	for _, l := range leaders {
		dev, err := l.Device()
		must(t, err)
		for k, p := range dev.Peers {
			o := keys[k]
			if o == nil {
				continue
			}
			for _, n := range byLoc[o.Cluster.Name+"/"+o.Location] {
				if !contains(p.AllowedIPs, n.PodCIDR6.String()) || !contains(p.AllowedIPs, n.PodCIDR.String()) {
					t.Errorf("leader %s: peer %s lacks %s's pod CIDRs %s, %s: %v", l.Name, o.Name, n.Name, n.PodCIDR, n.PodCIDR6, p.AllowedIPs)
				}
			}
			if ep, err := netip.ParseAddrPort(p.Endpoint); err != nil || ep.Addr().Is6() != (underlay == "IPv6") {
				t.Errorf("leader %s: peer %s at %q, want an %s endpoint", l.Name, o.Name, p.Endpoint, underlay)
			}
		}
	}

	// A one-peer change: a Peer of both families on cluster-a.
	a := env.Cluster("cluster-a")
	var aLeaders []*harness.Node
	for _, l := range leaders {
		if l.Cluster == a {
			aLeaders = append(aLeaders, l)
		}
	}
	before := leaderHandshakes(ctx, t, leaders, true)
	dp := harness.WatchDataPlane(ctx, 100*time.Millisecond, leaders...)
	_, key := harness.NewKeyPair()
	must(t, a.Apply(ctx, fmt.Sprintf(`{"apiVersion":"kilo.squat.ai/v1alpha1","kind":"Peer","metadata":{"name":"laptop"},
"spec":{"allowedIPs":["10.1.240.1/32","fd10:1:0:f0::1/128"],"publicKey":%q,"persistentKeepalive":25}}`, key)))
	changed := time.Now()
	for _, l := range aLeaders {
		awaitPeer(t, ctx, l, key, true)
		must(t, harness.Poll(ctx, 30*time.Second, 50*time.Millisecond, l.Name+" routes the Peer's IPv6", func() (bool, error) {
			rs, err := l.Routes(ctx)
			return slices.ContainsFunc(rs, func(r string) bool { return strings.HasPrefix(r, "fd10:1:0:f0::1 dev kilo0") }), err
		}))
	}
	took := time.Since(changed)
	reachAll(t, ctx, nodes, 10*time.Second)
	res := dp.Stop(nil)
	after := leaderHandshakes(ctx, t, leaders, false)
	kept := 0
	for k, h := range before {
		if after[k] != h {
			t.Errorf("%s: session re-created by a one-peer change (handshake %s, then %s)", k, h.Format(time.StampMilli), after[k].Format(time.StampMilli))
			continue
		}
		kept++
	}
	report(t, "a Peer of both families on every cluster-a leader in %v; the other %d of %d sessions kept their handshake after traffic in both families; %d data plane items removed in %d samples",
		took.Round(time.Millisecond), kept, len(before), len(res.Removed), res.Samples)
	if len(res.Removed) > 0 {
		t.Errorf("removed from the data plane: %s", strings.Join(res.Removed, "; "))
	}
}

// leaderHandshakes is every leader's last handshake with each peer that
// had one, once settled (settledHandshakes) when settle is set.
func leaderHandshakes(ctx context.Context, t *testing.T, leaders []*harness.Node, settle bool) map[string]time.Time {
	t.Helper()
	out := map[string]time.Time{}
	for _, l := range leaders {
		hs := handshakes(t, l)
		if settle {
			hs = settledHandshakes(ctx, t, l)
		}
		for k, at := range hs {
			if !at.IsZero() {
				out[l.Name+" → "+k] = at
			}
		}
	}
	return out
}

// reachAll waits until every node's pod answers every other node's pod, in
// both families.
func reachAll(t *testing.T, ctx context.Context, nodes []*harness.Node, timeout time.Duration) {
	t.Helper()
	start := time.Now()
	var mu sync.Mutex
	var failed []string
	var wg sync.WaitGroup
	pairs := 0
	for _, x := range nodes {
		for _, y := range nodes {
			if x == y {
				continue
			}
			for _, dst := range []netip.Addr{y.PodIP, y.PodIP6} {
				pairs++
				wg.Add(1)
				go func() {
					defer wg.Done()
					if _, err := x.WaitReachable(ctx, dst, timeout); err != nil {
						mu.Lock()
						failed = append(failed, fmt.Sprintf("%s→%s(%s)", x.Name, y.Name, dst))
						mu.Unlock()
					}
				}()
			}
		}
	}
	wg.Wait()
	if len(failed) > 0 {
		sort.Strings(failed)
		t.Fatalf("%d of %d pod pairs unreachable: %s", len(failed), pairs, strings.Join(failed, " "))
	}
	report(t, "%d/%d pod pairs (IPv4 and IPv6, across locations and clusters) answer, within %v", pairs, pairs, time.Since(start).Round(time.Millisecond))
}
