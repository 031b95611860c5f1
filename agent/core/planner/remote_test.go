package planner

import (
	"fmt"
	"net/netip"
	"reflect"
	"testing"
	"time"

	"github.com/meshlet/meshlet/agent/core/topology"
)

// twoClusters: local cluster-a (threeLocations) and remote cluster-b with
// two locations: x (leader bx-1 with a WireGuard IP, bx-2 behind it) and y
// (by-1, NATed: no external IP, no public endpoint).
func twoClusters() topology.Snapshot {
	bx1 := node(21, "bx-1", "x", "172.16.1.1/24", "172.16.1.1:51820", "10.2.1.0/24")
	bx1.WireGuardIP = pfx("100.66.1.1/24")
	bx1.ExternalIPs = []netip.Addr{addr("2001:db8::1"), addr("198.51.100.21")}
	bx2 := node(22, "bx-2", "x", "172.16.1.2/24", "172.16.1.2:51820", "10.2.2.0/24")
	by1 := node(23, "by-1", "y", "172.16.2.1/24", "", "10.2.3.0/24")
	by1.Endpoint = "172.16.2.1:51820"
	by1.WireGuardIP = pfx("100.66.1.2/24")
	return topology.Snapshot{
		Now:   now,
		Nodes: threeLocations(),
		Meshes: []topology.Mesh{{Namespace: "kilo-system", Name: "prod", Clusters: []topology.MeshCluster{
			{Name: "cluster-a", Local: true, AllowedNetworks: pfxs("10.244.0.0/16", "10.4.0.0/24", "10.96.0.0/12"), WireGuardPort: 51820},
			{Name: "cluster-b", AllowedNetworks: pfxs("10.2.0.0/16", "100.66.1.0/24", "10.112.0.0/12", "172.16.0.0/16"), WireGuardPort: 51821, PersistentKeepalive: 25},
		}}},
		Remotes: []topology.RemoteCluster{{
			Name: "cluster-b", Synced: true, Nodes: []topology.Node{bx1, bx2, by1},
			Peers: []topology.Peer{{Name: "b-laptop", AllowedIPs: pfxs("10.2.200.1/32"), PublicKey: key(99)}},
		}},
	}
}

func TestRemoteClusterLeaders(t *testing.T) {
	snap := twoClusters()
	self := selfOf(snap.Nodes[1], "eth0") // a-2 leads location a
	pl := Compute(snap, self)
	bx := peerByName(t, pl, "bx-1")
	// bx-1 is the first leader: it also carries the remote Peers and the
	// allowedNetworks no node covers.
	want := pfxs("10.2.0.0/16", "10.2.1.0/24", "10.2.2.0/24", "10.2.200.1/32", "10.112.0.0/12", "100.66.1.0/24", "100.66.1.1/32",
		"172.16.0.0/16", "172.16.1.1/32", "172.16.1.2/32")
	if !reflect.DeepEqual(bx.AllowedIPs, want) {
		t.Errorf("bx-1 allowed IPs:\n got %v\nwant %v", bx.AllowedIPs, want)
	}
	if bx.Kind != topology.KindRemote || bx.Cluster != "cluster-b" || bx.Endpoint != "198.51.100.21:51821" || bx.EndpointSource != "external-ip:51821" {
		t.Errorf("bx-1 = %+v: want the first IPv4 ExternalIP with the cluster's port", bx)
	}
	// Rule 2: the smallest non-zero of remote (25), local (0), node (0).
	if bx.PersistentKeepalive != 25 || bx.KeepaliveSource != topology.KeepaliveRemoteCluster || !bx.Roaming {
		t.Errorf("bx-1 keepalive = %d (%s) roaming=%v", bx.PersistentKeepalive, bx.KeepaliveSource, bx.Roaming)
	}
	by := peerByName(t, pl, "by-1")
	if !reflect.DeepEqual(by.AllowedIPs, pfxs("10.2.3.0/24", "100.66.1.2/32", "172.16.2.1/32")) {
		t.Errorf("by-1 allowed IPs = %v", by.AllowedIPs)
	}
	if by.Endpoint != "172.16.2.1:51820" || by.EndpointSource != "annotation" {
		t.Errorf("by-1 endpoint = %q (%s)", by.Endpoint, by.EndpointSource)
	}
	// Leader routes every accepted allowedNetwork to kilo0.
	for _, n := range snap.Meshes[0].Clusters[1].AllowedNetworks {
		if r, ok := routeTo(pl, n.String(), 0); !ok || r.Dev != "kilo0" || r.Src != addr("10.0.1.2") {
			t.Errorf("route to %v = %+v %v", n, r, ok)
		}
	}
	if len(pl.Remotes) != 1 || !reflect.DeepEqual(pl.Remotes[0].Leaders, []string{"bx-1", "by-1"}) {
		t.Errorf("remotes = %+v", pl.Remotes)
	}
	for _, ex := range pfxs("10.2.0.0/16", "10.112.0.0/12") {
		if !containedIn(ex, pl.NAT.Exceptions) {
			t.Errorf("remote network %v is masqueraded", ex)
		}
	}

	// A non-leader routes the remote networks to its leader and does not
	// peer.
	pl = Compute(snap, selfOf(snap.Nodes[0], "eth0"))
	if len(pl.WireGuard.Peers) != 0 {
		t.Fatalf("non-leader peers = %v", peerNames(pl))
	}
	if r, ok := routeTo(pl, "10.2.0.0/16", 0); !ok || r.Gw != addr("10.0.1.2") || r.Dev != "tunl0" {
		t.Errorf("non-leader route to remote = %+v %v", r, ok)
	}
}

