package topology

import (
	"net/netip"
	"time"
)

// The WireGuard device's peers (Kilo's pkg/mesh Conf, extended with the
// remote clusters' leaders): one per other segment, per Kilo Peer and per
// remote leader on a segment leader; on every node the device peers kept
// while their remote cluster is not known yet.

// DeviceInput is what the device stage reads: the topology as the leaders
// stage left it, the validated Peers, the remote clusters resolved and
// their watchers' state.
type DeviceInput struct {
	Settings   Settings
	Self       Self
	Local      Local
	Leader     bool
	Peers      []Peer
	Discovered map[Key]netip.AddrPort
	Remotes    []Remote
	States     []RemoteCluster
	// Claims are the local cluster's and the reservations (claims.go):
	// what a remote cluster's nodes and Peers may not claim.
	Claims *Claims
	Now    time.Time
}

// DevicePlan is the device stage's output.
type DevicePlan struct {
	// Peers in the order they were accepted (the plan sorts them).
	Peers []WireGuardPeer
	// Remotes describes each remote cluster.
	Remotes []RemoteInfo
	// Probes are the tunnels this leader's health probes watch: the
	// other leaders' WireGuard IPs (Settings.HealthProbes).
	Probes     []ProbeTarget
	Rejections []Rejection
}

// deviceBuilder accepts peers in order: a key is used once, never this
// node's.
type deviceBuilder struct {
	in   DeviceInput
	used map[Key]string
	out  DevicePlan
}

func (b *deviceBuilder) reject(obj ObjectRef, field string, reason Reason, msg string) {
	b.out.Rejections = append(b.out.Rejections, Rejection{Object: obj, Field: field, Reason: reason, Message: msg})
}

func (b *deviceBuilder) add(ref ObjectRef, wp WireGuardPeer) bool {
	if wp.PublicKey == b.in.Self.PublicKey {
		b.reject(ref, "key", ReasonOwnKey, "peer has this node's public key")
		return false
	}
	if other, ok := b.used[wp.PublicKey]; ok {
		b.reject(ref, "key", ReasonDuplicateKey, "public key already used by "+other)
		return false
	}
	b.used[wp.PublicKey] = string(wp.Kind) + " " + wp.Name
	wp.AllowedIPs = sortedUnique(wp.AllowedIPs)
	b.out.Peers = append(b.out.Peers, wp)
	return true
}

// probe adds a tunnel to the probes: the peer's WireGuard IP, which its
// kernel answers through the tunnel.
func (b *deviceBuilder) probe(wp WireGuardPeer, addr netip.Addr) {
	if b.in.Settings.HealthProbes && addr.IsValid() {
		b.out.Probes = append(b.out.Probes, ProbeTarget{Name: wp.Name, Cluster: wp.Cluster, PublicKey: wp.PublicKey, Addr: addr})
	}
}

// SameLocation: segment s is reached without WireGuard from this node (its
// own segment, or in cross granularity a segment of the same location —
// nodes without a location share the empty one, as in Cozystack's kg,
// where cross comes from: case X3-cross-nodes-without-location).
func (l Local) SameLocation(s *Segment, set Settings) bool {
	if s == l.SelfSegment {
		return true
	}
	return set.Granularity == GranularityCross && s.Location == l.SelfSegment.Location
}

// DevicePeers plans the device's peers. A leader has one peer per segment of
// another location, per Peer and per remote leader (a key used once; the
// earlier kind wins); the peers of a remote cluster not synced yet are
// kept as the device has them.
func DevicePeers(in DeviceInput) DevicePlan {
	b := &deviceBuilder{in: in, used: map[Key]string{}}
	if in.Leader {
		b.segmentPeers()
		b.objectPeers()
	}
	var preserve []netip.Prefix
	for _, r := range in.Remotes {
		info := RemoteInfo{Cluster: r.Entry.Name, Mesh: r.Mesh.Namespace + "/" + r.Mesh.Name, AllowedNetworks: r.Networks}
		rc := remoteState(in.States, r.Entry.Name)
		if rc != nil {
			info.Synced = rc.Synced
		}
		switch {
		case !in.Leader:
		case rc != nil && rc.Synced:
			info.Leaders, info.Segments = b.remotePeers(r, rc)
		default:
			preserve = append(preserve, r.Networks...)
		}
		b.out.Remotes = append(b.out.Remotes, info)
	}
	b.out.Peers = append(b.out.Peers, preserved(in.Self.Device, b.out.Peers, preserve)...)
	return b.out
}

