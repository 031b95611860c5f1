package topology

import (
	"fmt"
	"net/netip"
	"sort"
	"time"
)

// Kilo's constants that other nodes rely on.
const (
	// KiloTable is the routing table for return traffic through the tunnel.
	KiloTable = 1107
	// readyWindow: a node whose last-seen is older than this is not Ready
	// (Kilo: twice the 30 s check-in period).
	readyWindow = 60 * time.Second

	locationPrefix = "location:"
	nodePrefix     = "node:"
)

// segment is one unit of the local topology that shares a WireGuard IP.
type segment struct {
	key string // "location:<name>" or "node:<name>"
	// location is the node location the segment belongs to; in cross
	// granularity segments of one location reach each other without WireGuard.
	location string
	nodes    []*Node // sorted by name
	leader   int
	wgIP     netip.Addr
	// allowedLocationIPs after Kilo's overlap filter.
	allowedLocationIPs []netip.Prefix
}

func (s *segment) leaderNode() *Node { return s.nodes[s.leader] }

// allowedIPs is what a WireGuard peer for this segment carries: every node's
// pod CIDRs and internal IP, the segment's WireGuard IP and its
// allowed-location-ips.
func (s *segment) allowedIPs() []netip.Prefix {
	var out []netip.Prefix
	for _, n := range s.nodes {
		out = append(out, n.PodCIDRs...)
		if n.InternalIP.IsValid() {
			out = append(out, host(n.InternalIP.Addr()))
		}
	}
	if s.wgIP.IsValid() {
		out = append(out, host(s.wgIP))
	}
	return append(out, s.allowedLocationIPs...)
}

// planner carries the state of one Compute call.
type planner struct {
	snap Snapshot
	set  Settings
	self Self

	selfNode    *Node
	selfSegment *segment
	segments    []*segment
	peers       []Peer // local Peer objects, validated and de-duplicated
	discovered  map[Key]netip.AddrPort
	// Decided from Self: this node's private IP and interface, endpoint.
	priv     HostAddress
	endpoint string
	// preserve are networks whose device peers stay as they are.
	preserve    []netip.Prefix
	localPrefix *prefixSet     // prefixes the local cluster owns
	usedKeys    map[Key]string // WireGuard peer keys already in the plan
	remotes     []*remote

	plan Plan
}

// Compute is the planner: it returns the desired network state of node
// self.Name from the snapshot. It is deterministic: the same input gives the
// same output, in the same order.
func Compute(snap Snapshot, self Self) Plan {
	p := &planner{snap: snap, set: withDefaults(snap.Settings), self: self, usedKeys: map[Key]string{}}
	p.plan = Plan{
		Node:        self.Name,
		Cluster:     p.set.ClusterName,
		Annotations: map[string]string{},
		WireGuard:   Device{Interface: p.set.Interface, ListenPort: p.set.Port, MTU: p.set.MTU},
	}
	p.plan.Rejections = append(p.plan.Rejections, snap.Rejections...)
	p.decideSelf()
	p.build()
	p.finish()
	return p.plan
}

func withDefaults(s Settings) Settings {
	if s.Interface == "" {
		s.Interface = "kilo0"
	}
	if s.Granularity == "" {
		s.Granularity = GranularityLocation
	}
	if !s.Subnet.IsValid() {
		s.Subnet = netip.MustParsePrefix("10.4.0.0/16")
	}
	if s.Port == 0 {
		s.Port = 51820
	}
	if s.Encapsulate == "" {
		s.Encapsulate = EncapsulateAlways
	}
	if s.TopologyLabel == "" {
		s.TopologyLabel = "topology.kubernetes.io/region"
	}
	return s
}

func (p *planner) reject(obj ObjectRef, field string, reason Reason, msg string) {
	p.plan.Rejections = append(p.plan.Rejections, Rejection{Object: obj, Field: field, Reason: reason, Message: msg})
}

