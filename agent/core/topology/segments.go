package topology

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"time"
)

// Kilo's topology of the local cluster (pkg/mesh NewTopology): Ready nodes
// grouped into segments, each with a leader and a WireGuard IP.

// Kilo's constants that other nodes rely on.
const (
	// KiloTable is the routing table for return traffic through the tunnel.
	KiloTable      = 1107
	locationPrefix = "location:"
	nodePrefix     = "node:"
)

// LocationSegment is the key of the segment of a location.
func LocationSegment(location string) string { return locationPrefix + location }

// Segment is one unit of the local topology that shares a WireGuard IP.
type Segment struct {
	Key string // "location:<name>" or "node:<name>"
	// Location is the node location the segment belongs to; in cross
	// granularity segments of one location reach each other without WireGuard.
	Location string
	Nodes    []*Node // sorted by name
	// Leader is the index in Nodes of the leader.
	Leader      int
	WireGuardIP netip.Addr // invalid when the subnet has no address left
	// DualStackWireGuardIP is the segment's address of the dual-stack
	// subnet (Local.WithDualStack; invalid in a single-stack mesh).
	DualStackWireGuardIP netip.Addr
	// AllowedLocationIPs after Kilo's overlap filter.
	AllowedLocationIPs []netip.Prefix
}

// LeaderNode is the segment's leader.
func (s *Segment) LeaderNode() *Node { return s.Nodes[s.Leader] }

// AllowedIPs is what a WireGuard peer for this segment carries: every
// node's pod CIDRs and internal IP, the segment's WireGuard IP and its
// allowed-location-ips.
func (s *Segment) AllowedIPs() []netip.Prefix {
	var out []netip.Prefix
	for _, n := range s.Nodes {
		out = append(out, n.PodCIDRs...)
		if ip, ok := n.routedPrivateIP(); ok {
			out = append(out, ip)
		}
		if ip, ok := n.routedDualStackIP(); ok {
			out = append(out, ip)
		}
	}
	if s.WireGuardIP.IsValid() {
		out = append(out, host(s.WireGuardIP))
	}
	if s.DualStackWireGuardIP.IsValid() {
		out = append(out, host(s.DualStackWireGuardIP))
	}
	return append(out, s.AllowedLocationIPs...)
}

// routedPrivateIP is the node's private IP as a host prefix, when it is
// routed to the node from other locations (valid and not refused:
// ClaimNodeAddresses).
func (n *Node) routedPrivateIP() (netip.Prefix, bool) {
	if !n.InternalIP.IsValid() || n.PrivateIPRefused {
		return netip.Prefix{}, false
	}
	return host(n.InternalIP.Addr()), true
}

// Local is the local cluster's topology as one node sees it.
type Local struct {
	Segments []*Segment // sorted by key
	// Self is this node with its live facts (nil: not Ready in Kilo's
	// sense), SelfSegment its segment.
	Self        *Node
	SelfSegment *Segment
	Rejections  []Rejection
}

// Defaults fills in the settings' defaults (Kilo's).
func Defaults(s Settings) Settings {
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

// location is the node's location name: the annotation, else the topology
// label.
func (n *Node) location(set Settings) string {
	if n.LocationAnnotation != "" {
		return n.LocationAnnotation
	}
	return n.Labels[set.TopologyLabel]
}

// NodeLocation is a node's location: its location annotation, else its
// topology label (Kilo's rule).
func NodeLocation(n Node, set Settings) string { return n.location(Defaults(set)) }

// ready is Kilo's readiness rule: endpoint, key, pod CIDR and a fresh
// last-seen.
func ready(n *Node, now time.Time) bool {
	return n.Endpoint != "" && !n.PublicKey.IsZero() && len(n.PodCIDRs) > 0 &&
		!n.LastSeen.IsZero() && now.Sub(n.LastSeen) < ReadyWindow
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
	case now.Sub(n.LastSeen) >= ReadyWindow:
		why = append(why, fmt.Sprintf("last seen %s ago (Kilo's window is %s)", now.Sub(n.LastSeen).Round(time.Second), ReadyWindow))
	}
	return why
}

func segmentKey(n *Node, set Settings) string {
	switch set.Granularity {
	case GranularityFull, GranularityCross:
		return nodePrefix + n.Name
	default:
		if !n.InternalIP.IsValid() {
			return nodePrefix + n.Name
		}
		return locationPrefix + n.location(set)
	}
}

// Published is node name as its Node object says (nil when there is none).
func Published(nodes []Node, name string) *Node {
	var out *Node
	for i := range nodes {
		if nodes[i].Name == name {
			out = &nodes[i]
		}
	}
	return out
}

