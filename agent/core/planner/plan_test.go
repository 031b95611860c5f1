package planner

import (
	"fmt"
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshlet/meshlet/agent/core/topology"
)

var now = time.Unix(1_800_000_000, 0)

func key(i int) topology.Key {
	var k topology.Key
	k[0] = byte(i)
	k[31] = 0x42
	return k
}

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }
func addr(s string) netip.Addr  { return netip.MustParseAddr(s) }
func pfxs(ss ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		out[i] = pfx(s)
	}
	return out
}

// node builds a Ready node: name, location, private IP, endpoint, pod CIDR.
func node(i int, name, loc, priv, endpoint, pod string) topology.Node {
	n := topology.Node{
		Name: name, LocationAnnotation: loc, Endpoint: endpoint, PublicKey: key(i),
		PodCIDRs: pfxs(pod), LastSeen: now.Add(-5 * time.Second), Ready: true,
	}
	if priv != "" {
		n.InternalIP = pfx(priv)
	}
	return n
}

// selfOf is what the agent on n would observe: its internal IP and its
// endpoint's IP on iface, which holds the default route.
func selfOf(n topology.Node, iface string) topology.Self {
	s := topology.Self{Name: n.Name, PublicKey: n.PublicKey, DefaultInterface: iface, DefaultMTU: 1500}
	if n.InternalIP.IsValid() {
		s.Addresses = append(s.Addresses, topology.HostAddress{Interface: iface, Prefix: n.InternalIP})
	}
	if a := endpointIP(n.Endpoint); a.IsValid() && (!n.InternalIP.IsValid() || a != n.InternalIP.Addr()) {
		s.Addresses = append(s.Addresses, topology.HostAddress{Interface: iface, Prefix: netip.PrefixFrom(a, a.BitLen())})
	}
	return s
}

// devicePeers is a device that completed a handshake with each key, at the
// endpoint given.
func devicePeers(eps map[topology.Key]netip.AddrPort) []topology.DevicePeer {
	var out []topology.DevicePeer
	for k, ep := range eps {
		out = append(out, topology.DevicePeer{PublicKey: k, Endpoint: ep, Handshake: true})
	}
	return out
}

// threeLocations: a (2 nodes, a-2 has the leader annotation), b (2 nodes,
// b-2 has a public endpoint), c (1 node).
func threeLocations() []topology.Node {
	a1 := node(1, "a-1", "a", "10.0.1.1/24", "10.0.1.1:51820", "10.244.1.0/24")
	a2 := node(2, "a-2", "a", "10.0.1.2/24", "10.0.1.2:51820", "10.244.2.0/24")
	a2.Leader = true
	b1 := node(3, "b-1", "b", "10.0.2.1/24", "10.0.2.1:51820", "10.244.3.0/24")
	b2 := node(4, "b-2", "b", "10.0.2.2/24", "198.51.100.2:51820", "10.244.4.0/24")
	c1 := node(5, "c-1", "c", "10.0.3.1/24", "203.0.113.5:51820", "10.244.5.0/24")
	c1.AllowedLocationIPs = pfxs("192.168.50.0/24")
	return []topology.Node{a1, a2, b1, b2, c1}
}

func peerByName(t *testing.T, pl topology.Plan, name string) topology.WireGuardPeer {
	t.Helper()
	for _, p := range pl.WireGuard.Peers {
		if p.Name == name {
			return p
		}
	}
	t.Fatalf("no peer %q in plan; peers: %v", name, peerNames(pl))
	return topology.WireGuardPeer{}
}

func peerNames(pl topology.Plan) []string {
	var out []string
	for _, p := range pl.WireGuard.Peers {
		out = append(out, string(p.Kind)+":"+p.Name)
	}
	return out
}

func routeTo(pl topology.Plan, dst string, table int) (topology.Route, bool) {
	for _, r := range pl.Routes {
		if r.Dst == pfx(dst) && r.Table == table {
			return r, true
		}
	}
	return topology.Route{}, false
}

func hasRejection(pl topology.Plan, obj string, reason topology.Reason) bool {
	for _, r := range pl.Rejections {
		if r.Object.String() == obj && r.Reason == reason {
			return true
		}
	}
	return false
}