// decideSelf decides this node's own facts from what was observed and from
// its published Node (force-endpoint).
func (p *planner) decideSelf() {
	force := ""
	for i := range p.snap.Nodes {
		if p.snap.Nodes[i].Name == p.self.Name {
			force = p.snap.Nodes[i].ForceEndpoint
		}
	}
	p.decideHost(force)
	p.plan.PrivateIP, p.plan.PrivateInterface, p.plan.Endpoint = p.priv.Prefix, p.priv.Interface, p.endpoint
	p.plan.WireGuard.MTU = p.mtu()
}

func (p *planner) build() {
	p.buildSegments()
	p.publishAnnotations()
	if p.selfSegment == nil {
		// This node is not (yet) part of the mesh, e.g. it has no pod CIDR:
		// it publishes its annotations and waits.
		return
	}
	p.plan.Leader = p.selfSegment.leaderNode().Name == p.self.Name
	p.plan.Segment = p.selfSegment.key
	p.plan.Location = p.selfNode.location(p.set)
	p.collectDiscovered()
	p.collectPeers()
	p.collectLocalPrefixes()
	if p.plan.Leader {
		p.plan.WireGuardIP = netip.PrefixFrom(p.selfSegment.wgIP, p.set.Subnet.Bits())
		p.plan.Annotations[AnnotationWireGuardIP] = p.plan.WireGuardIP.String()
		p.plan.WireGuard.Up = true
		p.plan.WireGuard.Addresses = []netip.Prefix{p.plan.WireGuardIP}
		p.segmentPeers()
		p.objectPeers()
	}
	p.remoteClusters()
	p.plan.WireGuard.Peers = append(p.plan.WireGuard.Peers, p.preserved(p.preserve)...)
	p.routes()
	p.nat()
}

// location is the node's location name: the annotation, else the topology
// label.
func (n *Node) location(set Settings) string {
	if n.LocationAnnotation != "" {
		return n.LocationAnnotation
	}
	return n.Labels[set.TopologyLabel]
}

// ready is Kilo's readiness rule: endpoint, key, pod CIDR and a fresh
// last-seen.
func ready(n *Node, now time.Time) bool {
	return n.Endpoint != "" && !n.PublicKey.IsZero() && len(n.PodCIDRs) > 0 &&
		!n.LastSeen.IsZero() && now.Sub(n.LastSeen) < readyWindow
}

// NotReady says why a node fails Kilo's readiness rule (ready), in the
// rule's order; nil when it is Ready (`meshlet diagnose`).
func NotReady(n Node, now time.Time) []string {
	var why []string
	if n.Endpoint == "" {
		why = append(why, "no endpoint")
	}
	if n.PublicKey.IsZero() {
		why = append(why, "no WireGuard public key")
	}
	if len(n.PodCIDRs) == 0 {
		why = append(why, "no pod CIDR")
	}
	switch {
	case n.LastSeen.IsZero():
		why = append(why, "never seen (no last-seen)")
	case now.Sub(n.LastSeen) >= readyWindow:
		why = append(why, fmt.Sprintf("last seen %s ago (Kilo's window is %s)", now.Sub(n.LastSeen).Round(time.Second), readyWindow))
	}
	return why
}

func (p *planner) segmentKey(n *Node) string {
	switch p.set.Granularity {
	case GranularityFull, GranularityCross:
		return nodePrefix + n.Name
	default:
		if !n.InternalIP.IsValid() {
			return nodePrefix + n.Name
		}
		return locationPrefix + n.location(p.set)
	}
}

// overlaySelf replaces the published facts of this node by the live ones, so
// the plan is right before the annotations have round-tripped through the
// API server.
func (p *planner) overlaySelf(n Node) Node {
	if !p.self.PublicKey.IsZero() {
		n.PublicKey = p.self.PublicKey
	}
	if p.endpoint != "" {
		n.Endpoint = p.endpoint
	}
	if p.priv.Prefix.IsValid() {
		n.InternalIP = p.priv.Prefix
	}
	if p.self.CiliumHostIP.IsValid() {
		n.CNICompatibilityIP = p.self.CiliumHostIP
	}
	n.MeshletVersion = p.self.Version
	n.LastSeen = p.snap.Now
	return n
}

