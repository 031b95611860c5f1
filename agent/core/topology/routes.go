package topology

import (
	"net/netip"
	"slices"
)

// Tunnel device names: Cilium creates cilium_tunl with
// enable-ipip-termination, flannel's VXLAN backend flannel.1; otherwise the
// kernel's fallback tunl0, which the plan may ask to create.
const (
	TunnelCilium  = "cilium_tunl"
	TunnelIPIP    = "tunl0"
	TunnelFlannel = "flannel.1"
)

// RouteInput is what the routes stage reads.
type RouteInput struct {
	Settings Settings
	Self     Self
	Host     Host
	Local    Local
	Leader   bool
	Peers    []Peer
	Remotes  []Remote
	// Discovered endpoints decide which nodes a leader reaches at their
	// endpoint IP (no route through the tunnel to it).
	Discovered map[Key]netip.AddrPort
}

// RoutePlan is the routes stage's output.
type RoutePlan struct {
	Routes     []Route
	Rules      []Rule
	Tunnel     Tunnel
	Rejections []Rejection
}

// routeBuilder collects one node's routes and rules in Kilo's order (the
// first route to a destination wins: dedupRoutes).
type routeBuilder struct {
	in  RouteInput
	out RoutePlan
	// twins: the second family's counterparts of first-family sources
	// and next hops (familyTwins; nil in a single-stack mesh).
	twins map[netip.Addr]netip.Addr
}

// Routes computes the routes and rules of this node (Kilo's pkg/mesh
// Routes, extended with routes to remote clusters).
func Routes(in RouteInput) RoutePlan {
	b := &routeBuilder{in: in, twins: familyTwins(in.Local, in.Settings)}
	if in.Leader {
		b.leaderRoutes()
	} else {
		b.nonLeaderRoutes()
	}
	if in.Settings.CarriesIPv6() && !slices.ContainsFunc(b.out.Routes, func(r Route) bool { return r.Dev == b.out.Tunnel.Name }) {
		b.out.Tunnel = Tunnel{} // only IPv6 asked for it, and left it (inFamily)
	}
	return b.out
}

func (b *routeBuilder) self() *Node        { return b.in.Local.Self }
func (b *routeBuilder) privIP() netip.Addr { return b.self().InternalIP.Addr() }

// tunnel returns the device to route through: the CNI's (flannel.1, or
// cilium_tunl where it exists), else tunl0, asked to be created when the
// node has none yet.
func (b *routeBuilder) tunnel() string {
	switch {
	case b.in.Settings.Compatibility == CompatibilityFlannel:
		b.out.Tunnel = Tunnel{Name: TunnelFlannel}
	case b.in.Self.TunnelDevice == TunnelCilium, b.in.Self.TunnelDevice == TunnelIPIP:
		b.out.Tunnel = Tunnel{Name: b.in.Self.TunnelDevice}
	default:
		b.out.Tunnel = Tunnel{Name: TunnelIPIP, Create: true}
	}
	return b.out.Tunnel.Name
}

// encapsulates tells whether traffic to gw goes through the IPIP tunnel
// (--encapsulate=always, or crosssubnet and gw outside the private subnet).
func (b *routeBuilder) encapsulates(gw netip.Addr) bool {
	if gw.Is6() && b.in.Settings.CarriesIPv6() {
		return false // IPIP carries IPv4 alone (docs/dual-stack.md#encapsulation)
	}
	switch b.in.Settings.Encapsulate {
	case EncapsulateAlways:
		return true
	case EncapsulateCrossSubnet:
		return !b.self().InternalIP.IsValid() || !b.self().InternalIP.Masked().Contains(gw)
	}
	return false
}

// viaGateway is a route to dst through gw on the underlay, or through the
// tunnel when encapsulation applies (then with src = private IP, so replies
// come back to an address the peer can reach).
func (b *routeBuilder) viaGateway(dst netip.Prefix, gw netip.Addr) Route {
	r := Route{Dst: dst, Gw: gw, Dev: b.in.Host.Private.Interface, OnLink: true}
	if b.encapsulates(gw) {
		r.Dev = b.tunnel()
		if b.self().InternalIP.IsValid() {
			r.Src = b.privIP()
		}
	}
	return r
}

