package topology

import (
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestFindLeader(t *testing.T) {
	mk := func(name, ep string, leader bool) *Node {
		return &Node{Name: name, Endpoint: ep, Leader: leader}
	}
	for _, tc := range []struct {
		name  string
		nodes []*Node
		want  string
	}{
		{"first when nothing stands out", []*Node{mk("a", "10.0.0.1:1", false), mk("b", "10.0.0.2:1", false)}, "a"},
		{"public endpoint wins", []*Node{mk("a", "10.0.0.1:1", false), mk("b", "1.2.3.4:1", false)}, "b"},
		{"annotation beats public", []*Node{mk("a", "1.2.3.4:1", false), mk("b", "10.0.0.2:1", true)}, "b"},
		{"annotated and public beats annotated", []*Node{mk("a", "10.0.0.1:1", true), mk("b", "1.2.3.4:1", true)}, "b"},
		{"DNS endpoint is not public", []*Node{mk("a", "10.0.0.1:1", false), mk("b", "vpn.example.com:1", false)}, "a"},
		{"IPv6 ULA is private", []*Node{mk("a", "[fd00::1]:1", false), mk("b", "[2001:db8::1]:1", false)}, "b"},
		{"172.16/12 is private", []*Node{mk("a", "172.20.0.1:1", false), mk("b", "172.32.0.1:1", false)}, "b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.nodes[findLeader(tc.nodes)].Name; got != tc.want {
				t.Errorf("leader = %s, want %s", got, tc.want)
			}
		})
	}
}

// TestNotReadyAgreesWithReady: the reasons diagnose prints are exactly the
// rule the planner applies.
func TestNotReadyAgreesWithReady(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	good := Node{Name: "n", Endpoint: "1.2.3.4:51820", PublicKey: Key{1}, PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.2.0.0/24")},
		LastSeen: now.Add(-10 * time.Second)}
	for _, tc := range []struct {
		name   string
		change func(*Node)
		want   []string
	}{
		{"ready", func(*Node) {}, nil},
		{"no endpoint", func(n *Node) { n.Endpoint = "" }, []string{"no endpoint"}},
		{"no key", func(n *Node) { n.PublicKey = Key{} }, []string{"no WireGuard public key"}},
		{"no pod CIDR", func(n *Node) { n.PodCIDRs = nil }, []string{"no pod CIDR"}},
		{"never seen", func(n *Node) { n.LastSeen = time.Time{} }, []string{"never seen (no last-seen)"}},
		{"stale", func(n *Node) { n.LastSeen = now.Add(-90 * time.Second) }, []string{"last seen 1m30s ago (Kilo's window is 1m0s)"}},
		{"at the window", func(n *Node) { n.LastSeen = now.Add(-ReadyWindow) }, []string{"last seen 1m0s ago (Kilo's window is 1m0s)"}},
		{"two reasons", func(n *Node) { n.Endpoint, n.PodCIDRs = "", nil }, []string{"no endpoint", "no pod CIDR"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := good
			tc.change(&n)
			got := NotReady(n, now)
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("NotReady = %q, want %q", got, tc.want)
			}
			if ready(&n, now) != (len(got) == 0) {
				t.Errorf("ready = %v but NotReady = %q", ready(&n, now), got)
			}
		})
	}
}

