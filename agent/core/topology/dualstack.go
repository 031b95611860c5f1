package topology

import (
	"net/netip"
	"slices"
)

// A dual-stack mesh (docs/dual-stack.md): with Settings.DualStackSubnet
// the mesh carries the other address family too. Kilo's rules decide the
// topology from the first family alone (segments, leaders, WireGuard IPs'
// order); the second family rides on it: each node's pod CIDR and private
// IP of that family join its segment's allowed IPs and routes, and each
// segment gets the second subnet's address of the same index. A route to a
// prefix of the second family takes that family's source and next hop (the
// twin of the first family's), and leaves the IPIP tunnel, which carries
// IPv4 alone, for the underlay.

// DualStack reports whether the mesh carries both address families.
func (s Settings) DualStack() bool { return s.DualStackSubnet.IsValid() }

// CarriesIPv6 reports whether the mesh carries IPv6 (a dual-stack mesh or
// an IPv6 subnet): the host must forward IPv6, and IPv6 leaves the tunnel.
func (s Settings) CarriesIPv6() bool {
	return s.DualStackSubnet.Addr().Is6() || s.Subnet.Addr().Is6()
}

func sameFamily(a, b netip.Addr) bool { return a.Is4() == b.Is4() }

// WithDualStack adds the second family to the topology, in place (l is the
// planner's own copy, after failover's veto, so the final leaders decide):
// a segment led by a node that runs meshlet carries its nodes' second pod
// CIDRs and private IPs and gets its second WireGuard IP; a segment led by
// kg carries the first family alone — kg plans one — and is reported once.
// In a single-stack mesh no node has a second family, whatever it
// publishes.
func (l Local) WithDualStack(set Settings) (Local, []Rejection) {
	if !set.DualStack() {
		for _, s := range l.Segments {
			for _, n := range s.Nodes {
				n.DualStackInternalIP, n.DualStackPodCIDR = netip.Prefix{}, netip.Prefix{}
			}
		}
		return l, nil
	}
	var rejs []Rejection
	base := set.DualStackSubnet.Masked().Addr()
	for i, s := range l.Segments {
		ln := s.LeaderNode()
		if ln.MeshletVersion == "" {
			if hasSecondFamily(s, set) {
				rejs = append(rejs, Rejection{Object: ObjectRef{Kind: "Node", Name: ln.Name}, Field: "leader", Reason: ReasonSingleFamily,
					Message: "segment " + s.Key + " is led by kg, which plans one address family: its " + familyName(set.DualStackSubnet.Addr()) +
						" addresses are not part of the mesh"})
			}
			for _, n := range s.Nodes {
				n.DualStackInternalIP, n.DualStackPodCIDR = netip.Prefix{}, netip.Prefix{}
			}
			continue
		}
		if ip := addrAdd(base, uint64(i)+1); ip.IsValid() && set.DualStackSubnet.Contains(ip) {
			s.DualStackWireGuardIP = ip
		}
		for _, n := range s.Nodes {
			if n.DualStackInternalIP.IsValid() && !sameFamily(n.DualStackInternalIP.Addr(), base) {
				n.DualStackInternalIP = netip.Prefix{}
			}
			if c := n.DualStackPodCIDR; c.IsValid() && sameFamily(c.Addr(), base) {
				n.PodCIDRs = append(slices.Clip(n.PodCIDRs), c.Masked())
			}
		}
	}
	return l, rejs
}

// hasSecondFamily reports whether a node of s has an address of the
// dual-stack family.
func hasSecondFamily(s *Segment, set Settings) bool {
	f := set.DualStackSubnet.Addr()
	for _, n := range s.Nodes {
		if (n.DualStackPodCIDR.IsValid() && sameFamily(n.DualStackPodCIDR.Addr(), f)) ||
			(n.DualStackInternalIP.IsValid() && sameFamily(n.DualStackInternalIP.Addr(), f)) {
			return true
		}
	}
	return false
}

func familyName(a netip.Addr) string {
	if a.Is4() {
		return "IPv4"
	}
	return "IPv6"
}

// routedDualStackIP is the node's second-family private IP as a host
// prefix, when it is routed to the node from other locations.
func (n *Node) routedDualStackIP() (netip.Prefix, bool) {
	if !n.DualStackInternalIP.IsValid() || n.DualStackRefused {
		return netip.Prefix{}, false
	}
	return host(n.DualStackInternalIP.Addr()), true
}