// gatewayOf is the address mesh traffic to node n is sent to (Kilo's
// Encapsulator.Gw): in Cilium mode n's cilium_host IP, else — Kilo's
// fallback — the network address of its pod CIDR; in flannel mode the
// network address of its pod CIDR (flannel.1's address there); otherwise
// n's private IP.
func gatewayOf(n *Node, set Settings) netip.Addr {
	if n.InternalIP.Addr().Is6() && set.CarriesIPv6() {
		// IPv6 takes no tunnel, so no CNI's gateway behind one: the
		// node's private IP on the underlay (docs/dual-stack.md#encapsulation).
		return n.InternalIP.Addr()
	}
	if set.Compatibility == CompatibilityFlannel && len(n.PodCIDRs) > 0 {
		return n.PodCIDRs[0].Masked().Addr()
	}
	if set.Compatibility == CompatibilityCilium {
		if n.CNICompatibilityIP.IsValid() {
			return n.CNICompatibilityIP.Addr()
		}
		if len(n.PodCIDRs) > 0 {
			return n.PodCIDRs[0].Masked().Addr()
		}
	}
	return n.InternalIP.Addr()
}

func (b *routeBuilder) add(rs ...Route) {
	for _, r := range rs {
		b.out.Routes = append(b.out.Routes, b.inFamily(r))
	}
}

// addRule adds rules of the IPIP return path (table 1107): IPv4's alone,
// as the second family never takes the tunnel (oneFamilyRules drops a rule
// mixing them).
func (b *routeBuilder) addRule(rs ...Rule) { b.out.Rules = append(b.out.Rules, rs...) }

// localSegmentRoutes: with --local, routes inside this node's location go
// directly to each node's private IP (encapsulated when required), with the
// table-1107 return path Kilo installs for encapsulated destinations.
func (b *routeBuilder) localSegmentRoutes(s *Segment) {
	self := b.self()
	if !b.in.Settings.Local || !self.InternalIP.IsValid() {
		return
	}
	for _, n := range s.Nodes {
		if n == self || !n.InternalIP.IsValid() {
			continue
		}
		priv := n.InternalIP.Addr()
		gw := gatewayOf(n, b.in.Settings)
		for _, c := range n.PodCIDRs {
			b.add(b.viaGateway(c, gw))
		}
		// Whether the return path needs the tunnel depends on the node's
		// private IP, the gateway on the mode (Kilo decides the same way).
		if !b.encapsulates(priv) {
			continue
		}
		b.add(Route{Dst: host(priv), Gw: gw, Dev: b.tunnel(), OnLink: true, Table: KiloTable, Src: b.privIP()})
		for _, c := range self.PodCIDRs {
			b.addRule(Rule{Src: c.Masked(), Dst: host(priv), Table: KiloTable})
		}
		if b.in.Leader {
			b.addRule(Rule{Iif: b.in.Settings.Interface, Dst: host(priv), Table: KiloTable})
		}
	}
}

func (b *routeBuilder) leaderRoutes() {
	set, l := b.in.Settings, b.in.Local
	dev := set.Interface
	var src netip.Addr
	if b.self().InternalIP.IsValid() {
		src = b.privIP()
	}
	for _, s := range l.Segments {
		if l.SameLocation(s, set) {
			b.localSegmentRoutes(s)
			b.ciliumReturnRoutes(s)
			continue
		}
		ln := s.LeaderNode()
		ep, _ := endpointFor(b.in.Discovered, ln.PublicKey, ln.Endpoint, "", ln.PersistentKeepalive > 0)
		endpointIP := endpointAddr(ep)
		for _, n := range s.Nodes {
			for _, c := range n.PodCIDRs {
				b.add(Route{Dst: c, Gw: s.WireGuardIP, Dev: dev, OnLink: true, Src: src})
			}
			// A node reachable only at its endpoint IP keeps that route on
			// the underlay: encapsulating traffic to an IP through itself
			// cannot work.
			if ip, ok := n.routedPrivateIP(); ok && ip.Addr() != endpointIP {
				b.add(Route{Dst: ip, Gw: s.WireGuardIP, Dev: dev, OnLink: true, Src: src})
			}
			if ip, ok := n.routedDualStackIP(); ok && ip.Addr() != endpointIP {
				b.add(Route{Dst: ip, Gw: s.WireGuardIP, Dev: dev, OnLink: true, Src: src})
			}
		}
		for _, a := range s.AllowedLocationIPs {
			b.add(Route{Dst: a, Gw: s.WireGuardIP, Dev: dev, OnLink: true, Src: src})
		}
	}
	for _, peer := range b.in.Peers {
		for _, a := range peer.AllowedIPs {
			b.add(Route{Dst: a, Dev: dev, Src: src})
		}
	}
	for _, r := range b.in.Remotes {
		for _, n := range r.Networks {
			b.add(Route{Dst: n, Dev: dev, Src: src})
		}
	}
}

