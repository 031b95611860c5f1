package topology

import (
	"net/netip"
	"testing"
)

// TestRoutes: Kilo's routes and rules for a leader (other segments via
// their WireGuard IP on kilo0, Peers and remote networks on kilo0, its own
// location with --local, Cilium's table-1107 return routes) and for a
// non-leader (everything outside its segment through its leader, over the
// tunnel when encapsulation applies), in every --encapsulate mode.
func TestRoutes(t *testing.T) {
	const priv1, priv2 = "10.0.1.1", "10.0.1.2"
	// On kilo0 via a segment's WireGuard IP, from a-1's private IP.
	wg := func(dst, gw string) Route {
		return Route{Dst: pfx(dst), Gw: addr(gw), Dev: "kilo0", OnLink: true, Src: addr(priv1)}
	}
	// On kilo0 without a gateway (WireGuard routes by allowed IPs).
	dev := func(dst string) Route { return Route{Dst: pfx(dst), Dev: "kilo0", Src: addr(priv1)} }
	// Through gw on device d, from src ("" = none).
	via := func(dst, gw, d, src string) Route {
		r := Route{Dst: pfx(dst), Gw: addr(gw), Dev: d, OnLink: true}
		if src != "" {
			r.Src = addr(src)
		}
		return r
	}
	ret := func(dst, gw, d, src string) Route { r := via(dst, gw, d, src); r.Table = KiloTable; return r }
	from := func(src, dst string) Rule { return Rule{Src: pfx(src), Dst: pfx(dst), Table: KiloTable} }
	iif := func(dst string) Rule { return Rule{Iif: "kilo0", Dst: pfx(dst), Table: KiloTable} }
	tunl0 := Tunnel{Name: TunnelIPIP, Create: true}
	// The routes to location b on leader a-1.
	toB := []Route{wg("10.244.3.0/24", "10.4.0.2"), wg("10.0.2.1/32", "10.4.0.2"), wg("10.244.4.0/24", "10.4.0.2"), wg("10.0.2.2/32", "10.4.0.2")}
	// The routes to location b on non-leader a-2, through a-1 on device d.
	toBVia := func(gw, d, src string) []Route {
		return []Route{via("10.4.0.1/32", gw, d, src), via("10.4.0.2/32", gw, d, src), via("10.244.3.0/24", gw, d, src), via("10.0.2.1/32", gw, d, src),
			via("10.244.4.0/24", gw, d, src), via("10.0.2.2/32", gw, d, src)}
	}
	site := func(self string, f func(a1, a2, b1, b2 *Node), extra ...Node) Local {
		a1, a2, b1, b2 := twoLocations()
		f(&a1, &a2, &b1, &b2)
		return local(self, seg("location:a", "a", "10.4.0.1", "a-1", append([]Node{a1, a2}, extra...)...), seg("location:b", "b", "10.4.0.2", "b-1", b1, b2))
	}
	plain := func(_, _, _, _ *Node) {}
	cilium := func(a1, a2, _, _ *Node) {
		a1.CNICompatibilityIP, a2.CNICompatibilityIP = pfx("10.244.1.1/32"), pfx("10.244.2.1/32")
	}
	a3 := mk(5, "a-3", "a", "10.0.9.3/24", "10.0.9.3:51820", "10.244.5.0/24") // location a, another subnet
	cat := func(rss ...[]Route) []Route {
		var out []Route
		for _, rs := range rss {
			out = append(out, rs...)
		}
		return out
	}
	for _, tc := range []struct {
		name   string
		in     RouteInput
		want   RoutePlan
		leader bool // in.Leader
	}{
		{name: "leader: other segments' pod CIDRs, private IPs and allowed-location-ips via their WireGuard IP on kilo0, from the private IP",
			leader: true, in: RouteInput{Local: func() Local {
				l := site("a-1", plain)
				l.Segments[1].AllowedLocationIPs = pfxs("192.168.50.0/24")
				return l
			}()},
			want: RoutePlan{Routes: append(toB, wg("192.168.50.0/24", "10.4.0.2"))}},
		{name: "leader: Peers' allowed IPs and remote clusters' networks on kilo0",
			leader: true, in: RouteInput{Local: site("a-1", plain), Peers: []Peer{{Name: "p", AllowedIPs: pfxs("10.5.0.0/24", "fd10::/64")}},
				Remotes: []Remote{remote("rb", "10.100.0.0/16", "10.97.0.0/16")}},
			want: RoutePlan{Routes: cat(toB, []Route{dev("10.5.0.0/24"), dev("fd10::/64"), dev("10.100.0.0/16"), dev("10.97.0.0/16")})}},
		{name: "leader: no route to a private IP that is its segment leader's endpoint IP",
			leader: true, in: RouteInput{Local: site("a-1", func(_, _, b1, _ *Node) { b1.Endpoint = "10.0.2.1:51820" })},
			want: RoutePlan{Routes: []Route{wg("10.244.3.0/24", "10.4.0.2"), wg("10.244.4.0/24", "10.4.0.2"), wg("10.0.2.2/32", "10.4.0.2")}}},
		{name: "leader: the endpoint is the discovered one where the leader keeps a keepalive",
			leader: true, in: RouteInput{Local: site("a-1", func(_, _, b1, _ *Node) { b1.PersistentKeepalive = 25 }),
				Discovered: map[Key]netip.AddrPort{key(3): netip.MustParseAddrPort("10.0.2.2:51820")}},
			want: RoutePlan{Routes: []Route{wg("10.244.3.0/24", "10.4.0.2"), wg("10.0.2.1/32", "10.4.0.2"), wg("10.244.4.0/24", "10.4.0.2")}}},
		{name: "leader without private IP: no source",
			leader: true, in: RouteInput{Local: site("a-1", func(a1, _, _, _ *Node) { a1.InternalIP = netip.Prefix{} })},
			want: RoutePlan{Routes: []Route{{Dst: pfx("10.244.3.0/24"), Gw: addr("10.4.0.2"), Dev: "kilo0", OnLink: true}, {Dst: pfx("10.0.2.1/32"), Gw: addr("10.4.0.2"), Dev: "kilo0", OnLink: true},
				{Dst: pfx("10.244.4.0/24"), Gw: addr("10.4.0.2"), Dev: "kilo0", OnLink: true}, {Dst: pfx("10.0.2.2/32"), Gw: addr("10.4.0.2"), Dev: "kilo0", OnLink: true}}}},
		{name: "leader --local, always: its location's pod CIDRs through tunl0 (created) to each private IP, with the table-1107 return path and rules",
			leader: true, in: RouteInput{Settings: Settings{Local: true}, Local: site("a-1", plain)},
			want: RoutePlan{Routes: cat([]Route{via("10.244.2.0/24", priv2, "tunl0", priv1), ret("10.0.1.2/32", priv2, "tunl0", priv1)}, toB),
				Rules: []Rule{from("10.244.1.0/24", "10.0.1.2/32"), iif("10.0.1.2/32")}, Tunnel: tunl0}},
		{name: "leader --local, never: directly on the private interface, no return path",
			leader: true, in: RouteInput{Settings: Settings{Local: true, Encapsulate: EncapsulateNever}, Local: site("a-1", plain)},
			want: RoutePlan{Routes: cat([]Route{via("10.244.2.0/24", priv2, "eth0", "")}, toB)}},
		{name: "leader --local, crosssubnet: through the tunnel only outside the private subnet",
			leader: true, in: RouteInput{Settings: Settings{Local: true, Encapsulate: EncapsulateCrossSubnet}, Local: site("a-1", plain, a3)},
			want: RoutePlan{Routes: cat([]Route{via("10.244.2.0/24", priv2, "eth0", ""), via("10.244.5.0/24", "10.0.9.3", "tunl0", priv1), ret("10.0.9.3/32", "10.0.9.3", "tunl0", priv1)}, toB),
				Rules: []Rule{from("10.244.1.0/24", "10.0.9.3/32"), iif("10.0.9.3/32")}, Tunnel: tunl0}},
		{name: "the tunnel device present (Cilium's cilium_tunl): used, not created",
			leader: true, in: RouteInput{Settings: Settings{Local: true}, Self: Self{TunnelDevice: TunnelCilium}, Local: site("a-1", plain)},
			want: RoutePlan{Routes: cat([]Route{via("10.244.2.0/24", priv2, "cilium_tunl", priv1), ret("10.0.1.2/32", priv2, "cilium_tunl", priv1)}, toB),
				Rules: []Rule{from("10.244.1.0/24", "10.0.1.2/32"), iif("10.0.1.2/32")}, Tunnel: Tunnel{Name: TunnelCilium}}},
		{name: "leader, Cilium, --local=false: table-1107 return routes through each non-leader's cilium_host IP, iif kilo0",
			leader: true, in: RouteInput{Settings: Settings{Compatibility: CompatibilityCilium}, Self: Self{TunnelDevice: TunnelCilium}, Local: site("a-1", cilium)},
			want: RoutePlan{Routes: cat([]Route{ret("10.0.1.2/32", "10.244.2.1", "cilium_tunl", "")}, toB),
				Rules: []Rule{iif("10.0.1.2/32")}, Tunnel: Tunnel{Name: TunnelCilium}}},
		{name: "leader, Cilium without cni-compatibility-ip: the network address of the pod CIDR (Kilo's fallback)",
			leader: true, in: RouteInput{Settings: Settings{Compatibility: CompatibilityCilium}, Local: site("a-1", plain)},
			want: RoutePlan{Routes: cat([]Route{ret("10.0.1.2/32", "10.244.2.0", "tunl0", "")}, toB), Rules: []Rule{iif("10.0.1.2/32")}, Tunnel: tunl0}},
		{name: "leader, Cilium, --local=false, never: no return routes",
			leader: true, in: RouteInput{Settings: Settings{Compatibility: CompatibilityCilium, Encapsulate: EncapsulateNever}, Local: site("a-1", cilium)},
			want: RoutePlan{Routes: toB}},
		{name: "leader, --local=false without Cilium: the gateway is the private IP, Kilo adds no return route",
			leader: true, in: RouteInput{Local: site("a-1", plain)},
			want: RoutePlan{Routes: toB}},
		{name: "full: a node of this location is a segment like any other (its private IP is its endpoint: no route to it)",
			leader: true, in: RouteInput{Settings: Settings{Granularity: GranularityFull}, Local: func() Local {
				a1, a2, _, _ := twoLocations()
				return local("a-1", seg("node:a-1", "a", "10.4.0.1", "a-1", a1), seg("node:a-2", "a", "10.4.0.2", "a-2", a2))
			}()},
			want: RoutePlan{Routes: []Route{wg("10.244.2.0/24", "10.4.0.2")}}},
		{name: "cross: a node of this location is reached without WireGuard (no route but with --local)",
			leader: true, in: RouteInput{Settings: Settings{Granularity: GranularityCross}, Local: func() Local {
				a1, a2, _, _ := twoLocations()
				return local("a-1", seg("node:a-1", "a", "10.4.0.1", "a-1", a1), seg("node:a-2", "a", "10.4.0.2", "a-2", a2))
			}()}},
		{name: "non-leader, always: everything outside its segment through its leader over tunl0, from its private IP",
			in:   RouteInput{Local: site("a-2", plain), Peers: []Peer{{Name: "p", AllowedIPs: pfxs("10.5.0.0/24")}}, Remotes: []Remote{remote("rb", "10.100.0.0/16")}},
			want: RoutePlan{Routes: cat(toBVia(priv1, "tunl0", priv2), []Route{via("10.5.0.0/24", priv1, "tunl0", priv2), via("10.100.0.0/16", priv1, "tunl0", priv2)}), Tunnel: tunl0}},
		{name: "non-leader, never: through its leader on the private interface",
			in:   RouteInput{Settings: Settings{Encapsulate: EncapsulateNever}, Local: site("a-2", plain)},
			want: RoutePlan{Routes: toBVia(priv1, "eth0", "")}},
		{name: "non-leader, crosssubnet, its leader in its subnet: no tunnel",
			in:   RouteInput{Settings: Settings{Encapsulate: EncapsulateCrossSubnet}, Local: site("a-2", plain)},
			want: RoutePlan{Routes: toBVia(priv1, "eth0", "")}},
		{name: "non-leader, crosssubnet, its leader in another subnet: the tunnel",
			in:   RouteInput{Settings: Settings{Encapsulate: EncapsulateCrossSubnet}, Local: site("a-2", func(a1, _, _, _ *Node) { a1.InternalIP = pfx("10.0.9.1/24") })},
			want: RoutePlan{Routes: toBVia("10.0.9.1", "tunl0", priv2), Tunnel: tunl0}},
		{name: "non-leader, Cilium: through its leader's cilium_host IP",
			in:   RouteInput{Settings: Settings{Compatibility: CompatibilityCilium}, Self: Self{TunnelDevice: TunnelCilium}, Local: site("a-2", cilium)},
			want: RoutePlan{Routes: toBVia("10.244.1.1", "cilium_tunl", priv2), Tunnel: Tunnel{Name: TunnelCilium}}},
		{name: "non-leader, flannel: through flannel.1 to its leader's pod subnet address",
			in:   RouteInput{Settings: Settings{Compatibility: CompatibilityFlannel}, Self: Self{TunnelDevice: TunnelIPIP}, Local: site("a-2", plain)},
			want: RoutePlan{Routes: toBVia("10.244.1.0", "flannel.1", priv2), Tunnel: Tunnel{Name: TunnelFlannel}}},
		{name: "leader --local, flannel: its location's nodes through flannel.1 to their pod subnet address",
			leader: true, in: RouteInput{Settings: Settings{Local: true, Compatibility: CompatibilityFlannel}, Local: site("a-1", plain)},
			want: RoutePlan{Routes: cat([]Route{via("10.244.2.0/24", "10.244.2.0", "flannel.1", priv1), ret("10.0.1.2/32", "10.244.2.0", "flannel.1", priv1)}, toB),
				Rules: []Rule{from("10.244.1.0/24", "10.0.1.2/32"), iif("10.0.1.2/32")}, Tunnel: Tunnel{Name: TunnelFlannel}}},
		{name: "non-leader --local: its location's nodes directly, with the return path but no iif rule",
			in: RouteInput{Settings: Settings{Local: true}, Local: site("a-2", plain)},
			want: RoutePlan{Routes: cat(toBVia(priv1, "tunl0", priv2)[:1], []Route{via("10.244.1.0/24", priv1, "tunl0", priv2), ret("10.0.1.1/32", priv1, "tunl0", priv2)}, toBVia(priv1, "tunl0", priv2)[1:]),
				Rules: []Rule{from("10.244.2.0/24", "10.0.1.1/32")}, Tunnel: tunl0}},
		{name: "non-leader whose leader has no address: rejected, no routes",
			in: RouteInput{Local: site("a-2", func(a1, _, _, _ *Node) { a1.InternalIP = netip.Prefix{} })},
			want: RoutePlan{Rejections: []Rejection{{Object: ObjectRef{Kind: "Node", Name: "a-1"}, Field: "internal-ip", Reason: ReasonInvalidAnnotation,
				Message: "segment leader has no address to route through"}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := tc.in
			in.Settings, in.Leader = Defaults(in.Settings), tc.leader
			in.Host = Host{Private: HostAddress{Interface: "eth0", Prefix: in.Local.Self.InternalIP}}
			check(t, "routes", Routes(in), tc.want)
		})
	}
}

// TestNATFor is Kilo's KILO-NAT chain: traffic from Peers (and to this
// location's allowed-location-ips) is masqueraded unless it goes to the
// mesh: every segment's allowed IPs, the Peers', the remote clusters'
// networks, the service CIDRs.
func TestNATFor(t *testing.T) {
	withALIPs := func(self string) Local {
		l := twoLocationsSeen(self)
		l.Segments[0].AllowedLocationIPs = pfxs("192.168.40.0/24")
		l.Segments[1].AllowedLocationIPs = pfxs("192.168.50.0/24")
		return l
	}
	segments := pfxs("10.0.1.1/32", "10.0.1.2/32", "10.0.2.1/32", "10.0.2.2/32", "10.4.0.1/32", "10.4.0.2/32", "10.244.1.0/24", "10.244.2.0/24", "10.244.3.0/24", "10.244.4.0/24")
	for _, tc := range []struct {
		name    string
		l       Local
		peers   []Peer
		remotes []Remote
		set     Settings
		want    NAT
	}{
		{name: "no Peers, no allowed-location-ips: nothing to masquerade",
			l:    twoLocationsSeen("a-1"),
			want: NAT{Sources: []netip.Prefix{}, Destinations: []netip.Prefix{}, Exceptions: segments}},
		{name: "from Peers, except to the mesh: segments, Peers, remote networks, services",
			l:       twoLocationsSeen("a-2"),
			peers:   []Peer{{Name: "p", AllowedIPs: pfxs("10.5.0.0/24", "10.5.1.9/32")}, {Name: "q", AllowedIPs: pfxs("10.5.0.0/24")}},
			remotes: []Remote{remote("rb", "10.100.0.0/16"), remote("rc", "10.101.0.0/16")},
			set:     Settings{ServiceCIDRs: pfxs("10.96.0.0/12")},
			want: NAT{Sources: pfxs("10.5.0.0/24", "10.5.1.9/32"), Destinations: []netip.Prefix{},
				Exceptions: pfxs("10.0.1.1/32", "10.0.1.2/32", "10.0.2.1/32", "10.0.2.2/32", "10.4.0.1/32", "10.4.0.2/32", "10.5.0.0/24", "10.5.1.9/32",
					"10.96.0.0/12", "10.100.0.0/16", "10.101.0.0/16", "10.244.1.0/24", "10.244.2.0/24", "10.244.3.0/24", "10.244.4.0/24")}},
		{name: "Kilo as the CNI: from this node's pod subnet too",
			l: twoLocationsSeen("a-2"), set: Settings{CNI: true},
			want: NAT{Sources: pfxs("10.244.2.0/24"), Destinations: []netip.Prefix{}, Exceptions: segments}},
		{name: "Kilo as the CNI on a node not Ready: no pod subnet to masquerade",
			l: twoLocationsSeen(""), set: Settings{CNI: true},
			want: NAT{Sources: []netip.Prefix{}, Destinations: []netip.Prefix{}, Exceptions: segments}},
		{name: "to this location's allowed-location-ips (only), never excepted (Kilo masquerades traffic to any location's)",
			l: withALIPs("b-2"),
			want: NAT{Sources: []netip.Prefix{}, Destinations: pfxs("192.168.50.0/24"), Exceptions: pfxs("10.0.1.1/32", "10.0.1.2/32", "10.0.2.1/32", "10.0.2.2/32", "10.4.0.1/32", "10.4.0.2/32",
				"10.244.1.0/24", "10.244.2.0/24", "10.244.3.0/24", "10.244.4.0/24")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			check(t, "NAT", NATFor(tc.l, tc.peers, tc.remotes, Defaults(tc.set)), tc.want)
		})
	}
}

// TestForwardFor is kg's --iptables-forward-rules where Kilo is the CNI:
// a leader accepts its location's pod subnets, private IPs and
// allowed-location-ips, any other node its own pod subnet.
func TestForwardFor(t *testing.T) {
	on := Settings{ForwardRules: true}
	withALIP := twoLocationsSeen("a-1")
	withALIP.Segments[0].AllowedLocationIPs = pfxs("192.168.40.0/24")
	withALIP.Segments[1].AllowedLocationIPs = pfxs("192.168.50.0/24")
	a1, a2, b1, _ := twoLocations()
	cross := local("a-1", seg("node:a-1", "a", "10.4.0.1", "a-1", a1), seg("node:a-2", "a", "10.4.0.2", "a-2", a2), seg("node:b-1", "b", "10.4.0.3", "b-1", b1))
	for _, tc := range []struct {
		name   string
		l      Local
		leader bool
		set    Settings
		want   []netip.Prefix
	}{
		{name: "off", l: withALIP, leader: true},
		{name: "not Ready", l: twoLocationsSeen(""), set: on},
		{name: "a non-leader: its pod subnet", l: twoLocationsSeen("a-2"), set: on, want: pfxs("10.244.2.0/24")},
		{name: "a leader: its location's pod subnets, private IPs and allowed-location-ips", l: withALIP, leader: true, set: on,
			want: pfxs("10.0.1.1/32", "10.0.1.2/32", "10.244.1.0/24", "10.244.2.0/24", "192.168.40.0/24")},
		{name: "cross: a leader forwards for the segments of its location", l: cross, leader: true, set: Settings{ForwardRules: true, Granularity: GranularityCross},
			want: pfxs("10.0.1.1/32", "10.0.1.2/32", "10.244.1.0/24", "10.244.2.0/24")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			check(t, "forward", ForwardFor(tc.l, tc.leader, Defaults(tc.set)), tc.want)
		})
	}
}