func TestSegmentsLeadersAndWireGuardIPs(t *testing.T) {
	nodes := threeLocations()
	pl := Compute(topology.Snapshot{Now: now, Nodes: nodes}, selfOf(nodes[1], "eth0"))
	want := []topology.SegmentInfo{
		{Name: "location:a", Location: "a", Leader: "a-2", Nodes: []string{"a-1", "a-2"}, WireGuardIP: pfx("10.4.0.1/16")},
		{Name: "location:b", Location: "b", Leader: "b-2", Nodes: []string{"b-1", "b-2"}, WireGuardIP: pfx("10.4.0.2/16")},
		{Name: "location:c", Location: "c", Leader: "c-1", Nodes: []string{"c-1"}, WireGuardIP: pfx("10.4.0.3/16")},
	}
	if !reflect.DeepEqual(pl.Segments, want) {
		t.Fatalf("segments:\n got %+v\nwant %+v", pl.Segments, want)
	}
	if !pl.Leader || pl.WireGuardIP != pfx("10.4.0.1/16") || pl.Annotations[topology.AnnotationWireGuardIP] != "10.4.0.1/16" {
		t.Fatalf("a-2 should lead location a with 10.4.0.1/16: leader=%v ip=%v ann=%q", pl.Leader, pl.WireGuardIP, pl.Annotations[topology.AnnotationWireGuardIP])
	}
	b := peerByName(t, pl, "b-2")
	if b.Endpoint != "198.51.100.2:51820" || b.Kind != topology.KindSegment || b.PublicKey != key(4) {
		t.Errorf("peer b-2: %+v", b)
	}
	wantIPs := pfxs("10.0.2.1/32", "10.0.2.2/32", "10.4.0.2/32", "10.244.3.0/24", "10.244.4.0/24")
	if !reflect.DeepEqual(b.AllowedIPs, wantIPs) {
		t.Errorf("b-2 allowed IPs = %v, want %v", b.AllowedIPs, wantIPs)
	}
	c := peerByName(t, pl, "c-1")
	if !reflect.DeepEqual(c.AllowedIPs, pfxs("10.0.3.1/32", "10.4.0.3/32", "10.244.5.0/24", "192.168.50.0/24")) {
		t.Errorf("c-1 allowed IPs = %v", c.AllowedIPs)
	}
	if len(pl.WireGuard.Peers) != 2 {
		t.Errorf("peers = %v, want b-2 and c-1", peerNames(pl))
	}
	// Leader routes: other segments via their WireGuard IP on kilo0, onlink,
	// src = private IP.
	r, ok := routeTo(pl, "10.244.3.0/24", 0)
	if want := (topology.Route{Dst: pfx("10.244.3.0/24"), Gw: addr("10.4.0.2"), Dev: "kilo0", Src: addr("10.0.1.2"), OnLink: true}); !ok || r != want {
		t.Errorf("route to b-1's pods = %+v, want %+v", r, want)
	}
	if r, ok := routeTo(pl, "192.168.50.0/24", 0); !ok || r.Gw != addr("10.4.0.3") {
		t.Errorf("allowed-location-ips route = %+v %v", r, ok)
	}
	if _, ok := routeTo(pl, "10.244.1.0/24", 0); ok {
		t.Error("leader must not route its own location through WireGuard")
	}

	// Every node computes the same leaders; a-1 is not a leader.
	pl1 := Compute(topology.Snapshot{Now: now, Nodes: nodes}, selfOf(nodes[0], "eth0"))
	if pl1.Leader || pl1.WireGuard.Up || len(pl1.WireGuard.Peers) != 0 || pl1.Annotations[topology.AnnotationWireGuardIP] != "" {
		t.Fatalf("a-1 should be a non-leader with kilo0 down and no peers: %+v", pl1.WireGuard)
	}
	if !reflect.DeepEqual(pl1.Segments, pl.Segments) {
		t.Fatal("two nodes disagree on the topology")
	}
}

func TestReadiness(t *testing.T) {
	nodes := threeLocations()
	stale := nodes[3] // b-2, the public leader of b
	stale.LastSeen = now.Add(-61 * time.Second)
	noCIDR := nodes[4]
	noCIDR.PodCIDRs = nil
	nodes[3], nodes[4] = stale, noCIDR
	pl := Compute(topology.Snapshot{Now: now, Nodes: nodes}, selfOf(nodes[1], "eth0"))
	if got := peerNames(pl); !reflect.DeepEqual(got, []string{"segment:b-1"}) {
		t.Fatalf("peers = %v: a stale leader fails over to b-1, a node without pod CIDR is out", got)
	}
}

func TestGranularity(t *testing.T) {
	nodes := threeLocations()
	for _, tc := range []struct {
		g         topology.Granularity
		wantPeers []string
		wantIP    string
	}{
		{topology.GranularityFull, []string{"segment:a-1", "segment:b-1", "segment:b-2", "segment:c-1"}, "10.4.0.2/16"},
		// cross: one segment per node, but no tunnel inside location a.
		{topology.GranularityCross, []string{"segment:b-1", "segment:b-2", "segment:c-1"}, "10.4.0.2/16"},
	} {
		t.Run(string(tc.g), func(t *testing.T) {
			pl := Compute(topology.Snapshot{Now: now, Nodes: nodes, Settings: topology.Settings{Granularity: tc.g}}, selfOf(nodes[1], "eth0"))
			if !pl.Leader || pl.Segment != "node:a-2" || pl.WireGuardIP != pfx(tc.wantIP) {
				t.Fatalf("leader=%v segment=%s ip=%v", pl.Leader, pl.Segment, pl.WireGuardIP)
			}
			if got := peerNames(pl); !reflect.DeepEqual(got, tc.wantPeers) {
				t.Fatalf("peers = %v, want %v", got, tc.wantPeers)
			}
			if pl.Annotations[topology.AnnotationGranularity] != string(tc.g) {
				t.Errorf("granularity annotation = %q", pl.Annotations[topology.AnnotationGranularity])
			}
			_, viaWG := routeTo(pl, "10.244.1.0/24", 0)
			if tc.g == topology.GranularityCross && viaWG {
				t.Error("cross granularity must not route a-1 through WireGuard")
			}
			if tc.g == topology.GranularityFull && !viaWG {
				t.Error("full granularity routes a-1 through WireGuard")
			}
		})
	}
}

func TestNodeWithoutInternalIPIsOwnSegment(t *testing.T) {
	nodes := threeLocations()
	nodes[0].InternalIP = netip.Prefix{}
	pl := Compute(topology.Snapshot{Now: now, Nodes: nodes}, selfOf(nodes[1], "eth0"))
	if len(pl.Segments) != 4 || pl.Segments[3].Name != "node:a-1" {
		t.Fatalf("segments = %+v", pl.Segments)
	}
	peerByName(t, pl, "a-1")
}

