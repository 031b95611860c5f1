package topology

import (
	"net/netip"
	"testing"
	"time"
)

func TestRemoteEndpointChain(t *testing.T) {
	for _, tc := range []struct {
		name string
		mod  func(*Node)
		want string
		src  string
	}{
		{"clustermesh-endpoint first", func(n *Node) { n.ClusterMeshEndpoint = "cm.example.com:4000"; n.ForceEndpoint = "1.1.1.1:1" }, "cm.example.com:4000", "clustermesh-endpoint"},
		{"force-endpoint second", func(n *Node) { n.ForceEndpoint = "1.1.1.1:1" }, "1.1.1.1:1", "force-endpoint"},
		{"external IPv4 third", func(n *Node) {
			n.ExternalIPs = []netip.Addr{netip.MustParseAddr("2001:db8::5"), netip.MustParseAddr("192.0.2.5")}
		}, "192.0.2.5:51821", "external-ip:51821"},
		{"external IPv6", func(n *Node) { n.ExternalIPs = []netip.Addr{netip.MustParseAddr("2001:db8::5")} }, "[2001:db8::5]:51821", "external-ip:51821"},
		{"endpoint annotation", func(n *Node) {}, "172.16.9.9:51820", "annotation"},
		{"none: roams", func(n *Node) { n.Endpoint = "" }, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := Node{Endpoint: "172.16.9.9:51820"}
			tc.mod(&n)
			got, src := remoteEndpoint(&n, 51821)
			if got != tc.want || src != tc.src {
				t.Errorf("endpoint = %q (%s), want %q (%s)", got, src, tc.want, tc.src)
			}
		})
	}
}

