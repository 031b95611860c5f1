package topology

import (
	"fmt"
	"math/bits"
	"net/netip"
	"slices"
	"strings"

	"github.com/google/btree"
)

// The one rule for every prefix a writer claims (docs/security.md#claims):
// a node's pod CIDRs, private IP and allowed-location-ips, a segment's
// WireGuard IP, a Peer's allowed IPs, a remote cluster's allowedNetworks and
// what its nodes and Peers publish. A claim is refused when it is broader
// than MinClaimBits4 / MinClaimBits6 (a default route included), or when
// it overlaps — contains, equals or lies inside — what an earlier owner
// holds. Owners are admitted in this order, so an earlier one keeps what it
// holds against any later one:
//
//  1. the nodes' own addresses: the segments' WireGuard IPs (the planner's
//     numbering), the service CIDRs, then every Ready node's pod CIDRs and
//     private IP, oldest node first;
//  2. what a ClusterMesh reserves for each remote cluster (its
//     allowedNetworks: an administrator's statement);
//  3. the Peers, oldest first (creation time, then name);
//  4. the locations' allowed-location-ips.
//
// Two exceptions, both of one owner's own addresses: a location's
// allowed-location-ips may contain its own nodes' addresses (its LAN, Kilo's
// usual case), and only allowed-location-ips keep out of another location's
// published private network (the masked internal-ip), which two locations
// may well number alike for their hosts but cannot both route.

// The shortest prefix any writer may claim, per family: an IPv4 /8 is what
// the largest private network (10.0.0.0/8) spans; an IPv6 /16 is far wider
// than any site's or cluster's allocation (a /48 or /56) and still a
// 65,536th of the address space. Anything broader routes a large share of
// every node's traffic (a /1 pair is a default route in two halves).
const (
	MinClaimBits4 = 8
	MinClaimBits6 = 16
)

// ClaimTooBroad says why prefix p may not be claimed by anyone whatever it
// overlaps: a default route, or broader than the bound of its family.
func ClaimTooBroad(p netip.Prefix) (Reason, string, bool) {
	p = p.Masked()
	bound := MinClaimBits4
	if p.Addr().Is6() {
		bound = MinClaimBits6
	}
	switch {
	case p.Bits() == 0:
		return ReasonDefaultRoute, p.String() + " is a default route", true
	case p.Bits() < bound:
		return ReasonTooBroad, fmt.Sprintf("%s is broader than /%d, the widest prefix meshlet routes for anyone", p, bound), true
	}
	return "", "", false
}

// claimKind is what a held claim is: it decides who may claim beside it.
type claimKind uint8

const (
	claimWireGuardIP claimKind = iota
	claimService
	claimPodCIDR
	claimPrivateIP
	// claimPrivateRange is the masked network of a node's private IP:
	// only allowed-location-ips keep out of another location's.
	claimPrivateRange
	claimReserved
	claimPeer
	claimLocationIP
	// claimRemote is a remote cluster's node or Peer: checked, never held
	// (the cluster's reservation holds it).
	claimRemote
)

// claimant is who claims a prefix: the kind of claim, its owner ("node
// a-x1", "peer laptop", "cluster b"), and for node addresses and
// allowed-location-ips the location they belong to.
type claimant struct {
	kind  claimKind
	owner string
	group string
}

// heldClaim is one prefix admitted, with who holds it; next is another
// holder of the same prefix.
type heldClaim struct {
	prefix netip.Prefix
	claimant
	seq  int
	next *heldClaim
}

// String says what is held, for a refusal's message.
func (h *heldClaim) String() string {
	p := h.prefix.String()
	if h.prefix.IsSingleIP() && (h.kind == claimWireGuardIP || h.kind == claimPrivateIP) {
		p = h.prefix.Addr().String()
	}
	switch h.kind {
	case claimWireGuardIP:
		return "the WireGuard IP " + p + " of " + h.owner
	case claimService:
		return "the service CIDR " + p
	case claimPodCIDR:
		return "the pod CIDR " + p + " of " + h.owner
	case claimPrivateIP:
		return "the private IP " + p + " of " + h.owner
	case claimPrivateRange:
		return "the private network " + p + " of " + h.owner
	case claimReserved:
		return p + ", reserved for remote " + h.owner + " by its ClusterMesh"
	case claimPeer:
		return p + " of " + h.owner
	case claimLocationIP:
		return "allowed-location-ips " + p + " of " + h.owner
	}
	return p + " of " + h.owner
}

// ignores tells whether claimant c may claim beside held claim h.
func (c claimant) ignores(h *heldClaim) bool {
	if h.owner == c.owner {
		return true
	}
	if c.kind == claimLocationIP {
		return c.group != "" && h.group == c.group
	}
	return h.kind == claimPrivateRange
}