// ciliumReturnRoutes: with --local=false and encapsulation (Cilium's case:
// Cilium routes inside the location), a non-leader sends mesh traffic to
// this leader through the tunnel from its private IP. Replies from kilo0 to
// that private IP must go back through the tunnel too, via the non-leader's
// gateway (its cilium_host IP): table 1107 and an iif rule do that. Where
// the gateway is the private IP itself (IPIP mode) Kilo adds nothing. In
// cross granularity every node of the location is such a node, each its
// own segment (Cozystack's kg: case X1-cross-cilium-return-routes-same-location).
func (b *routeBuilder) ciliumReturnRoutes(s *Segment) {
	set, self := b.in.Settings, b.self()
	if set.Local || set.Encapsulate == EncapsulateNever || !self.InternalIP.IsValid() {
		return
	}
	for _, n := range s.Nodes {
		if n == self || !n.InternalIP.IsValid() {
			continue
		}
		priv := n.InternalIP.Addr()
		gw := gatewayOf(n, set)
		if !gw.IsValid() || gw == priv || (priv.Is6() && set.CarriesIPv6()) {
			continue // IPv6 takes no tunnel: no return path through it
		}
		b.add(Route{Dst: host(priv), Gw: gw, Dev: b.tunnel(), OnLink: true, Table: KiloTable})
		b.addRule(Rule{Iif: set.Interface, Dst: host(priv), Table: KiloTable})
	}
}

func (b *routeBuilder) nonLeaderRoutes() {
	set, l := b.in.Settings, b.in.Local
	gw := gatewayOf(l.SelfSegment.LeaderNode(), set)
	if !gw.IsValid() {
		b.out.Rejections = append(b.out.Rejections, Rejection{Object: ObjectRef{Kind: "Node", Name: l.SelfSegment.LeaderNode().Name},
			Field: "internal-ip", Reason: ReasonInvalidAnnotation, Message: "segment leader has no address to route through"})
		return
	}
	for _, s := range l.Segments {
		if s.WireGuardIP.IsValid() {
			b.add(b.viaGateway(host(s.WireGuardIP), gw))
		}
		if s.DualStackWireGuardIP.IsValid() {
			b.add(b.viaGateway(host(s.DualStackWireGuardIP), gw))
		}
		if l.SameLocation(s, set) {
			b.localSegmentRoutes(s)
			continue
		}
		for _, n := range s.Nodes {
			for _, c := range n.PodCIDRs {
				b.add(b.viaGateway(c, gw))
			}
			if ip, ok := n.routedPrivateIP(); ok {
				b.add(b.viaGateway(ip, gw))
			}
			if ip, ok := n.routedDualStackIP(); ok {
				b.add(b.viaGateway(ip, gw))
			}
		}
		for _, a := range s.AllowedLocationIPs {
			b.add(b.viaGateway(a, gw))
		}
	}
	for _, peer := range b.in.Peers {
		for _, a := range peer.AllowedIPs {
			b.add(b.viaGateway(a, gw))
		}
	}
	// Non-leaders do not watch remote clusters: they route each remote
	// cluster's allowedNetworks (known from the ClusterMesh) to the leader.
	for _, r := range b.in.Remotes {
		for _, n := range r.Networks {
			b.add(b.viaGateway(n, gw))
		}
	}
}