// TestResolveRemotes: the remote clusters of the meshes this cluster is
// in — meshes by namespace/name, entries by name, the first mention of a
// cluster wins — with the allowedNetworks that are neither a default route
// nor overlapping what the local cluster owns.
func TestResolveRemotes(t *testing.T) {
	type remoteView struct {
		Mesh, Local string
		Entry       MeshCluster
		Networks    []netip.Prefix
	}
	mc := func(name string, local bool, nets ...string) MeshCluster {
		return MeshCluster{Name: name, Local: local, AllowedNetworks: pfxs(nets...)}
	}
	rv := func(mesh, local string, e MeshCluster, nets ...string) remoteView {
		v := remoteView{Mesh: mesh, Local: local, Entry: e}
		if len(nets) > 0 {
			v.Networks = pfxs(nets...)
		}
		return v
	}
	bad := func(mesh, cluster string, reason Reason, msg string) Rejection {
		return Rejection{Object: ObjectRef{Kind: "ClusterMesh", Namespace: "kilo", Name: mesh}, Field: "spec.clusters[" + cluster + "].allowedNetworks", Reason: reason, Message: msg}
	}
	b, c := mc("b", false, "10.101.0.0/16"), mc("c", false, "10.102.0.0/16")
	here := mc("here", true, "10.244.0.0/16")
	owned := owns("10.244.1.0/24", "10.0.1.1/32", "10.96.0.0/16")
	for _, tc := range []struct {
		name     string
		meshes   []Mesh
		set      Settings
		want     []remoteView
		wantRejs []Rejection
	}{
		{name: "the entries by name but this cluster's (marked local)",
			meshes: []Mesh{{Namespace: "kilo", Name: "m", Clusters: []MeshCluster{c, here, b}}},
			want:   []remoteView{rv("kilo/m", "here", b, "10.101.0.0/16"), rv("kilo/m", "here", c, "10.102.0.0/16")}},
		{name: "--cluster-name selects this cluster's entry, whatever is marked local",
			meshes: []Mesh{{Namespace: "kilo", Name: "m", Clusters: []MeshCluster{c, here, b}}}, set: Settings{ClusterName: "b"},
			want:     []remoteView{rv("kilo/m", "b", c, "10.102.0.0/16"), rv("kilo/m", "b", here)}, // here's network is the local pod range
			wantRejs: []Rejection{bad("m", "here", ReasonOverlapsLocal, "10.244.0.0/16 contains the pod CIDR 10.244.1.0/24 of node local")}},
		{name: "a mesh without this cluster: not this cluster's",
			meshes: []Mesh{{Namespace: "kilo", Name: "m", Clusters: []MeshCluster{b, c}}}},
		{name: "meshes by namespace and name; a cluster in two: the first mention wins",
			meshes: []Mesh{
				{Namespace: "kilo", Name: "z", Clusters: []MeshCluster{here, mc("b", false, "10.201.0.0/16"), c}},
				{Namespace: "kilo", Name: "a", Clusters: []MeshCluster{here, b}},
			},
			want: []remoteView{rv("kilo/a", "here", b, "10.101.0.0/16"), rv("kilo/z", "here", c, "10.102.0.0/16")}},
		{name: "allowedNetworks: default routes and overlaps with the local cluster rejected, host bits masked",
			meshes: []Mesh{{Namespace: "kilo", Name: "m", Clusters: []MeshCluster{here,
				mc("b", false, "0.0.0.0/0", "::/0", "10.0.0.0/8", "10.244.1.128/25", "10.101.7.7/16", "fd10::/64")}}},
			want: []remoteView{rv("kilo/m", "here", mc("b", false, "0.0.0.0/0", "::/0", "10.0.0.0/8", "10.244.1.128/25", "10.101.7.7/16", "fd10::/64"),
				"10.101.0.0/16", "fd10::/64")},
			wantRejs: []Rejection{
				bad("m", "b", ReasonDefaultRoute, "0.0.0.0/0 is a default route"),
				bad("m", "b", ReasonDefaultRoute, "::/0 is a default route"),
				bad("m", "b", ReasonOverlapsLocal, "10.0.0.0/8 contains the pod CIDR 10.0.1.1/32 of node local"),
				bad("m", "b", ReasonOverlapsLocal, "10.244.1.128/25 lies inside the pod CIDR 10.244.1.0/24 of node local"),
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rs, rejs := ResolveRemotes(tc.meshes, Defaults(tc.set), owned)
			var got []remoteView
			for _, r := range rs {
				got = append(got, remoteView{Mesh: r.Mesh.Namespace + "/" + r.Mesh.Name, Local: r.Local.Name, Entry: r.Entry, Networks: r.Networks})
				if len(r.allowed.starts) != len(r.Networks) || !allCovered(r.allowed, r.Networks) {
					t.Errorf("%s: the index of allowed networks is not Networks", r.Entry.Name)
				}
			}
			check(t, "remotes", got, tc.want)
			check(t, "rejections", rejs, tc.wantRejs)
		})
	}
}