func (p *planner) buildSegments() {
	bySeg := map[string]*segment{}
	for i := range p.snap.Nodes {
		n := p.snap.Nodes[i]
		if n.Name == p.self.Name {
			n = p.overlaySelf(n)
		}
		if !ready(&n, p.snap.Now) {
			continue
		}
		np := &n
		if n.Name == p.self.Name {
			p.selfNode = np
		}
		k := p.segmentKey(np)
		s := bySeg[k]
		if s == nil {
			s = &segment{key: k, location: np.location(p.set)}
			bySeg[k] = s
			p.segments = append(p.segments, s)
		}
		s.nodes = append(s.nodes, np)
	}
	sort.Slice(p.segments, func(i, j int) bool { return p.segments[i].key < p.segments[j].key })
	base := p.set.Subnet.Masked().Addr()
	for i, s := range p.segments {
		sort.Slice(s.nodes, func(a, b int) bool { return s.nodes[a].Name < s.nodes[b].Name })
		s.leader = findLeader(s.nodes)
		ip := addrAdd(base, uint64(i)+1)
		if ip.IsValid() && p.set.Subnet.Contains(ip) {
			s.wgIP = ip
		} else {
			l := s.leaderNode()
			p.reject(ObjectRef{Kind: "Node", Name: l.Name}, "wireguard-ip", ReasonInvalidCIDR,
				"mesh subnet "+p.set.Subnet.String()+" has no address left for segment "+s.key)
		}
		if p.selfNode != nil {
			for _, n := range s.nodes {
				if n == p.selfNode {
					p.selfSegment = s
				}
			}
		}
		loc := s.location
		if s.key != locationPrefix+loc && p.set.Granularity == GranularityLocation {
			// A node without internal IP is its own segment and location.
			loc = s.key
		}
		p.plan.Segments = append(p.plan.Segments, SegmentInfo{
			Name: s.key, Location: loc, Leader: s.leaderNode().Name, Nodes: nodeNames(s.nodes),
			WireGuardIP: prefixOrZero(s.wgIP, p.set.Subnet.Bits()),
		})
	}
	p.filterAllowedLocationIPs()
}

func nodeNames(ns []*Node) []string {
	out := make([]string, len(ns))
	for i, n := range ns {
		out[i] = n.Name
	}
	return out
}

func prefixOrZero(a netip.Addr, bits int) netip.Prefix {
	if !a.IsValid() {
		return netip.Prefix{}
	}
	return netip.PrefixFrom(a, bits)
}

// findLeader is Kilo's rule, over nodes sorted by name: the first node with
// the leader annotation and a public endpoint, else the first with the
// annotation, else the first with a public endpoint, else the first.
func findLeader(nodes []*Node) int {
	leaders, public := -1, -1
	for i, n := range nodes {
		pub := isPublic(endpointAddr(n.Endpoint))
		if n.Leader {
			if pub {
				return i
			}
			if leaders < 0 {
				leaders = i
			}
		}
		if pub && public < 0 {
			public = i
		}
	}
	switch {
	case leaders >= 0:
		return leaders
	case public >= 0:
		return public
	}
	return 0
}

// isPublic mirrors Kilo: any IPv4 outside RFC 1918 and any IPv6 outside
// fd00::/8 is public; an unknown (DNS) endpoint is not.
func isPublic(a netip.Addr) bool {
	if !a.IsValid() {
		return false
	}
	if a.Is4() || a.Is4In6() {
		b := a.Unmap().As4()
		switch {
		case b[0] == 10, b[0] == 172 && b[1]&0xf0 == 16, b[0] == 192 && b[1] == 168:
			return false
		}
		return true
	}
	b := a.As16()
	return b[0] != 0xfd || b[1] != 0x00
}