// NATFor is Kilo's KILO-NAT chain as data: no masquerade for mesh
// destinations, masquerade the rest, for traffic from Peers (and to this
// location's allowed-location-ips).
func NATFor(l Local, peers []Peer, remotes []Remote, set Settings) NAT {
	var nat NAT
	var ex []netip.Prefix
	for _, s := range l.Segments {
		if s.WireGuardIP.IsValid() {
			ex = append(ex, host(s.WireGuardIP))
		}
		// Kilo's KILO-NAT returns for a segment's pod subnets and private
		// and WireGuard IPs, never for its allowed-location-ips: traffic
		// to those networks (which know no route back) is masqueraded.
		ex = append(ex, s.AllowedIPs()[:len(s.AllowedIPs())-len(s.AllowedLocationIPs)]...)
		if s == l.SelfSegment {
			nat.Destinations = append(nat.Destinations, s.AllowedLocationIPs...)
		}
	}
	for _, peer := range peers {
		ex = append(ex, peer.AllowedIPs...)
		nat.Sources = append(nat.Sources, peer.AllowedIPs...)
	}
	for _, r := range remotes {
		ex = append(ex, r.Networks...)
	}
	ex = append(ex, set.ServiceCIDRs...)
	if set.CNI && l.Self != nil {
		// Kilo as the CNI: pods reach the world through the node.
		nat.Sources = append(nat.Sources, l.Self.PodCIDRs...)
	}
	nat.Exceptions = sortedUnique(ex)
	nat.Sources = sortedUnique(nat.Sources)
	nat.Destinations = sortedUnique(nat.Destinations)
	return nat
}

// ForwardFor are the prefixes kg's --iptables-forward-rules accepts in
// FORWARD, to and from, where Kilo is the CNI: on a leader, which forwards
// for its location, the location's pod subnets, allowed-location-ips and
// private IPs; on any other node its own pod subnet.
func ForwardFor(l Local, leader bool, set Settings) []netip.Prefix {
	if !set.ForwardRules || l.Self == nil {
		return nil
	}
	if !leader {
		return sortedUnique(l.Self.PodCIDRs)
	}
	var out []netip.Prefix
	for _, s := range l.Segments {
		if !l.SameLocation(s, set) {
			continue
		}
		for _, n := range s.Nodes {
			out = append(out, n.PodCIDRs...)
			if n.InternalIP.IsValid() {
				out = append(out, host(n.InternalIP.Addr()))
			}
			if n.DualStackInternalIP.IsValid() {
				out = append(out, host(n.DualStackInternalIP.Addr()))
			}
		}
		out = append(out, s.AllowedLocationIPs...)
	}
	return sortedUnique(out)
}

// WithoutHostRoutes leaves out the planned routes whose destination the
// host already routes in the same table (Self.HostRoutes: its default
// route, a connected network, a CNI's or DHCP's route): meshlet never
// replaces a route it does not own, and says so on this node. kg's routes
// are not among them: meshlet takes those over at the switch.
func WithoutHostRoutes(routes []Route, hostRoutes []HostRoute, self string) ([]Route, []Rejection) {
	if len(hostRoutes) == 0 {
		return routes, nil
	}
	type key struct {
		table int
		dst   netip.Prefix
	}
	held := make(map[key]string, len(hostRoutes))
	for _, h := range hostRoutes {
		held[key{h.Table, h.Dst.Masked()}] = h.Desc
	}
	var rejs []Rejection
	out := routes[:0]
	for _, r := range routes {
		if desc, ok := held[key{r.Table, r.Dst.Masked()}]; ok {
			rejs = append(rejs, Rejection{Object: ObjectRef{Kind: "Node", Name: self}, Field: "routes", Reason: ReasonHostRoute,
				Message: r.Dst.Masked().String() + " is routed by the host (" + desc + "): left as it is, not routed through the mesh"})
			continue
		}
		out = append(out, r)
	}
	return out, rejs
}