func TestRemoteNATedWithDiscoveredEndpoint(t *testing.T) {
	snap := twoClusters()
	// by-1 is NATed: the device learned where its packets come from.
	self := selfOf(snap.Nodes[1], "eth0")
	self.Device = devicePeers(map[topology.Key]netip.AddrPort{key(23): netip.MustParseAddrPort("198.51.100.200:33333")})
	pl := Compute(snap, self)
	by := peerByName(t, pl, "by-1")
	if by.Endpoint != "198.51.100.200:33333" || by.EndpointSource != "discovered" || !by.Roaming {
		t.Errorf("by-1 = %+v, want the discovered endpoint", by)
	}
	want := `{"` + key(23).String() + `":{"IP":"198.51.100.200","Port":33333,"Zone":""}}`
	if got := pl.Annotations[topology.AnnotationDiscoveredEndpoints]; got != want {
		t.Errorf("discovered-endpoints = %s", got)
	}
	// Another local node's annotation is enough when this device has none.
	snap.Nodes[0].DiscoveredEndpoints = map[topology.Key]netip.AddrPort{key(23): netip.MustParseAddrPort("198.51.100.201:1")}
	pl = Compute(snap, selfOf(snap.Nodes[1], "eth0"))
	if by := peerByName(t, pl, "by-1"); by.Endpoint != "198.51.100.201:1" {
		t.Errorf("by-1 endpoint = %s", by.Endpoint)
	}
}