// TestSegments is Kilo's topology: Ready nodes grouped by granularity,
// segments sorted by key and numbered from the subnet, leaders by Kilo's
// rule, this node with its live facts, allowed-location-ips filtered.
func TestSegments(t *testing.T) {
	a1, a2, b1, b2 := twoLocations()
	sv := func(key, loc, wg, leader string, nodes ...string) segmentView {
		v := segmentView{Key: key, Location: loc, Leader: leader, Nodes: nodes}
		if wg != "" {
			v.WireGuardIP = addr(wg)
		}
		return v
	}
	alips := func(v segmentView, ps ...string) segmentView { v.AllowedLocationIPs = pfxs(ps...); return v }
	dropped := func(owner, msg string) Rejection {
		return Rejection{Object: ObjectRef{Kind: "Node", Name: owner}, Field: "allowed-location-ips", Reason: ReasonNetworksOverlap, Message: msg}
	}
	noIP := func(name, leader string) Rejection {
		return Rejection{Object: ObjectRef{Kind: "Node", Name: leader}, Field: "wireguard-ip", Reason: ReasonInvalidCIDR,
			Message: "mesh subnet 10.4.0.0/31 has no address left for segment " + name}
	}
	alip := func(n Node, ps ...string) Node { n.AllowedLocationIPs = pfxs(ps...); return n }
	label := func(n Node, labels map[string]string) Node { n.LocationAnnotation, n.Labels = "", labels; return n }
	mesh := []Mesh{{Namespace: "kilo", Name: "m", Clusters: []MeshCluster{
		{Name: "here", Local: true, AllowedNetworks: pfxs("10.244.0.0/16")},
		{Name: "there", AllowedNetworks: pfxs("10.96.0.0/16", "172.30.0.0/16")},
	}}}
	for _, tc := range []struct {
		name     string
		nodes    []Node
		peers    []Peer
		meshes   []Mesh
		set      Settings
		self     Self
		host     Host
		want     localView
		wantSelf *Node // the node with its live facts, when checked
	}{
		{name: "location: one segment per location, sorted by key, numbered in that order, leaders by Kilo's rule",
			nodes: []Node{b2, a2, b1, a1},
			want: localView{Segments: []segmentView{
				sv("location:a", "a", "10.4.0.1", "a-1", "a-1", "a-2"),
				sv("location:b", "b", "10.4.0.2", "b-1", "b-1", "b-2"), // b-1's endpoint is public
			}}},
		{name: "the leader: annotation and public endpoint, else annotation, else public endpoint, else the first by name",
			nodes: []Node{
				mk(1, "a-1", "a", "10.0.1.1/24", "10.0.1.1:51820", "10.244.1.0/24"),
				with(mk(2, "a-2", "a", "10.0.1.2/24", "10.0.1.2:51820", "10.244.2.0/24"), func(n *Node) { n.Leader = true }),
				mk(3, "a-3", "a", "10.0.1.3/24", "198.51.100.3:51820", "10.244.3.0/24"),
				with(mk(4, "a-4", "a", "10.0.1.4/24", "198.51.100.4:51820", "10.244.4.0/24"), func(n *Node) { n.Leader = true }),
				mk(5, "b-1", "b", "10.0.2.1/24", "10.0.2.1:51820", "10.244.5.0/24"),
				with(mk(6, "b-2", "b", "10.0.2.2/24", "10.0.2.2:51820", "10.244.6.0/24"), func(n *Node) { n.Leader = true }),
				mk(7, "b-3", "b", "10.0.2.3/24", "198.51.100.7:51820", "10.244.7.0/24"),
				mk(8, "c-1", "c", "10.0.3.1/24", "10.0.3.1:51820", "10.244.8.0/24"),
				mk(9, "c-2", "c", "10.0.3.2/24", "[2001:db8::9]:51820", "10.244.9.0/24"),
				mk(10, "d-1", "d", "10.0.4.1/24", "vpn.example.com:51820", "10.244.10.0/24"),
				mk(11, "d-2", "d", "10.0.4.2/24", "100.64.0.11:51820", "10.244.11.0/24"), // CGNAT is public to Kilo
			},
			want: localView{Segments: []segmentView{
				sv("location:a", "a", "10.4.0.1", "a-4", "a-1", "a-2", "a-3", "a-4"),
				sv("location:b", "b", "10.4.0.2", "b-2", "b-1", "b-2", "b-3"),
				sv("location:c", "c", "10.4.0.3", "c-2", "c-1", "c-2"),
				sv("location:d", "d", "10.4.0.4", "d-2", "d-1", "d-2"),
			}}},
		{name: "the location is the annotation, else the topology label",
			nodes: []Node{label(a1, map[string]string{"topology.kubernetes.io/region": "eu"}), a2,
				with(label(b1, map[string]string{"topology.kubernetes.io/region": "eu"}), func(n *Node) { n.LocationAnnotation = "a" })},
			want: localView{Segments: []segmentView{
				sv("location:a", "a", "10.4.0.1", "b-1", "a-2", "b-1"),
				sv("location:eu", "eu", "10.4.0.2", "a-1", "a-1"),
			}}},
		{name: "--topology-label names the label",
			nodes: []Node{label(a1, map[string]string{"zone": "z1", "topology.kubernetes.io/region": "eu"}), label(b1, map[string]string{"zone": "z2"})},
			set:   Settings{TopologyLabel: "zone"},
			want: localView{Segments: []segmentView{
				sv("location:z1", "z1", "10.4.0.1", "a-1", "a-1"),
				sv("location:z2", "z2", "10.4.0.2", "b-1", "b-1"),
			}}},
		{name: "a node without internal IP is its own segment",
			nodes: []Node{a1, with(a2, func(n *Node) { n.InternalIP = netip.Prefix{} })},
			want: localView{Segments: []segmentView{
				sv("location:a", "a", "10.4.0.1", "a-1", "a-1"),
				sv("node:a-2", "a", "10.4.0.2", "a-2", "a-2"),
			}}},
		{name: "full: every node is a segment",
			nodes: []Node{a1, a2, b1}, set: Settings{Granularity: GranularityFull},
			want: localView{Segments: []segmentView{
				sv("node:a-1", "a", "10.4.0.1", "a-1", "a-1"),
				sv("node:a-2", "a", "10.4.0.2", "a-2", "a-2"),
				sv("node:b-1", "b", "10.4.0.3", "b-1", "b-1"),
			}}},
		{name: "cross: every node is a segment that keeps its location",
			nodes: []Node{b1, a1, a2}, set: Settings{Granularity: GranularityCross},
			want: localView{Segments: []segmentView{
				sv("node:a-1", "a", "10.4.0.1", "a-1", "a-1"),
				sv("node:a-2", "a", "10.4.0.2", "a-2", "a-2"),
				sv("node:b-1", "b", "10.4.0.3", "b-1", "b-1"),
			}}},
		{name: "readiness: no endpoint, no key, no pod CIDR, never seen, or seen at the window's end: left out",
			nodes: []Node{a1,
				with(a2, func(n *Node) { n.Endpoint = "" }),
				with(b1, func(n *Node) { n.PublicKey = Key{} }),
				with(b2, func(n *Node) { n.PodCIDRs = nil }),
				with(mk(5, "c-1", "c", "10.0.3.1/24", "10.0.3.1:51820", "10.244.5.0/24"), func(n *Node) { n.LastSeen = time.Time{} }),
				with(mk(6, "c-2", "c", "10.0.3.2/24", "10.0.3.2:51820", "10.244.6.0/24"), func(n *Node) { n.LastSeen = now.Add(-ReadyWindow) }),
				with(mk(7, "c-3", "c", "10.0.3.3/24", "10.0.3.3:51820", "10.244.7.0/24"), func(n *Node) {
					n.LastSeen = now.Add(-ReadyWindow + time.Second)
					n.Ready = false // the kubelet's condition is not Kilo's rule
				}),
			},
			want: localView{Segments: []segmentView{
				sv("location:a", "a", "10.4.0.1", "a-1", "a-1"),
				sv("location:c", "c", "10.4.0.2", "c-3", "c-3"),
			}}},
		{name: "--subnet: numbered from its network address",
			nodes: []Node{a1, b1}, set: Settings{Subnet: pfx("10.10.0.7/24")},
			want: localView{Segments: []segmentView{
				sv("location:a", "a", "10.10.0.1", "a-1", "a-1"),
				sv("location:b", "b", "10.10.0.2", "b-1", "b-1"),
			}}},
		{name: "the subnet exhausted: later segments have no WireGuard IP, reported on their leaders",
			nodes: []Node{a1, b1, mk(5, "c-1", "c", "10.0.3.1/24", "10.0.3.1:51820", "10.244.5.0/24")}, set: Settings{Subnet: pfx("10.4.0.0/31")},
			want: localView{Segments: []segmentView{
				sv("location:a", "a", "10.4.0.1", "a-1", "a-1"),
				sv("location:b", "b", "", "b-1", "b-1"),
				sv("location:c", "c", "", "c-1", "c-1"),
			}, Rejections: []Rejection{noIP("location:b", "b-1"), noIP("location:c", "c-1")}}},
		{name: "this node with its live facts: Ready before its annotations round-trip",
			nodes: []Node{a1, {Name: "a-2", LocationAnnotation: "a", PodCIDRs: pfxs("10.244.2.0/24"), InternalIP: pfx("10.0.9.9/24")}},
			self:  Self{Name: "a-2", PublicKey: key(2), Version: "v2", CiliumHostIP: pfx("10.244.2.1/32")},
			host:  Host{Private: HostAddress{Interface: "eth0", Prefix: pfx("10.0.1.2/24")}, Endpoint: "10.0.1.2:51820"},
			want: localView{Segments: []segmentView{sv("location:a", "a", "10.4.0.1", "a-1", "a-1", "a-2")},
				Self: "a-2", SelfSegment: "location:a"},
			wantSelf: &Node{Name: "a-2", LocationAnnotation: "a", PodCIDRs: pfxs("10.244.2.0/24"), InternalIP: pfx("10.0.1.2/24"),
				PublicKey: key(2), Endpoint: "10.0.1.2:51820", CNICompatibilityIP: pfx("10.244.2.1/32"), MeshletVersion: "v2", LastSeen: now}},
		{name: "this node without live facts keeps what it published (but is seen now)",
			nodes: []Node{a1, a2}, self: Self{Name: "a-2"},
			want: localView{Segments: []segmentView{sv("location:a", "a", "10.4.0.1", "a-1", "a-1", "a-2")},
				Self: "a-2", SelfSegment: "location:a"},
			wantSelf: func() *Node { n := with(a2, func(n *Node) { n.LastSeen, n.MeshletVersion = now, "" }); return &n }()},
		{name: "this node not Ready (no pod CIDR): no Self, no SelfSegment",
			nodes: []Node{a1, with(a2, func(n *Node) { n.PodCIDRs = nil })},
			self:  Self{Name: "a-2", PublicKey: key(2)}, host: Host{Endpoint: "10.0.1.2:51820"},
			want: localView{Segments: []segmentView{sv("location:a", "a", "10.4.0.1", "a-1", "a-1")}}},
		{name: "allowed-location-ips: a segment's are its nodes', sorted, without duplicates; one containing the LAN is kept",
			nodes: []Node{alip(a1, "192.168.50.0/24", "10.0.1.0/24"), alip(a2, "192.168.50.0/24", "192.168.40.0/24"), b1},
			want: localView{Segments: []segmentView{
				alips(sv("location:a", "a", "10.4.0.1", "a-1", "a-1", "a-2"), "10.0.1.0/24", "192.168.40.0/24", "192.168.50.0/24"),
				sv("location:b", "b", "10.4.0.2", "b-1", "b-1"),
			}}},
		{name: "allowed-location-ips overlapping another segment's: dropped from both",
			nodes: []Node{alip(a1, "192.168.0.0/16"), alip(b1, "192.168.50.0/24", "172.16.0.0/24")},
			want: localView{Segments: []segmentView{
				sv("location:a", "a", "10.4.0.1", "a-1", "a-1"),
				alips(sv("location:b", "b", "10.4.0.2", "b-1", "b-1"), "172.16.0.0/24"),
			}, Rejections: []Rejection{
				dropped("a-1", "192.168.0.0/16 overlaps allowed-location-ips of segment location:b"),
				dropped("b-1", "192.168.50.0/24 overlaps allowed-location-ips of segment location:a"),
			}}},
		{name: "full: one entry on two nodes is in two segments: dropped from both",
			nodes: []Node{alip(a1, "192.168.50.0/24"), alip(a2, "192.168.50.0/24")}, set: Settings{Granularity: GranularityFull},
			want: localView{Segments: []segmentView{
				sv("node:a-1", "a", "10.4.0.1", "a-1", "a-1"),
				sv("node:a-2", "a", "10.4.0.2", "a-2", "a-2"),
			}, Rejections: []Rejection{
				dropped("a-1", "192.168.50.0/24 overlaps allowed-location-ips of segment node:a-2"),
				dropped("a-2", "192.168.50.0/24 overlaps allowed-location-ips of segment node:a-1"),
			}}},
		{name: "allowed-location-ips at a pod CIDR, a private IP or a WireGuard IP of any segment: dropped, reported on the node carrying it",
			nodes: []Node{a1, alip(a2, "10.244.3.128/25", "10.0.2.1/32", "10.4.0.2/32", "10.244.2.0/23"), b1},
			want: localView{Segments: []segmentView{
				sv("location:a", "a", "10.4.0.1", "a-1", "a-1", "a-2"),
				sv("location:b", "b", "10.4.0.2", "b-1", "b-1"),
			}, Rejections: []Rejection{
				dropped("a-2", "10.0.2.1/32 is the private IP of node b-1"),
				dropped("a-2", "10.4.0.2/32 is the WireGuard IP of segment location:b"),
				dropped("a-2", "10.244.2.0/23 is inside the pod CIDR 10.244.2.0/24 of node a-2"),
				dropped("a-2", "10.244.3.128/25 is inside the pod CIDR 10.244.3.0/24 of node b-1"),
			}}},
		{name: "allowed-location-ips overlapping a Peer's allowed IPs: dropped",
			nodes: []Node{alip(a1, "192.168.50.0/24", "192.168.60.0/24")},
			peers: []Peer{{Name: "laptop", PublicKey: key(20), AllowedIPs: pfxs("192.168.50.7/32")}},
			want: localView{Segments: []segmentView{alips(sv("location:a", "a", "10.4.0.1", "a-1", "a-1"), "192.168.60.0/24")},
				Rejections: []Rejection{dropped("a-1", "192.168.50.0/24 contains 192.168.50.7/32 of Peer laptop")}}},
		{name: "allowed-location-ips overlapping a remote cluster's network: dropped (the annotation loses, not the mesh)",
			nodes:  []Node{alip(a1, "172.30.5.0/24", "10.244.200.0/24")},
			meshes: mesh,
			want: localView{Segments: []segmentView{alips(sv("location:a", "a", "10.4.0.1", "a-1", "a-1"), "10.244.200.0/24")},
				Rejections: []Rejection{dropped("a-1", "172.30.5.0/24 lies inside 172.30.0.0/16, reserved for remote cluster there by its ClusterMesh")}}},
		{name: "a mesh this cluster is not in constrains nothing",
			nodes:  []Node{alip(a1, "172.30.5.0/24")},
			meshes: mesh, set: Settings{ClusterName: "elsewhere"},
			want: localView{Segments: []segmentView{alips(sv("location:a", "a", "10.4.0.1", "a-1", "a-1"), "172.30.5.0/24")}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			snap := Snapshot{Now: now, Nodes: tc.nodes, Peers: tc.peers, Meshes: tc.meshes}
			set := Defaults(tc.set)
			l := Segments(snap, set, tc.self, tc.host)
			// What the nodes claim, in the planner's order (claims.go).
			cs, rejs := ClaimNodeAddresses(l, snap.Nodes, set)
			ResolveRemotes(snap.Meshes, set, cs)
			ValidatePeers(snap.Peers, l, "", Key{}, cs)
			l.Rejections = append(append(l.Rejections, rejs...), ClaimAllowedLocationIPs(l, cs, set)...)
			check(t, "topology", view(l), tc.want)
			if tc.wantSelf != nil {
				check(t, "this node", l.Self, tc.wantSelf)
			}
		})
	}
}

