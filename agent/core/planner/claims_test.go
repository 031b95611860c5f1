package planner

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/meshlet/meshlet/agent/core/topology"
)

// TestLocalInputBounded: every row of the local writers' table in
// docs/security.md#claims, planned on every node of a two-cluster mesh
// (twoClusters): the hostile claim is refused with its reason on the
// writer's object, on every node, and nothing else changes — every node's
// plan without the hostile input's own claims is what it was.
func TestLocalInputBounded(t *testing.T) {
	peer := func(name string, k int, created time.Duration, ips ...string) topology.Peer {
		return topology.Peer{Name: name, PublicKey: key(k), AllowedIPs: pfxs(ips...), Created: now.Add(created)}
	}
	withPeers := func(ps ...topology.Peer) func(*topology.Snapshot) {
		return func(s *topology.Snapshot) { s.Peers = append(s.Peers, ps...) }
	}
	onNode := func(name string, f func(*topology.Node)) func(*topology.Snapshot) {
		return func(s *topology.Snapshot) {
			for i := range s.Nodes {
				if s.Nodes[i].Name == name {
					f(&s.Nodes[i])
				}
			}
		}
	}
	alip := func(name string, ips ...string) func(*topology.Snapshot) {
		return onNode(name, func(n *topology.Node) { n.AllowedLocationIPs = pfxs(ips...) })
	}
	laptop := peer("laptop", 90, -time.Hour, "10.5.0.0/24")
	// Every node reports its private IP in status.addresses, as a kubelet
	// does.
	reported := func(s *topology.Snapshot) {
		for i := range s.Nodes {
			if n := &s.Nodes[i]; n.InternalIP.IsValid() {
				n.ReportedIPs = []netip.Addr{n.InternalIP.Addr()}
			}
		}
	}
	for _, tc := range []struct {
		name    string
		hostile func(*topology.Snapshot)
		// baseline is the snapshot as if the writer had not written the
		// refused claim (nil: the snapshot without the hostile input).
		baseline func(*topology.Snapshot)
		// ignore: the writer's own address in the baseline, which the
		// refusal leaves unrouted (no input can say so).
		ignore []string
		object string
		reason topology.Reason
		// notRouted: destinations no node routes through the mesh
		// (through kilo0 or to its leader) after the hostile input.
		notRouted []string
	}{
		{name: "a node's allowed-location-ips 0.0.0.0/0", hostile: alip("c-1", "0.0.0.0/0"), baseline: alip("c-1"),
			object: "Node/c-1", reason: topology.ReasonDefaultRoute, notRouted: []string{"0.0.0.0/0"}},
		{name: "a node's allowed-location-ips ::/0", hostile: alip("c-1", "::/0"), baseline: alip("c-1"),
			object: "Node/c-1", reason: topology.ReasonDefaultRoute, notRouted: []string{"::/0"}},
		{name: "a node's allowed-location-ips 0.0.0.0/1 and 128.0.0.0/1", hostile: alip("c-1", "0.0.0.0/1", "128.0.0.0/1"), baseline: alip("c-1"),
			object: "Node/c-1", reason: topology.ReasonTooBroad, notRouted: []string{"0.0.0.0/1", "128.0.0.0/1"}},
		{name: "a node's internal-ip is another location's node's address",
			hostile: onNode("c-1", func(n *topology.Node) { n.InternalIP = pfx("10.0.2.1/24") }),
			// c-1's own address is no longer routed to it; b-1 keeps its own.
			baseline: onNode("c-1", func(n *topology.Node) { n.InternalIP = pfx("192.0.2.1/24") }), ignore: []string{"192.0.2.1/32"},
			object: "Node/c-1", reason: topology.ReasonDuplicatePrivateIP},
		{name: "a node's allowed-location-ips in another location's LAN", hostile: alip("c-1", "10.0.1.0/25"), baseline: alip("c-1"),
			object: "Node/c-1", reason: topology.ReasonNetworksOverlap, notRouted: []string{"10.0.1.0/25"}},
		{name: "a Peer with 0.0.0.0/0", hostile: withPeers(peer("exit", 91, 0, "0.0.0.0/0", "10.6.0.0/24")),
			object: "Peer/exit", reason: topology.ReasonDefaultRoute, notRouted: []string{"0.0.0.0/0"}},
		{name: "a Peer with the /1 pair", hostile: withPeers(peer("exit", 91, 0, "0.0.0.0/1", "128.0.0.0/1")),
			object: "Peer/exit", reason: topology.ReasonTooBroad, notRouted: []string{"0.0.0.0/1", "128.0.0.0/1"}},
		{name: "a Peer with ::/0", hostile: withPeers(peer("exit", 91, 0, "::/0")),
			object: "Peer/exit", reason: topology.ReasonDefaultRoute, notRouted: []string{"::/0"}},
		{name: "a Peer with a /25 inside a node's pod CIDR", hostile: withPeers(peer("thief", 91, 0, "10.244.5.128/25")),
			object: "Peer/thief", reason: topology.ReasonDuplicateAllowedIP, notRouted: []string{"10.244.5.128/25"}},
		{name: "a Peer with a /32 inside an older Peer's /24", hostile: withPeers(peer("thief", 91, 0, "10.5.0.7/32")),
			object: "Peer/thief", reason: topology.ReasonDuplicateAllowedIP, notRouted: []string{"10.5.0.7/32"}},
		{name: "a newer Peer with an older Peer's exact prefix and a name that sorts first", hostile: withPeers(peer("aaa", 91, 0, "10.5.0.0/24")),
			object: "Peer/aaa", reason: topology.ReasonDuplicateAllowedIP},
		{name: "a Peer claiming a remote cluster's network", hostile: withPeers(peer("thief", 91, 0, "10.2.0.0/16")),
			object: "Peer/thief", reason: topology.ReasonDuplicateAllowedIP},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clean := twoClusters()
			clean.Peers = []topology.Peer{laptop}
			reported(&clean)
			bad := twoClusters()
			bad.Peers = []topology.Peer{laptop}
			reported(&bad)
			tc.hostile(&bad)
			if tc.baseline != nil {
				tc.baseline(&clean)
			}
			for _, n := range clean.Nodes {
				if n.Name == "c-1" && (tc.object == "Node/c-1") {
					continue // the writer itself: its own plan may change
				}
				want := Compute(clean, selfOf(n, "eth0"))
				got := Compute(bad, selfOf(n, "eth0"))
				if !hasRejection(got, tc.object, tc.reason) {
					t.Errorf("%s: no %s on %s: %+v", n.Name, tc.reason, tc.object, got.Rejections)
				}
				for _, d := range tc.notRouted {
					if r, ok := routeTo(got, d, 0); ok {
						t.Errorf("%s routes %s: %+v", n.Name, d, r)
					}
					for _, p := range got.WireGuard.Peers {
						if slices.Contains(p.AllowedIPs, pfx(d)) {
							t.Errorf("%s: peer %s carries %s", n.Name, p.Name, d)
						}
					}
				}
				// Nothing else changed: the same peers with the same allowed
				// IPs (the hostile Peer's kept prefixes aside), the same routes.
				if g, w := deviceView(got, tc.object, tc.ignore), deviceView(want, "", tc.ignore); !slices.Equal(g, w) {
					t.Errorf("%s: device changed:\n got %q\nwant %q", n.Name, g, w)
				}
				if g, w := routesView(got, bad, tc.ignore), routesView(want, bad, tc.ignore); !slices.Equal(g, w) {
					t.Errorf("%s: routes changed:\n got %q\nwant %q", n.Name, g, w)
				}
				if len(want.Remotes) != len(got.Remotes) || len(got.Remotes) > 0 && !slices.Equal(got.Remotes[0].AllowedNetworks, want.Remotes[0].AllowedNetworks) {
					t.Errorf("%s: remote clusters changed: %+v", n.Name, got.Remotes)
				}
			}
		})
	}
}

