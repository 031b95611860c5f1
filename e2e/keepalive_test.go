package e2e

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/e2e/harness"
)

// Scenario 2: per-peer keepalive from a Kilo Peer object, behind NAT. The
// node a-n1 sits behind a NAT router; a laptop (a Kilo Peer) outside can
// reach the node's pods only while the NAT mapping lives. With
// persistentKeepalive 0 (the control) a forgotten mapping leaves the laptop
// cut off; with persistentKeepalive 1 the node's keepalives restore it.
// The node has no persistent-keepalive annotation: the value on the device
// comes from the Peer object.
func TestPeerKeepaliveBehindNAT(t *testing.T) {
	env, ctx := newEnv(t)
	r, err := env.AddRouter(ctx, "r1")
	must(t, err)
	laptop, err := env.AddPeerHost(ctx, "laptop", netip.MustParseAddr("10.9.0.1"))
	must(t, err)
	l := harness.Small(0)
	l.NoMesh = true
	l.Clusters = l.Clusters[:1]
	l.Clusters[0].Nodes = []harness.NodeSpec{{Name: "a-n1", Location: "n", Behind: r}}
	must(t, env.Build(ctx, l))
	n1 := env.Node("a-n1")
	a := n1.Cluster
	ann, err := a.Annotations(ctx, n1.Name)
	must(t, err)
	if v, ok := ann[topology.AnnotationPersistentKeepalive]; ok {
		t.Fatalf("a-n1 has persistent-keepalive %q; the test needs it absent", v)
	}
	nKey, err := n1.PublicKey(ctx)
	must(t, err)
	// The laptop's side, as `kgctl showconf peer` would give it: the node
	// as its peer, no endpoint (the node is behind NAT), cluster-a's pods
	// through the tunnel.
	must(t, laptop.SetPeer(ctx, nKey, "", []netip.Prefix{a.PodNet}))

	peer := func(keepalive int) string {
		return fmt.Sprintf(`{"apiVersion":"kilo.squat.ai/v1alpha1","kind":"Peer","metadata":{"name":"laptop"},
"spec":{"allowedIPs":["%s/32"],"publicKey":"%s","endpoint":{"dnsOrIP":{"ip":"%s"},"port":51820},"persistentKeepalive":%d}}`,
			laptop.Addr, laptop.Public, laptop.IP.Addr(), keepalive)
	}
	deviceKeepalive := func(want int) {
		t.Helper()
		must(t, harness.Poll(ctx, 15*time.Second, 20*time.Millisecond, fmt.Sprintf("laptop peer with keepalive %d on a-n1", want), func() (bool, error) {
			d, err := n1.Device()
			if err != nil || d == nil {
				return false, err
			}
			p, ok := d.Peers[laptop.Public]
			return ok && p.Keepalive == want, fmt.Errorf("%+v", p)
		}))
		m, err := n1.Metrics(ctx)
		must(t, err)
		if v, ok := m.Value("meshlet_peer_persistent_keepalive_seconds", "kind", "peer"); want > 0 && (!ok || v != float64(want)) {
			t.Errorf("meshlet_peer_persistent_keepalive_seconds{kind=peer} = %v (%v), want %d", v, ok, want)
		}
	}
	// laptopReaches flushes the router's NAT mappings (as if they idled
	// out), waits until the node had the chance to send keepalives (one
	// keepalive interval + margin, the router's UDP timeout is 2 s), and
	// pings the node's pod from the laptop.
	laptopReaches := func() (bool, string) {
		must(t, r.FlushUDP(ctx))
		pace(ctx, 1500*time.Millisecond)
		mappings := r.UDPMappings(ctx)
		// Two tries: one lost echo must not decide the case.
		for try := 0; try < 2; try++ {
			if laptop.Reachable(ctx, n1.PodIP, time.Second) {
				return true, mappings
			}
		}
		return false, mappings
	}

	// Control: keepalive 0. One ping from the node teaches the laptop the
	// node's NAT address; then the mapping is forgotten.
	must(t, a.Apply(ctx, peer(0)))
	deviceKeepalive(0)
	_, err = n1.WaitReachable(ctx, laptop.Addr, 20*time.Second)
	must(t, err)
	start := time.Now()
	// WireGuard itself sends one passive keepalive 10 s after the last data
	// it received (the ping above), which can fall into one flush-and-ping
	// window and renew the mapping once; a keepalive interval renews it in
	// every window. So the control passes when any of three windows finds
	// the mapping gone, and fails only when every one finds it renewed.
	var reached0 bool
	var map0 string
	for try := 0; try < 3; try++ {
		if reached0, map0 = laptopReaches(); !reached0 {
			break
		}
		t.Logf("control (keepalive 0), window %d: the mapping was renewed (WireGuard's passive keepalive?); router mappings:\n%s", try+1, map0)
	}
	if reached0 {
		t.Errorf("control (keepalive 0): the laptop reached a-n1's pod after each of 3 NAT flushes; router mappings:\n%s", map0)
	}
	if time.Since(start) > 8*time.Second {
		t.Logf("control took %v: WireGuard's passive keepalive (10 s) may have refreshed the mapping", time.Since(start))
	}

	// keepalive 1 from the Peer object.
	must(t, a.Apply(ctx, peer(1)))
	deviceKeepalive(1)
	// The keepalives alone (no traffic from the node) teach the laptop
	// where the node is.
	must(t, harness.Poll(ctx, 15*time.Second, 50*time.Millisecond, "laptop learned the node's NAT address", func() (bool, error) {
		d, err := laptop.Device()
		if err != nil {
			return false, err
		}
		return d.Peers[nKey].EndpointAddr().Addr() == r.WAN.Addr(), nil
	}))
	reached1, map1 := laptopReaches()
	if !reached1 {
		t.Errorf("keepalive 1: the laptop could not reach a-n1's pod after the NAT mapping was flushed; router mappings:\n%s", map1)
	}
	report(t, "Peer keepalive 0 (control): laptop→a-n1 pod after NAT flush: reachable=%v; Peer keepalive 1: reachable=%v (device keepalive from the Peer object, node annotation absent; router mappings after flush: %d)",
		reached0, reached1, len(strings.Split(strings.TrimSpace(map1), "\n")))
}
