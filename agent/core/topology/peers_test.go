package topology

import (
	"net/netip"
	"testing"
	"time"
)

// TestValidatePeers: Peers as a set, oldest first (then by name); a key
// already used (this node's, a segment leader's, an older Peer's) rejects
// the Peer; each allowed IP is a claim (claims.go): too broad, or
// overlapping — equal, inside or containing — a node's address, a remote
// cluster's reservation or an older Peer's allowed IP, it is dropped and
// the Peer keeps the rest; host bits are masked.
func TestValidatePeers(t *testing.T) {
	p := func(name string, k int, ips ...string) Peer {
		return Peer{Name: name, PublicKey: key(k), AllowedIPs: pfxs(ips...)}
	}
	aged := func(pr Peer, minutes int) Peer {
		pr.Created = time.Unix(0, 0).Add(time.Duration(minutes) * time.Minute)
		return pr
	}
	rej := func(name string, reason Reason, msg string) Rejection {
		return Rejection{Object: ObjectRef{Kind: "Peer", Name: name}, Field: "spec.allowedIPs", Reason: reason, Message: msg}
	}
	keyRej := func(name string, reason Reason, msg string) Rejection {
		return Rejection{Object: ObjectRef{Kind: "Peer", Name: name}, Field: "spec.publicKey", Reason: reason, Message: msg}
	}
	dup := ReasonDuplicateAllowedIP
	for _, tc := range []struct {
		name     string
		peers    []Peer
		reserved []string // a remote cluster's allowedNetworks
		want     []Peer
		wantRejs []Rejection
	}{
		{name: "sorted by name when of one age, host bits masked",
			peers: []Peer{p("zeta", 20, "10.5.1.1/24"), p("alpha", 21, "10.5.0.1/32", "fd10::1/64")},
			want:  []Peer{p("alpha", 21, "10.5.0.1/32", "fd10::/64"), p("zeta", 20, "10.5.1.0/24")}},
		{name: "this node's key: OwnKey (a non-leader's own key too)",
			peers:    []Peer{p("mine", 2, "10.5.0.0/24")},
			wantRejs: []Rejection{keyRej("mine", ReasonOwnKey, "peer uses the public key of node a-2")}},
		{name: "a segment leader's key: DuplicatePublicKey",
			peers:    []Peer{p("imposter", 3, "10.5.0.0/24")},
			wantRejs: []Rejection{keyRej("imposter", ReasonDuplicateKey, "public key already used by node b-1")}},
		{name: "another non-leader's key is not a WireGuard peer of anyone: accepted",
			peers: []Peer{p("shares-b-2", 4, "10.5.0.0/24")},
			want:  []Peer{p("shares-b-2", 4, "10.5.0.0/24")}},
		{name: "two Peers with one key: the older stays (not the one whose name sorts first), and only it claims its allowed IPs",
			peers:    []Peer{aged(p("b", 20, "10.5.0.0/24", "10.6.0.0/24"), 1), aged(p("a", 20, "10.5.0.0/24"), 2), aged(p("c", 21, "10.6.0.0/24"), 3)},
			want:     []Peer{aged(p("b", 20, "10.5.0.0/24", "10.6.0.0/24"), 1), aged(Peer{Name: "c", PublicKey: key(21)}, 3)},
			wantRejs: []Rejection{keyRej("a", ReasonDuplicateKey, "public key already used by peer b"), rej("c", dup, "10.6.0.0/24 is 10.6.0.0/24 of Peer b")}},
		{name: "a node's addresses stay with it: pod CIDR, private IP, WireGuard IP, equal or more specific",
			peers: []Peer{p("greedy", 20, "10.244.3.0/24", "10.0.2.2/32", "10.4.0.1/32", "10.244.4.128/25", "10.5.0.0/24")},
			want:  []Peer{p("greedy", 20, "10.5.0.0/24")},
			wantRejs: []Rejection{
				rej("greedy", dup, "10.244.3.0/24 is the pod CIDR 10.244.3.0/24 of node b-1"),
				rej("greedy", dup, "10.0.2.2/32 is the private IP 10.0.2.2 of node b-2"),
				rej("greedy", dup, "10.4.0.1/32 is the WireGuard IP 10.4.0.1 of segment location:a"),
				rej("greedy", dup, "10.244.4.128/25 lies inside the pod CIDR 10.244.4.0/24 of node b-2"),
			}},
		{name: "a prefix containing a node's address: dropped too (the node's route would win on the node, not on the device)",
			peers:    []Peer{p("wide", 20, "10.244.0.0/16", "10.9.0.0/16")},
			want:     []Peer{p("wide", 20, "10.9.0.0/16")},
			wantRejs: []Rejection{rej("wide", dup, "10.244.0.0/16 contains the pod CIDR 10.244.1.0/24 of node a-1")}},
		{name: "a node's private network is not the node's: a Peer may claim an address of the LAN",
			peers: []Peer{p("lan", 20, "10.0.1.200/32")},
			want:  []Peer{p("lan", 20, "10.0.1.200/32")}},
		{name: "an older Peer keeps its addresses against a newer one whose name sorts first: equal, inside, containing",
			peers: []Peer{aged(p("zz-old", 21, "10.5.0.0/24", "10.7.0.0/24", "10.8.1.0/24"), 1),
				aged(p("aa-new", 20, "10.5.0.9/24", "10.7.0.7/32", "10.8.0.0/16", "10.9.0.0/24"), 2)},
			want: []Peer{aged(p("zz-old", 21, "10.5.0.0/24", "10.7.0.0/24", "10.8.1.0/24"), 1), aged(p("aa-new", 20, "10.9.0.0/24"), 2)},
			wantRejs: []Rejection{
				rej("aa-new", dup, "10.5.0.0/24 is 10.5.0.0/24 of Peer zz-old"),
				rej("aa-new", dup, "10.7.0.7/32 lies inside 10.7.0.0/24 of Peer zz-old"),
				rej("aa-new", dup, "10.8.0.0/16 contains 10.8.1.0/24 of Peer zz-old"),
			}},
		{name: "a default route, its two halves, anything broader than /8 or /16: refused, the rest kept",
			peers: []Peer{p("exit", 20, "0.0.0.0/0", "0.0.0.0/1", "128.0.0.0/1", "::/0", "2000::/3", "11.0.0.0/7", "12.0.0.0/8", "fd20::/16")},
			want:  []Peer{p("exit", 20, "12.0.0.0/8", "fd20::/16")},
			wantRejs: []Rejection{
				rej("exit", ReasonDefaultRoute, "0.0.0.0/0 is a default route"),
				rej("exit", ReasonTooBroad, "0.0.0.0/1 is broader than /8, the widest prefix meshlet routes for anyone"),
				rej("exit", ReasonTooBroad, "128.0.0.0/1 is broader than /8, the widest prefix meshlet routes for anyone"),
				rej("exit", ReasonDefaultRoute, "::/0 is a default route"),
				rej("exit", ReasonTooBroad, "2000::/3 is broader than /16, the widest prefix meshlet routes for anyone"),
				rej("exit", ReasonTooBroad, "10.0.0.0/7 is broader than /8, the widest prefix meshlet routes for anyone"),
			}},
		{name: "a remote cluster's reservation: no Peer claims inside it (or around it)",
			peers: []Peer{p("thief", 20, "10.101.0.0/16", "10.101.3.0/24", "10.100.0.0/14", "10.5.0.0/24")}, reserved: []string{"10.101.0.0/16"},
			want: []Peer{p("thief", 20, "10.5.0.0/24")},
			wantRejs: []Rejection{
				rej("thief", dup, "10.101.0.0/16 is 10.101.0.0/16, reserved for remote cluster b by its ClusterMesh"),
				rej("thief", dup, "10.101.3.0/24 lies inside 10.101.0.0/16, reserved for remote cluster b by its ClusterMesh"),
				rej("thief", dup, "10.100.0.0/14 contains 10.101.0.0/16, reserved for remote cluster b by its ClusterMesh"),
			}},
		{name: "every allowed IP refused: the Peer stays without any (as Kilo's de-duplication leaves it)",
			peers:    []Peer{p("late", 20, "10.244.1.0/24")},
			want:     []Peer{{Name: "late", PublicKey: key(20)}},
			wantRejs: []Rejection{rej("late", dup, "10.244.1.0/24 is the pod CIDR 10.244.1.0/24 of node a-1")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := twoLocationsSeen("a-2")
			cs, rejs := ClaimNodeAddresses(l, nodesOf(l), Settings{})
			if len(rejs) > 0 {
				t.Fatalf("the nodes' claims: %v", rejs)
			}
			if len(tc.reserved) > 0 {
				_, rejs := ResolveRemotes([]Mesh{{Namespace: "kilo", Name: "m", Clusters: []MeshCluster{{Name: "here", Local: true},
					{Name: "b", AllowedNetworks: pfxs(tc.reserved...)}}}}, Defaults(Settings{}), cs)
				if len(rejs) > 0 {
					t.Fatalf("the reservation: %v", rejs)
				}
			}
			in := append([]Peer(nil), tc.peers...)
			got, rejs := ValidatePeers(tc.peers, l, "a-2", key(2), cs)
			check(t, "peers", got, tc.want)
			check(t, "rejections", rejs, tc.wantRejs)
			check(t, "the input afterwards", tc.peers, in)
		})
	}
}

