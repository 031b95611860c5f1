package topology

import (
	"maps"
	"net/netip"
	"testing"
	"time"
)

// TestAnnotations: what this node writes on its Node, in Kilo's formats;
// wireguard-ip only while it leads (else empty, clearing a stale one),
// cni-compatibility-ip only in Cilium mode.
func TestAnnotations(t *testing.T) {
	self := Self{Name: "a-1", PublicKey: key(1), Version: "v1.2.3", CiliumHostIP: pfx("10.244.1.1/32")}
	h := Host{Private: HostAddress{Interface: "eth0", Prefix: pfx("10.0.1.1/24")}, Endpoint: "198.51.100.1:51820"}
	base := map[string]string{
		AnnotationKey: key(1).String(), AnnotationEndpoint: "198.51.100.1:51820", AnnotationInternalIP: "10.0.1.1/24",
		AnnotationLastSeen: "1800000000", AnnotationWireGuardIP: "", AnnotationGranularity: "location", AnnotationVersion: "v1.2.3",
		AnnotationCNICompatibilityIP: "",
	}
	// but is base with the keys and values given (a value "-" removes its key).
	but := func(kv ...string) map[string]string {
		m := maps.Clone(base)
		for i := 0; i < len(kv); i += 2 {
			if kv[i+1] == "-" {
				delete(m, kv[i])
			} else {
				m[kv[i]] = kv[i+1]
			}
		}
		return m
	}
	for _, tc := range []struct {
		name   string
		self   Self
		h      Host
		set    Settings
		wgIP   netip.Prefix
		leader bool
		want   map[string]string
	}{
		{name: "a leader: its WireGuard IP", self: self, h: h, wgIP: pfx("10.4.0.1/16"), leader: true,
			want: but(AnnotationWireGuardIP, "10.4.0.1/16")},
		{name: "a non-leader: wireguard-ip empty", self: self, h: h, want: base},
		{name: "the granularity is --mesh-granularity", self: self, h: h, set: Settings{Granularity: GranularityFull},
			want: but(AnnotationGranularity, "full")},
		{name: "Cilium mode: cilium_host's IP", self: self, h: h, set: Settings{Compatibility: CompatibilityCilium},
			want: but(AnnotationCNICompatibilityIP, "10.244.1.1/32")},
		{name: "Cilium mode without cilium_host: empty", self: Self{PublicKey: key(1), Version: "v1.2.3"}, h: h, set: Settings{Compatibility: CompatibilityCilium}, want: base},
		{name: "no key yet, no address: no key, empty endpoint and internal-ip", self: Self{Version: "v1.2.3"},
			want: but(AnnotationKey, "-", AnnotationEndpoint, "", AnnotationInternalIP, "")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			check(t, "annotations", Annotations(tc.self, tc.h, Defaults(tc.set), now, tc.wgIP, tc.leader), tc.want)
		})
	}
}