// TestRemoteGroups: a remote cluster's segments rebuilt with Kilo's rules
// from its nodes' annotations (its own granularity), readiness without the
// endpoint by the remote clock, each led by the node its agents elected
// when that node published its WireGuard IP, else the first that did;
// claims outside allowedNetworks or of a WireGuard IP another leader holds
// more recently are rejected; segments without a leader follow their
// location's.
func TestRemoteGroups(t *testing.T) {
	type groupView struct {
		Key, Leader string
		Nodes       []string
	}
	g := func(key, leader string, nodes ...string) groupView { return groupView{key, leader, nodes} }
	r := remote("b", "10.5.0.0/16", "10.100.0.0/16", "10.30.0.0/16")
	bx1 := rnode(1, "bx-1", "x", "10.30.1.1/24", "10.5.0.1/16", "10.100.1.0/24")
	bx2 := rnode(2, "bx-2", "x", "10.30.1.2/24", "", "10.100.2.0/24")
	by1 := rnode(3, "by-1", "y", "10.30.2.1/24", "10.5.0.2/16", "10.100.3.0/24")
	ref := func(name string, reason Reason, msg string) Rejection {
		return Rejection{Object: ObjectRef{Kind: "Node", Cluster: "b", Name: name}, Field: "wireguard-ip", Reason: reason, Message: msg}
	}
	for _, tc := range []struct {
		name     string
		rc       RemoteCluster
		want     []groupView
		wantRejs []Rejection
	}{
		{name: "segments by location, sorted, led by the elected node with its WireGuard IP",
			rc:   RemoteCluster{Nodes: []Node{by1, bx2, bx1}},
			want: []groupView{g("location:x", "bx-1", "bx-1", "bx-2"), g("location:y", "by-1", "by-1")}},
		{name: "readiness: key, pod CIDR and a fresh last-seen; no endpoint needed",
			rc: RemoteCluster{Nodes: []Node{bx1, by1,
				with(bx2, func(n *Node) { n.Endpoint = "" }),
				with(rnode(4, "bx-3", "x", "10.30.1.3/24", "", "10.100.4.0/24"), func(n *Node) { n.PublicKey = Key{} }),
				with(rnode(5, "bx-4", "x", "10.30.1.4/24", "", "10.100.5.0/24"), func(n *Node) { n.PodCIDRs = nil }),
				with(rnode(6, "bx-5", "x", "10.30.1.5/24", "", "10.100.6.0/24"), func(n *Node) { n.LastSeen = time.Time{} }),
				with(rnode(7, "bx-6", "x", "10.30.1.6/24", "", "10.100.7.0/24"), func(n *Node) { n.LastSeen = now.Add(-ReadyWindow) }),
			}},
			want: []groupView{g("location:x", "bx-1", "bx-1", "bx-2"), g("location:y", "by-1", "by-1")}},
		{name: "ages by the remote cluster's frozen clock: an unreachable API drops nobody",
			rc: RemoteCluster{ObservedAt: now.Add(-5 * time.Minute), Nodes: []Node{
				with(bx1, func(n *Node) { n.LastSeen = now.Add(-5*time.Minute - 10*time.Second) }),
				with(by1, func(n *Node) { n.LastSeen = now.Add(-5*time.Minute - ReadyWindow) }),
			}},
			want: []groupView{g("location:x", "bx-1", "bx-1")}},
		{name: "Kilo's leader without a WireGuard IP yet: the first node of the segment that published one",
			rc: RemoteCluster{Nodes: []Node{
				with(bx1, func(n *Node) { n.WireGuardIP = netip.Prefix{} }),
				with(bx2, func(n *Node) { n.WireGuardIP = pfx("10.5.0.1/16") }),
				with(rnode(4, "bx-3", "x", "10.30.1.3/24", "", "10.100.4.0/24"), func(n *Node) { n.Endpoint = "198.51.100.3:51820" }),
				rnode(5, "bx-4", "x", "10.30.1.4/24", "10.5.0.9/16", "10.100.5.0/24"),
			}},
			want: []groupView{g("location:x", "bx-2", "bx-1", "bx-2", "bx-3", "bx-4")}},
		{name: "a stale claim of a node that does not lead: ignored, not reported",
			rc:   RemoteCluster{Nodes: []Node{bx1, with(bx2, func(n *Node) { n.WireGuardIP = pfx("10.5.0.7/16") })}},
			want: []groupView{g("location:x", "bx-1", "bx-1", "bx-2")}},
		{name: "the remote cluster's granularity: full makes every node its own segment",
			rc: RemoteCluster{Nodes: []Node{
				with(bx1, func(n *Node) { n.Granularity = GranularityFull }),
				with(bx2, func(n *Node) { n.Granularity, n.WireGuardIP = GranularityFull, pfx("10.5.0.2/16") }),
			}},
			want: []groupView{g("node:bx-1", "bx-1", "bx-1"), g("node:bx-2", "bx-2", "bx-2")}},
		{name: "a segment without a leader follows its location's; one whose location has none is left out",
			rc: RemoteCluster{Nodes: []Node{bx1, by1,
				with(rnode(4, "bx-3", "x", "", "", "10.100.4.0/24"), func(n *Node) { n.Endpoint = "198.51.100.3:51820" }),
				rnode(5, "bz-1", "z", "10.30.3.1/24", "", "10.100.5.0/24"),
			}},
			want: []groupView{g("location:x", "bx-1", "bx-1", "bx-3"), g("location:y", "by-1", "by-1")}},
		{name: "followers prefer a leader with a private IP",
			rc: RemoteCluster{Nodes: []Node{
				with(rnode(1, "bx-1", "x", "", "10.5.0.1/16", "10.100.1.0/24"), func(n *Node) { n.Granularity, n.Endpoint = GranularityFull, "198.51.100.1:51820" }),
				with(bx2, func(n *Node) { n.Granularity, n.WireGuardIP = GranularityFull, pfx("10.5.0.2/16") }),
				with(rnode(4, "bx-3", "x", "10.30.1.3/24", "", "10.100.4.0/24"), func(n *Node) { n.Granularity = GranularityFull }),
			}},
			want: []groupView{g("node:bx-1", "bx-1", "bx-1"), g("node:bx-2", "bx-2", "bx-2", "bx-3")}},
		{name: "followers of leaders without a private IP: the first",
			rc: RemoteCluster{Nodes: []Node{
				with(rnode(1, "bx-1", "x", "", "10.5.0.1/16", "10.100.1.0/24"), func(n *Node) { n.Granularity, n.Endpoint = GranularityFull, "198.51.100.1:51820" }),
				with(rnode(2, "bx-2", "x", "", "10.5.0.2/16", "10.100.2.0/24"), func(n *Node) { n.Granularity, n.Endpoint = GranularityFull, "198.51.100.2:51820" }),
				with(rnode(4, "bx-3", "x", "10.30.1.3/24", "", "10.100.4.0/24"), func(n *Node) { n.Granularity = GranularityFull }),
			}},
			want: []groupView{g("node:bx-1", "bx-1", "bx-1", "bx-3"), g("node:bx-2", "bx-2", "bx-2")}},
		{name: "a WireGuard IP outside the allowedNetworks: rejected, its segment left out",
			rc:       RemoteCluster{Nodes: []Node{bx1, with(by1, func(n *Node) { n.WireGuardIP = pfx("10.6.0.2/16") })}},
			want:     []groupView{g("location:x", "bx-1", "bx-1")},
			wantRejs: []Rejection{ref("by-1", ReasonOutsideAllowed, "10.6.0.2 is outside the cluster's allowedNetworks")}},
		{name: "one WireGuard IP claimed by two leaders: the newer last-seen stands",
			rc: RemoteCluster{Nodes: []Node{
				with(bx1, func(n *Node) { n.LastSeen = now.Add(-20 * time.Second) }),
				with(by1, func(n *Node) { n.WireGuardIP = pfx("10.5.0.1/16") }),
			}},
			want:     []groupView{g("location:y", "by-1", "by-1")},
			wantRejs: []Rejection{ref("bx-1", ReasonDuplicateWireGuardIP, "10.5.0.1 already used by node by-1")}},
		{name: "one WireGuard IP claimed by two leaders seen together: the first segment's stands",
			rc:       RemoteCluster{Nodes: []Node{bx1, with(by1, func(n *Node) { n.WireGuardIP = pfx("10.5.0.1/16") })}},
			want:     []groupView{g("location:x", "bx-1", "bx-1")},
			wantRejs: []Rejection{ref("by-1", ReasonDuplicateWireGuardIP, "10.5.0.1 already used by node bx-1")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			groups, rejs := remoteGroups(r, &tc.rc, Defaults(Settings{}), now)
			var got []groupView
			for _, gr := range groups {
				got = append(got, groupView{gr.key, gr.leader.Name, nodeNames(gr.nodes)})
			}
			check(t, "groups", got, tc.want)
			check(t, "rejections", rejs, tc.wantRejs)
		})
	}
}