func TestPeerKeepalivePrecedence(t *testing.T) {
	nodes := threeLocations()
	laptop := topology.Peer{Name: "laptop", AllowedIPs: pfxs("10.5.0.1/32"), Endpoint: "203.0.113.7:51820", PersistentKeepalive: 25, PublicKey: key(100)}
	phone := topology.Peer{Name: "phone", AllowedIPs: pfxs("10.5.0.2/32"), PublicKey: key(101)}
	ruled := topology.Peer{Name: "ruled", AllowedIPs: pfxs("10.5.0.3/32"), PublicKey: key(102), PersistentKeepalive: 25,
		NodeKeepalive: []topology.KeepaliveRule{{Value: 7, Location: "b"}, {Value: 9, NodeSelector: map[string]string{"tier": "edge"}}, {Value: 11, Location: "a"}}}
	for _, tc := range []struct {
		name    string
		nodeKA  int
		labels  map[string]string
		peer    topology.Peer
		want    int
		wantSrc topology.KeepaliveSource
		roaming bool
	}{
		// Kilo ignores spec.persistentKeepalive on the nodes; meshlet applies it.
		{"spec keepalive without node annotation", 0, nil, laptop, 25, topology.KeepalivePeerSpec, true},
		{"spec wins over node annotation", 10, nil, laptop, 25, topology.KeepalivePeerSpec, true},
		{"node annotation when spec is 0", 10, nil, phone, 10, topology.KeepaliveNodeAnnotation, true},
		{"nothing", 0, nil, phone, 0, topology.KeepaliveNone, true},
		{"first matching rule: selector", 0, map[string]string{"tier": "edge"}, ruled, 9, topology.KeepalivePeerAnnotation, true},
		{"first matching rule: location", 0, nil, ruled, 11, topology.KeepalivePeerAnnotation, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := append([]topology.Node(nil), nodes...)
			ns[1].PersistentKeepalive = tc.nodeKA
			ns[1].Labels = tc.labels
			pl := Compute(topology.Snapshot{Now: now, Nodes: ns, Peers: []topology.Peer{tc.peer}}, selfOf(ns[1], "eth0"))
			got := peerByName(t, pl, tc.peer.Name)
			if got.PersistentKeepalive != tc.want || got.KeepaliveSource != tc.wantSrc || got.Roaming != tc.roaming || got.Kind != topology.KindPeer {
				t.Fatalf("keepalive=%d (%s) roaming=%v, want %d (%s) %v", got.PersistentKeepalive, got.KeepaliveSource, got.Roaming, tc.want, tc.wantSrc, tc.roaming)
			}
			if r, ok := routeTo(pl, tc.peer.AllowedIPs[0].String(), 0); !ok || r.Dev != "kilo0" || r.Gw.IsValid() {
				t.Errorf("peer route = %+v %v", r, ok)
			}
		})
	}
}

func TestPeerValidationAsSet(t *testing.T) {
	nodes := threeLocations()
	self := selfOf(nodes[1], "eth0")
	peers := []topology.Peer{
		{Name: "b", AllowedIPs: pfxs("10.5.0.1/32", "10.5.0.2/32"), PublicKey: key(100)},
		{Name: "a", AllowedIPs: pfxs("10.5.0.1/32"), PublicKey: key(101)},
		{Name: "c-dup-key", AllowedIPs: pfxs("10.5.0.9/32"), PublicKey: key(101)},
		{Name: "d-own-key", AllowedIPs: pfxs("10.5.0.8/32"), PublicKey: self.PublicKey},
		// A node's pod CIDR stays the node's.
		{Name: "e-node-cidr", AllowedIPs: pfxs("10.244.5.0/24", "10.5.0.7/32"), PublicKey: key(102)},
	}
	pl := Compute(topology.Snapshot{Now: now, Nodes: nodes, Peers: peers}, self)
	if got := peerNames(pl); !reflect.DeepEqual(got, []string{"segment:b-2", "segment:c-1", "peer:a", "peer:b", "peer:e-node-cidr"}) {
		t.Fatalf("peers = %v", got)
	}
	if b := peerByName(t, pl, "b"); !reflect.DeepEqual(b.AllowedIPs, pfxs("10.5.0.2/32")) {
		t.Errorf("peer b keeps only the IP peer a did not claim first: %v", b.AllowedIPs)
	}
	if e := peerByName(t, pl, "e-node-cidr"); !reflect.DeepEqual(e.AllowedIPs, pfxs("10.5.0.7/32")) {
		t.Errorf("peer e-node-cidr kept node c-1's pod CIDR: %v", e.AllowedIPs)
	}
	if r, _ := routeTo(pl, "10.244.5.0/24", 0); r.Gw != addr("10.4.0.3") {
		t.Errorf("route to c-1's pods = %+v, want via c's WireGuard IP", r)
	}
	for _, want := range []struct {
		obj    string
		reason topology.Reason
	}{{"Peer/b", topology.ReasonDuplicateAllowedIP}, {"Peer/c-dup-key", topology.ReasonDuplicateKey}, {"Peer/d-own-key", topology.ReasonOwnKey}, {"Peer/e-node-cidr", topology.ReasonDuplicateAllowedIP}} {
		if !hasRejection(pl, want.obj, want.reason) {
			t.Errorf("missing rejection %s %s in %+v", want.obj, want.reason, pl.Rejections)
		}
	}
}

func TestDiscoveredEndpointsForRoamingPeers(t *testing.T) {
	nodes := threeLocations()
	// c-1 is behind NAT: it keeps its link alive, a-1 learned where it is.
	nodes[4].PersistentKeepalive = 25
	nodes[0].DiscoveredEndpoints = map[topology.Key]netip.AddrPort{
		key(5): netip.MustParseAddrPort("198.51.100.77:40000"),
		key(4): netip.MustParseAddrPort("198.51.100.78:40000"), // b-2 does not roam
	}
	self := selfOf(nodes[1], "eth0")
	pl := Compute(topology.Snapshot{Now: now, Nodes: nodes}, self)
	if c := peerByName(t, pl, "c-1"); c.Endpoint != "198.51.100.77:40000" || c.EndpointSource != "discovered" || !c.Roaming {
		t.Errorf("c-1 = %+v, want the discovered endpoint", c)
	}
	if b := peerByName(t, pl, "b-2"); b.Endpoint != "198.51.100.2:51820" || b.Roaming {
		t.Errorf("b-2 = %+v, want its configured endpoint", b)
	}
	// This node's own device wins, and it publishes what it learned for
	// roaming peers only.
	self.Device = devicePeers(map[topology.Key]netip.AddrPort{
		key(5): netip.MustParseAddrPort("198.51.100.99:41000"),
		key(4): netip.MustParseAddrPort("198.51.100.2:51820"),
		key(9): netip.MustParseAddrPort("127.0.0.1:1"),
	})
	pl = Compute(topology.Snapshot{Now: now, Nodes: nodes}, self)
	if c := peerByName(t, pl, "c-1"); c.Endpoint != "198.51.100.99:41000" {
		t.Errorf("c-1 endpoint = %s, want the device's", c.Endpoint)
	}
	want := `{"` + key(5).String() + `":{"IP":"198.51.100.99","Port":41000,"Zone":""}}`
	if got := pl.Annotations[topology.AnnotationDiscoveredEndpoints]; got != want {
		t.Errorf("discovered-endpoints = %s, want %s", got, want)
	}
}