// overlaySelf replaces the published facts of this node by the live ones,
// so the plan is right before the annotations have round-tripped through
// the API server.
func overlaySelf(n Node, self Self, h Host, now time.Time) Node {
	if !self.PublicKey.IsZero() {
		n.PublicKey = self.PublicKey
	}
	if h.Endpoint != "" {
		n.Endpoint = h.Endpoint
	}
	if h.Private.Prefix.IsValid() {
		n.InternalIP = h.Private.Prefix
	}
	n.DualStackInternalIP = h.DualStackPrivate.Prefix
	if self.CiliumHostIP.IsValid() {
		n.CNICompatibilityIP = self.CiliumHostIP
	}
	n.MeshletVersion = self.Version
	n.LastSeen = now
	return n
}

// Segments is Kilo's topology: the Ready nodes (this one with its live
// facts) grouped into segments sorted by key, each led by the node Kilo's
// rule elects, numbered from the subnet in that order. What the nodes
// claim is admitted later (ClaimNodeAddresses, ClaimAllowedLocationIPs).
func Segments(snap Snapshot, set Settings, self Self, h Host) Local {
	var l Local
	bySeg := map[string]*Segment{}
	for i := range snap.Nodes {
		n := snap.Nodes[i]
		if n.Name == self.Name {
			n = overlaySelf(n, self, h, snap.Now)
		}
		if !ready(&n, snap.Now) {
			continue
		}
		np := &n
		if n.Name == self.Name {
			l.Self = np
		}
		k := segmentKey(np, set)
		s := bySeg[k]
		if s == nil {
			s = &Segment{Key: k, Location: np.location(set)}
			bySeg[k] = s
			l.Segments = append(l.Segments, s)
		}
		s.Nodes = append(s.Nodes, np)
	}
	sort.Slice(l.Segments, func(i, j int) bool { return l.Segments[i].Key < l.Segments[j].Key })
	base := set.Subnet.Masked().Addr()
	for i, s := range l.Segments {
		sort.Slice(s.Nodes, func(a, b int) bool { return s.Nodes[a].Name < s.Nodes[b].Name })
		s.Leader = findLeader(s.Nodes)
		ip := addrAdd(base, uint64(i)+1)
		if ip.IsValid() && set.Subnet.Contains(ip) {
			s.WireGuardIP = ip
		} else {
			l.Rejections = append(l.Rejections, Rejection{Object: ObjectRef{Kind: "Node", Name: s.LeaderNode().Name}, Field: "wireguard-ip",
				Reason: ReasonInvalidCIDR, Message: "mesh subnet " + set.Subnet.String() + " has no address left for segment " + s.Key})
		}
		if l.Self != nil && slices.Contains(s.Nodes, l.Self) {
			l.SelfSegment = s
		}
	}
	l.Rejections = append(l.Rejections, crossWithoutPrivateIP(l.Segments, set)...)
	return l
}

// crossWithoutPrivateIP names, in cross granularity, the nodes that share
// their location with others but have no private IP: the nodes of a
// location reach each other over their private IPs (no WireGuard between
// them), so no node of its location routes to it there; other locations
// still reach it through its own WireGuard peer. Cozystack's kg, where cross
// comes from, crashes on such a node (case X5-cross-node-without-private-ip-kg-panics).
func crossWithoutPrivateIP(segs []*Segment, set Settings) []Rejection {
	if set.Granularity != GranularityCross {
		return nil
	}
	perLocation := map[string]int{}
	for _, s := range segs {
		perLocation[s.Location]++
	}
	var rejs []Rejection
	for _, s := range segs {
		for _, n := range s.Nodes {
			if !n.InternalIP.IsValid() && perLocation[s.Location] > 1 {
				rejs = append(rejs, Rejection{Object: ObjectRef{Kind: "Node", Name: n.Name}, Field: "internal-ip", Reason: ReasonNoPrivateIP,
					Message: "no private IP: in cross granularity the nodes of location " + strconv.Quote(s.Location) +
						" reach each other over their private IPs, so none of them routes to this node (other locations reach it through its WireGuard peer)"})
			}
		}
	}
	return rejs
}

// Infos describes the segments for the plan.
func (l Local) Infos(set Settings) []SegmentInfo {
	var out []SegmentInfo
	for _, s := range l.Segments {
		loc := s.Location
		if s.Key != locationPrefix+loc && set.Granularity == GranularityLocation {
			// A node without internal IP is its own segment and location.
			loc = s.Key
		}
		out = append(out, SegmentInfo{
			Name: s.Key, Location: loc, Leader: s.LeaderNode().Name, Nodes: nodeNames(s.Nodes),
			WireGuardIP:          prefixOrZero(s.WireGuardIP, set.Subnet.Bits()),
			DualStackWireGuardIP: prefixOrZero(s.DualStackWireGuardIP, set.DualStackSubnet.Bits()),
		})
	}
	return out
}