// TestCNIRange: with Kilo as the CNI, the IPAM range is the node's pod
// CIDR as its Node says; nothing before it has one, and nothing (rejected)
// while the file cannot be written.
func TestCNIRange(t *testing.T) {
	on := Settings{CNI: true}
	self := Self{Name: "a-1"}
	published := &Node{PodCIDRs: pfxs("10.244.1.7/24", "fd10::/64")}
	for _, tc := range []struct {
		name      string
		set       Settings
		self      Self
		published *Node
		want      netip.Prefix
		wantRejs  []Rejection
	}{
		{name: "not the CNI", self: self, published: published},
		{name: "the Node not known yet", set: on, self: self},
		{name: "no pod CIDR yet", set: on, self: self, published: &Node{}},
		{name: "the first pod CIDR, masked", set: on, self: self, published: published, want: pfx("10.244.1.0/24")},
		{name: "the configuration cannot be written: rejected, left as it is", set: on, self: Self{Name: "a-1", CNI: CNIState{Err: "not JSON"}}, published: published,
			wantRejs: []Rejection{{Object: ObjectRef{Kind: "Node", Name: "a-1"}, Field: "cni-path", Reason: ReasonInvalidCNIConfig,
				Message: "not JSON; the file is left as it is (the install-cni init container writes it)"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, rejs := CNIRange(tc.set, tc.self, tc.published)
			check(t, "range", got, tc.want)
			check(t, "rejections", rejs, tc.wantRejs)
		})
	}
}

// TestDiscoveredToPublish is Kilo's set of discovered endpoints: what the
// device learned (handshakes, usable addresses) for segment leaders that
// keep a keepalive themselves and for every Peer; for remote peers, those
// that roam.
func TestDiscoveredToPublish(t *testing.T) {
	ep := netip.MustParseAddrPort
	a1, a2, b1, b2 := twoLocations()
	b1.PersistentKeepalive = 25
	c1 := mk(5, "c-1", "c", "10.0.3.1/24", "10.0.3.1:51820", "10.244.5.0/24")
	l := local("a-1", seg("location:a", "a", "10.4.0.1", "a-1", a1, a2), seg("location:b", "b", "10.4.0.2", "b-1", b1, b2), seg("location:c", "c", "10.4.0.3", "c-1", c1))
	hs := func(k int, e string) DevicePeer {
		return DevicePeer{PublicKey: key(k), Endpoint: ep(e), Handshake: true}
	}
	peer := func(kind PeerKind, k int, roaming bool) WireGuardPeer {
		return WireGuardPeer{Kind: kind, PublicKey: key(k), Roaming: roaming}
	}
	for _, tc := range []struct {
		name   string
		device []DevicePeer
		peers  []WireGuardPeer
		want   map[Key]netip.AddrPort
	}{
		{name: "a segment leader with a keepalive of its own: published; one without: not",
			device: []DevicePeer{hs(3, "203.0.113.3:4000"), hs(5, "203.0.113.5:4000")},
			peers:  []WireGuardPeer{peer(KindSegment, 3, true), peer(KindSegment, 5, false)},
			want:   map[Key]netip.AddrPort{key(3): ep("203.0.113.3:4000")}},
		{name: "every Peer, roaming or not",
			device: []DevicePeer{hs(20, "203.0.113.20:4000"), hs(21, "203.0.113.21:4000")},
			peers:  []WireGuardPeer{peer(KindPeer, 20, false), peer(KindPeer, 21, true)},
			want:   map[Key]netip.AddrPort{key(20): ep("203.0.113.20:4000"), key(21): ep("203.0.113.21:4000")}},
		{name: "remote peers that roam",
			device: []DevicePeer{hs(30, "203.0.113.30:4000"), hs(31, "203.0.113.31:4000")},
			peers:  []WireGuardPeer{peer(KindRemote, 30, true), peer(KindRemote, 31, false)},
			want:   map[Key]netip.AddrPort{key(30): ep("203.0.113.30:4000")}},
		{name: "nothing learned: no handshake, an unusable address, a device peer not planned",
			device: []DevicePeer{{PublicKey: key(20), Endpoint: ep("203.0.113.20:4000")}, hs(21, "127.0.0.1:4000"), hs(22, "203.0.113.22:4000")},
			peers:  []WireGuardPeer{peer(KindPeer, 20, true), peer(KindPeer, 21, true)},
			want:   map[Key]netip.AddrPort{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			check(t, "published", DiscoveredToPublish(Self{Device: tc.device}, l, tc.peers), tc.want)
		})
	}
}

// TestNormalize: the plan's final form — peers by kind, cluster and name;
// routes one per table and destination (the first), of one address family,
// sorted; rules the same; rejections sorted, de-duplicated, each with the
// node that reports it; empty lists rather than none.
func TestNormalize(t *testing.T) {
	r := func(dst, gw, dev, src string, table int) Route {
		rt := Route{Dst: pfx(dst), Dev: dev, Table: table}
		if gw != "" {
			rt.Gw, rt.OnLink = addr(gw), true
		}
		if src != "" {
			rt.Src = addr(src)
		}
		return rt
	}
	nodeRej := func(cluster, name, msg string) Rejection {
		return Rejection{Object: ObjectRef{Kind: "Node", Cluster: cluster, Name: name}, Field: "f", Reason: ReasonInvalidAnnotation, Message: msg}
	}
	peerRej := Rejection{Object: ObjectRef{Kind: "Peer", Name: "p"}, Field: "spec.publicKey", Reason: ReasonDuplicateKey, Message: "m"}
	reported := func(rj Rejection, by string) Rejection { rj.Reporter = by; return rj }
	empty := Plan{WireGuard: Device{Peers: []WireGuardPeer{}}, Routes: []Route{}, Rules: []Rule{}, Rejections: []Rejection{}}
	a1, a2, b1, b2 := twoLocations()
	kg := func(n *Node) { n.MeshletVersion = "" }
	for _, tc := range []struct {
		name string
		in   Plan
		l    Local
		want Plan
	}{
		{name: "nothing: empty lists", want: empty},
		{name: "peers: segments, Peers, then remote leaders by cluster and name",
			in: Plan{WireGuard: Device{Peers: []WireGuardPeer{
				{Kind: KindRemote, Cluster: "z", Name: "a"}, {Kind: KindPeer, Name: "p"}, {Kind: KindRemote, Cluster: "b", Name: "y"},
				{Kind: KindSegment, Name: "s"}, {Kind: KindRemote, Cluster: "b", Name: "x"},
			}}},
			want: with(empty, func(p *Plan) {
				p.WireGuard.Peers = []WireGuardPeer{{Kind: KindSegment, Name: "s"}, {Kind: KindPeer, Name: "p"},
					{Kind: KindRemote, Cluster: "b", Name: "x"}, {Kind: KindRemote, Cluster: "b", Name: "y"}, {Kind: KindRemote, Cluster: "z", Name: "a"}}
			})},
		{name: "routes: masked, the first per table and destination, sorted by table and destination",
			in: Plan{Routes: []Route{
				r("10.244.3.7/24", "10.4.0.2", "kilo0", "", 0), r("10.0.2.1/32", "10.0.1.1", "tunl0", "", KiloTable), r("10.244.3.0/24", "10.4.0.3", "kilo0", "", 0),
				r("10.0.2.1/32", "10.4.0.2", "kilo0", "", 0), r("10.0.2.1/32", "10.0.1.9", "tunl0", "", KiloTable),
			}},
			want: with(empty, func(p *Plan) {
				p.Routes = []Route{r("10.0.2.1/32", "10.4.0.2", "kilo0", "", 0), r("10.244.3.0/24", "10.4.0.2", "kilo0", "", 0), r("10.0.2.1/32", "10.0.1.1", "tunl0", "", KiloTable)}
			})},
		{name: "one family: a foreign source left out, a foreign gateway too on kilo0; a route needing one elsewhere dropped",
			in: Plan{Routes: []Route{
				r("fd10::/64", "", "kilo0", "10.0.1.1", 0), r("fd11::/64", "10.0.1.1", "tunl0", "10.0.1.2", 0), r("fd12::/64", "10.4.0.2", "kilo0", "10.0.1.1", 0),
			}},
			want: with(empty, func(p *Plan) {
				p.Routes = []Route{r("fd10::/64", "", "kilo0", "", 0), r("fd12::/64", "", "kilo0", "", 0)}
			})},
		{name: "rules: de-duplicated, of one family, sorted",
			in: Plan{Rules: []Rule{
				{Iif: "kilo0", Dst: pfx("10.0.1.2/32"), Table: KiloTable}, {Src: pfx("10.244.1.0/24"), Dst: pfx("10.0.1.2/32"), Table: KiloTable},
				{Iif: "kilo0", Dst: pfx("10.0.1.2/32"), Table: KiloTable}, {Src: pfx("10.244.1.0/24"), Dst: pfx("fd10::1/128"), Table: KiloTable},
				{Src: pfx("10.244.1.0/24"), Dst: pfx("10.0.1.1/32"), Table: KiloTable},
			}},
			want: with(empty, func(p *Plan) {
				p.Rules = []Rule{{Src: pfx("10.244.1.0/24"), Dst: pfx("10.0.1.1/32"), Table: KiloTable},
					{Iif: "kilo0", Dst: pfx("10.0.1.2/32"), Table: KiloTable}, {Src: pfx("10.244.1.0/24"), Dst: pfx("10.0.1.2/32"), Table: KiloTable}}
			})},
		{name: "rejections: sorted, de-duplicated; a meshlet node reports its own, the first meshlet leader by name the rest",
			l: local("a-2", seg("location:a", "a", "10.4.0.1", "a-1", with(a1, kg), a2), seg("location:b", "b", "10.4.0.2", "b-1", b1, with(b2, kg))),
			in: Plan{Rejections: []Rejection{peerRej, nodeRej("", "b-2", "kg's"), nodeRej("", "a-2", "own"), nodeRej("rb", "a-2", "remote"), peerRej,
				nodeRej("", "a-1", "kg leader")}},
			want: with(empty, func(p *Plan) {
				p.Rejections = []Rejection{reported(nodeRej("", "a-1", "kg leader"), "b-1"), reported(nodeRej("", "a-2", "own"), "a-2"),
					reported(nodeRej("", "b-2", "kg's"), "b-1"), reported(peerRej, "b-1"), reported(nodeRej("rb", "a-2", "remote"), "b-1")}
			})},
		{name: "rejections: no meshlet leader: the first other meshlet node reports",
			l:    local("a-1", seg("location:a", "a", "10.4.0.1", "a-1", with(a1, kg), with(a2, kg)), seg("location:b", "b", "10.4.0.2", "b-1", with(b1, kg), b2)),
			in:   Plan{Rejections: []Rejection{peerRej}},
			want: with(empty, func(p *Plan) { p.Rejections = []Rejection{reported(peerRej, "b-2")} })},
		{name: "rejections: no meshlet node Ready: this node reports",
			in:   Plan{Rejections: []Rejection{peerRej}},
			want: with(empty, func(p *Plan) { p.Rejections = []Rejection{reported(peerRej, "self")} })},
	} {
		t.Run(tc.name, func(t *testing.T) {
			check(t, "plan", Normalize(tc.in, tc.l, Defaults(Settings{}), "self"), tc.want)
		})
	}
}

// TestPublishedTunnels: what the node of a key publishes of its tunnels,
// local nodes first, then the remote clusters'.
func TestPublishedTunnels(t *testing.T) {
	snap := Snapshot{
		Nodes:   []Node{{PublicKey: key(1), Tunnels: TunnelsUp}, {PublicKey: key(2)}},
		Remotes: []RemoteCluster{{Nodes: []Node{{PublicKey: key(1), Tunnels: TunnelsDown}, {PublicKey: key(3), Tunnels: TunnelsDown}}}},
	}
	of := PublishedTunnels(snap)
	for _, tc := range []struct {
		name string
		k    Key
		want string
	}{
		{"a local node's", key(1), TunnelsUp},
		{"a local node that publishes nothing", key(2), ""},
		{"a remote node's", key(3), TunnelsDown},
		{"unknown", key(9), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := of(tc.k); got != tc.want {
				t.Errorf("tunnels %q, want %q", got, tc.want)
			}
		})
	}
}