// filterAllowedLocationIPs applies Kilo's rule to allowed-location-ips: an
// entry is dropped when it overlaps another segment's entry, when a pod
// CIDR, private IP or WireGuard IP of any segment contains its address, or
// when it overlaps a Peer's allowed IPs. An entry that contains pod CIDRs or
// private IPs is fine (the more specific routes still win): a location's own
// LAN, the usual case. meshlet reports each drop, and also drops entries
// that overlap a remote cluster's networks (docs/kilo-compatibility.md).
func (p *planner) filterAllowedLocationIPs() {
	raw := make([][]netip.Prefix, len(p.segments))
	for i, s := range p.segments {
		seen := map[netip.Prefix]bool{}
		for _, n := range s.nodes {
			for _, a := range n.AllowedLocationIPs {
				if !seen[a] {
					seen[a] = true
					raw[i] = append(raw[i], a)
				}
			}
		}
		sortPrefixes(raw[i])
	}
	for i, s := range p.segments {
		for _, ip := range raw[i] {
			if why := p.allowedLocationIPConflict(i, ip, raw); why != "" {
				p.rejectALIP(s, ip, why)
				continue
			}
			s.allowedLocationIPs = append(s.allowedLocationIPs, ip)
		}
	}
}

// allowedLocationIPConflict says why allowed-location-ip ip of segment i
// cannot be routed to that segment, or "" when it can.
func (p *planner) allowedLocationIPConflict(i int, ip netip.Prefix, raw [][]netip.Prefix) string {
	a := ip.Addr()
	for j, o := range p.segments {
		if j != i {
			for _, q := range raw[j] {
				if ip.Overlaps(q) {
					return "overlaps allowed-location-ips of segment " + o.key
				}
			}
		}
		for _, n := range o.nodes {
			for _, c := range n.PodCIDRs {
				if c.Contains(a) {
					return "is inside the pod CIDR " + c.String() + " of node " + n.Name
				}
			}
			if n.InternalIP.IsValid() && n.InternalIP.Addr() == a {
				return "is the private IP of node " + n.Name
			}
		}
		if o.wgIP.IsValid() && o.wgIP == a {
			return "is the WireGuard IP of segment " + o.key
		}
	}
	for _, peer := range p.snap.Peers {
		for _, pa := range peer.AllowedIPs {
			if ip.Overlaps(pa) {
				return "overlaps allowed IPs of peer " + peer.Name
			}
		}
	}
	// A network another cluster of a mesh owns: accepting it as local would
	// make every local prefix check reject that whole remote cluster (one
	// node annotation cutting the mesh), so the annotation loses, not the
	// mesh.
	if c, n, ok := p.remoteNetworkOverlapping(ip); ok {
		return "overlaps " + n.String() + " of remote cluster " + c
	}
	return ""
}

// remoteNetworkOverlapping finds a remote cluster's allowedNetworks entry
// (from the meshes this cluster belongs to) overlapping ip.
func (p *planner) remoteNetworkOverlapping(ip netip.Prefix) (string, netip.Prefix, bool) {
	for mi := range p.snap.Meshes {
		m := &p.snap.Meshes[mi]
		local, ok := localEntry(m, p.set.ClusterName)
		if !ok {
			continue
		}
		for _, e := range m.Clusters {
			if e.Name == local.Name {
				continue
			}
			for _, n := range e.AllowedNetworks {
				if n.Bits() > 0 && ip.Overlaps(n.Masked()) {
					return e.Name, n.Masked(), true
				}
			}
		}
	}
	return "", netip.Prefix{}, false
}