// TestInfos: the plan's description of the segments; in location
// granularity a node without internal IP is its own location.
func TestInfos(t *testing.T) {
	a1, a2, b1, _ := twoLocations()
	info := func(name, loc, leader, wg string, nodes ...string) SegmentInfo {
		i := SegmentInfo{Name: name, Location: loc, Leader: leader, Nodes: nodes}
		if wg != "" {
			i.WireGuardIP = pfx(wg)
		}
		return i
	}
	for _, tc := range []struct {
		name string
		l    Local
		set  Settings
		want []SegmentInfo
	}{
		{name: "segments with their WireGuard IP in the subnet's size", l: twoLocationsSeen(""),
			want: []SegmentInfo{info("location:a", "a", "a-1", "10.4.0.1/16", "a-1", "a-2"), info("location:b", "b", "b-1", "10.4.0.2/16", "b-1", "b-2")}},
		{name: "location: a node without internal IP is its own location",
			l:    local("", seg("location:a", "a", "10.4.0.1", "a-1", a1), seg("node:a-2", "a", "10.4.0.2", "a-2", a2)),
			set:  Settings{Subnet: pfx("10.4.0.0/24")},
			want: []SegmentInfo{info("location:a", "a", "a-1", "10.4.0.1/24", "a-1"), info("node:a-2", "node:a-2", "a-2", "10.4.0.2/24", "a-2")}},
		{name: "full: node segments keep their location",
			l:    local("", seg("node:a-1", "a", "10.4.0.1", "a-1", a1), seg("node:b-1", "b", "", "b-1", b1)),
			set:  Settings{Granularity: GranularityFull},
			want: []SegmentInfo{info("node:a-1", "a", "a-1", "10.4.0.1/16", "a-1"), info("node:b-1", "b", "b-1", "", "b-1")}},
		{name: "no segment", l: Local{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			check(t, "infos", tc.l.Infos(Defaults(tc.set)), tc.want)
		})
	}
}