// TestDiscovered: the endpoints learned, first wins: this node's device
// (handshakes only), its own annotation, then every segment's nodes in
// segment order; unusable addresses are skipped.
func TestDiscovered(t *testing.T) {
	ep := netip.MustParseAddrPort
	hs := func(k int, e string) DevicePeer {
		return DevicePeer{PublicKey: key(k), Endpoint: ep(e), Handshake: true}
	}
	disc := func(n Node, m map[Key]netip.AddrPort) Node { n.DiscoveredEndpoints = m; return n }
	a1, a2, b1, b2 := twoLocations()
	site := func(self string, a1, a2, b1, b2 Node) Local {
		return local(self, seg("location:a", "a", "10.4.0.1", "a-1", a1, a2), seg("location:b", "b", "10.4.0.2", "b-1", b1, b2))
	}
	for _, tc := range []struct {
		name   string
		device []DevicePeer
		l      Local
		want   map[Key]netip.AddrPort
	}{
		{name: "nothing learned", l: site("a-1", a1, a2, b1, b2), want: map[Key]netip.AddrPort{}},
		{name: "the device's handshakes first",
			device: []DevicePeer{hs(20, "198.51.100.20:4000"), {PublicKey: key(21), Endpoint: ep("198.51.100.21:4000")}, {PublicKey: key(22), Handshake: true}},
			l:      site("a-1", disc(a1, map[Key]netip.AddrPort{key(20): ep("198.51.100.99:1")}), a2, b1, b2),
			want:   map[Key]netip.AddrPort{key(20): ep("198.51.100.20:4000")}},
		{name: "this node's annotation before the segments' (it is not the first node)",
			l:    site("b-2", disc(a1, map[Key]netip.AddrPort{key(20): ep("198.51.100.1:1")}), a2, b1, disc(b2, map[Key]netip.AddrPort{key(20): ep("198.51.100.2:2")})),
			want: map[Key]netip.AddrPort{key(20): ep("198.51.100.2:2")}},
		{name: "then the segments in order, their nodes in order",
			l: site("", a1, disc(a2, map[Key]netip.AddrPort{key(20): ep("198.51.100.2:2"), key(21): ep("198.51.100.2:3")}),
				disc(b1, map[Key]netip.AddrPort{key(20): ep("198.51.100.3:2"), key(22): ep("198.51.100.3:3")}), b2),
			want: map[Key]netip.AddrPort{key(20): ep("198.51.100.2:2"), key(21): ep("198.51.100.2:3"), key(22): ep("198.51.100.3:3")}},
		{name: "loopback, link-local, unspecified or port 0: skipped, a later source may give one",
			device: []DevicePeer{hs(20, "127.0.0.1:4000"), hs(21, "[fe80::1]:4000"), hs(22, "0.0.0.0:4000"), hs(23, "198.51.100.23:0")},
			l:      site("a-1", disc(a1, map[Key]netip.AddrPort{key(20): ep("198.51.100.20:1")}), a2, b1, b2),
			want:   map[Key]netip.AddrPort{key(20): ep("198.51.100.20:1")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			check(t, "discovered", Discovered(Self{Name: "a-1", Device: tc.device}, tc.l), tc.want)
		})
	}
}