// StatusWriter is the node that writes the status of the cluster's
// ClusterMeshes (agent/runtime/meshstatus): the leader of the first
// segment, in the topology's order, that runs meshlet ("" when every
// leader runs kg). It is one of the agents that watch the remote clusters,
// every node that sees the same topology names the same one, and it moves
// with leadership — so the writer needs no Lease of its own.
func (l Local) StatusWriter() string {
	for _, s := range l.Segments {
		if n := s.LeaderNode(); n != nil && n.MeshletVersion != "" {
			return n.Name
		}
	}
	return ""
}

// WithoutLeader is the topology where node name, which Kilo's rule elects
// in its segment, does not lead it (failover's veto): the next node in
// Kilo's order leads, and name routes through it.
func (l Local) WithoutLeader(name string) Local {
	seg := l.SelfSegment
	if seg == nil || len(seg.Nodes) < 2 {
		return l
	}
	rest := make([]*Node, 0, len(seg.Nodes)-1)
	for _, n := range seg.Nodes {
		if n.Name != name {
			rest = append(rest, n)
		}
	}
	next := rest[findLeader(rest)]
	vetoed := *seg
	vetoed.Leader = slices.Index(seg.Nodes, next)
	out := l
	out.Segments = slices.Clone(l.Segments)
	out.Segments[slices.Index(l.Segments, seg)] = &vetoed
	out.SelfSegment = &vetoed
	return out
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

// KiloOrder sorts nodes as Kilo's rule prefers them (findLeader): the
// leader annotation with a public endpoint, the annotation, a public
// endpoint, then by name.
func KiloOrder(nodes []*Node) []*Node {
	out := slices.Clone(nodes)
	rank := func(n *Node) int {
		pub := isPublic(endpointAddr(n.Endpoint))
		switch {
		case n.Leader && pub:
			return 0
		case n.Leader:
			return 1
		case pub:
			return 2
		}
		return 3
	}
	sort.SliceStable(out, func(i, j int) bool {
		ri, rj := rank(out[i]), rank(out[j])
		if ri != rj {
			return ri < rj
		}
		return out[i].Name < out[j].Name
	})
	return out
}

// IsPublicEndpoint reports whether an endpoint's host is a public IP in
// Kilo's sense (a DNS name is not).
func IsPublicEndpoint(ep string) bool { return isPublic(endpointAddr(ep)) }

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

// allowedLocationIPConflict is Kilo's own filter of allowed-location-ips
// (FilterAllowedLocationIPs): it says why entry ip of segment i is dropped,
// or "". An entry is dropped when it overlaps another segment's entry, or
// when a pod CIDR, private IP or WireGuard IP of any segment contains its
// address. What Kilo lets through is then a claim like any other
// (ClaimAllowedLocationIPs): it may contain its own location's addresses
// (its LAN, the usual case), not another location's
// (docs/kilo-compatibility.md#claims).
func allowedLocationIPConflict(segs []*Segment, i int, ip netip.Prefix, raw [][]netip.Prefix, set Settings) string {
	a := ip.Addr()
	for j, o := range segs {
		// In cross granularity the segments of one location are one
		// location: their entries are its (ClaimAllowedLocationIPs).
		if j != i && (set.Granularity != GranularityCross || o.Location != segs[i].Location) {
			for _, q := range raw[j] {
				if ip.Overlaps(q) {
					return "overlaps allowed-location-ips of segment " + o.Key
				}
			}
		}
		for _, n := range o.Nodes {
			for _, c := range n.PodCIDRs {
				if c.Contains(a) {
					return "is inside the pod CIDR " + c.String() + " of node " + n.Name
				}
			}
			if n.InternalIP.IsValid() && n.InternalIP.Addr() == a {
				return "is the private IP of node " + n.Name
			}
		}
		if o.WireGuardIP.IsValid() && o.WireGuardIP == a {
			return "is the WireGuard IP of segment " + o.Key
		}
	}
	return ""
}

func rejectALIP(s *Segment, ip netip.Prefix, reason Reason, msg string) Rejection {
	owner := s.LeaderNode().Name
	for _, n := range s.Nodes {
		for _, a := range n.AllowedLocationIPs {
			if a == ip {
				owner = n.Name
			}
		}
	}
	return Rejection{Object: ObjectRef{Kind: "Node", Name: owner}, Field: "allowed-location-ips", Reason: reason, Message: msg}
}