// Claims holds what has been admitted so far. The zero value is not
// usable: NewClaims.
type Claims struct {
	exact  map[netip.Prefix]*heldClaim // the first holder of each prefix
	levels [2][3]uint64                // prefix lengths present, per family (IPv4, IPv6)
	tree   *btree.BTreeG[*heldClaim]
	seq    int
	slab   []heldClaim // held claims are allocated from it, a chunk at a time

	// The query in progress (conflict): its pivot, claimant and result,
	// and the tree's visitor made once, so that a query allocates nothing
	// (the planner asks for every prefix of every remote node).
	pivot heldClaim
	query claimant
	found *heldClaim
	visit func(*heldClaim) bool
}

// NewClaims returns an empty set of claims.
func NewClaims() *Claims {
	cs := &Claims{exact: map[netip.Prefix]*heldClaim{}, tree: btree.NewG(16, heldLess)}
	cs.visit = cs.inside
	return cs
}

// inside visits the held claims from the pivot's address on, while they
// start inside the pivot's prefix, for one the query may not claim beside.
func (cs *Claims) inside(h *heldClaim) bool {
	p := cs.pivot.prefix
	if !p.Contains(h.prefix.Addr()) {
		return false
	}
	if h.prefix.Bits() >= p.Bits() && !cs.query.ignores(h) {
		cs.found = h
		return false
	}
	return true
}

// heldLess orders held claims by start address, then length, then
// admission: the claims inside a prefix are one run of the order.
func heldLess(a, b *heldClaim) bool {
	if c := a.prefix.Addr().Compare(b.prefix.Addr()); c != 0 {
		return c < 0
	}
	if a.prefix.Bits() != b.prefix.Bits() {
		return a.prefix.Bits() < b.prefix.Bits()
	}
	return a.seq < b.seq
}

func family(a netip.Addr) int {
	if a.Is4() {
		return 0
	}
	return 1
}

// conflict returns an earlier claim that p overlaps and c may not claim
// beside, or nil. The claims containing p are found by length (at most one
// prefix per length), those inside p as the run of the order starting at
// p's address. Not safe for concurrent use (the planner's is one call).
func (cs *Claims) conflict(p netip.Prefix, c claimant) *heldClaim {
	p = p.Masked()
	f := family(p.Addr())
	for w, word := range cs.levels[f] {
		for word != 0 {
			b := w*64 + bits.TrailingZeros64(word)
			word &= word - 1
			if b > p.Bits() {
				break
			}
			q, err := p.Addr().Prefix(b)
			if err != nil {
				continue
			}
			for h := cs.exact[q]; h != nil; h = h.next {
				if !c.ignores(h) {
					return h
				}
			}
		}
	}
	cs.pivot, cs.query, cs.found = heldClaim{prefix: p}, c, nil
	cs.tree.AscendGreaterOrEqual(&cs.pivot, cs.visit)
	return cs.found
}

// hold records p for c without checking it.
func (cs *Claims) hold(p netip.Prefix, c claimant) {
	p = p.Masked()
	cs.seq++
	if len(cs.slab) == cap(cs.slab) {
		cs.slab = make([]heldClaim, 0, 64)
	}
	cs.slab = append(cs.slab, heldClaim{prefix: p, claimant: c, seq: cs.seq})
	h := &cs.slab[len(cs.slab)-1]
	if first := cs.exact[p]; first != nil {
		for ; first.next != nil; first = first.next {
		}
		first.next = h
	} else {
		cs.exact[p] = h
	}
	cs.levels[family(p.Addr())][p.Bits()/64] |= 1 << (p.Bits() % 64)
	cs.tree.ReplaceOrInsert(h)
}

// claim admits p for c, or says why not: too broad (ClaimTooBroad's
// reason), or what earlier claim it overlaps (reason "").
func (cs *Claims) claim(p netip.Prefix, c claimant) (Reason, string, bool) {
	if reason, why, bad := ClaimTooBroad(p); bad {
		return reason, why, false
	}
	if h := cs.conflict(p, c); h != nil {
		return "", overlapMessage(p, h), false
	}
	cs.hold(p, c)
	return "", "", true
}

// check says what earlier claim p overlaps for c ("" when none), without
// admitting it: a remote cluster's nodes and Peers claim inside what its
// ClusterMesh reserved, which holds it for them.
func (cs *Claims) check(p netip.Prefix, c claimant) string {
	if h := cs.conflict(p, c); h != nil {
		return overlapMessage(p, h)
	}
	return ""
}

func overlapMessage(p netip.Prefix, h *heldClaim) string {
	p = p.Masked()
	switch {
	case p == h.prefix:
		return p.String() + " is " + h.String()
	case h.prefix.Contains(p.Addr()) && h.prefix.Bits() < p.Bits():
		return p.String() + " lies inside " + h.String()
	}
	return p.String() + " contains " + h.String()
}