// TestWithoutHostRoutes: a planned route to a destination the host routes in
// the same table is left out and said on this node; another table's, or
// another destination, stays.
func TestWithoutHostRoutes(t *testing.T) {
	routes := []Route{
		{Dst: pfx("0.0.0.0/0"), Dev: "kilo0"},
		{Dst: pfx("192.168.1.0/24"), Dev: "kilo0"},
		{Dst: pfx("192.168.1.0/24"), Dev: "tunl0", Table: KiloTable},
		{Dst: pfx("10.2.0.0/24"), Dev: "kilo0"},
	}
	host := []HostRoute{{Dst: pfx("0.0.0.0/0"), Desc: "default via 192.168.1.1 dev eth0 proto dhcp metric 100"},
		{Dst: pfx("192.168.1.0/24"), Desc: "192.168.1.0/24 dev eth0 proto kernel"}}
	got, rejs := WithoutHostRoutes(append([]Route(nil), routes...), host, "a-1")
	check(t, "routes", got, []Route{routes[2], routes[3]})
	rej := func(msg string) Rejection {
		return Rejection{Object: ObjectRef{Kind: "Node", Name: "a-1"}, Field: "routes", Reason: ReasonHostRoute, Message: msg}
	}
	check(t, "rejections", rejs, []Rejection{
		rej("0.0.0.0/0 is routed by the host (default via 192.168.1.1 dev eth0 proto dhcp metric 100): left as it is, not routed through the mesh"),
		rej("192.168.1.0/24 is routed by the host (192.168.1.0/24 dev eth0 proto kernel): left as it is, not routed through the mesh"),
	})
}