// TestClip: of what a remote cluster claims, only what lies inside its
// allowedNetworks, is no default route and does not overlap the local
// cluster is kept; the rest is rejected with the reason.
func TestClip(t *testing.T) {
	r := remote("b", "10.100.0.0/16", "fd10::/48")
	owned := owns("10.100.9.0/24")
	ref := ObjectRef{Kind: "Node", Cluster: "b", Name: "bx-1"}
	rej := func(reason Reason, msg string) Rejection {
		return Rejection{Object: ref, Field: "podCIDRs", Reason: reason, Message: msg}
	}
	for _, tc := range []struct {
		name     string
		in       []netip.Prefix
		want     []netip.Prefix
		wantRejs []Rejection
	}{
		{"inside, masked", pfxs("10.100.1.7/24", "fd10::1/64"), pfxs("10.100.1.0/24", "fd10::/64"), nil},
		{"a default route", pfxs("0.0.0.0/0", "::/0"), nil, []Rejection{
			rej(ReasonDefaultRoute, "0.0.0.0/0 is a default route"), rej(ReasonDefaultRoute, "::/0 is a default route"),
		}},
		{"overlapping the local cluster", pfxs("10.100.9.128/25", "10.100.0.0/16"), nil, []Rejection{
			rej(ReasonOverlapsLocal, "10.100.9.128/25 lies inside the pod CIDR 10.100.9.0/24 of node local"),
			rej(ReasonOverlapsLocal, "10.100.0.0/16 contains the pod CIDR 10.100.9.0/24 of node local"),
		}},
		{"outside the allowedNetworks (an overlap with the local cluster is said first)", pfxs("10.101.0.0/24", "10.0.0.0/8", "fd11::/64"), nil, []Rejection{
			rej(ReasonOutsideAllowed, "10.101.0.0/24 is outside the cluster's allowedNetworks"),
			rej(ReasonOverlapsLocal, "10.0.0.0/8 contains the pod CIDR 10.100.9.0/24 of node local"),
			rej(ReasonOutsideAllowed, "fd11::/64 is outside the cluster's allowedNetworks"),
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, rejs := clip(r, owned, ref, "podCIDRs", tc.in)
			check(t, "kept", got, tc.want)
			check(t, "rejections", rejs, tc.wantRejs)
		})
	}
}