func TestAnnotationsPublished(t *testing.T) {
	nodes := threeLocations()
	self := selfOf(nodes[0], "eth0")
	self.CiliumHostIP = pfx("10.244.1.1/32")
	self.Version = "v1.2.3"
	pl := Compute(topology.Snapshot{Now: now, Nodes: nodes, Settings: topology.Settings{Compatibility: topology.CompatibilityCilium}}, self)
	want := map[string]string{
		topology.AnnotationVersion:             "v1.2.3",
		topology.AnnotationKey:                 key(1).String(),
		topology.AnnotationEndpoint:            "10.0.1.1:51820",
		topology.AnnotationInternalIP:          "10.0.1.1/24",
		topology.AnnotationLastSeen:            "1800000000",
		topology.AnnotationWireGuardIP:         "",
		topology.AnnotationGranularity:         "location",
		topology.AnnotationCNICompatibilityIP:  "10.244.1.1/32",
		topology.AnnotationDiscoveredEndpoints: "{}",
		topology.AnnotationSeen:                "1800000000",
	}
	if !reflect.DeepEqual(pl.Annotations, want) {
		t.Fatalf("annotations:\n got %v\nwant %v", pl.Annotations, want)
	}
	// Published as planned 10 s ago: the heartbeat is not due, so the plan
	// keeps it (topology.WithLastSeen) and the publisher has nothing to
	// write.
	published := maps.Clone(want)
	published[topology.AnnotationLastSeen], published[topology.AnnotationSeen] = "1799999990", "1799999990"
	pl = Compute(topology.Snapshot{Now: now, Nodes: nodes, Settings: topology.Settings{Compatibility: topology.CompatibilityCilium},
		Published: published}, self)
	if !reflect.DeepEqual(pl.Annotations, published) {
		t.Fatalf("annotations with a fresh heartbeat published:\n got %v\nwant %v", pl.Annotations, published)
	}
}

func TestSelfNotReadyPublishesOnly(t *testing.T) {
	nodes := threeLocations()
	nodes[0].PodCIDRs = nil
	pl := Compute(topology.Snapshot{Now: now, Nodes: nodes}, selfOf(nodes[0], "eth0"))
	if pl.Leader || len(pl.WireGuard.Peers) != 0 || len(pl.Routes) != 0 || pl.Annotations[topology.AnnotationKey] == "" {
		t.Fatalf("a node outside the mesh only publishes its annotations: %+v", pl)
	}
}

// ciliumSite is Cozystack's setup: location "a" with leader a-1 and
// non-leader a-2 (cilium_host IPs published), and remote location "b".
func ciliumSite() ([]topology.Node, topology.Settings) {
	a1 := node(1, "a-1", "a", "192.168.1.10/32", "203.0.113.10:51820", "10.244.0.0/24")
	a1.CNICompatibilityIP = pfx("10.244.0.77/32")
	a2 := node(2, "a-2", "a", "192.168.1.11/32", "192.168.1.11:51820", "10.244.1.0/24")
	a2.CNICompatibilityIP = pfx("10.244.1.88/32")
	b1 := node(3, "b-1", "b", "192.168.2.10/32", "198.51.100.10:51820", "10.244.2.0/24")
	return []topology.Node{a1, a2, b1}, topology.Settings{
		Compatibility: topology.CompatibilityCilium, Encapsulate: topology.EncapsulateCrossSubnet, Local: false,
		Subnet: pfx("100.66.0.0/16"), ServiceCIDRs: pfxs("10.96.0.0/12"),
	}
}