func TestRemoteRejections(t *testing.T) {
	snap := twoClusters()
	rc := &snap.Remotes[0]
	// bx-2 advertises a default route via allowed-location-ips and a pod
	// CIDR that is the local a-1's.
	rc.Nodes[1].AllowedLocationIPs = pfxs("0.0.0.0/0")
	rc.Nodes[1].PodCIDRs = pfxs("10.244.1.0/24")
	// A remote node with a WireGuard IP outside allowedNetworks, one that
	// duplicates bx-1's, one with a malformed endpoint, one with a's key.
	evil := node(30, "bz-1", "z", "172.16.3.1/24", "172.16.3.1:51820", "10.2.4.0/24")
	evil.WireGuardIP = pfx("100.66.2.1/24")
	dup := node(31, "bz-2", "z2", "172.16.4.1/24", "172.16.4.1:51820", "10.2.5.0/24")
	dup.WireGuardIP = pfx("100.66.1.1/24")
	bad := node(32, "bz-3", "z3", "172.16.5.1/24", "172.16.5.1:51820", "10.2.6.0/24")
	bad.WireGuardIP = pfx("100.66.1.9/24")
	bad.MalformedEndpoint = true
	stolen := node(2, "bz-4", "z4", "172.16.6.1/24", "172.16.6.1:51820", "10.2.7.0/24")
	stolen.WireGuardIP = pfx("100.66.1.10/24")
	rc.Nodes = append(rc.Nodes, evil, dup, bad, stolen)
	rc.Peers = append(rc.Peers, topology.Peer{Name: "b-evil", AllowedIPs: pfxs("10.244.0.0/16", "8.8.8.8/32"), PublicKey: key(98)})

	pl := Compute(snap, selfOf(snap.Nodes[1], "eth0"))
	for _, want := range []struct {
		obj    string
		reason topology.Reason
	}{
		{"cluster-b:Node/bx-2", topology.ReasonDefaultRoute},
		{"cluster-b:Node/bx-2", topology.ReasonOverlapsLocal},
		{"cluster-b:Node/bz-1", topology.ReasonOutsideAllowed},
		{"cluster-b:Node/bz-2", topology.ReasonDuplicateWireGuardIP},
		{"cluster-b:Node/bz-3", topology.ReasonInvalidEndpoint},
		{"cluster-b:Node/bz-4", topology.ReasonOwnKey},
		{"cluster-b:Peer/b-evil", topology.ReasonOverlapsLocal},
		{"cluster-b:Peer/b-evil", topology.ReasonOutsideAllowed},
	} {
		if !hasRejection(pl, want.obj, want.reason) {
			t.Errorf("missing rejection %s %s", want.obj, want.reason)
		}
	}
	// Everything else still works: bx-1 and by-1 peer, without the bad
	// prefixes.
	if got := peerNames(pl); !reflect.DeepEqual(got, []string{"segment:b-2", "segment:c-1", "remote:bx-1", "remote:by-1"}) {
		t.Fatalf("peers = %v", got)
	}
	for _, p := range pl.WireGuard.Peers {
		for _, a := range p.AllowedIPs {
			if a.Bits() == 0 || (p.Kind == topology.KindRemote && a.Overlaps(pfx("10.244.0.0/16"))) || a == pfx("8.8.8.8/32") {
				t.Errorf("peer %s carries forbidden %v", p.Name, a)
			}
		}
	}
}

func TestRemoteAllowedNetworksOverlappingLocal(t *testing.T) {
	snap := twoClusters()
	snap.Meshes[0].Clusters[1].AllowedNetworks = append(snap.Meshes[0].Clusters[1].AllowedNetworks, pfx("10.244.5.0/24"), pfx("0.0.0.0/0"))
	pl := Compute(snap, selfOf(snap.Nodes[1], "eth0"))
	if !hasRejection(pl, "ClusterMesh/kilo-system/prod", topology.ReasonOverlapsLocal) || !hasRejection(pl, "ClusterMesh/kilo-system/prod", topology.ReasonDefaultRoute) {
		t.Fatalf("rejections = %+v", pl.Rejections)
	}
	if r, _ := routeTo(pl, "10.244.5.0/24", 0); r.Dev == "kilo0" && !r.Gw.IsValid() {
		t.Error("local location c's pod CIDR hijacked by the remote cluster")
	}
	if _, ok := routeTo(pl, "0.0.0.0/0", 0); ok {
		t.Error("default route installed")
	}
}

func TestRemoteOutageKeepsLeaders(t *testing.T) {
	snap := twoClusters()
	// The remote API has been unreachable for 10 minutes: last-seen values
	// are old relative to now, but not relative to when the watch was last
	// healthy. Nothing is removed.
	later := snap
	later.Now = now.Add(10 * time.Minute)
	later.Nodes = threeLocations()
	for i := range later.Nodes {
		later.Nodes[i].LastSeen = later.Now.Add(-time.Second)
	}
	later.Remotes = []topology.RemoteCluster{snap.Remotes[0]}
	later.Remotes[0].ObservedAt = now
	pl := Compute(later, selfOf(later.Nodes[1], "eth0"))
	if got := len(pl.Remotes[0].Leaders); got != 2 {
		t.Fatalf("remote leaders during outage = %d, want 2", got)
	}
	// Without ObservedAt (a healthy watch) the same nodes are stale.
	later.Remotes[0].ObservedAt = time.Time{}
	pl = Compute(later, selfOf(later.Nodes[1], "eth0"))
	if got := len(pl.Remotes[0].Leaders); got != 0 {
		t.Fatalf("stale remote leaders = %d, want 0", got)
	}
}

func TestClusterNameSelectsEntry(t *testing.T) {
	// The same manifest is applied to both clusters: cluster-b finds its
	// entry by name, and then a is the remote.
	snap := twoClusters()
	snap.Settings.ClusterName = "cluster-b"
	snap.Remotes = nil
	pl := Compute(snap, selfOf(snap.Nodes[1], "eth0"))
	if len(pl.Remotes) != 1 || pl.Remotes[0].Cluster != "cluster-a" {
		t.Fatalf("remotes = %+v", pl.Remotes)
	}
}