func (p *planner) rejectALIP(s *segment, ip netip.Prefix, why string) {
	owner := s.leaderNode().Name
	for _, n := range s.nodes {
		for _, a := range n.AllowedLocationIPs {
			if a == ip {
				owner = n.Name
			}
		}
	}
	p.reject(ObjectRef{Kind: "Node", Name: owner}, "allowed-location-ips", ReasonNetworksOverlap, ip.String()+" "+why)
}

// collectDiscovered gathers endpoints learned from handshakes: this node's
// live device first, then the discovered-endpoints annotations in segment
// order (Kilo's order), first wins.
func (p *planner) collectDiscovered() {
	p.discovered = map[Key]netip.AddrPort{}
	add := func(m map[Key]netip.AddrPort) {
		for k, v := range m {
			if _, ok := p.discovered[k]; !ok && usableDiscovered(v) {
				p.discovered[k] = v
			}
		}
	}
	add(p.deviceEndpoints())
	add(p.selfNode.DiscoveredEndpoints)
	for _, s := range p.segments {
		for _, n := range s.nodes {
			add(n.DiscoveredEndpoints)
		}
	}
}

func usableDiscovered(ap netip.AddrPort) bool {
	a := ap.Addr()
	return ap.IsValid() && ap.Port() != 0 && !a.IsLoopback() && !a.IsLinkLocalUnicast() && !a.IsUnspecified()
}

// collectPeers validates Peer objects as a set: sorted by name, a public key
// already used (this node's, or an earlier Peer's) is rejected, and an
// allowed IP claimed by an earlier Peer is dropped (Kilo de-duplicates the
// same way; meshlet also says so).
func (p *planner) collectPeers() {
	peers := append([]Peer(nil), p.snap.Peers...)
	sort.Slice(peers, func(i, j int) bool { return peers[i].Name < peers[j].Name })
	// WireGuard gives each allowed IP to one peer only; a Peer claiming one
	// a segment already carries (a node's pod CIDR, say) would take it over
	// or lose it depending on the order of updates, and Kilo would ask for
	// two routes to it. The node keeps it.
	claimed := map[netip.Prefix]string{}
	keys := map[Key]string{}
	for _, s := range p.segments {
		keys[s.leaderNode().PublicKey] = "node " + s.leaderNode().Name
		for _, a := range s.allowedIPs() {
			claimed[a.Masked()] = "segment " + s.key
		}
	}
	for _, peer := range peers {
		ref := ObjectRef{Kind: "Peer", Name: peer.Name}
		if peer.PublicKey == p.self.PublicKey && !peer.PublicKey.IsZero() {
			p.reject(ref, "spec.publicKey", ReasonOwnKey, "peer uses the public key of node "+p.self.Name)
			continue
		}
		if other, ok := keys[peer.PublicKey]; ok {
			p.reject(ref, "spec.publicKey", ReasonDuplicateKey, "public key already used by "+other)
			continue
		}
		keys[peer.PublicKey] = "peer " + peer.Name
		var ips []netip.Prefix
		for _, a := range peer.AllowedIPs {
			a = a.Masked()
			if other, ok := claimed[a]; ok {
				p.reject(ref, "spec.allowedIPs", ReasonDuplicateAllowedIP, a.String()+" already claimed by "+other)
				continue
			}
			claimed[a] = "peer " + peer.Name
			ips = append(ips, a)
		}
		peer.AllowedIPs = ips
		p.peers = append(p.peers, peer)
	}
}

// collectLocalPrefixes lists what the local cluster owns; no remote cluster
// may claim any of it.
func (p *planner) collectLocalPrefixes() {
	var own []netip.Prefix
	for _, s := range p.segments {
		for _, n := range s.nodes {
			own = append(own, n.PodCIDRs...)
			if n.InternalIP.IsValid() {
				own = append(own, host(n.InternalIP.Addr()))
			}
		}
		if s.wgIP.IsValid() {
			own = append(own, host(s.wgIP))
		}
		own = append(own, s.allowedLocationIPs...)
	}
	for _, peer := range p.peers {
		own = append(own, peer.AllowedIPs...)
	}
	own = append(own, p.set.ServiceCIDRs...)
	p.localPrefix = newPrefixSet(own)
}