func TestCiliumLocalFalseRoutes(t *testing.T) {
	nodes, set := ciliumSite()
	for _, tc := range []struct {
		name       string
		self       int
		tunnel     string
		wantRoutes []topology.Route
		wantRules  []topology.Rule
		wantTunnel topology.Tunnel
	}{
		{
			name: "leader", self: 0, tunnel: topology.TunnelCilium,
			wantRoutes: []topology.Route{
				{Dst: pfx("10.244.2.0/24"), Gw: addr("100.66.0.2"), Dev: "kilo0", Src: addr("192.168.1.10"), OnLink: true},
				{Dst: pfx("192.168.2.10/32"), Gw: addr("100.66.0.2"), Dev: "kilo0", Src: addr("192.168.1.10"), OnLink: true},
				// Replies to the non-leader's private IP return via its
				// cilium_host IP through the tunnel.
				{Dst: pfx("192.168.1.11/32"), Gw: addr("10.244.1.88"), Dev: "cilium_tunl", OnLink: true, Table: topology.KiloTable},
			},
			wantRules:  []topology.Rule{{Iif: "kilo0", Dst: pfx("192.168.1.11/32"), Table: topology.KiloTable}},
			wantTunnel: topology.Tunnel{Name: "cilium_tunl"},
		},
		{
			name: "non-leader", self: 1, tunnel: "",
			wantRoutes: []topology.Route{
				{Dst: pfx("10.244.2.0/24"), Gw: addr("10.244.0.77"), Dev: "tunl0", Src: addr("192.168.1.11"), OnLink: true},
				{Dst: pfx("100.66.0.1/32"), Gw: addr("10.244.0.77"), Dev: "tunl0", Src: addr("192.168.1.11"), OnLink: true},
				{Dst: pfx("100.66.0.2/32"), Gw: addr("10.244.0.77"), Dev: "tunl0", Src: addr("192.168.1.11"), OnLink: true},
				{Dst: pfx("192.168.2.10/32"), Gw: addr("10.244.0.77"), Dev: "tunl0", Src: addr("192.168.1.11"), OnLink: true},
			},
			wantRules:  []topology.Rule{},
			wantTunnel: topology.Tunnel{Name: "tunl0", Create: true},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			self := selfOf(nodes[tc.self], "eth0")
			self.TunnelDevice = tc.tunnel
			pl := Compute(topology.Snapshot{Now: now, Nodes: nodes, Settings: set}, self)
			if !reflect.DeepEqual(pl.Routes, tc.wantRoutes) {
				t.Errorf("routes:\n got %s\nwant %s", fmtRoutes(pl.Routes), fmtRoutes(tc.wantRoutes))
			}
			if !reflect.DeepEqual(pl.Rules, tc.wantRules) {
				t.Errorf("rules: got %+v want %+v", pl.Rules, tc.wantRules)
			}
			if pl.Tunnel != tc.wantTunnel {
				t.Errorf("tunnel = %+v, want %+v", pl.Tunnel, tc.wantTunnel)
			}
		})
	}
}

func fmtRoutes(rs []topology.Route) string {
	var b strings.Builder
	for _, r := range rs {
		fmt.Fprintf(&b, "\n  %v via %v dev %s src %v table %d onlink=%v", r.Dst, r.Gw, r.Dev, r.Src, r.Table, r.OnLink)
	}
	return b.String()
}

func TestIPIPLocalTrueRoutes(t *testing.T) {
	// IPIP mode, --local=true, --encapsulate=always: routes inside the
	// location go through the tunnel to each node's private IP, with the
	// table-1107 return path from the private IP (Kilo sets src there).
	nodes := threeLocations()
	for _, tc := range []struct {
		name     string
		self     int
		wantKilo []topology.Route
		rules    []topology.Rule
	}{
		{"non-leader a-1", 0,
			[]topology.Route{{Dst: pfx("10.0.1.2/32"), Gw: addr("10.0.1.2"), Dev: "tunl0", OnLink: true, Table: topology.KiloTable, Src: addr("10.0.1.1")}},
			[]topology.Rule{{Src: pfx("10.244.1.0/24"), Dst: pfx("10.0.1.2/32"), Table: topology.KiloTable}}},
		{"leader a-2", 1,
			[]topology.Route{{Dst: pfx("10.0.1.1/32"), Gw: addr("10.0.1.1"), Dev: "tunl0", OnLink: true, Table: topology.KiloTable, Src: addr("10.0.1.2")}},
			[]topology.Rule{{Iif: "kilo0", Dst: pfx("10.0.1.1/32"), Table: topology.KiloTable}, {Src: pfx("10.244.2.0/24"), Dst: pfx("10.0.1.1/32"), Table: topology.KiloTable}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pl := Compute(topology.Snapshot{Now: now, Nodes: nodes, Settings: topology.Settings{Local: true}}, selfOf(nodes[tc.self], "eth0"))
			var kilo []topology.Route
			for _, r := range pl.Routes {
				if r.Table == topology.KiloTable {
					kilo = append(kilo, r)
				}
			}
			if !reflect.DeepEqual(kilo, tc.wantKilo) {
				t.Errorf("table 1107:%s\nwant%s", fmtRoutes(kilo), fmtRoutes(tc.wantKilo))
			}
			if !reflect.DeepEqual(pl.Rules, tc.rules) {
				t.Errorf("rules = %+v, want %+v", pl.Rules, tc.rules)
			}
			other := 1 - tc.self
			r, ok := routeTo(pl, nodes[other].PodCIDRs[0].String(), 0)
			if !ok || r.Dev != "tunl0" || r.Gw != nodes[other].InternalIP.Addr() || !r.OnLink || r.Src != nodes[tc.self].InternalIP.Addr() {
				t.Errorf("route to the other node's pods = %+v", r)
			}
		})
	}
}

func TestNonLeaderIPIPCrossSubnet(t *testing.T) {
	nodes := threeLocations()
	pl := Compute(topology.Snapshot{Now: now, Nodes: nodes, Settings: topology.Settings{Encapsulate: topology.EncapsulateCrossSubnet}}, selfOf(nodes[0], "eth0"))
	// The leader a-2 is in a-1's subnet: plain route on the underlay.
	r, ok := routeTo(pl, "10.244.5.0/24", 0)
	if want := (topology.Route{Dst: pfx("10.244.5.0/24"), Gw: addr("10.0.1.2"), Dev: "eth0", OnLink: true}); !ok || r != want {
		t.Fatalf("route = %+v, want %+v", r, want)
	}
	if pl.Tunnel.Name != "" {
		t.Errorf("no tunnel needed, got %+v", pl.Tunnel)
	}
	for _, d := range []string{"10.4.0.1/32", "10.4.0.2/32", "10.4.0.3/32", "10.0.3.1/32", "192.168.50.0/24"} {
		if _, ok := routeTo(pl, d, 0); !ok {
			t.Errorf("non-leader lacks a route to %s", d)
		}
	}
}