// locationGroup is the location a segment's addresses belong to for the
// rule's exception: its location, else (no location) the segment itself —
// but in cross granularity the nodes without a location share the empty
// one (Cozystack's kg, where cross comes from).
func locationGroup(s *Segment, set Settings) string {
	if s.Location != "" || set.Granularity == GranularityCross {
		return locationPrefix + s.Location
	}
	return s.Key
}

// ClaimNodeAddresses starts the rule with its first owners, the nodes' own
// addresses (see the package comment of claims.go): the segments'
// WireGuard IPs, the service CIDRs, then each Ready node's pod CIDRs and
// private IP, oldest node first. A refused pod CIDR leaves the node's
// prefixes; a refused private IP stays the node's address inside its
// location (segments and routes there are Kilo's) but is routed to it from
// nowhere else (Node.PrivateIPRefused). nodes are all the cluster's Nodes,
// Ready or not: a node's private IP may not be another node's address as
// that node reports it.
func ClaimNodeAddresses(l Local, nodes []Node, set Settings) (*Claims, []Rejection) {
	cs := NewClaims()
	var rejs []Rejection
	groups := make(map[*Segment]string, len(l.Segments))
	for _, s := range l.Segments {
		groups[s] = locationGroup(s, set)
		for _, ip := range []netip.Addr{s.WireGuardIP, s.DualStackWireGuardIP} {
			if ip.IsValid() {
				cs.hold(host(ip), claimant{kind: claimWireGuardIP, owner: "segment " + s.Key, group: groups[s]})
			}
		}
	}
	for _, p := range set.ServiceCIDRs {
		cs.hold(p, claimant{kind: claimService, owner: "the cluster's services"})
	}
	type member struct {
		n            *Node
		owner, group string
	}
	var ready []member
	for _, s := range l.Segments {
		for _, n := range s.Nodes {
			ready = append(ready, member{n, "node " + n.Name, groups[s]})
		}
	}
	slices.SortStableFunc(ready, func(a, b member) int {
		if c := a.n.Created.Compare(b.n.Created); c != 0 {
			return c
		}
		return strings.Compare(a.n.Name, b.n.Name)
	})
	for _, m := range ready {
		n := m.n
		var kept []netip.Prefix
		for _, p := range n.PodCIDRs {
			reason, why, ok := cs.claim(p, claimant{kind: claimPodCIDR, owner: m.owner, group: m.group})
			if !ok {
				rejs = append(rejs, Rejection{Object: ObjectRef{Kind: "Node", Name: n.Name}, Field: "spec.podCIDR",
					Reason: reasonOr(reason, ReasonNetworksOverlap), Message: why + ": not routed to this node"})
				continue
			}
			kept = append(kept, p)
		}
		n.PodCIDRs = kept
	}
	addrs := reportedAddresses(nodes, l)
	for _, m := range ready {
		c := claimant{kind: claimPrivateIP, owner: m.owner, group: m.group}
		rejs = append(rejs, admitPrivateIP(cs, addrs, m.n, m.n.InternalIP, "internal-ip", &m.n.PrivateIPRefused, c)...)
		rejs = append(rejs, admitPrivateIP(cs, addrs, m.n, m.n.DualStackInternalIP, AnnotationDualStackInternalIP, &m.n.DualStackRefused, c)...)
	}
	return cs, rejs
}

// admitPrivateIP admits one private IP of node n (ip, of the annotation
// field): refused, it is marked so (refused) and routed to the node from
// no other location; admitted, its network is held too, when not too broad.
func admitPrivateIP(cs *Claims, addrs addressOwners, n *Node, ip netip.Prefix, field string, refused *bool, c claimant) []Rejection {
	if !ip.IsValid() {
		return nil
	}
	ref := ObjectRef{Kind: "Node", Name: n.Name}
	a := ip.Addr()
	if other := addrs.otherOwner(a, n.Name); other != "" {
		*refused = true
		return []Rejection{{Object: ref, Field: field, Reason: ReasonDuplicatePrivateIP,
			Message: a.String() + " is " + other + ": routed to neither from other locations"}}
	}
	if reason, why, ok := cs.claim(host(a), c); !ok {
		*refused = true
		return []Rejection{{Object: ref, Field: field, Reason: reasonOr(reason, ReasonDuplicatePrivateIP),
			Message: why + ": not routed to this node from other locations"}}
	}
	if r := ip.Masked(); r.Bits() < a.BitLen() {
		if _, _, broad := ClaimTooBroad(r); !broad {
			c.kind = claimPrivateRange
			cs.hold(r, c)
		}
	}
	return nil
}