// secondFamilyPrivate is this node's private IP of the dual-stack family:
// Kilo's choice (hostIPs) among the host's addresses of that family, within
// the --internal-cidr entries of that family when there are any; where the
// family has no private address (IPv6 hosts often have global ones only),
// the first public one — the address the location's nodes reach it at.
func secondFamilyPrivate(self Self, set Settings) HostAddress {
	if !set.DualStack() {
		return HostAddress{}
	}
	f := set.DualStackSubnet.Addr()
	fam := self
	fam.Addresses = nil
	for _, a := range self.Addresses {
		if sameFamily(a.Prefix.Addr(), f) {
			fam.Addresses = append(fam.Addresses, a)
		}
	}
	var allowed []netip.Prefix
	for _, c := range set.InternalCIDRs {
		if sameFamily(c.Addr(), f) {
			allowed = append(allowed, c)
		}
	}
	priv, pub, ok := hostIPs(fam, allowed)
	switch {
	case !ok:
		return HostAddress{}
	case priv.Prefix.IsValid():
		return priv
	}
	return pub
}

// familyTwins maps each first-family address a route may use as its source
// or next hop to the same node's (or segment's) address of the second
// family: private IPs, Cilium's and flannel's gateways (the second family
// leaves the tunnel, so they become the node's private IP) and WireGuard
// IPs. Empty in a single-stack mesh.
func familyTwins(l Local, set Settings) map[netip.Addr]netip.Addr {
	if !set.DualStack() {
		return nil
	}
	out := map[netip.Addr]netip.Addr{}
	for _, s := range l.Segments {
		if s.WireGuardIP.IsValid() && s.DualStackWireGuardIP.IsValid() {
			out[s.WireGuardIP] = s.DualStackWireGuardIP
		}
		for _, n := range s.Nodes {
			if !n.DualStackInternalIP.IsValid() {
				continue
			}
			twin := n.DualStackInternalIP.Addr()
			for _, gw := range []netip.Addr{gatewayOf(n, set), n.InternalIP.Addr()} {
				if gw.IsValid() {
					out[gw] = twin
				}
			}
		}
	}
	return out
}

// inFamily gives a route to a prefix of the second family that family's
// source and next hop, and takes it off the tunnel (IPIP carries IPv4
// alone) onto the underlay interface of that family. What has no twin is
// left as it is: the plan's last step (oneFamily) drops or trims it.
func (b *routeBuilder) inFamily(r Route) Route {
	v4 := r.Dst.Addr().Is4()
	if b.twins != nil {
		if r.Gw.IsValid() && r.Gw.Is4() != v4 {
			if t, ok := b.twins[r.Gw]; ok {
				r.Gw = t
			}
		}
		if r.Src.IsValid() && r.Src.Is4() != v4 {
			if t, ok := b.twins[r.Src]; ok {
				r.Src = t
			}
		}
	}
	if !v4 && b.in.Settings.CarriesIPv6() && r.Dev != "" && r.Dev == b.out.Tunnel.Name && r.Dev != b.in.Settings.Interface {
		r.Dev = b.in.Host.DualStackPrivate.Interface
		if r.Dev == "" || b.in.Settings.Subnet.Addr().Is6() {
			r.Dev = b.in.Host.Private.Interface
		}
		r.Src = netip.Addr{}
	}
	return r
}

// DualStackAnnotations are what this node publishes of the second family:
// its private IP and, on a leader, its segment's WireGuard IP; in a
// single-stack mesh, the removal of what an earlier dual-stack run left
// (published: this node's annotations as the API server has them).
func DualStackAnnotations(set Settings, h Host, wireGuardIP netip.Prefix, published map[string]string) map[string]string {
	out := map[string]string{}
	if !set.DualStack() {
		for _, k := range []string{AnnotationDualStackInternalIP, AnnotationDualStackWireGuardIP} {
			if _, ok := published[k]; ok {
				out[k] = ""
			}
		}
		return out
	}
	out[AnnotationDualStackInternalIP] = FormatPrefix(h.DualStackPrivate.Prefix)
	out[AnnotationDualStackWireGuardIP] = FormatPrefix(wireGuardIP)
	return out
}