// roams tells whether the actuator must keep a peer's learned endpoint
// instead of writing the planned one: the peer is NATed (its keepalive > 0),
// this side keeps the session alive, or there is no endpoint to configure.
// It is wider than Kilo's rule on purpose (docs/kilo-compatibility.md): it
// changes what is written to the device, never the planned endpoint.
func roams(ourKeepalive, theirKeepalive int, endpoint string) bool {
	return ourKeepalive > 0 || theirKeepalive > 0 || endpoint == ""
}

// endpointFor returns the endpoint to plan for a peer: the one discovered by
// a handshake when useDiscovered and one is known, else the configured one.
// In-cluster segments and Peers use Kilo's rule (updateEndpoint): discovered
// only when the target itself keeps a keepalive, because an address learned
// by one node through a NAT is wrong for another; remote clusters use
// roams (docs/kilo-compatibility.md).
func (p *planner) endpointFor(k Key, configured, source string, useDiscovered bool) (string, string) {
	if useDiscovered {
		if d, ok := p.discovered[k]; ok {
			return d.String(), "discovered"
		}
	}
	if configured == "" {
		return "", ""
	}
	return configured, source
}

func (p *planner) addPeer(ref ObjectRef, wp WireGuardPeer) bool {
	if wp.PublicKey == p.self.PublicKey {
		p.reject(ref, "key", ReasonOwnKey, "peer has this node's public key")
		return false
	}
	if other, ok := p.usedKeys[wp.PublicKey]; ok {
		p.reject(ref, "key", ReasonDuplicateKey, "public key already used by "+other)
		return false
	}
	p.usedKeys[wp.PublicKey] = string(wp.Kind) + " " + wp.Name
	wp.AllowedIPs = sortedUnique(wp.AllowedIPs)
	p.plan.WireGuard.Peers = append(p.plan.WireGuard.Peers, wp)
	return true
}

// sameLocation: the segment is reached without WireGuard from this node
// (its own segment, or in cross granularity a segment of the same location).
func (p *planner) sameLocation(s *segment) bool {
	if s == p.selfSegment {
		return true
	}
	return p.set.Granularity == GranularityCross && s.location != "" && s.location == p.selfSegment.location
}

func (p *planner) segmentPeers() {
	ka := p.selfNode.PersistentKeepalive
	for _, s := range p.segments {
		if p.sameLocation(s) {
			continue
		}
		l := s.leaderNode()
		roaming := roams(ka, l.PersistentKeepalive, l.Endpoint)
		ep, src := p.endpointFor(l.PublicKey, l.Endpoint, "annotation", l.PersistentKeepalive > 0)
		wp := WireGuardPeer{
			Name: l.Name, Kind: KindSegment, Location: s.location, PublicKey: l.PublicKey,
			Endpoint: ep, EndpointSource: src, AllowedIPs: s.allowedIPs(),
			PersistentKeepalive: ka, Roaming: roaming, SessionProbe: sessionProbe(l, s.wgIP),
		}
		if ka > 0 {
			wp.KeepaliveSource = KeepaliveNodeAnnotation
		}
		p.addPeer(ObjectRef{Kind: "Node", Name: l.Name}, wp)
	}
}

// sessionProbe is the address to probe a kg-run peer's session at (its
// WireGuard IP), or none for a peer run by meshlet, which never drops a
// session it keeps.
func sessionProbe(leader *Node, wgIP netip.Addr) netip.Addr {
	if leader.MeshletVersion != "" {
		return netip.Addr{}
	}
	return wgIP
}

