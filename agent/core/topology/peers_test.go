package topology

import (
	"net/netip"
	"testing"
)

// TestValidatePeers: Peers as a set, sorted by name; a key already used
// (this node's, a segment leader's, an earlier Peer's) rejects the Peer,
// an allowed IP already claimed (by a segment or an earlier Peer) is
// dropped from it; host bits are masked.
func TestValidatePeers(t *testing.T) {
	p := func(name string, k int, ips ...string) Peer {
		return Peer{Name: name, PublicKey: key(k), AllowedIPs: pfxs(ips...)}
	}
	rej := func(name, field string, reason Reason, msg string) Rejection {
		return Rejection{Object: ObjectRef{Kind: "Peer", Name: name}, Field: field, Reason: reason, Message: msg}
	}
	a1, a2, b1, b2 := twoLocations()
	b1.AllowedLocationIPs = pfxs("192.168.50.0/24")
	withALIP := local("a-2", seg("location:a", "a", "10.4.0.1", "a-1", a1, a2), seg("location:b", "b", "10.4.0.2", "b-1", b1, b2))
	withALIP.Segments[1].AllowedLocationIPs = pfxs("192.168.50.0/24")
	for _, tc := range []struct {
		name     string
		peers    []Peer
		l        Local
		want     []Peer
		wantRejs []Rejection
	}{
		{name: "sorted by name, host bits masked",
			peers: []Peer{p("zeta", 20, "10.5.1.1/24"), p("alpha", 21, "10.5.0.1/32", "fd10::1/64")},
			want:  []Peer{p("alpha", 21, "10.5.0.1/32", "fd10::/64"), p("zeta", 20, "10.5.1.0/24")}},
		{name: "this node's key: OwnKey (a non-leader's own key too)",
			peers:    []Peer{p("mine", 2, "10.5.0.0/24")},
			wantRejs: []Rejection{rej("mine", "spec.publicKey", ReasonOwnKey, "peer uses the public key of node a-2")}},
		{name: "a segment leader's key: DuplicatePublicKey",
			peers:    []Peer{p("imposter", 3, "10.5.0.0/24")},
			wantRejs: []Rejection{rej("imposter", "spec.publicKey", ReasonDuplicateKey, "public key already used by node b-1")}},
		{name: "another non-leader's key is not a WireGuard peer of anyone: accepted",
			peers: []Peer{p("shares-b-2", 4, "10.5.0.0/24")},
			want:  []Peer{p("shares-b-2", 4, "10.5.0.0/24")}},
		{name: "two Peers with one key: the first by name stays, and only it claims its allowed IPs",
			peers:    []Peer{p("b", 20, "10.5.0.0/24", "10.6.0.0/24"), p("a", 20, "10.5.0.0/24"), p("c", 21, "10.6.0.0/24")},
			want:     []Peer{p("a", 20, "10.5.0.0/24"), p("c", 21, "10.6.0.0/24")},
			wantRejs: []Rejection{rej("b", "spec.publicKey", ReasonDuplicateKey, "public key already used by peer a")}},
		{name: "an allowed IP a segment carries stays with it: pod CIDR, private IP, WireGuard IP, allowed-location-ip",
			peers: []Peer{p("greedy", 20, "10.244.3.0/24", "10.0.2.2/32", "10.4.0.1/32", "192.168.50.0/24", "10.5.0.0/24")},
			l:     withALIP,
			want:  []Peer{p("greedy", 20, "10.5.0.0/24")},
			wantRejs: []Rejection{
				rej("greedy", "spec.allowedIPs", ReasonDuplicateAllowedIP, "10.244.3.0/24 already claimed by segment location:b"),
				rej("greedy", "spec.allowedIPs", ReasonDuplicateAllowedIP, "10.0.2.2/32 already claimed by segment location:b"),
				rej("greedy", "spec.allowedIPs", ReasonDuplicateAllowedIP, "10.4.0.1/32 already claimed by segment location:a"),
				rej("greedy", "spec.allowedIPs", ReasonDuplicateAllowedIP, "192.168.50.0/24 already claimed by segment location:b"),
			}},
		{name: "an allowed IP of an earlier Peer: dropped from the later one (after masking)",
			peers:    []Peer{p("b", 21, "10.5.0.9/24", "10.7.0.0/24"), p("a", 20, "10.5.0.0/24")},
			want:     []Peer{p("a", 20, "10.5.0.0/24"), p("b", 21, "10.7.0.0/24")},
			wantRejs: []Rejection{rej("b", "spec.allowedIPs", ReasonDuplicateAllowedIP, "10.5.0.0/24 already claimed by peer a")}},
		{name: "only the same prefix is a duplicate: one containing a segment's is kept (the longest prefix wins)",
			peers: []Peer{p("wide", 20, "10.244.0.0/16")},
			want:  []Peer{p("wide", 20, "10.244.0.0/16")}},
		{name: "every allowed IP claimed: the Peer stays without any (as Kilo's de-duplication leaves it)",
			peers:    []Peer{p("late", 20, "10.244.1.0/24")},
			want:     []Peer{{Name: "late", PublicKey: key(20)}},
			wantRejs: []Rejection{rej("late", "spec.allowedIPs", ReasonDuplicateAllowedIP, "10.244.1.0/24 already claimed by segment location:a")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := tc.l
			if l.Segments == nil {
				l = twoLocationsSeen("a-2")
			}
			in := append([]Peer(nil), tc.peers...)
			got, rejs := ValidatePeers(tc.peers, l, "a-2", key(2))
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

// TestLocalPrefixes: what the local cluster owns — every segment's allowed
// IPs (pod CIDRs, private IPs, WireGuard IP, allowed-location-ips), the
// Peers' allowed IPs, the service CIDRs.
func TestLocalPrefixes(t *testing.T) {
	l := twoLocationsSeen("a-1")
	l.Segments[1].AllowedLocationIPs = pfxs("192.168.50.0/24")
	for _, tc := range []struct {
		name  string
		l     Local
		peers []Peer
		set   Settings
		want  []netip.Prefix
	}{
		{name: "segments, Peers, services", l: l, peers: []Peer{{Name: "p", AllowedIPs: pfxs("10.5.0.0/24")}}, set: Settings{ServiceCIDRs: pfxs("10.96.0.0/12")},
			want: pfxs("10.0.1.1/32", "10.0.1.2/32", "10.0.2.1/32", "10.0.2.2/32", "10.4.0.1/32", "10.4.0.2/32", "10.5.0.0/24", "10.96.0.0/12",
				"10.244.1.0/24", "10.244.2.0/24", "10.244.3.0/24", "10.244.4.0/24", "192.168.50.0/24")},
		{name: "nothing Ready", l: Local{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			check(t, "owned", LocalPrefixes(tc.l, tc.peers, tc.set).set.starts, tc.want)
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