// TestAllowedLocationIPsKiloRule: Kilo drops an entry whose address lies in
// another entry, a pod CIDR, a private or WireGuard IP, or a Peer's allowed
// IPs; an entry containing its own location's pod CIDRs or private IPs is
// fine (a location's own LAN, as in Cozystack's guide). One containing
// another location's is a claim on that location's addresses: Kilo keeps
// it, meshlet does not (docs/kilo-compatibility.md#claims).
func TestAllowedLocationIPsKiloRule(t *testing.T) {
	ownPods := func(nodes []topology.Node) {
		nodes[2].PodCIDRs, nodes[3].PodCIDRs = pfxs("10.245.1.0/24"), pfxs("10.245.2.0/24")
	}
	for _, tc := range []struct {
		name  string
		alip  string
		kept  bool
		setup func([]topology.Node)
	}{
		{"the location's own LAN, containing its private IPs", "10.0.2.0/24", true, nil},
		{"a supernet of its own location's pod CIDRs", "10.245.0.0/16", true, ownPods},
		{"a supernet of other locations' pod CIDRs", "10.244.0.0/16", false, nil},
		{"another location's LAN", "10.0.1.0/24", false, nil},
		{"a part of another location's LAN, no node's address", "10.0.1.128/25", false, nil},
		{"inside another location's allowed-location-ips", "192.168.50.128/25", false, nil},
		{"inside a pod CIDR", "10.244.5.0/25", false, nil},
		{"equal to a pod CIDR", "10.244.1.0/24", false, nil},
		{"a private IP", "10.0.1.1/32", false, nil},
		{"a WireGuard IP", "10.4.0.3/32", false, nil},
		{"a Peer's allowed IPs", "10.5.0.0/16", false, nil},
		{"a default route", "0.0.0.0/0", false, nil},
		{"unrelated", "172.30.0.0/16", true, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nodes := threeLocations()
			if tc.setup != nil {
				tc.setup(nodes)
			}
			nodes[3].AllowedLocationIPs = pfxs(tc.alip)
			peers := []topology.Peer{{Name: "laptop", AllowedIPs: pfxs("10.5.0.1/32"), PublicKey: key(90)}}
			pl := Compute(topology.Snapshot{Now: now, Nodes: nodes, Peers: peers}, selfOf(nodes[1], "eth0"))
			b := peerByName(t, pl, "b-2")
			_, routed := routeTo(pl, tc.alip, 0)
			if kept := containedIn(pfx(tc.alip), b.AllowedIPs); kept != tc.kept || routed != tc.kept {
				t.Errorf("%s: in b-2's allowed IPs %v, routed %v; want %v", tc.alip, kept, routed, tc.kept)
			}
			rejected := hasRejection(pl, "Node/b-2", topology.ReasonNetworksOverlap) || hasRejection(pl, "Node/b-2", topology.ReasonDefaultRoute)
			if rejected == tc.kept {
				t.Errorf("rejected = %v, want %v: %+v", rejected, !tc.kept, pl.Rejections)
			}
		})
	}
}

// TestDiscoveredEndpointOnlyForKeepaliveTargets is Kilo's updateEndpoint: a
// segment or Peer gets an endpoint learned by a handshake only when it keeps
// a keepalive itself; this node's own keepalive makes it roam (the device's
// learned endpoint is kept) but does not change the planned endpoint.
func TestDiscoveredEndpointOnlyForKeepaliveTargets(t *testing.T) {
	nat := netip.MustParseAddrPort("100.64.0.9:40000")
	for _, tc := range []struct {
		name         string
		ours, theirs int
		wantEndpoint string
		wantRoaming  bool
	}{
		{"neither keeps alive", 0, 0, "203.0.113.5:51820", false},
		{"only this node", 25, 0, "203.0.113.5:51820", true},
		{"the target", 0, 25, nat.String(), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nodes := threeLocations()
			nodes[1].PersistentKeepalive = tc.ours
			nodes[4].PersistentKeepalive = tc.theirs
			nodes[0].DiscoveredEndpoints = map[topology.Key]netip.AddrPort{key(5): nat}
			pl := Compute(topology.Snapshot{Now: now, Nodes: nodes}, selfOf(nodes[1], "eth0"))
			c := peerByName(t, pl, "c-1")
			if c.Endpoint != tc.wantEndpoint || c.Roaming != tc.wantRoaming {
				t.Errorf("c-1 endpoint %q roaming %v, want %q %v", c.Endpoint, c.Roaming, tc.wantEndpoint, tc.wantRoaming)
			}
		})
	}
}

// TestOneAddressFamilyPerRoute: an IPv6 Peer in an IPv4 mesh gets routes the
// kernel accepts: through kilo0 without the IPv4 source on the leader, none
// via an IPv4 next hop on a non-leader; no rule mixes families.
func TestOneAddressFamilyPerRoute(t *testing.T) {
	nodes := threeLocations()
	peers := []topology.Peer{{Name: "phone", AllowedIPs: pfxs("10.5.0.2/32", "fd00:5::2/128"), PublicKey: key(90)}}
	for _, self := range []int{1, 0} {
		pl := Compute(topology.Snapshot{Now: now, Nodes: nodes, Peers: peers, Settings: topology.Settings{Local: true}}, selfOf(nodes[self], "eth0"))
		for _, r := range pl.Routes {
			if r.Src.IsValid() && r.Src.Is4() != r.Dst.Addr().Is4() || r.Gw.IsValid() && r.Gw.Is4() != r.Dst.Addr().Is4() {
				t.Errorf("%s: route mixes families: %+v", nodes[self].Name, r)
			}
		}
		for _, r := range pl.Rules {
			if r.Src.IsValid() && r.Dst.IsValid() && r.Src.Addr().Is4() != r.Dst.Addr().Is4() {
				t.Errorf("%s: rule mixes families: %+v", nodes[self].Name, r)
			}
		}
		r6, ok := routeTo(pl, "fd00:5::2/128", 0)
		switch {
		case pl.Leader && (!ok || r6.Dev != "kilo0" || r6.Src.IsValid()):
			t.Errorf("leader: IPv6 Peer route = %+v, %v", r6, ok)
		case !pl.Leader && ok:
			t.Errorf("non-leader: IPv6 route via an IPv4 next hop planned: %+v", r6)
		}
		if _, ok := routeTo(pl, "10.5.0.2/32", 0); !ok {
			t.Errorf("%s: no route to the Peer's IPv4 address", nodes[self].Name)
		}
	}
}

