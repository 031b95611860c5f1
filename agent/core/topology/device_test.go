package topology

import (
	"net/netip"
	"testing"
)

// TestDevicePeers: a leader's device has one peer per segment of another
// location, per Peer and per remote leader (a key used once, the earlier
// kind wins), each with its endpoint, keepalive and roaming rules; the
// first remote leader accepted carries its cluster's Peers and
// allowedNetworks; the peers of a remote cluster not synced yet are kept
// as the device has them.
func TestDevicePeers(t *testing.T) {
	ep := netip.MustParseAddrPort
	// The segment peer of location b on a-1.
	peerB := WireGuardPeer{Name: "b-1", Kind: KindSegment, Location: "b", PublicKey: key(3), Endpoint: "198.51.100.1:51820", EndpointSource: "annotation",
		AllowedIPs: pfxs("10.0.2.1/32", "10.0.2.2/32", "10.4.0.2/32", "10.244.3.0/24", "10.244.4.0/24")}
	site := func(f func(a1, a2, b1, b2 *Node)) Local {
		a1, a2, b1, b2 := twoLocations()
		f(&a1, &a2, &b1, &b2)
		return local("a-1", seg("location:a", "a", "10.4.0.1", "a-1", a1, a2), seg("location:b", "b", "10.4.0.2", "b-1", b1, b2))
	}
	keepalive := func(ka int) Local { return site(func(a1, _, _, _ *Node) { a1.PersistentKeepalive = ka }) }
	// Every node its own segment (full and cross granularity), seen by a-1.
	perNode := func() Local {
		a1, a2, b1, _ := twoLocations()
		return local("a-1", seg("node:a-1", "a", "10.4.0.1", "a-1", a1), seg("node:a-2", "a", "10.4.0.2", "a-2", a2), seg("node:b-1", "b", "10.4.0.3", "b-1", b1))
	}()
	natted := site(func(_, _, b1, _ *Node) { b1.PersistentKeepalive = 25 })
	learned := map[Key]netip.AddrPort{key(3): ep("203.0.113.3:40000"), key(20): ep("203.0.113.20:40000"), key(12): ep("203.0.113.12:40000")}

	// Remote cluster b: leaders bx-1 (location x, with bx-2) and by-1.
	r := remote("rb", "10.5.0.0/16", "10.100.0.0/16", "10.30.1.0/24", "10.97.0.0/16")
	rb := func(f func(bx1, bx2, by1 *Node)) []RemoteCluster {
		bx1 := rnode(11, "bx-1", "x", "10.30.1.1/24", "10.5.0.1/16", "10.100.1.0/24")
		bx2 := rnode(12, "bx-2", "x", "10.30.1.2/24", "", "10.100.2.0/24")
		by1 := rnode(13, "by-1", "y", "10.30.2.1/24", "10.5.0.2/16", "10.100.3.0/24")
		f(&bx1, &bx2, &by1)
		return []RemoteCluster{{Name: "rb", Synced: true, Nodes: []Node{bx1, bx2, by1},
			Peers: []Peer{{Name: "rp", AllowedIPs: pfxs("10.100.200.0/24")}, {Name: "astray", AllowedIPs: pfxs("10.200.0.0/24")}}}}
	}
	synced := rb(func(_, _, _ *Node) {})
	peerBX := WireGuardPeer{Name: "bx-1", Kind: KindRemote, Cluster: "rb", Location: "x", PublicKey: key(11), Endpoint: "10.30.1.1:51820", EndpointSource: "annotation",
		AllowedIPs: pfxs("10.5.0.0/16", "10.5.0.1/32", "10.30.1.0/24", "10.30.1.1/32", "10.30.1.2/32", "10.97.0.0/16", "10.100.0.0/16", "10.100.1.0/24", "10.100.2.0/24", "10.100.200.0/24")}
	peerBY := WireGuardPeer{Name: "by-1", Kind: KindRemote, Cluster: "rb", Location: "y", PublicKey: key(13), Endpoint: "10.30.2.1:51820", EndpointSource: "annotation",
		AllowedIPs: pfxs("10.5.0.2/32", "10.100.3.0/24")}
	segX := SegmentInfo{Name: "location:x", Location: "x", Leader: "bx-1", Nodes: []string{"bx-1", "bx-2"}, WireGuardIP: pfx("10.5.0.1/16")}
	segY := SegmentInfo{Name: "location:y", Location: "y", Leader: "by-1", Nodes: []string{"by-1"}, WireGuardIP: pfx("10.5.0.2/16")}
	info := func(synced bool, leaders []string, segs ...SegmentInfo) RemoteInfo {
		return RemoteInfo{Cluster: "rb", Mesh: "kilo/mesh", AllowedNetworks: r.Networks, Synced: synced, Leaders: leaders, Segments: segs}
	}
	astray := Rejection{Object: ObjectRef{Kind: "Peer", Cluster: "rb", Name: "astray"}, Field: "spec.allowedIPs", Reason: ReasonOutsideAllowed,
		Message: "10.200.0.0/24 is outside the cluster's allowedNetworks"}
	owned := owns("10.244.0.0/16", "10.0.0.0/16", "10.4.0.0/16")

	for _, tc := range []struct {
		name string
		in   DeviceInput
		want DevicePlan
	}{
		{name: "a non-leader: no peer",
			in: DeviceInput{Local: twoLocationsSeen("a-2"), Peers: []Peer{{Name: "p", PublicKey: key(20), AllowedIPs: pfxs("10.5.0.0/24")}}}},
		{name: "a leader: a peer per other segment, its leader's key and endpoint, the segment's allowed IPs",
			in:   DeviceInput{Leader: true, Local: twoLocationsSeen("a-1")},
			want: DevicePlan{Peers: []WireGuardPeer{peerB}}},
		{name: "this node's keepalive on every segment peer: it roams",
			in: DeviceInput{Leader: true, Local: keepalive(25)},
			want: DevicePlan{Peers: []WireGuardPeer{with(peerB, func(p *WireGuardPeer) {
				p.PersistentKeepalive, p.KeepaliveSource, p.Roaming = 25, KeepaliveNodeAnnotation, true
			})}}},
		{name: "a segment leader that keeps a keepalive itself: the discovered endpoint, and it roams",
			in: DeviceInput{Leader: true, Local: natted, Discovered: learned},
			want: DevicePlan{Peers: []WireGuardPeer{with(peerB, func(p *WireGuardPeer) {
				p.Endpoint, p.EndpointSource, p.Roaming = "203.0.113.3:40000", "discovered", true
			})}}},
		{name: "a segment leader without keepalive: its annotation, whatever was discovered (Kilo's rule)",
			in:   DeviceInput{Leader: true, Local: twoLocationsSeen("a-1"), Discovered: learned},
			want: DevicePlan{Peers: []WireGuardPeer{peerB}}},
		{name: "a segment leader run by kg: a session probe at its WireGuard IP",
			in:   DeviceInput{Leader: true, Local: site(func(_, _, b1, _ *Node) { b1.MeshletVersion = "" })},
			want: DevicePlan{Peers: []WireGuardPeer{with(peerB, func(p *WireGuardPeer) { p.SessionProbe = addr("10.4.0.2") })}}},
		{name: "health probes: each other leader's WireGuard IP",
			in: DeviceInput{Settings: Settings{HealthProbes: true}, Leader: true, Local: twoLocationsSeen("a-1")},
			want: DevicePlan{Peers: []WireGuardPeer{peerB},
				Probes: []ProbeTarget{{Name: "b-1", PublicKey: key(3), Addr: addr("10.4.0.2")}}}},
		{name: "full: every other node is a peer, of its own location too",
			in: DeviceInput{Settings: Settings{Granularity: GranularityFull}, Leader: true, Local: perNode},
			want: DevicePlan{Peers: []WireGuardPeer{
				{Name: "a-2", Kind: KindSegment, Location: "a", PublicKey: key(2), Endpoint: "10.0.1.2:51820", EndpointSource: "annotation", AllowedIPs: pfxs("10.0.1.2/32", "10.4.0.2/32", "10.244.2.0/24")},
				{Name: "b-1", Kind: KindSegment, Location: "b", PublicKey: key(3), Endpoint: "198.51.100.1:51820", EndpointSource: "annotation", AllowedIPs: pfxs("10.0.2.1/32", "10.4.0.3/32", "10.244.3.0/24")},
			}}},
		{name: "cross: segments of this location are reached without WireGuard",
			in: DeviceInput{Settings: Settings{Granularity: GranularityCross}, Leader: true, Local: perNode},
			want: DevicePlan{Peers: []WireGuardPeer{
				{Name: "b-1", Kind: KindSegment, Location: "b", PublicKey: key(3), Endpoint: "198.51.100.1:51820", EndpointSource: "annotation", AllowedIPs: pfxs("10.0.2.1/32", "10.4.0.3/32", "10.244.3.0/24")},
			}}},
		{name: "Peers: the spec's endpoint and preshared key; a keepalive by precedence; one with a keepalive takes the discovered endpoint and roams",
			in: DeviceInput{Leader: true, Local: twoLocationsSeen("a-1"), Discovered: learned, Peers: []Peer{
				{Name: "office", PublicKey: key(21), Endpoint: "198.51.100.21:51820", AllowedIPs: pfxs("10.6.0.0/24"), PresharedKey: &Key{7}},
				{Name: "phone", PublicKey: key(20), Endpoint: "198.51.100.20:51820", PersistentKeepalive: 25, AllowedIPs: pfxs("10.5.0.2/32")},
				{Name: "laptop", PublicKey: key(22), AllowedIPs: pfxs("10.5.0.3/32"), NodeKeepalive: []KeepaliveRule{{Value: 10, Location: "a"}}},
			}},
			want: DevicePlan{Peers: []WireGuardPeer{peerB,
				{Name: "office", Kind: KindPeer, PublicKey: key(21), Endpoint: "198.51.100.21:51820", EndpointSource: "spec", AllowedIPs: pfxs("10.6.0.0/24"), PresharedKey: &Key{7}},
				{Name: "phone", Kind: KindPeer, PublicKey: key(20), Endpoint: "203.0.113.20:40000", EndpointSource: "discovered", AllowedIPs: pfxs("10.5.0.2/32"),
					PersistentKeepalive: 25, KeepaliveSource: KeepalivePeerSpec, Roaming: true},
				{Name: "laptop", Kind: KindPeer, PublicKey: key(22), AllowedIPs: pfxs("10.5.0.3/32"), PersistentKeepalive: 10, KeepaliveSource: KeepalivePeerAnnotation, Roaming: true},
			}}},
		{name: "a key used twice: the earlier kind wins; this node's own key is never a peer",
			in: DeviceInput{Self: Self{PublicKey: key(1)}, Leader: true, Local: twoLocationsSeen("a-1"), Peers: []Peer{
				{Name: "twin", PublicKey: key(3), AllowedIPs: pfxs("10.5.0.0/24")},
				{Name: "mirror", PublicKey: key(1), AllowedIPs: pfxs("10.6.0.0/24")},
			}},
			want: DevicePlan{Peers: []WireGuardPeer{peerB}, Rejections: []Rejection{
				{Object: ObjectRef{Kind: "Peer", Name: "twin"}, Field: "key", Reason: ReasonDuplicateKey, Message: "public key already used by segment b-1"},
				{Object: ObjectRef{Kind: "Peer", Name: "mirror"}, Field: "key", Reason: ReasonOwnKey, Message: "peer has this node's public key"},
			}}},
		{name: "a synced remote cluster: a peer per remote leader, the first with the cluster's Peers and allowedNetworks; private IPs only where allowed",
			in: DeviceInput{Settings: Settings{HealthProbes: true}, Leader: true, Local: twoLocationsSeen("a-1"), Remotes: []Remote{r}, States: synced, Claims: owned, Now: now},
			want: DevicePlan{Peers: []WireGuardPeer{peerB, peerBX, peerBY},
				Remotes:    []RemoteInfo{info(true, []string{"bx-1", "by-1"}, segX, segY)},
				Probes:     []ProbeTarget{{Name: "b-1", PublicKey: key(3), Addr: addr("10.4.0.2")}, {Name: "bx-1", Cluster: "rb", PublicKey: key(11), Addr: addr("10.5.0.1")}, {Name: "by-1", Cluster: "rb", PublicKey: key(13), Addr: addr("10.5.0.2")}},
				Rejections: []Rejection{astray}}},
		{name: "a remote node's prefixes the cluster may not claim: left out and reported",
			in: DeviceInput{Leader: true, Local: twoLocationsSeen("a-1"), Remotes: []Remote{r}, Claims: owned, Now: now,
				States: rb(func(_, _, by1 *Node) {
					by1.AllowedLocationIPs, by1.PodCIDRs = pfxs("10.244.9.0/24"), pfxs("10.100.3.0/24", "0.0.0.0/0")
				})},
			want: DevicePlan{Peers: []WireGuardPeer{peerB, peerBX, peerBY},
				Remotes: []RemoteInfo{info(true, []string{"bx-1", "by-1"}, segX, segY)},
				Rejections: []Rejection{astray,
					{Object: ObjectRef{Kind: "Node", Cluster: "rb", Name: "by-1"}, Field: "podCIDRs", Reason: ReasonDefaultRoute, Message: "0.0.0.0/0 is a default route"},
					{Object: ObjectRef{Kind: "Node", Cluster: "rb", Name: "by-1"}, Field: "allowed-location-ips", Reason: ReasonOverlapsLocal, Message: "10.244.9.0/24 lies inside the pod CIDR 10.244.0.0/16 of node local"},
				}}},
		{name: "remote keepalive: the smallest of the entries and the node's; a roaming remote leader takes the discovered endpoint",
			in: func() DeviceInput {
				rk := r
				rk.Entry.PersistentKeepalive, rk.Local.PersistentKeepalive = 25, 20
				return DeviceInput{Leader: true, Local: keepalive(30), Remotes: []Remote{rk}, States: synced, Claims: owned, Now: now, Discovered: map[Key]netip.AddrPort{key(11): ep("203.0.113.11:40000")}}
			}(),
			want: DevicePlan{Peers: []WireGuardPeer{
				with(peerB, func(p *WireGuardPeer) {
					p.PersistentKeepalive, p.KeepaliveSource, p.Roaming = 30, KeepaliveNodeAnnotation, true
				}),
				with(peerBX, func(p *WireGuardPeer) {
					p.Endpoint, p.EndpointSource, p.PersistentKeepalive, p.KeepaliveSource, p.Roaming = "203.0.113.11:40000", "discovered", 20, KeepaliveLocalCluster, true
				}),
				with(peerBY, func(p *WireGuardPeer) {
					p.PersistentKeepalive, p.KeepaliveSource, p.Roaming = 20, KeepaliveLocalCluster, true
				}),
			}, Remotes: []RemoteInfo{info(true, []string{"bx-1", "by-1"}, segX, segY)}, Rejections: []Rejection{astray}}},
		{name: "a remote leader without an endpoint roams; the endpoint chain starts at clustermesh-endpoint, external IPs use the entry's port",
			in: func() DeviceInput {
				rp := r
				rp.Entry.WireGuardPort = 51999
				return DeviceInput{Leader: true, Local: twoLocationsSeen("a-1"), Remotes: []Remote{rp}, Claims: owned, Now: now, Discovered: map[Key]netip.AddrPort{key(13): ep("203.0.113.13:40000")},
					States: rb(func(bx1, _, by1 *Node) { by1.Endpoint, bx1.ExternalIPs = "", []netip.Addr{addr("192.0.2.11")} })}
			}(),
			want: DevicePlan{Peers: []WireGuardPeer{peerB,
				with(peerBX, func(p *WireGuardPeer) { p.Endpoint, p.EndpointSource = "192.0.2.11:51999", "external-ip:51999" }),
				with(peerBY, func(p *WireGuardPeer) {
					p.Endpoint, p.EndpointSource, p.Roaming = "203.0.113.13:40000", "discovered", true
				}),
			}, Remotes: []RemoteInfo{info(true, []string{"bx-1", "by-1"}, segX, segY)}, Rejections: []Rejection{astray}}},
		{name: "a remote leader with a malformed endpoint is skipped: the next carries the cluster's Peers and networks",
			in: DeviceInput{Leader: true, Local: twoLocationsSeen("a-1"), Remotes: []Remote{r}, Claims: owned, Now: now,
				States: rb(func(bx1, _, _ *Node) { bx1.MalformedEndpoint = true })},
			want: DevicePlan{Peers: []WireGuardPeer{peerB, with(peerBY, func(p *WireGuardPeer) {
				p.AllowedIPs = pfxs("10.5.0.0/16", "10.5.0.2/32", "10.30.1.0/24", "10.97.0.0/16", "10.100.0.0/16", "10.100.3.0/24", "10.100.200.0/24")
			})}, Remotes: []RemoteInfo{info(true, []string{"by-1"}, segX, segY)}, Rejections: []Rejection{
				{Object: ObjectRef{Kind: "Node", Cluster: "rb", Name: "bx-1"}, Field: "endpoint", Reason: ReasonInvalidEndpoint, Message: "malformed clustermesh-endpoint or force-endpoint: node skipped"},
				astray,
			}}},
		{name: "a remote leader with a key in use here: rejected, the next carries the cluster's Peers and networks",
			in: DeviceInput{Leader: true, Local: twoLocationsSeen("a-1"), Remotes: []Remote{r}, Claims: owned, Now: now,
				States: rb(func(bx1, _, _ *Node) { bx1.PublicKey = key(3) })},
			want: DevicePlan{Peers: []WireGuardPeer{peerB, with(peerBY, func(p *WireGuardPeer) {
				p.AllowedIPs = pfxs("10.5.0.0/16", "10.5.0.2/32", "10.30.1.0/24", "10.97.0.0/16", "10.100.0.0/16", "10.100.3.0/24", "10.100.200.0/24")
			})}, Remotes: []RemoteInfo{info(true, []string{"by-1"}, segX, segY)}, Rejections: []Rejection{
				astray,
				{Object: ObjectRef{Kind: "Node", Cluster: "rb", Name: "bx-1"}, Field: "key", Reason: ReasonDuplicateKey, Message: "public key already used by segment b-1"},
				astray, // clipped again for by-1; Normalize de-duplicates
			}}},
		{name: "a remote cluster not synced yet: the device's peers inside its networks are kept as they are",
			in: DeviceInput{Leader: true, Local: twoLocationsSeen("a-1"), Remotes: []Remote{r}, States: []RemoteCluster{{Name: "rb"}}, Claims: owned, Now: now,
				Self: Self{Device: []DevicePeer{
					{PublicKey: key(30), Endpoint: ep("203.0.113.30:51820"), AllowedIPs: pfxs("10.100.1.0/24", "10.5.0.1/32", "10.100.1.0/24"), PersistentKeepalive: 25},
					{PublicKey: key(31), AllowedIPs: pfxs("10.100.2.0/24")},
					{PublicKey: key(32), AllowedIPs: pfxs("10.100.3.0/24", "192.168.0.0/24")},
					{PublicKey: key(33)},
					{PublicKey: key(3), AllowedIPs: pfxs("10.100.4.0/24")},
				}}},
			want: DevicePlan{Peers: []WireGuardPeer{peerB,
				{Name: "preserved", Kind: KindRemote, PublicKey: key(30), Endpoint: "203.0.113.30:51820", EndpointSource: "device", AllowedIPs: pfxs("10.5.0.1/32", "10.100.1.0/24"), PersistentKeepalive: 25, Roaming: true},
				{Name: "preserved", Kind: KindRemote, PublicKey: key(31), EndpointSource: "device", AllowedIPs: pfxs("10.100.2.0/24"), Roaming: true},
			}, Remotes: []RemoteInfo{info(false, nil)}}},
		{name: "a non-leader: remote clusters described, no peer, nothing kept",
			in: DeviceInput{Local: twoLocationsSeen("a-2"), Remotes: []Remote{r}, States: synced, Claims: owned, Now: now,
				Self: Self{Device: []DevicePeer{{PublicKey: key(30), AllowedIPs: pfxs("10.100.1.0/24")}}}},
			want: DevicePlan{Remotes: []RemoteInfo{info(true, nil)}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := tc.in
			in.Settings = Defaults(in.Settings)
			check(t, "device", DevicePeers(in), tc.want)
		})
	}
}