// peerKeepalive is precedence rule 1: the Peer's node-persistent-keepalive
// rules, else its spec, else this node's annotation.
func (p *planner) peerKeepalive(peer Peer) (int, KeepaliveSource) {
	loc := p.selfNode.location(p.set)
	for _, r := range peer.NodeKeepalive {
		if r.Location != "" && r.Location == loc || len(r.NodeSelector) > 0 && matchLabels(r.NodeSelector, p.selfNode.Labels) {
			return r.Value, KeepalivePeerAnnotation
		}
	}
	if peer.PersistentKeepalive > 0 {
		return peer.PersistentKeepalive, KeepalivePeerSpec
	}
	if ka := p.selfNode.PersistentKeepalive; ka > 0 {
		return ka, KeepaliveNodeAnnotation
	}
	return 0, KeepaliveNone
}

func matchLabels(sel, labels map[string]string) bool {
	for k, v := range sel {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

func (p *planner) objectPeers() {
	for _, peer := range p.peers {
		ka, src := p.peerKeepalive(peer)
		roaming := roams(ka, peer.PersistentKeepalive, peer.Endpoint)
		ep, esrc := p.endpointFor(peer.PublicKey, peer.Endpoint, "spec", peer.PersistentKeepalive > 0)
		p.addPeer(ObjectRef{Kind: "Peer", Name: peer.Name}, WireGuardPeer{
			Name: peer.Name, Kind: KindPeer, PublicKey: peer.PublicKey, Endpoint: ep, EndpointSource: esrc,
			AllowedIPs: append([]netip.Prefix(nil), peer.AllowedIPs...), PersistentKeepalive: ka,
			KeepaliveSource: src, PresharedKey: peer.PresharedKey, Roaming: roaming,
		})
	}
}

// publishAnnotations: what this node writes on its own Node object, in
// Kilo's formats. wireguard-ip is set by build once the role is known.
func (p *planner) publishAnnotations() {
	a := p.plan.Annotations
	if !p.self.PublicKey.IsZero() {
		a[AnnotationKey] = p.self.PublicKey.String()
	}
	a[AnnotationEndpoint] = p.endpoint
	a[AnnotationInternalIP] = FormatPrefix(p.priv.Prefix)
	a[AnnotationLastSeen] = FormatLastSeen(p.snap.Now)
	a[AnnotationWireGuardIP] = ""
	a[AnnotationGranularity] = string(p.set.Granularity)
	a[AnnotationVersion] = p.self.Version
	a[AnnotationCNICompatibilityIP] = ""
	if p.set.Compatibility == CompatibilityCilium {
		a[AnnotationCNICompatibilityIP] = FormatPrefix(p.self.CiliumHostIP)
	}
}

// finish sorts what must be deterministic and fills derived output.
func (p *planner) finish() {
	pl := &p.plan
	pl.Annotations[AnnotationDiscoveredEndpoints] = FormatDiscoveredEndpoints(p.discoveredToPublish())
	sort.SliceStable(pl.WireGuard.Peers, func(i, j int) bool {
		a, b := pl.WireGuard.Peers[i], pl.WireGuard.Peers[j]
		if a.Kind != b.Kind {
			return kindOrder(a.Kind) < kindOrder(b.Kind)
		}
		if a.Cluster != b.Cluster {
			return a.Cluster < b.Cluster
		}
		return a.Name < b.Name
	})
	pl.Routes = oneFamily(dedupRoutes(pl.Routes), p.set.Interface)
	sort.SliceStable(pl.Routes, func(i, j int) bool { return routeLess(pl.Routes[i], pl.Routes[j]) })
	pl.Rules = oneFamilyRules(dedupRules(pl.Rules))
	sort.SliceStable(pl.Rules, func(i, j int) bool { return ruleLess(pl.Rules[i], pl.Rules[j]) })
	sort.SliceStable(pl.Rejections, func(i, j int) bool {
		a, b := pl.Rejections[i], pl.Rejections[j]
		if a.Object.String() != b.Object.String() {
			return a.Object.String() < b.Object.String()
		}
		if a.Field != b.Field {
			return a.Field < b.Field
		}
		return a.Message < b.Message
	})
	pl.Rejections = dedupRejections(pl.Rejections)
	p.assignReporters()
	if pl.WireGuard.Peers == nil {
		pl.WireGuard.Peers = []WireGuardPeer{}
	}
	if pl.Routes == nil {
		pl.Routes = []Route{}
	}
	if pl.Rules == nil {
		pl.Rules = []Rule{}
	}
	if pl.Rejections == nil {
		pl.Rejections = []Rejection{}
	}
}

// discoveredToPublish is what this node publishes in discovered-endpoints,
// Kilo's set (discoverNATEndpoints): what its device learned for segment
// leaders that keep a keepalive themselves and for every Peer; for remote
// peers (meshlet's), what it learned for those that roam.
func (p *planner) discoveredToPublish() map[Key]netip.AddrPort {
	natted := map[Key]bool{}
	for _, s := range p.segments {
		natted[s.leaderNode().PublicKey] = s.leaderNode().PersistentKeepalive != 0
	}
	learned := p.deviceEndpoints()
	out := map[Key]netip.AddrPort{}
	for _, wp := range p.plan.WireGuard.Peers {
		ap, ok := learned[wp.PublicKey]
		if !ok || !usableDiscovered(ap) {
			continue
		}
		switch {
		case wp.Kind == KindSegment && natted[wp.PublicKey], wp.Kind == KindPeer, wp.Kind == KindRemote && wp.Roaming:
			out[wp.PublicKey] = ap
		}
	}
	return out
}

// assignReporters sets each rejection's Reporter (see Rejection): only Ready
// nodes that run meshlet (meshlet.io/version) can write an Event.
func (p *planner) assignReporters() {
	runs := map[string]bool{}
	var leaders, others []string
	for _, s := range p.segments {
		for _, n := range s.nodes {
			if n.MeshletVersion == "" {
				continue
			}
			runs[n.Name] = true
			if n == s.leaderNode() {
				leaders = append(leaders, n.Name)
			} else {
				others = append(others, n.Name)
			}
		}
	}
	sort.Strings(leaders)
	sort.Strings(others)
	reporter := p.self.Name
	switch {
	case len(leaders) > 0:
		reporter = leaders[0]
	case len(others) > 0:
		reporter = others[0]
	}
	for i := range p.plan.Rejections {
		r := &p.plan.Rejections[i]
		r.Reporter = reporter
		if r.Object.Kind == "Node" && r.Object.Cluster == "" && runs[r.Object.Name] {
			r.Reporter = r.Object.Name
		}
	}
}

func kindOrder(k PeerKind) int {
	switch k {
	case KindSegment:
		return 0
	case KindPeer:
		return 1
	}
	return 2
}

func dedupRejections(rs []Rejection) []Rejection {
	out := rs[:0]
	for i, r := range rs {
		if i > 0 && r == rs[i-1] {
			continue
		}
		out = append(out, r)
	}
	return out
}

// NextReadinessChange is the earliest time after snap.Now at which a node
// (local or remote) that is fresh now stops being Ready because its
// last-seen ages past Kilo's window; zero when none will. Nothing notifies
// the agent of an annotation that does NOT change, so the loop re-plans at
// that moment instead of at the next resync: a dead leader is replaced as
// soon as Kilo's rule allows, not up to a resync period later.
func NextReadinessChange(snap Snapshot) time.Time {
	var next time.Time
	consider := func(ns []Node) {
		for i := range ns {
			if ns[i].LastSeen.IsZero() {
				continue
			}
			t := ns[i].LastSeen.Add(readyWindow)
			if t.After(snap.Now) && (next.IsZero() || t.Before(next)) {
				next = t
			}
		}
	}
	consider(snap.Nodes)
	for _, r := range snap.Remotes {
		consider(r.Nodes)
	}
	return next
}