// TestSessionProbeForKgPeers: a segment or remote leader without
// meshlet.io/version runs kg; its peer carries its WireGuard IP as the
// address to probe its session at. meshlet-run leaders carry none.
func TestSessionProbeForKgPeers(t *testing.T) {
	nodes := threeLocations()
	nodes[3].MeshletVersion = "v1" // b-2 (leader of b) runs meshlet; c-1 runs kg
	pl := Compute(topology.Snapshot{Now: now, Nodes: nodes}, selfOf(nodes[1], "eth0"))
	if p := peerByName(t, pl, "b-2"); p.SessionProbe.IsValid() {
		t.Errorf("meshlet peer b-2 has a session probe %v", p.SessionProbe)
	}
	if p := peerByName(t, pl, "c-1"); p.SessionProbe != addr("10.4.0.3") {
		t.Errorf("kg peer c-1: session probe %v, want its WireGuard IP 10.4.0.3", p.SessionProbe)
	}
}

// TestSessionsJudgedForKgPeersOnly: the observed sessions of the planned
// peers under the half-dead rule are judged into the plan; one of a
// meshlet-run peer, or of a peer not planned, is not.
func TestSessionsJudgedForKgPeersOnly(t *testing.T) {
	nodes := threeLocations()
	nodes[3].MeshletVersion = "v1" // b-2 runs meshlet, c-1 kg
	self := selfOf(nodes[1], "eth0")
	unanswered := func(k topology.Key) topology.SessionObservation {
		return topology.SessionObservation{PublicKey: k, At: now, Rx: 1, Tx: 9, Handshake: now.Add(-time.Minute),
			UnansweredFrom: now.Add(-time.Second), UnansweredSeen: now.Add(-900 * time.Millisecond)}
	}
	kg := peerByName(t, Compute(topology.Snapshot{Now: now, Nodes: nodes}, self), "c-1").PublicKey
	ml := peerByName(t, Compute(topology.Snapshot{Now: now, Nodes: nodes}, self), "b-2").PublicKey
	self.Sessions = []topology.SessionObservation{unanswered(ml), unanswered(kg), unanswered(topology.Key{0xee})}
	pl := Compute(topology.Snapshot{Now: now, Nodes: nodes}, self)
	if pl.Sessions == nil || len(pl.Sessions.Probe) != 1 || pl.Sessions.Probe[0] != kg || len(pl.Sessions.Recreate)+len(pl.Sessions.Retry) != 0 {
		t.Fatalf("plan's sessions %+v, want one probe of c-1's", pl.Sessions)
	}
	self.Sessions = nil
	if pl := Compute(topology.Snapshot{Now: now, Nodes: nodes}, self); pl.Sessions != nil {
		t.Errorf("nothing observed, plan's sessions %+v", pl.Sessions)
	}
}

func TestDeterministic(t *testing.T) {
	nodes := threeLocations()
	peers := []topology.Peer{{Name: "z", AllowedIPs: pfxs("10.5.0.9/32"), PublicKey: key(90)}, {Name: "y", AllowedIPs: pfxs("10.5.0.8/32"), PublicKey: key(91)}}
	a := Compute(topology.Snapshot{Now: now, Nodes: nodes, Peers: peers}, selfOf(nodes[1], "eth0"))
	rev := append([]topology.Node(nil), nodes...)
	for i, j := 0, len(rev)-1; i < j; i, j = i+1, j-1 {
		rev[i], rev[j] = rev[j], rev[i]
	}
	b := Compute(topology.Snapshot{Now: now, Nodes: rev, Peers: []topology.Peer{peers[1], peers[0]}}, selfOf(nodes[1], "eth0"))
	if !reflect.DeepEqual(a, b) {
		t.Fatal("plan depends on input order")
	}
}

// TestDiscoveredEndpointsPublishedAsKilo: the discovered-endpoints
// annotation holds what the device learned for segment leaders with a
// keepalive of their own and for every Peer — Kilo's set — not for a leader
// that roams only because this node keeps alive.
func TestDiscoveredEndpointsPublishedAsKilo(t *testing.T) {
	nodes := threeLocations()
	nodes[1].PersistentKeepalive = 25 // this node (a-2) keeps alive: every peer roams
	nodes[4].PersistentKeepalive = 10 // c-1 keeps alive itself
	peers := []topology.Peer{{Name: "laptop", AllowedIPs: pfxs("10.5.0.1/32"), PublicKey: key(90)}}
	self := selfOf(nodes[1], "eth0")
	self.Device = devicePeers(map[topology.Key]netip.AddrPort{
		key(4):  netip.MustParseAddrPort("198.51.100.2:51820"), // b-2: no keepalive of its own
		key(5):  netip.MustParseAddrPort("198.51.100.55:40000"),
		key(90): netip.MustParseAddrPort("198.51.100.90:41000"),
	})
	pl := Compute(topology.Snapshot{Now: now, Nodes: nodes, Peers: peers}, self)
	want := topology.FormatDiscoveredEndpoints(map[topology.Key]netip.AddrPort{
		key(5): netip.MustParseAddrPort("198.51.100.55:40000"), key(90): netip.MustParseAddrPort("198.51.100.90:41000")})
	if got := pl.Annotations[topology.AnnotationDiscoveredEndpoints]; got != want {
		t.Errorf("discovered-endpoints = %s, want %s", got, want)
	}
}

