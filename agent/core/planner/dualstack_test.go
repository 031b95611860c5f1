package planner

import (
	"fmt"
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"testing"

	"github.com/meshlet/meshlet/agent/core/topology"
)

// withSecondFamily gives every local and remote node of a random input an
// IPv6 pod CIDR and private IP (and the remote leaders an IPv6 WireGuard
// IP), this node its IPv6 address, and a Peer an IPv6 allowed IP.
func withSecondFamily(snap topology.Snapshot, self topology.Self) (topology.Snapshot, topology.Self) {
	snap.Nodes = slices.Clone(snap.Nodes)
	for i := range snap.Nodes {
		n := &snap.Nodes[i]
		n.DualStackPodCIDR = pfx(fmt.Sprintf("fd10:244:0:%x::/64", i))
		n.DualStackInternalIP = pfx(fmt.Sprintf("fd00::%x/64", i+1))
		if n.Name == self.Name {
			self.Addresses = append(slices.Clone(self.Addresses), topology.HostAddress{Interface: "eth0", Prefix: n.DualStackInternalIP})
		}
	}
	snap.Remotes = slices.Clone(snap.Remotes)
	for c := range snap.Remotes {
		rc := &snap.Remotes[c]
		rc.Nodes = slices.Clone(rc.Nodes)
		for j := range rc.Nodes {
			rc.Nodes[j].DualStackPodCIDR = pfx(fmt.Sprintf("fd%x::%x:0:0:0/64", 0x20+c, j))
			if rc.Nodes[j].WireGuardIP.IsValid() {
				rc.Nodes[j].DualStackWireGuardIP = pfx(fmt.Sprintf("fd%x:ffff::%x/64", 0x20+c, j+1))
			}
		}
	}
	snap.Peers = slices.Clone(snap.Peers)
	if len(snap.Peers) > 0 {
		snap.Peers[0].AllowedIPs = append(slices.Clone(snap.Peers[0].AllowedIPs), pfx("fd05::1/128"))
	}
	return snap, self
}

// firstFamily is a plan without anything of IPv6: what a single-stack mesh
// plans for the same nodes.
func firstFamily(pl topology.Plan) topology.Plan {
	v4 := func(ps []netip.Prefix) []netip.Prefix {
		if ps == nil {
			return nil
		}
		return slices.DeleteFunc(slices.Clone(ps), func(p netip.Prefix) bool { return p.Addr().Is6() })
	}
	pl.DualStackPrivateIP, pl.DualStackWireGuardIP, pl.IPv6Forwarding = netip.Prefix{}, netip.Prefix{}, false
	pl.WireGuard.Addresses = v4(pl.WireGuard.Addresses)
	pl.WireGuard.Peers = slices.Clone(pl.WireGuard.Peers)
	for i := range pl.WireGuard.Peers {
		pl.WireGuard.Peers[i].AllowedIPs = v4(pl.WireGuard.Peers[i].AllowedIPs)
	}
	pl.Routes = slices.DeleteFunc(slices.Clone(pl.Routes), func(r topology.Route) bool { return r.Dst.Addr().Is6() })
	pl.NAT.Sources, pl.NAT.Exceptions, pl.NAT.Destinations = v4(pl.NAT.Sources), v4(pl.NAT.Exceptions), v4(pl.NAT.Destinations)
	pl.Forward = v4(pl.Forward)
	pl.Annotations = maps.Clone(pl.Annotations)
	delete(pl.Annotations, topology.AnnotationDualStackInternalIP)
	delete(pl.Annotations, topology.AnnotationDualStackWireGuardIP)
	pl.Rejections = slices.DeleteFunc(slices.Clone(pl.Rejections), func(r topology.Rejection) bool {
		return r.Reason == topology.ReasonSingleFamily || r.Field == topology.AnnotationDualStackInternalIP ||
			r.Field == topology.AnnotationDualStackWireGuardIP || r.Field == "spec.podCIDRs"
	})
	pl.Segments = slices.Clone(pl.Segments)
	for i := range pl.Segments {
		pl.Segments[i].DualStackWireGuardIP = netip.Prefix{}
	}
	return pl
}

// carriesSecondFamily reports whether a plan routes or allows an IPv6
// address withSecondFamily gave a node (a Peer's IPv6 is Kilo's to route).
func carriesSecondFamily(pl topology.Plan) bool {
	given := pfxs("fd10:244::/32", "fd00::/64", "fd20::/12")
	in := func(p netip.Prefix) bool {
		return slices.ContainsFunc(given, func(g netip.Prefix) bool { return g.Overlaps(p) })
	}
	for _, wp := range pl.WireGuard.Peers {
		if slices.ContainsFunc(wp.AllowedIPs, in) {
			return true
		}
	}
	return slices.ContainsFunc(pl.Routes, func(r topology.Route) bool { return in(r.Dst) }) || pl.IPv6Forwarding ||
		pl.DualStackPrivateIP.IsValid() || pl.Annotations[topology.AnnotationDualStackInternalIP] != ""
}

// TestDualStackKeepsTheFirstFamily: on every random input given a second
// family, the dual-stack plan's IPv4 is exactly the single-stack plan
// (which ignores the second family: TestRandomInputs and the goldens hold
// it to today's), and its IPv6 is well formed — every route of one family,
// none through the IPIP tunnel, every segment led by meshlet numbered.
func TestDualStackKeepsTheFirstFamily(t *testing.T) {
	n := 2000
	if testing.Short() {
		n = 200
	}
	for seed := uint64(0); seed < uint64(n); seed++ {
		snap, self := withSecondFamily(randomInput(seed))
		single := Compute(snap, self)
		snap.Settings.DualStackSubnet = pfx("fd4b::/64")
		dual := Compute(snap, self)
		if got := firstFamily(dual); !reflect.DeepEqual(got, firstFamily(single)) {
			t.Fatalf("seed %d: the dual-stack plan's IPv4 differs from the single-stack plan:\n%+v\n%+v", seed, got, single)
		}
		if carriesSecondFamily(single) {
			t.Fatalf("seed %d: the single-stack plan carries the nodes' second family", seed)
		}
		for _, r := range dual.Routes {
			if (r.Gw.IsValid() && r.Gw.Is4() != r.Dst.Addr().Is4()) || (r.Src.IsValid() && r.Src.Is4() != r.Dst.Addr().Is4()) {
				t.Fatalf("seed %d: route of two families %+v", seed, r)
			}
			if r.Dst.Addr().Is6() && (r.Dev == topology.TunnelIPIP || r.Dev == topology.TunnelCilium) {
				t.Fatalf("seed %d: IPv6 through the IPIP tunnel %+v", seed, r)
			}
		}
		if dual.Leader && !dual.DualStackWireGuardIP.IsValid() {
			t.Fatalf("seed %d: a leader without its IPv6 WireGuard IP", seed)
		}
		if !dual.IPv6Forwarding {
			t.Fatalf("seed %d: IPv6 not forwarded", seed)
		}
	}
}
