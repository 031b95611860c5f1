package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshlet/meshlet/agent/core/diagnose"
	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/e2e/harness"
	"github.com/meshlet/meshlet/netlinkx"
)

// Scenario: a dual-stack mesh (docs/dual-stack.md) — two clusters, three
// locations, IPv4 and IPv6 pod CIDRs on every node, meshlet with
// --dual-stack-subnet. Every pod reaches every other pod in both families,
// across locations and clusters, through the leaders (non-leaders send
// IPv6 to their leader on the underlay: IPIP carries IPv4 alone). Then a
// Peer with allowed IPs of both families is added: only that peer and its
// routes change on the leaders, every other session keeps its handshake.
// Run with WireGuard over the IPv4 underlay (the nodes' discovered
// endpoints), over the IPv6 underlay (force-endpoint on each node's IPv6
// address), and with cluster-b behind a NAT router for IPv4 while its IPv6
// is routed (its keepalive in the ClusterMesh, as for any NATed cluster).
func TestDualStackMesh(t *testing.T) {
	for _, underlay := range []string{"IPv4", "IPv6", "IPv4-NAT"} {
		t.Run(underlay+"-underlay", func(t *testing.T) {
			env, ctx := newEnv(t)
			start := time.Now()
			must(t, buildDualStack(ctx, env, underlay))
			report(t, "dual-stack mesh over the %s underlay built and converged in %v", underlay, time.Since(start).Round(time.Millisecond))
			checkDualStack(t, ctx, env, underlay)
		})
	}
}