// TestWithoutLeader is failover's veto: the next node in Kilo's order
// leads the segment instead; nothing else changes, and the input is not
// modified.
func TestWithoutLeader(t *testing.T) {
	x := func(i int, ep string, leader bool) Node {
		n := mk(i, fmt.Sprintf("x-%d", i), "x", fmt.Sprintf("10.0.1.%d/24", i), ep, fmt.Sprintf("10.244.%d.0/24", i))
		n.Leader = leader
		return n
	}
	y := mk(9, "y-1", "y", "10.0.2.1/24", "10.0.2.1:51820", "10.244.9.0/24")
	site := func(self, leader string, xs ...Node) Local {
		return local(self, seg("location:x", "x", "10.4.0.1", leader, xs...), seg("location:y", "y", "10.4.0.2", "y-1", y))
	}
	ySeg := segmentView{Key: "location:y", Location: "y", Leader: "y-1", Nodes: []string{"y-1"}, WireGuardIP: addr("10.4.0.2")}
	xSeg := func(leader string, nodes ...string) segmentView {
		return segmentView{Key: "location:x", Location: "x", Leader: leader, Nodes: nodes, WireGuardIP: addr("10.4.0.1")}
	}
	for _, tc := range []struct {
		name    string
		in      Local
		without string
		want    localView
	}{
		{name: "the next in Kilo's order: a public endpoint before a lower name",
			in: site("x-1", "x-1", x(1, "10.0.1.1:51820", true), x(2, "10.0.1.2:51820", false), x(3, "198.51.100.3:51820", false)), without: "x-1",
			want: localView{Segments: []segmentView{xSeg("x-3", "x-1", "x-2", "x-3"), ySeg}, Self: "x-1", SelfSegment: "location:x"}},
		{name: "the next in Kilo's order: an annotation before a public endpoint",
			in: site("x-3", "x-3", x(1, "10.0.1.1:51820", true), x(2, "198.51.100.2:51820", false), x(3, "198.51.100.3:51820", true)), without: "x-3",
			want: localView{Segments: []segmentView{xSeg("x-1", "x-1", "x-2", "x-3"), ySeg}, Self: "x-3", SelfSegment: "location:x"}},
		{name: "nothing stands out: the next by name",
			in: site("x-1", "x-1", x(1, "10.0.1.1:51820", false), x(2, "10.0.1.2:51820", false), x(3, "10.0.1.3:51820", false)), without: "x-1",
			want: localView{Segments: []segmentView{xSeg("x-2", "x-1", "x-2", "x-3"), ySeg}, Self: "x-1", SelfSegment: "location:x"}},
		{name: "alone in its segment: it keeps leading (nobody else can)",
			in: site("x-1", "x-1", x(1, "10.0.1.1:51820", false)), without: "x-1",
			want: localView{Segments: []segmentView{xSeg("x-1", "x-1"), ySeg}, Self: "x-1", SelfSegment: "location:x"}},
		{name: "not Ready: nothing to veto",
			in: site("", "x-1", x(1, "10.0.1.1:51820", false), x(2, "10.0.1.2:51820", false)), without: "x-1",
			want: localView{Segments: []segmentView{xSeg("x-1", "x-1", "x-2"), ySeg}}},
		{name: "a node that does not lead: the leader stays",
			in: site("x-2", "x-1", x(1, "10.0.1.1:51820", true), x(2, "10.0.1.2:51820", false)), without: "x-2",
			want: localView{Segments: []segmentView{xSeg("x-1", "x-1", "x-2"), ySeg}, Self: "x-2", SelfSegment: "location:x"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := view(tc.in)
			out := tc.in.WithoutLeader(tc.without)
			check(t, "topology", view(out), tc.want)
			check(t, "the input afterwards", view(tc.in), before)
			if out.SelfSegment != nil && !slices.Contains(out.Segments, out.SelfSegment) {
				t.Error("SelfSegment is not one of the segments")
			}
		})
	}
}