// deviceView is the plan's WireGuard peers as strings, without the peer of
// Peer object skip ("Peer/name") and the prefixes ignored.
func deviceView(pl topology.Plan, skip string, ignore []string) []string {
	var out []string
	for _, p := range pl.WireGuard.Peers {
		if p.Kind == topology.KindPeer && "Peer/"+p.Name == skip {
			continue
		}
		s := p.Name + ":"
		for _, a := range p.AllowedIPs {
			if !slices.Contains(ignore, a.String()) {
				s += " " + a.String()
			}
		}
		out = append(out, s)
	}
	return out
}

// routesView is the plan's routes as strings, without those to the hostile
// Peers' kept prefixes (the Peers of snap but the laptop) and those ignored.
func routesView(pl topology.Plan, snap topology.Snapshot, ignore []string) []string {
	var skip []netip.Prefix
	for _, p := range snap.Peers {
		if p.Name != "laptop" {
			skip = append(skip, p.AllowedIPs...)
		}
	}
	var out []string
	for _, r := range pl.Routes {
		if slices.Contains(skip, r.Dst) || slices.Contains(ignore, r.Dst.String()) {
			continue
		}
		out = append(out, r.Dst.String()+" "+r.Dev+" "+r.Gw.String())
	}
	return out
}

// TestHostRoutesLeftAlone: a destination the host routes itself is not
// planned, and the node says so; the rest of the plan stands.
func TestHostRoutesLeftAlone(t *testing.T) {
	snap := twoClusters()
	self := selfOf(snap.Nodes[1], "eth0") // a-2 leads location a
	before := Compute(snap, self)
	if _, ok := routeTo(before, "10.244.3.0/24", 0); !ok {
		t.Fatal("the plan does not route b-1's pod CIDR: the test needs it")
	}
	self.HostRoutes = []topology.HostRoute{{Dst: pfx("10.244.3.0/24"), Desc: "10.244.3.0/24 via 10.0.1.9 dev eth0 proto bird"}}
	pl := Compute(snap, self)
	if _, ok := routeTo(pl, "10.244.3.0/24", 0); ok {
		t.Error("the host's route would be replaced")
	}
	if !hasRejection(pl, "Node/a-2", topology.ReasonHostRoute) {
		t.Errorf("rejections: %+v", pl.Rejections)
	}
	if len(pl.Routes) != len(before.Routes)-1 {
		t.Errorf("%d routes, want %d", len(pl.Routes), len(before.Routes)-1)
	}
}