// buildDualStack is env.Build(harness.DualStack()), with the nodes'
// endpoints on their IPv6 underlay addresses for the IPv6 underlay (the
// force-endpoint a user would set), or cluster-b behind a NAT router for
// IPv4-NAT, before any meshlet starts.
func buildDualStack(ctx context.Context, env *harness.Env, underlay string) error {
	l := harness.DualStack()
	if underlay == "IPv4-NAT" {
		r, err := env.AddRouter(ctx, "r1")
		if err != nil {
			return err
		}
		l.Clusters[1].Keepalive = 1
		for i := range l.Clusters[1].Nodes {
			l.Clusters[1].Nodes[i].Behind = r
		}
	}
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
			if underlay == "IPv6" {
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
	if underlay == "IPv4-NAT" {
		// IPv6 is routed: the nodes behind the router answer on their own
		// IPv6 addresses, from the hub, outside the mesh.
		x1 := env.Node("a-x1")
		for _, n := range nodes {
			if n.Behind != nil {
				if out, err := x1.Exec(ctx, "ping", "-n", "-c", "1", "-W", "2", n.IP6.Addr().String()); err != nil {
					t.Errorf("a-x1 → %s's routed IPv6 %s on the underlay: %v\n%s", n.Name, n.IP6.Addr(), err, out)
				}
			}
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
			ep, err := netip.ParseAddrPort(p.Endpoint)
			if err != nil || ep.Addr().Is6() != (underlay == "IPv6") {
				t.Errorf("leader %s: peer %s at %q, want an %s endpoint", l.Name, o.Name, p.Endpoint, underlay)
			}
			if natted := o.Behind != nil; natted && (l.Behind != nil || ep.Addr() != o.Behind.WAN.Addr()) {
				t.Errorf("leader %s: peer %s at %q, want its router's address %s (IPv4 NAT)", l.Name, o.Name, p.Endpoint, o.Behind.WAN.Addr())
			}
		}
	}

	// A one-peer change: a laptop of both families joins cluster-a as a
	// Peer without endpoint (it roams), through location x's leader, over
	// the underlay's family.
	a := env.Cluster("cluster-a")
	var aLeaders []*harness.Node
	for _, l := range leaders {
		if l.Cluster == a {
			aLeaders = append(aLeaders, l)
		}
	}
	x := byLoc["cluster-a/x"]
	x1 := leaderOf(t, ctx, x...)
	x2 := x[0]
	if x2 == x1 {
		x2 = x[1]
	}
	before := leaderHandshakes(ctx, t, leaders, true)
	dp := harness.WatchDataPlane(ctx, 100*time.Millisecond, leaders...)
	// Pod to pod across the clusters, in both families, 10 times a second
	// while the change lands.
	zs := byLoc["cluster-b/z"]
	far := zs[len(zs)-1]
	var pingers []*harness.Pinger
	for _, dst := range far.PodIPs() {
		p, err := x2.StartPinger(ctx, dst, 100*time.Millisecond)
		must(t, err)
		must(t, harness.Poll(ctx, 10*time.Second, 50*time.Millisecond, "pings a-x2 → "+dst.String()+" answered", func() (bool, error) {
			return p.Replied(time.Now().Add(-time.Second)), nil
		}))
		pingers = append(pingers, p)
	}
	laptop, err := env.AddPeerHost(ctx, "laptop", netip.MustParseAddr("10.1.240.1"), netip.MustParseAddr("fd10:1:0:f0::1"))
	must(t, err)
	must(t, a.Apply(ctx, fmt.Sprintf(`{"apiVersion":"kilo.squat.ai/v1alpha1","kind":"Peer","metadata":{"name":"laptop"},
"spec":{"allowedIPs":["10.1.240.1/32","fd10:1:0:f0::1/128"],"publicKey":%q,"persistentKeepalive":25}}`, laptop.Public)))
	changed := time.Now()
	for _, l := range aLeaders {
		awaitPeer(t, ctx, l, laptop.Public, true)
		must(t, harness.Poll(ctx, 30*time.Second, 50*time.Millisecond, l.Name+" routes the Peer's IPv6", func() (bool, error) {
			rs, err := l.Routes(ctx)
			return slices.ContainsFunc(rs, func(r string) bool { return strings.HasPrefix(r, "fd10:1:0:f0::1 dev kilo0") }), err
		}))
	}
	took := time.Since(changed)
	// NAT per family: traffic from the Peer is masqueraded except to the
	// mesh, in ip6tables as in iptables (the chain exists for a Peer).
	for _, l := range aLeaders {
		must(t, harness.Poll(ctx, 10*time.Second, 50*time.Millisecond, l.Name+"'s IPv6 NAT for the Peer", func() (bool, error) {
			chain, err := l.Exec(ctx, "ip6tables", "-t", "nat", "-S", netlinkx.ChainNAT)
			if err != nil {
				return false, err
			}
			jumps, err := l.Exec(ctx, "ip6tables", "-t", "nat", "-S", "POSTROUTING")
			return strings.Contains(chain, "-d "+l.PodCIDR6.String()+" -j RETURN") && strings.Contains(jumps, "-s fd10:1:0:f0::1/128 -j "+netlinkx.ChainNAT),
				fmt.Errorf("%v:\n%s\n%s", err, chain, jumps)
		}))
	}
	x1Key, err := x1.PublicKey(ctx)
	must(t, err)
	ep := netip.AddrPortFrom(x1.IP.Addr(), 51820)
	if underlay == "IPv6" {
		ep = netip.AddrPortFrom(x1.IP6.Addr(), 51820)
	}
	must(t, laptop.SetPeer(ctx, x1Key, ep.String(), []netip.Prefix{a.PodNet, a.PodNet6}))
	laptopReaches(t, ctx, laptop, x2)
	if underlay == "IPv6" {
		// The laptop changes networks: x1 follows it to its new address.
		to := netip.PrefixFrom(netip.MustParseAddr("fd00:99::f0:1"), 64)
		must(t, laptop.MoveIPv6(ctx, to))
		laptopReaches(t, ctx, laptop, x2)
		must(t, harness.Poll(ctx, 10*time.Second, 50*time.Millisecond, "a-x1 follows the laptop to "+to.Addr().String(), func() (bool, error) {
			d, err := x1.Device()
			if err != nil || d == nil {
				return false, err
			}
			return d.Peers[laptop.Public].Endpoint == netip.AddrPortFrom(to.Addr(), 51820).String(), nil
		}))
		report(t, "the laptop roamed to %s: a-x1's device follows it, its pods answer in both families", to.Addr())
	}
	reachAll(t, ctx, nodes, 10*time.Second)
	res := dp.Stop(nil)
	for i, p := range pingers {
		tl := p.Stop()
		report(t, "pod to pod a-x2 → %s %s under the change: %d of %d pings lost, longest gap %v", far.Name, far.PodIPs()[i], tl.Lost, tl.Sent,
			tl.LongestGap().Round(10*time.Millisecond))
		if tl.Lost > 1 {
			t.Errorf("a-x2 → %s %s: %d of %d pings lost under a one-peer change", far.Name, far.PodIPs()[i], tl.Lost, tl.Sent)
		}
	}
	after := leaderHandshakes(ctx, t, leaders, false)
	kept := 0
	for k, h := range before {
		if after[k] != h {
			t.Errorf("%s: session re-created by a one-peer change (handshake %s, then %s)", k, h.Format(time.StampMilli), after[k].Format(time.StampMilli))
			continue
		}
		kept++
	}
	report(t, "a laptop Peer of both families on every cluster-a leader in %v, reached through a-x1; the other %d of %d sessions kept their handshake after traffic in both families; %d data plane items removed in %d samples",
		took.Round(time.Millisecond), kept, len(before), len(res.Removed), res.Samples)
	if len(res.Removed) > 0 {
		t.Errorf("removed from the data plane: %s", strings.Join(res.Removed, "; "))
	}
}

// laptopReaches checks the laptop and n's pod reach each other in both
// families (through n's leader).
func laptopReaches(t *testing.T, ctx context.Context, laptop *harness.PeerHost, n *harness.Node) {
	t.Helper()
	for _, dst := range n.PodIPs() {
		must(t, harness.Poll(ctx, 20*time.Second, 0, "laptop → "+n.Name+" "+dst.String(), func() (bool, error) {
			return laptop.Reachable(ctx, dst, 500*time.Millisecond), nil
		}))
	}
	for _, a := range laptop.Addrs {
		_, err := n.WaitReachable(ctx, a, 10*time.Second)
		must(t, err)
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
// every family the nodes have.
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
			for _, dst := range y.PodIPs() {
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
	report(t, "%d/%d pod pairs (every family, across locations and clusters) answer, within %v", pairs, pairs, time.Since(start).Round(time.Millisecond))
}

// Scenario: an IPv6-only mesh (docs/dual-stack.md#ipv6-only) — the same two
// clusters with no IPv4 anywhere: IPv6 pod CIDRs, underlay, endpoints and
// --subnet. Every pod reaches every other pod across locations and
// clusters; a Peer added keeps the other sessions.
func TestIPv6OnlyMesh(t *testing.T) {
	env, ctx := newEnv(t)
	start := time.Now()
	must(t, env.Build(ctx, harness.IPv6Only()))
	report(t, "IPv6-only mesh built and converged in %v", time.Since(start).Round(time.Millisecond))
	nodes := env.Nodes()
	reachAll(t, ctx, nodes, 60*time.Second)
	var leaders []*harness.Node
	for _, n := range nodes {
		ann, err := n.Cluster.Annotations(ctx, n.Name)
		must(t, err)
		for _, k := range []string{topology.AnnotationInternalIP, topology.AnnotationEndpoint, topology.AnnotationWireGuardIP} {
			if v := ann[k]; strings.Contains(v, ".") {
				t.Errorf("%s publishes %s %q: IPv4 in an IPv6-only mesh", n.Name, k, v)
			}
		}
		if ann[topology.AnnotationWireGuardIP] != "" {
			leaders = append(leaders, n)
		}
		out, err := n.Exec(ctx, "ip", "-4", "route", "show", "table", "all", "proto", harness.RouteProtocol)
		must(t, err)
		if strings.TrimSpace(out) != "" {
			t.Errorf("%s has IPv4 routes of meshlet's:\n%s", n.Name, out)
		}
	}
	before := leaderHandshakes(ctx, t, leaders, true)
	_, key := harness.NewKeyPair()
	a := env.Cluster("cluster-a")
	must(t, a.Apply(ctx, fmt.Sprintf(`{"apiVersion":"kilo.squat.ai/v1alpha1","kind":"Peer","metadata":{"name":"laptop"},
"spec":{"allowedIPs":["fd10:1:0:f0::1/128"],"publicKey":%q,"endpoint":{"dnsOrIP":{"ip":"2001:db8::7"},"port":51820},"persistentKeepalive":25}}`, key)))
	for _, l := range leaders {
		if l.Cluster == a {
			awaitPeer(t, ctx, l, key, true)
		}
	}
	reachAll(t, ctx, nodes, 10*time.Second)
	after := leaderHandshakes(ctx, t, leaders, false)
	for k, h := range before {
		if after[k] != h {
			t.Errorf("%s: session re-created by a one-peer change", k)
		}
	}
	report(t, "a Peer with an IPv6 endpoint added on cluster-a's leaders: the other %d sessions kept their handshake", len(before))
}

// Scenario: a dual-stack cluster where location y runs kg (the stand-in,
// which plans one family, as kg 0.7). The IPv4 mesh is whole; IPv6 flows
// between the meshlet-led locations; the kg-led segment carries IPv4 alone:
// meshlet's leaders leave its IPv6 out of its peer, the plan rejects it as
// SingleFamily (an Event on the kg node) and meshlet diagnose names it.
func TestDualStackBesideKg(t *testing.T) {
	env, ctx := newEnv(t)
	l := harness.DualStack()
	l.NoMesh = true
	l.Clusters = l.Clusters[:1]
	l.Clusters[0].Nodes = []harness.NodeSpec{{Name: "a-x1", Location: "x"}, {Name: "a-x2", Location: "x"}, {Name: "a-z1", Location: "z"}}
	must(t, env.Build(ctx, l))
	a := env.Cluster("cluster-a")
	kg, err := a.AddKgNode(ctx, "a-y1", "y")
	must(t, err)
	x1, x2, z1 := env.Node("a-x1"), env.Node("a-x2"), env.Node("a-z1")
	meshletNodes := []*harness.Node{x1, x2, z1}
	for _, n := range meshletNodes {
		_, err := n.WaitReachable(ctx, kg.PodIP, 30*time.Second)
		must(t, err)
		_, err = kg.WaitReachable(ctx, n.PodIP, 30*time.Second)
		must(t, err)
	}
	must(t, kg.Err())
	reachAll(t, ctx, meshletNodes, 30*time.Second)

	kgKey := kg.Key()
	for _, l := range []*harness.Node{x1, z1} {
		must(t, harness.Poll(ctx, 30*time.Second, 50*time.Millisecond, l.Name+"'s peer for the kg segment", func() (bool, error) {
			d, err := l.Device()
			if err != nil || d == nil {
				return false, err
			}
			p, ok := d.Peers[kgKey]
			if !ok {
				return false, fmt.Errorf("no peer for a-y1")
			}
			if !contains(p.AllowedIPs, kg.PodCIDR.String()) {
				return false, fmt.Errorf("peer a-y1 lacks its IPv4 pod CIDR: %v", p.AllowedIPs)
			}
			for _, ip := range p.AllowedIPs {
				if strings.Contains(ip, ":") {
					return false, fmt.Errorf("peer a-y1 carries IPv6 %s: %v", ip, p.AllowedIPs)
				}
			}
			return true, nil
		}))
	}
	_, err = awaitEvents(t, ctx, a, 30*time.Second, "SingleFamily on the kg leader", []eventWant{{kind: "Node", name: "a-y1",
		reasons: []string{string(topology.ReasonSingleFamily)}, mentions: "led by kg"}})
	must(t, err)
	out, err := exec.CommandContext(ctx, os.Getenv("MESHLET_BIN"), "diagnose", "--kubeconfig", a.AdminKubeconfig(), "--namespace", harness.Namespace,
		"--cluster-name", a.Name, "--subnet", a.WGSubnet.String(), "--dual-stack-subnet", a.WGSubnet6.String(), "--agents=false", "-o", "json").Output()
	if len(out) == 0 {
		t.Fatalf("meshlet diagnose: %v", err)
	}
	var fs []diagnose.Finding
	must(t, json.Unmarshal(out, &fs))
	if !slices.ContainsFunc(fs, func(f diagnose.Finding) bool {
		return f.ID == diagnose.IDSingleFamilySegment && f.Subject == "node a-y1"
	}) {
		t.Errorf("meshlet diagnose does not name the kg-led segment (%s):\n%s", diagnose.IDSingleFamilySegment, out)
	}
	report(t, "dual-stack cluster with a kg-led location: IPv4 between every node and kg's, %d meshlet pod pairs in both families; the kg segment's peer carries IPv4 alone, SingleFamily Event on a-y1, diagnose names %s",
		len(meshletNodes)*(len(meshletNodes)-1)*2, diagnose.IDSingleFamilySegment)
}