func (b *deviceBuilder) segmentPeers() {
	l, set := b.in.Local, b.in.Settings
	ka := l.Self.PersistentKeepalive
	for _, s := range l.Segments {
		if l.SameLocation(s, set) {
			continue
		}
		ln := s.LeaderNode()
		roaming := roams(ka, ln.PersistentKeepalive, ln.Endpoint)
		ep, src := endpointFor(b.in.Discovered, ln.PublicKey, ln.Endpoint, "annotation", ln.PersistentKeepalive > 0)
		wp := WireGuardPeer{
			Name: ln.Name, Kind: KindSegment, Location: s.Location, PublicKey: ln.PublicKey,
			Endpoint: ep, EndpointSource: src, AllowedIPs: s.AllowedIPs(),
			PersistentKeepalive: ka, Roaming: roaming, SessionProbe: sessionProbe(ln, s.WireGuardIP),
		}
		if ka > 0 {
			wp.KeepaliveSource = KeepaliveNodeAnnotation
		}
		if b.add(ObjectRef{Kind: "Node", Name: ln.Name}, wp) {
			b.probe(wp, s.WireGuardIP)
		}
	}
}

func (b *deviceBuilder) objectPeers() {
	for _, peer := range b.in.Peers {
		ka, src := peerKeepalive(peer, b.in.Local.Self, b.in.Settings)
		roaming := roams(ka, peer.PersistentKeepalive, peer.Endpoint)
		ep, esrc := endpointFor(b.in.Discovered, peer.PublicKey, peer.Endpoint, "spec", peer.PersistentKeepalive > 0)
		b.add(ObjectRef{Kind: "Peer", Name: peer.Name}, WireGuardPeer{
			Name: peer.Name, Kind: KindPeer, PublicKey: peer.PublicKey, Endpoint: ep, EndpointSource: esrc,
			AllowedIPs: append([]netip.Prefix(nil), peer.AllowedIPs...), PersistentKeepalive: ka,
			KeepaliveSource: src, PresharedKey: peer.PresharedKey, Roaming: roaming,
		})
	}
}

// remotePeers adds one WireGuard peer per remote leader and returns their
// names and the remote segments; the first leader accepted also carries
// the cluster's Peers and allowedNetworks.
func (b *deviceBuilder) remotePeers(r Remote, rc *RemoteCluster) ([]string, []SegmentInfo) {
	set := b.in.Settings
	groups, rejs := remoteGroups(r, rc, set, b.in.Now)
	b.out.Rejections = append(b.out.Rejections, rejs...)
	var names []string
	var segs []SegmentInfo
	first := true
	for _, g := range groups {
		l := g.leader
		segs = append(segs, SegmentInfo{Name: g.key, Location: l.location(set), Leader: l.Name, Nodes: nodeNames(g.nodes),
			WireGuardIP: l.WireGuardIP})
		ref := ObjectRef{Kind: "Node", Cluster: r.Entry.Name, Name: l.Name}
		if l.MalformedEndpoint {
			b.reject(ref, "endpoint", ReasonInvalidEndpoint, "malformed clustermesh-endpoint or force-endpoint: node skipped")
			continue
		}
		wp, rejs := remoteLeaderPeer(r, rc, g, first, b.in.Claims, b.in.Local.Self, b.in.Discovered, set)
		b.out.Rejections = append(b.out.Rejections, rejs...)
		if b.add(ref, wp) {
			names = append(names, l.Name)
			first = false
			b.probe(wp, l.WireGuardIP.Addr())
		}
	}
	return names, segs
}