// TestPeerKeepalive is precedence rule 1: the first of the Peer's
// node-persistent-keepalive rules matching this node (by location or by
// labels), else its spec, else this node's annotation.
func TestPeerKeepalive(t *testing.T) {
	self := mk(1, "a-1", "a", "10.0.1.1/24", "10.0.1.1:51820", "10.244.1.0/24")
	self.Labels = map[string]string{"nat": "yes", "zone": "z1"}
	self.PersistentKeepalive = 30
	rules := func(rs ...KeepaliveRule) Peer { return Peer{Name: "p", PersistentKeepalive: 25, NodeKeepalive: rs} }
	for _, tc := range []struct {
		name string
		peer Peer
		self Node
		set  Settings
		ka   int
		src  KeepaliveSource
	}{
		{"a rule for this location", rules(KeepaliveRule{Value: 10, Location: "b"}, KeepaliveRule{Value: 15, Location: "a"}), self, Settings{}, 15, KeepalivePeerAnnotation},
		{"a rule selecting this node's labels", rules(KeepaliveRule{Value: 10, NodeSelector: map[string]string{"nat": "yes", "zone": "z1"}}), self, Settings{}, 10, KeepalivePeerAnnotation},
		{"the first matching rule wins", rules(KeepaliveRule{Value: 10, NodeSelector: map[string]string{"nat": "yes"}}, KeepaliveRule{Value: 15, Location: "a"}), self, Settings{}, 10, KeepalivePeerAnnotation},
		{"a rule of 0 turns the keepalive off", rules(KeepaliveRule{Value: 0, Location: "a"}), self, Settings{}, 0, KeepalivePeerAnnotation},
		{"a location rule matches the topology label too", rules(KeepaliveRule{Value: 15, Location: "eu"}),
			with(self, func(n *Node) {
				n.LocationAnnotation, n.Labels = "", map[string]string{"topology.kubernetes.io/region": "eu"}
			}), Settings{}, 15, KeepalivePeerAnnotation},
		{"no rule matches (a label differs, an empty rule): the spec", rules(KeepaliveRule{Value: 10, NodeSelector: map[string]string{"nat": "no"}}, KeepaliveRule{Value: 5}), self, Settings{}, 25, KeepalivePeerSpec},
		{"no spec: this node's annotation", Peer{Name: "p"}, self, Settings{}, 30, KeepaliveNodeAnnotation},
		{"nothing: none", Peer{Name: "p"}, with(self, func(n *Node) { n.PersistentKeepalive = 0 }), Settings{}, 0, KeepaliveNone},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ka, src := peerKeepalive(tc.peer, &tc.self, Defaults(tc.set))
			if ka != tc.ka || src != tc.src {
				t.Errorf("keepalive %d (%s), want %d (%s)", ka, src, tc.ka, tc.src)
			}
		})
	}
}