// TestNextReadinessChange: the earliest moment a node fresh now leaves
// Kilo's window — local and remote nodes by last-seen, remote nodes heard
// by this agent by when it heard them; none for a frozen remote cluster.
func TestNextReadinessChange(t *testing.T) {
	seen := func(ago time.Duration) Node { return Node{LastSeen: now.Add(-ago)} }
	heard := func(lastSeenAgo, heardAgo time.Duration) Node {
		return Node{LastSeen: now.Add(-lastSeenAgo), Heard: now.Add(-heardAgo), HeardChange: true}
	}
	for _, tc := range []struct {
		name string
		snap Snapshot
		want time.Time
	}{
		{name: "no node", want: time.Time{}},
		{name: "local nodes: the oldest fresh last-seen + 60 s (never seen or stale ones change nothing)",
			snap: Snapshot{Nodes: []Node{seen(10 * time.Second), seen(30 * time.Second), {}, seen(2 * time.Minute)}},
			want: now.Add(30 * time.Second)},
		{name: "remote nodes without Heard: by their last-seen",
			snap: Snapshot{Nodes: []Node{seen(10 * time.Second)}, Remotes: []RemoteCluster{{Nodes: []Node{seen(45 * time.Second)}}}},
			want: now.Add(15 * time.Second)},
		{name: "remote nodes heard: when heard + 60 s, whatever their clock says",
			snap: Snapshot{Remotes: []RemoteCluster{{Nodes: []Node{heard(5*time.Minute, 20*time.Second), heard(5*time.Minute, 50*time.Second)}}}},
			want: now.Add(10 * time.Second)},
		{name: "a remote node heard just now whose clock is behind: by when heard, not by its last-seen",
			snap: Snapshot{Remotes: []RemoteCluster{{Nodes: []Node{heard(55*time.Second, 5*time.Second)}}}},
			want: now.Add(55 * time.Second)},
		{name: "remote nodes heard and already stale: nothing",
			snap: Snapshot{Remotes: []RemoteCluster{{Nodes: []Node{heard(5*time.Minute, 2*time.Minute)}}}}},
		{name: "a frozen remote cluster (its API unreachable): nothing",
			snap: Snapshot{Remotes: []RemoteCluster{{ObservedAt: now.Add(-time.Minute), Nodes: []Node{seen(10 * time.Second), heard(time.Second, time.Second)}}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.snap.Now = now
			if got := NextReadinessChange(tc.snap); !got.Equal(tc.want) {
				t.Errorf("next change %v, want %v", got, tc.want)
			}
		})
	}
}

// TestWithLastSeen is the heartbeat rule: last-seen and meshlet.io/seen as
// published while meshlet's, fresh and alone; now otherwise.
func TestWithLastSeen(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	ls, seen := AnnotationLastSeen, AnnotationSeen
	for _, tc := range []struct {
		name      string
		published map[string]string
		want      string // the last-seen (and seen) planned
	}{
		{"nothing published yet", nil, "1800000000"},
		{"all current and fresh", map[string]string{AnnotationKey: "k", ls: "1799999990", seen: "1799999990"}, "1799999990"},
		{"refresh due", map[string]string{AnnotationKey: "k", ls: "1799999975", seen: "1799999975"}, "1800000000"},
		{"just younger than the refresh", map[string]string{AnnotationKey: "k", ls: "1799999976", seen: "1799999976"}, "1799999976"},
		{"a value changed: last-seen rides along", map[string]string{AnnotationKey: "old", ls: "1799999999", seen: "1799999999"}, "1800000000"},
		{"a value not published yet", map[string]string{ls: "1799999999", seen: "1799999999"}, "1800000000"},
		{"unparsable last-seen", map[string]string{AnnotationKey: "k", ls: "soon", seen: "soon"}, "1800000000"},
		// kg wrote last-seen after meshlet (or a meshlet before seen
		// existed): written again at once, so others do not take the
		// marks for stale.
		{"last-seen someone else wrote", map[string]string{AnnotationKey: "k", ls: "1799999995", seen: "1799999960"}, "1800000000"},
		{"no seen yet", map[string]string{AnnotationKey: "k", ls: "1799999995"}, "1800000000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := map[string]string{AnnotationKey: "k", ls: FormatLastSeen(now)}
			got := WithLastSeen(want, tc.published, now)
			if got[ls] != tc.want || got[seen] != tc.want || got[AnnotationKey] != "k" || len(got) != 3 {
				t.Errorf("got %v, want last-seen and seen %s", got, tc.want)
			}
		})
	}
}