// TestKiloOrder: the order in which Kilo's rule prefers nodes.
func TestKiloOrder(t *testing.T) {
	n := func(name, ep string, leader bool) *Node { return &Node{Name: name, Endpoint: ep, Leader: leader} }
	for _, tc := range []struct {
		name  string
		nodes []*Node
		want  []string
	}{
		{"by name when nothing stands out", []*Node{n("c", "10.0.0.3:1", false), n("a", "10.0.0.1:1", false), n("b", "10.0.0.2:1", false)}, []string{"a", "b", "c"}},
		{"annotation and public, annotation, public, the rest", []*Node{
			n("a", "10.0.0.1:1", false), n("b", "1.2.3.4:1", false), n("c", "10.0.0.3:1", true), n("d", "1.2.3.5:1", true), n("e", "dns.example:1", true),
		}, []string{"d", "c", "e", "b", "a"}},
		{"empty", nil, []string{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := []string{}
			for _, x := range KiloOrder(tc.nodes) {
				got = append(got, x.Name)
			}
			check(t, "order", got, tc.want)
			if len(tc.nodes) > 0 && got[0] != tc.nodes[findLeader(tc.nodes)].Name && slices.IsSortedFunc(tc.nodes, func(a, b *Node) int { return strings.Compare(a.Name, b.Name) }) {
				t.Errorf("first in Kilo's order %s is not Kilo's leader", got[0])
			}
		})
	}
}