// TestRejectionReporters: one node writes each rejection's Event — the node
// itself for its own annotations when it runs meshlet, else the first
// segment leader (by name) that runs meshlet; nodes run by kg never do.
func TestRejectionReporters(t *testing.T) {
	nodes := threeLocations() // leaders a-2, b-2, c-1
	for i := range nodes {
		nodes[i].MeshletVersion = "v1"
	}
	nodes[1].MeshletVersion = "" // a-2 runs kg
	nodes[0].ForceEndpoint = ""
	snap := topology.Snapshot{Now: now, Nodes: nodes, Rejections: []topology.Rejection{
		{Object: topology.ObjectRef{Kind: "Node", Name: "a-1"}, Field: "kilo.squat.ai/force-endpoint", Reason: topology.ReasonInvalidEndpoint},
		{Object: topology.ObjectRef{Kind: "Node", Name: "a-2"}, Field: "kilo.squat.ai/force-endpoint", Reason: topology.ReasonInvalidEndpoint},
		{Object: topology.ObjectRef{Kind: "Peer", Name: "laptop"}, Reason: topology.ReasonInvalidKey},
	}}
	self := selfOf(nodes[3], "eth0")
	self.Version = "v1"
	pl := Compute(snap, self)
	got := map[string]string{}
	for _, r := range pl.Rejections {
		got[r.Object.String()] = r.Reporter
	}
	want := map[string]string{"Node/a-1": "a-1", "Node/a-2": "b-2", "Peer/laptop": "b-2"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("reporters = %v, want %v", got, want)
	}
}

// TestSelfDecided: what the plan says about this node from what was
// observed: private IP and interface, endpoint (force-endpoint first), MTU.
func TestSelfDecided(t *testing.T) {
	nodes := threeLocations()
	self := topology.Self{Name: "b-2", PublicKey: key(4), DefaultInterface: "ens3", DefaultMTU: 9000, Addresses: []topology.HostAddress{
		{Interface: "ens3", Prefix: pfx("10.0.2.2/24")}, {Interface: "ens3", Prefix: pfx("198.51.100.2/32")}}}
	pl := Compute(topology.Snapshot{Now: now, Nodes: nodes, Settings: topology.Settings{Port: 51821}}, self)
	if pl.PrivateIP != pfx("10.0.2.2/24") || pl.PrivateInterface != "ens3" || pl.Endpoint != "198.51.100.2:51821" || pl.WireGuard.MTU != 8920 {
		t.Errorf("decided %v on %q, endpoint %q, MTU %d", pl.PrivateIP, pl.PrivateInterface, pl.Endpoint, pl.WireGuard.MTU)
	}
	if pl.Annotations[topology.AnnotationEndpoint] != "198.51.100.2:51821" || pl.Annotations[topology.AnnotationInternalIP] != "10.0.2.2/24" {
		t.Errorf("published %v", pl.Annotations)
	}
	nodes[3].ForceEndpoint = "b2.example.net:51820"
	pl = Compute(topology.Snapshot{Now: now, Nodes: nodes, Settings: topology.Settings{MTU: 1380, PrivateIP: pfx("10.0.2.2/16")}}, self)
	if pl.Endpoint != "b2.example.net:51820" || pl.PrivateIP != pfx("10.0.2.2/16") || pl.PrivateInterface != "ens3" || pl.WireGuard.MTU != 1380 {
		t.Errorf("with force-endpoint, --internal-cidr and --mtu: %v on %q, endpoint %q, MTU %d", pl.PrivateIP, pl.PrivateInterface, pl.Endpoint, pl.WireGuard.MTU)
	}
}

// endpointIP is an endpoint's IP (zero for a DNS name or none).
func endpointIP(ep string) netip.Addr {
	ap, err := netip.ParseAddrPort(ep)
	if err != nil {
		return netip.Addr{}
	}
	return ap.Addr()
}

// containedIn reports whether p lies entirely inside one of nets.
func containedIn(p netip.Prefix, nets []netip.Prefix) bool {
	for _, n := range nets {
		if n.Bits() <= p.Bits() && n.Contains(p.Addr()) {
			return true
		}
	}
	return false
}

// TestStatusWriterNamed: with a ClusterMesh, every node's plan names the
// same writer — the first segment's leader when it runs meshlet (self
// always does), else the next segment's meshlet leader; without one,
// nobody writes.
func TestStatusWriterNamed(t *testing.T) {
	nodes := threeLocations()
	for i := range nodes {
		nodes[i].MeshletVersion = "v1"
	}
	mesh := []topology.Mesh{{Namespace: "kilo-system", Name: "prod"}}
	writers := func(nodes []topology.Node, meshes []topology.Mesh) []string {
		var out []string
		for _, n := range nodes {
			if n.MeshletVersion == "" {
				continue // kg runs no planner
			}
			self := selfOf(n, "eth0")
			self.Version = n.MeshletVersion
			if Compute(topology.Snapshot{Now: now, Nodes: nodes, Meshes: meshes}, self).StatusWriter {
				out = append(out, n.Name)
			}
		}
		return out
	}
	if got := writers(nodes, mesh); !reflect.DeepEqual(got, []string{"a-2"}) {
		t.Errorf("writers %v, want [a-2] (location a's leader)", got)
	}
	if got := writers(nodes, nil); got != nil {
		t.Errorf("writers without a ClusterMesh %v, want none", got)
	}
	kgA := slices.Clone(nodes)
	kgA[1].MeshletVersion = "" // location a's leader a-2 runs kg
	if got := writers(kgA, mesh); !reflect.DeepEqual(got, []string{"b-2"}) {
		t.Errorf("writers %v, want [b-2] (location b's leader: a's runs kg)", got)
	}
}