func TestUnsyncedRemoteRoutesOnly(t *testing.T) {
	snap := twoClusters()
	snap.Remotes[0].Synced = false
	pl := Compute(snap, selfOf(snap.Nodes[1], "eth0"))
	for _, p := range pl.WireGuard.Peers {
		if p.Kind == topology.KindRemote {
			t.Fatalf("peer %s from an unsynced cluster (no device peers to preserve)", p.Name)
		}
	}
	if _, ok := routeTo(pl, "10.2.0.0/16", 0); !ok {
		t.Error("remote networks must still route to kilo0 (never leak to the default route)")
	}
	// The device keeps whatever peers it has for that cluster until the
	// watcher has synced (e.g. right after a restart): a device peer inside
	// the cluster's networks stays exactly as it is; one partly outside, or
	// without allowed IPs, does not.
	self := selfOf(snap.Nodes[1], "eth0")
	self.Device = []topology.DevicePeer{
		{PublicKey: key(21), AllowedIPs: pfxs("10.2.1.0/24", "100.66.1.1/32"), PersistentKeepalive: 25,
			Endpoint: netip.MustParseAddrPort("198.51.100.1:40000"), Handshake: true},
		{PublicKey: key(22), AllowedIPs: pfxs("10.2.2.0/24", "10.9.0.0/24")},
		{PublicKey: key(24)},
	}
	for _, remotes := range [][]topology.RemoteCluster{snap.Remotes, nil /* not even watched yet */} {
		snap.Remotes = remotes
		pl = Compute(snap, self)
		var kept []topology.WireGuardPeer
		for _, p := range pl.WireGuard.Peers {
			if p.Kind == topology.KindRemote {
				kept = append(kept, p)
			}
		}
		want := []topology.WireGuardPeer{{Name: "preserved", Kind: topology.KindRemote, PublicKey: key(21), AllowedIPs: pfxs("10.2.1.0/24", "100.66.1.1/32"),
			Endpoint: "198.51.100.1:40000", EndpointSource: "device", PersistentKeepalive: 25, Roaming: true}}
		if !reflect.DeepEqual(kept, want) {
			t.Errorf("remotes %v: kept %+v, want %+v", remotes != nil, kept, want)
		}
	}
}

// A local node's allowed-location-ips claiming a remote cluster's network
// is rejected; before, it became a "local" prefix and the whole remote
// allowedNetworks entry (10.2.0.0/16) was rejected instead, cutting the
// mesh (found by e2e scenario 7).
func TestLocalAllowedLocationIPInRemoteNetwork(t *testing.T) {
	snap := twoClusters()
	snap.Nodes[3].AllowedLocationIPs = pfxs("10.2.1.0/24")
	pl := Compute(snap, selfOf(snap.Nodes[1], "eth0"))
	if !hasRejection(pl, "Node/"+snap.Nodes[3].Name, topology.ReasonNetworksOverlap) {
		t.Errorf("no NetworksOverlap rejection on %s: %+v", snap.Nodes[3].Name, pl.Rejections)
	}
	if hasRejection(pl, "ClusterMesh/kilo-system/prod", topology.ReasonOverlapsLocal) {
		t.Errorf("the remote cluster's network was rejected instead: %+v", pl.Rejections)
	}
	if bx := peerByName(t, pl, "bx-1"); !containedIn(pfx("10.2.1.0/24"), bx.AllowedIPs) {
		t.Errorf("bx-1 lost its pod CIDR: %v", bx.AllowedIPs)
	}
}