func reasonOr(r, def Reason) Reason {
	if r != "" {
		return r
	}
	return def
}

// addressOwners are, per address, the nodes that report it: in their
// status.addresses, or as their private IP.
type addressOwners map[netip.Addr][]addressOwner

type addressOwner struct {
	node     string
	reported bool // in status.addresses
}

// reportedAddresses collects every node's addresses: the Ready nodes' as
// planned (this node's live private IP), the others' as published.
func reportedAddresses(nodes []Node, l Local) addressOwners {
	planned := map[string]*Node{}
	for _, s := range l.Segments {
		for _, n := range s.Nodes {
			planned[n.Name] = n
		}
	}
	out := addressOwners{}
	add := func(a netip.Addr, name string, reported bool) {
		for i, o := range out[a] {
			if o.node == name {
				out[a][i].reported = o.reported || reported
				return
			}
		}
		out[a] = append(out[a], addressOwner{name, reported})
	}
	for i := range nodes {
		n := &nodes[i]
		if p := planned[n.Name]; p != nil {
			n = p
		}
		for _, a := range n.ReportedIPs {
			add(a, n.Name, true)
		}
		for _, ip := range []netip.Prefix{n.InternalIP, n.DualStackInternalIP} {
			if ip.IsValid() {
				add(ip.Addr(), n.Name, false)
			}
		}
	}
	return out
}

// otherOwner says whose address a is when node name may not have it as its
// private IP: another node reports it, and name is not the only one of
// them to report it in status.addresses. "" when name may have it.
func (o addressOwners) otherOwner(a netip.Addr, name string) string {
	var mine bool
	var others, reporters []string
	for _, w := range o[a] {
		switch {
		case w.node == name:
			mine = w.reported
		case w.reported:
			reporters = append(reporters, w.node)
		default:
			others = append(others, w.node)
		}
	}
	switch {
	case len(reporters) > 0:
		return "the address node " + reporters[0] + " reports in status.addresses"
	case len(others) > 0 && !mine:
		return "the private IP of node " + others[0] + " too"
	}
	return ""
}

// ClaimAllowedLocationIPs is the rule's last tier: each segment's
// allowed-location-ips, after Kilo's own filter (allowedLocationIPConflict),
// are admitted against everything held; what is kept becomes the segment's
// AllowedLocationIPs. In cross granularity every node is a segment of its
// own, and an entry the nodes of one location share (a location's LAN on
// each of its nodes, as Cozystack's guide has it) is carried by the last
// of them, as Cozystack's kg does (case X4-cross-alip-shared-by-location).
func ClaimAllowedLocationIPs(l Local, cs *Claims, set Settings) []Rejection {
	segs := l.Segments
	raw := make([][]netip.Prefix, len(segs))
	for i, s := range segs {
		seen := map[netip.Prefix]bool{}
		for _, n := range s.Nodes {
			for _, a := range n.AllowedLocationIPs {
				if !seen[a] {
					seen[a] = true
					raw[i] = append(raw[i], a)
				}
			}
		}
		sortPrefixes(raw[i])
	}
	if set.Granularity == GranularityCross {
		last := map[string]int{} // location and entry → its last segment
		for i, s := range segs {
			for _, a := range raw[i] {
				last[locationGroup(s, set)+" "+a.String()] = i
			}
		}
		for i, s := range segs {
			raw[i] = slices.DeleteFunc(raw[i], func(a netip.Prefix) bool { return last[locationGroup(s, set)+" "+a.String()] != i })
		}
	}
	var rejs []Rejection
	for i, s := range segs {
		s.AllowedLocationIPs = nil
		group := locationGroup(s, set)
		c := claimant{kind: claimLocationIP, owner: "location " + strings.TrimPrefix(group, locationPrefix), group: group}
		// Broadest first: a location's own prefixes inside one it already
		// holds are found at once, not by walking what is inside it.
		order := slices.Clone(raw[i])
		slices.SortStableFunc(order, func(a, b netip.Prefix) int { return a.Bits() - b.Bits() })
		refused := map[netip.Prefix]Rejection{}
		for _, ip := range order {
			if why := allowedLocationIPConflict(segs, i, ip, raw, set); why != "" {
				refused[ip] = rejectALIP(s, ip, ReasonNetworksOverlap, ip.String()+" "+why)
				continue
			}
			if reason, why, ok := cs.claim(ip, c); !ok {
				refused[ip] = rejectALIP(s, ip, reasonOr(reason, ReasonNetworksOverlap), why)
			}
		}
		for _, ip := range raw[i] {
			if r, bad := refused[ip]; bad {
				rejs = append(rejs, r)
				continue
			}
			s.AllowedLocationIPs = append(s.AllowedLocationIPs, ip)
		}
	}
	return rejs
}