// TestRemoteKeepalive is precedence rule 2: the smallest non-zero of the
// remote entry's, this cluster's entry's and this node's annotation.
func TestRemoteKeepalive(t *testing.T) {
	for _, tc := range []struct {
		name                string
		remote, local, node int
		ka                  int
		src                 KeepaliveSource
	}{
		{"none", 0, 0, 0, 0, KeepaliveNone},
		{"the remote entry's", 25, 0, 0, 25, KeepaliveRemoteCluster},
		{"this cluster's entry's", 0, 20, 0, 20, KeepaliveLocalCluster},
		{"this node's", 0, 0, 15, 15, KeepaliveNodeAnnotation},
		{"the smallest wins", 25, 10, 15, 10, KeepaliveLocalCluster},
		{"equal: the earlier in the chain", 10, 10, 10, 10, KeepaliveRemoteCluster},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := remote("b")
			r.Entry.PersistentKeepalive, r.Local.PersistentKeepalive = tc.remote, tc.local
			ka, src := remoteKeepalive(r, &Node{PersistentKeepalive: tc.node})
			if ka != tc.ka || src != tc.src {
				t.Errorf("keepalive %d (%s), want %d (%s)", ka, src, tc.ka, tc.src)
			}
		})
	}
}

// TestRemoteAge: by the remote cluster's clock — the time since this agent
// saw the last-seen change, and for a node not seen changing yet at least
// how far it is behind its cluster's newest; without Heard, Kilo's rule.
func TestRemoteAge(t *testing.T) {
	newest := now.Add(-90 * time.Second) // the remote clock is 90 s behind
	for _, tc := range []struct {
		name string
		n    Node
		want time.Duration
	}{
		{"no Heard: last-seen against now", Node{LastSeen: newest}, 90 * time.Second},
		{"seen changing: the time since", Node{LastSeen: newest, Heard: now.Add(-3 * time.Second), HeardChange: true}, 3 * time.Second},
		{"seen changing long ago", Node{LastSeen: newest.Add(-time.Hour), Heard: now.Add(-2 * time.Minute), HeardChange: true}, 2 * time.Minute},
		{"first value only, close to the newest: the time since", Node{LastSeen: newest.Add(-time.Second), Heard: now.Add(-4 * time.Second)}, 4 * time.Second},
		{"first value only, far behind the newest", Node{LastSeen: newest.Add(-2 * time.Minute), Heard: now.Add(-4 * time.Second)}, 2 * time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := RemoteAge(&tc.n, newest, now); got != tc.want {
				t.Errorf("age %s, want %s", got, tc.want)
			}
		})
	}
}
