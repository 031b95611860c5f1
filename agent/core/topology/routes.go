package topology

import "net/netip"

// Tunnel device names: Cilium creates cilium_tunl with
// enable-ipip-termination; otherwise the kernel's fallback tunl0.
const (
	TunnelCilium = "cilium_tunl"
	TunnelIPIP   = "tunl0"
)

// routes computes the routes and rules of this node (Kilo's pkg/mesh
// Routes, extended with routes to remote clusters).
func (p *planner) routes() {
	if p.plan.Leader {
		p.leaderRoutes()
	} else {
		p.nonLeaderRoutes()
	}
}

func (p *planner) privIP() netip.Addr { return p.selfNode.InternalIP.Addr() }

// tunnel returns the IPIP device to route through, asking for tunl0 to be
// created when the node has no tunnel device yet.
func (p *planner) tunnel() string {
	switch p.self.TunnelDevice {
	case TunnelCilium, TunnelIPIP:
		p.plan.Tunnel = Tunnel{Name: p.self.TunnelDevice}
	default:
		p.plan.Tunnel = Tunnel{Name: TunnelIPIP, Create: true}
	}
	return p.plan.Tunnel.Name
}

// encapsulates tells whether traffic to gw goes through the IPIP tunnel
// (--encapsulate=always, or crosssubnet and gw outside the private subnet).
func (p *planner) encapsulates(gw netip.Addr) bool {
	switch p.set.Encapsulate {
	case EncapsulateAlways:
		return true
	case EncapsulateCrossSubnet:
		return !p.selfNode.InternalIP.IsValid() || !p.selfNode.InternalIP.Masked().Contains(gw)
	}
	return false
}

// viaGateway is a route to dst through gw on the underlay, or through the
// tunnel when encapsulation applies (then with src = private IP, so replies
// come back to an address the peer can reach).
func (p *planner) viaGateway(dst netip.Prefix, gw netip.Addr) Route {
	r := Route{Dst: dst, Gw: gw, Dev: p.priv.Interface, OnLink: true}
	if p.encapsulates(gw) {
		r.Dev = p.tunnel()
		if p.selfNode.InternalIP.IsValid() {
			r.Src = p.privIP()
		}
	}
	return r
}

// gatewayOf is the address mesh traffic to node n is sent to (Kilo's
// Encapsulator.Gw): in Cilium mode n's cilium_host IP, else — Kilo's
// fallback — the network address of its pod CIDR; otherwise n's private IP.
func (p *planner) gatewayOf(n *Node) netip.Addr {
	if p.set.Compatibility == CompatibilityCilium {
		if n.CNICompatibilityIP.IsValid() {
			return n.CNICompatibilityIP.Addr()
		}
		if len(n.PodCIDRs) > 0 {
			return n.PodCIDRs[0].Masked().Addr()
		}
	}
	return n.InternalIP.Addr()
}

func (p *planner) add(rs ...Route)    { p.plan.Routes = append(p.plan.Routes, rs...) }
func (p *planner) addRule(rs ...Rule) { p.plan.Rules = append(p.plan.Rules, rs...) }

// localSegmentRoutes: with --local, routes inside this node's location go
// directly to each node's private IP (encapsulated when required), with the
// table-1107 return path Kilo installs for encapsulated destinations.
func (p *planner) localSegmentRoutes(s *segment) {
	if !p.set.Local || !p.selfNode.InternalIP.IsValid() {
		return
	}
	for _, n := range s.nodes {
		if n == p.selfNode || !n.InternalIP.IsValid() {
			continue
		}
		priv := n.InternalIP.Addr()
		gw := p.gatewayOf(n)
		for _, c := range n.PodCIDRs {
			p.add(p.viaGateway(c, gw))
		}
		// Whether the return path needs the tunnel depends on the node's
		// private IP, the gateway on the mode (Kilo decides the same way).
		if !p.encapsulates(priv) {
			continue
		}
		p.add(Route{Dst: host(priv), Gw: gw, Dev: p.tunnel(), OnLink: true, Table: KiloTable, Src: p.privIP()})
		for _, c := range p.selfNode.PodCIDRs {
			p.addRule(Rule{Src: c.Masked(), Dst: host(priv), Table: KiloTable})
		}
		if p.plan.Leader {
			p.addRule(Rule{Iif: p.set.Interface, Dst: host(priv), Table: KiloTable})
		}
	}
}