func TestRemoteLeadersFollowKilosRules(t *testing.T) {
	snap := twoClusters()
	rc := &snap.Remotes[0]
	// bx-2 still shows a WireGuard IP although bx-1 leads location x (an
	// agent starting up, or a leader that just lost the role): it is not a
	// peer, and it is not an error either.
	rc.Nodes[1].WireGuardIP = pfx("100.66.1.1/24")
	pl := Compute(snap, selfOf(snap.Nodes[1], "eth0"))
	if got := pl.Remotes[0].Leaders; !reflect.DeepEqual(got, []string{"bx-1", "by-1"}) {
		t.Errorf("leaders = %v", got)
	}
	for _, r := range pl.Rejections {
		if r.Object.Cluster == "cluster-b" {
			t.Errorf("unexpected rejection %+v", r)
		}
	}
	// The leader annotation moves the role: bx-2 leads once it has its IP.
	rc.Nodes[1].Leader = true
	rc.Nodes[1].WireGuardIP = pfx("100.66.1.3/24")
	rc.Nodes[0].WireGuardIP = netip.Prefix{}
	pl = Compute(snap, selfOf(snap.Nodes[1], "eth0"))
	if got := pl.Remotes[0].Leaders; !reflect.DeepEqual(got, []string{"bx-2", "by-1"}) {
		t.Errorf("leaders after the move = %v", got)
	}
	bx2 := peerByName(t, pl, "bx-2")
	if !containedIn(pfx("10.2.1.0/24"), bx2.AllowedIPs) {
		t.Errorf("bx-2 must carry its location's nodes (bx-1's pods): %v", bx2.AllowedIPs)
	}
	// A remote cluster with full granularity: every node is its own leader.
	for i := range rc.Nodes {
		rc.Nodes[i].Granularity = topology.GranularityFull
		rc.Nodes[i].WireGuardIP = pfx(fmt.Sprintf("100.66.1.%d/24", 20+i))
	}
	pl = Compute(snap, selfOf(snap.Nodes[1], "eth0"))
	if got := len(pl.Remotes[0].Leaders); got != 3 {
		t.Errorf("full granularity leaders = %v", pl.Remotes[0].Leaders)
	}
}

// TestRemoteSessionProbe: a remote leader run by kg (no meshlet.io/version,
// e.g. a cluster still on kilo-clustermesh-operator) gets its WireGuard IP
// as the session probe; one run by meshlet gets none.
func TestRemoteSessionProbe(t *testing.T) {
	snap := twoClusters()
	snap.Remotes[0].Nodes[2].MeshletVersion = "v1" // by-1 runs meshlet
	pl := Compute(snap, selfOf(snap.Nodes[1], "eth0"))
	if bx := peerByName(t, pl, "bx-1"); bx.SessionProbe != addr("100.66.1.1") {
		t.Errorf("kg-run bx-1: session probe %v, want 100.66.1.1", bx.SessionProbe)
	}
	if by := peerByName(t, pl, "by-1"); by.SessionProbe.IsValid() {
		t.Errorf("meshlet-run by-1: session probe %v, want none", by.SessionProbe)
	}
}

// A remote node that re-numbered once another of its cluster dropped out
// claims the dead one's WireGuard IP before this agent judges the dead one
// stale (its last change was heard later than the remote cluster saw it):
// the claim with the newer last-seen stands, in whichever segment order.
func TestRemoteDuplicateWireGuardIPNewerClaimStands(t *testing.T) {
	snap := twoClusters()
	rc := &snap.Remotes[0]
	// bx-1 (location x, first by segment) stopped 50 s ago; by-1 took its
	// WireGuard IP.
	rc.Nodes[0].LastSeen = now.Add(-50 * time.Second)
	rc.Nodes[1].LastSeen = now.Add(-50 * time.Second)
	rc.Nodes[2].WireGuardIP = rc.Nodes[0].WireGuardIP
	pl := Compute(snap, selfOf(snap.Nodes[1], "eth0"))
	if !hasRejection(pl, "cluster-b:Node/bx-1", topology.ReasonDuplicateWireGuardIP) {
		t.Errorf("bx-1's older claim not rejected: %v", pl.Rejections)
	}
	if hasRejection(pl, "cluster-b:Node/by-1", topology.ReasonDuplicateWireGuardIP) {
		t.Error("by-1's newer claim rejected")
	}
	peerByName(t, pl, "by-1")
	// Equal last-seen: the first segment's claim stands.
	rc.Nodes[0].LastSeen, rc.Nodes[1].LastSeen = rc.Nodes[2].LastSeen, rc.Nodes[2].LastSeen
	pl = Compute(snap, selfOf(snap.Nodes[1], "eth0"))
	if !hasRejection(pl, "cluster-b:Node/by-1", topology.ReasonDuplicateWireGuardIP) || hasRejection(pl, "cluster-b:Node/bx-1", topology.ReasonDuplicateWireGuardIP) {
		t.Errorf("equal claims: want by-1 rejected, bx-1 kept: %v", pl.Rejections)
	}
}