// TestStatusWriter: the leader of the first segment that runs meshlet
// writes the ClusterMesh status; kg leaders are passed over.
func TestStatusWriter(t *testing.T) {
	kg := func(n Node) Node { n.MeshletVersion = ""; return n }
	a1 := mk(1, "a-1", "a", "10.0.1.1/24", "198.51.100.1:51820", "10.244.1.0/24")
	a2 := mk(2, "a-2", "a", "10.0.1.2/24", "10.0.1.2:51820", "10.244.2.0/24")
	b1 := mk(3, "b-1", "b", "10.0.2.1/24", "198.51.100.3:51820", "10.244.3.0/24")
	for _, tc := range []struct {
		name string
		l    Local
		want string
	}{
		{name: "the first segment's leader", l: local("a-2", seg("location:a", "a", "10.4.0.1", "a-1", a1, a2), seg("location:b", "b", "10.4.0.2", "b-1", b1)), want: "a-1"},
		{name: "a vetoed leader: the one who leads instead", l: local("a-2", seg("location:a", "a", "10.4.0.1", "a-2", a1, a2), seg("location:b", "b", "10.4.0.2", "b-1", b1)), want: "a-2"},
		{name: "the first segment led by kg: the next segment's meshlet leader", l: local("a-2", seg("location:a", "a", "10.4.0.1", "a-1", kg(a1), a2), seg("location:b", "b", "10.4.0.2", "b-1", b1)), want: "b-1"},
		{name: "every leader runs kg: none", l: local("a-2", seg("location:a", "a", "10.4.0.1", "a-1", kg(a1), a2), seg("location:b", "b", "10.4.0.2", "b-1", kg(b1))), want: ""},
		{name: "no segment: none", l: Local{}, want: ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.l.StatusWriter(); got != tc.want {
				t.Errorf("StatusWriter() = %q, want %q", got, tc.want)
			}
		})
	}
}