func (p *planner) leaderRoutes() {
	dev := p.set.Interface
	var src netip.Addr
	if p.selfNode.InternalIP.IsValid() {
		src = p.privIP()
	}
	for _, s := range p.segments {
		if p.sameLocation(s) {
			p.localSegmentRoutes(s)
			p.ciliumReturnRoutes(s)
			continue
		}
		l := s.leaderNode()
		ep, _ := p.endpointFor(l.PublicKey, l.Endpoint, "", l.PersistentKeepalive > 0)
		endpointIP := endpointAddr(ep)
		for _, n := range s.nodes {
			for _, c := range n.PodCIDRs {
				p.add(Route{Dst: c, Gw: s.wgIP, Dev: dev, OnLink: true, Src: src})
			}
			// A node reachable only at its endpoint IP keeps that route on
			// the underlay: encapsulating traffic to an IP through itself
			// cannot work.
			if n.InternalIP.IsValid() && n.InternalIP.Addr() != endpointIP {
				p.add(Route{Dst: host(n.InternalIP.Addr()), Gw: s.wgIP, Dev: dev, OnLink: true, Src: src})
			}
		}
		for _, a := range s.allowedLocationIPs {
			p.add(Route{Dst: a, Gw: s.wgIP, Dev: dev, OnLink: true, Src: src})
		}
	}
	for _, peer := range p.peers {
		for _, a := range peer.AllowedIPs {
			p.add(Route{Dst: a, Dev: dev, Src: src})
		}
	}
	for _, r := range p.remotes {
		for _, n := range r.networks {
			p.add(Route{Dst: n, Dev: dev, Src: src})
		}
	}
}

// ciliumReturnRoutes: with --local=false and encapsulation (Cilium's case:
// Cilium routes inside the location), a non-leader sends mesh traffic to
// this leader through the tunnel from its private IP. Replies from kilo0 to
// that private IP must go back through the tunnel too, via the non-leader's
// gateway (its cilium_host IP): table 1107 and an iif rule do that. Where
// the gateway is the private IP itself (IPIP mode) Kilo adds nothing.
func (p *planner) ciliumReturnRoutes(s *segment) {
	if p.set.Local || p.set.Encapsulate == EncapsulateNever || !p.selfNode.InternalIP.IsValid() || s != p.selfSegment {
		return
	}
	for _, n := range s.nodes {
		if n == p.selfNode || !n.InternalIP.IsValid() {
			continue
		}
		priv := n.InternalIP.Addr()
		gw := p.gatewayOf(n)
		if !gw.IsValid() || gw == priv {
			continue
		}
		p.add(Route{Dst: host(priv), Gw: gw, Dev: p.tunnel(), OnLink: true, Table: KiloTable})
		p.addRule(Rule{Iif: p.set.Interface, Dst: host(priv), Table: KiloTable})
	}
}

func (p *planner) nonLeaderRoutes() {
	gw := p.gatewayOf(p.selfSegment.leaderNode())
	if !gw.IsValid() {
		p.reject(ObjectRef{Kind: "Node", Name: p.selfSegment.leaderNode().Name}, "internal-ip", ReasonInvalidAnnotation,
			"segment leader has no address to route through")
		return
	}
	for _, s := range p.segments {
		if s.wgIP.IsValid() {
			p.add(p.viaGateway(host(s.wgIP), gw))
		}
		if p.sameLocation(s) {
			p.localSegmentRoutes(s)
			continue
		}
		for _, n := range s.nodes {
			for _, c := range n.PodCIDRs {
				p.add(p.viaGateway(c, gw))
			}
			if n.InternalIP.IsValid() {
				p.add(p.viaGateway(host(n.InternalIP.Addr()), gw))
			}
		}
		for _, a := range s.allowedLocationIPs {
			p.add(p.viaGateway(a, gw))
		}
	}
	for _, peer := range p.peers {
		for _, a := range peer.AllowedIPs {
			p.add(p.viaGateway(a, gw))
		}
	}
	// Non-leaders do not watch remote clusters: they route each remote
	// cluster's allowedNetworks (known from the ClusterMesh) to the leader.
	for _, r := range p.remotes {
		for _, n := range r.networks {
			p.add(p.viaGateway(n, gw))
		}
	}
}

// nat is Kilo's KILO-NAT chain as data: no masquerade for mesh
// destinations, masquerade the rest, for traffic from Peers (and to this
// location's allowed-location-ips).
func (p *planner) nat() {
	var ex []netip.Prefix
	for _, s := range p.segments {
		if s.wgIP.IsValid() {
			ex = append(ex, host(s.wgIP))
		}
		ex = append(ex, s.allowedIPs()...)
		if s == p.selfSegment {
			p.plan.NAT.Destinations = append(p.plan.NAT.Destinations, s.allowedLocationIPs...)
		}
	}
	for _, peer := range p.peers {
		ex = append(ex, peer.AllowedIPs...)
		p.plan.NAT.Sources = append(p.plan.NAT.Sources, peer.AllowedIPs...)
	}
	for _, r := range p.remotes {
		ex = append(ex, r.networks...)
	}
	ex = append(ex, p.set.ServiceCIDRs...)
	p.plan.NAT.Exceptions = sortedUnique(ex)
	p.plan.NAT.Sources = sortedUnique(p.plan.NAT.Sources)
	p.plan.NAT.Destinations = sortedUnique(p.plan.NAT.Destinations)
}
