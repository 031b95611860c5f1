package topology

import (
	"net/netip"
	"sort"
	"strconv"
	"time"
)

// Remote is one remote cluster of the meshes this cluster belongs to.
type Remote struct {
	Mesh  *Mesh
	Local MeshCluster // this cluster's entry in the mesh
	Entry MeshCluster
	// Networks are the entry's allowedNetworks that survived the checks
	// against the local cluster; everything this cluster may claim is
	// inside.
	Networks []netip.Prefix
	allowed  *prefixSet // Networks, indexed
	// claimant is the cluster as the claims know it (claims.go).
	claimant claimant
}

// ResolveRemotes resolves the ClusterMesh entries into remote clusters
// (meshes by namespace/name, entries by name, the first mention of a
// cluster wins) and reserves each one's allowedNetworks for it, the
// rule's second tier (claims.go): what is too broad or overlaps the local
// nodes' addresses or an earlier cluster's reservation is refused; no Peer
// or allowed-location-ips may claim inside what is reserved.
func ResolveRemotes(meshes []Mesh, set Settings, cs *Claims) ([]Remote, []Rejection) {
	sorted := append([]Mesh(nil), meshes...)
	sort.Slice(sorted, func(i, j int) bool {
		if sorted[i].Namespace != sorted[j].Namespace {
			return sorted[i].Namespace < sorted[j].Namespace
		}
		return sorted[i].Name < sorted[j].Name
	})
	seen := map[string]bool{}
	var remotes []Remote
	var rejs []Rejection
	for mi := range sorted {
		m := &sorted[mi]
		local, ok := localEntry(m, set.ClusterName)
		if !ok {
			continue // the ClusterMesh validator reports it
		}
		entries := append([]MeshCluster(nil), m.Clusters...)
		sort.Slice(entries, func(i, j int) bool { return entries[i].Name < entries[j].Name })
		for _, e := range entries {
			if e.Name == local.Name || seen[e.Name] {
				continue
			}
			seen[e.Name] = true
			r := Remote{Mesh: m, Local: local, Entry: e}
			ref := ObjectRef{Kind: "ClusterMesh", Namespace: m.Namespace, Name: m.Name}
			field := "spec.clusters[" + e.Name + "].allowedNetworks"
			c := claimant{kind: claimReserved, owner: "cluster " + e.Name}
			r.claimant = claimant{kind: claimRemote, owner: c.owner}
			for _, n := range e.AllowedNetworks {
				n = n.Masked()
				if reason, why, ok := cs.claim(n, c); !ok {
					rejs = append(rejs, Rejection{Object: ref, Field: field, Reason: reasonOr(reason, ReasonOverlapsLocal), Message: why})
					continue
				}
				r.Networks = append(r.Networks, n)
			}
			r.allowed = newPrefixSet(r.Networks)
			remotes = append(remotes, r)
		}
	}
	return remotes, rejs
}

// localEntry finds this cluster's entry: by name when --cluster-name is set,
// else the entry marked local.
func localEntry(m *Mesh, name string) (MeshCluster, bool) {
	for _, c := range m.Clusters {
		if name != "" && c.Name == name || name == "" && c.Local {
			return c, true
		}
	}
	return MeshCluster{}, false
}

// remoteState is what the watcher knows of cluster name (nil: nothing).
func remoteState(states []RemoteCluster, name string) *RemoteCluster {
	for i := range states {
		if states[i].Name == name {
			return &states[i]
		}
	}
	return nil
}

// remoteGroup is a remote segment: its leader and the nodes it serves.
type remoteGroup struct {
	key    string
	leader *Node
	nodes  []*Node
}

// remoteGroups rebuilds the remote cluster's segments with Kilo's rules,
// from what its nodes publish (their granularity annotation, location,
// endpoint), and takes as each segment's leader the node its agents elect —
// when it has published its WireGuard IP; otherwise the first node of the
// segment that did (the remote agents may label locations differently than
// this cluster's --topology-label says). Other WireGuard IPs in a segment
// are stale claims (an agent starting up, a leader that just lost the
// role): ignored, not reported. Nodes of a segment without any leader
// follow a leader of their location, if there is one.
func remoteGroups(r Remote, rc *RemoteCluster, set Settings, snapNow time.Time) ([]*remoteGroup, []Rejection) {
	now := rc.ObservedAt
	if now.IsZero() {
		now = snapNow
	}
	var rejs []Rejection
	bySeg := map[string][]*Node{}
	var keys []string
	newest := newestLastSeen(rc.Nodes)
	for _, n := range sortedNodes(rc.Nodes) {
		// Kilo's readiness without the endpoint: other clusters reach a
		// node through the endpoint chain (clustermesh-endpoint,
		// force-endpoint, ExternalIP), and a NATed one through none. The
		// age is by the remote cluster's own clock (RemoteAge).
		if n.PublicKey.IsZero() || len(n.PodCIDRs) == 0 || n.LastSeen.IsZero() || RemoteAge(n, newest, now) >= ReadyWindow {
			continue
		}
		k := remoteSegmentKey(n, set)
		if _, ok := bySeg[k]; !ok {
			keys = append(keys, k)
		}
		bySeg[k] = append(bySeg[k], n)
	}
	sort.Strings(keys)
	var groups []*remoteGroup
	byLocation := map[string]*remoteGroup{}
	var orphans []*Node
	leaders := map[string]*Node{}
	// claims holds, per WireGuard IP, the leader whose claim stands: the
	// one with the newest last-seen (comparable within one cluster), so a
	// node that re-numbered after another dropped out is not shadowed by
	// the dead one's claim while this agent has yet to judge it stale;
	// between equals, the first segment.
	claims := map[netip.Addr]*Node{}
	for _, k := range keys {
		l := electedWithWireGuardIP(bySeg[k])
		leaders[k] = l
		if l == nil {
			continue
		}
		ip := l.WireGuardIP.Addr()
		if _, in := r.allowed.covering(host(ip)); !in {
			continue
		}
		if c := claims[ip]; c == nil || l.LastSeen.After(c.LastSeen) {
			claims[ip] = l
		}
	}
	for _, k := range keys {
		seg := bySeg[k]
		l := leaders[k]
		if l == nil {
			orphans = append(orphans, seg...)
			continue
		}
		ref := ObjectRef{Kind: "Node", Cluster: r.Entry.Name, Name: l.Name}
		ip := l.WireGuardIP.Addr()
		if _, in := r.allowed.covering(host(ip)); !in {
			rejs = append(rejs, Rejection{Object: ref, Field: "wireguard-ip", Reason: ReasonOutsideAllowed, Message: ip.String() + " is outside the cluster's allowedNetworks"})
			continue
		}
		if c := claims[ip]; c != l {
			rejs = append(rejs, Rejection{Object: ref, Field: "wireguard-ip", Reason: ReasonDuplicateWireGuardIP, Message: ip.String() + " already used by node " + c.Name})
			continue
		}
		g := &remoteGroup{key: k, leader: l, nodes: seg}
		groups = append(groups, g)
		if loc := l.location(set); byLocation[loc] == nil || !byLocation[loc].leader.InternalIP.IsValid() && l.InternalIP.IsValid() {
			byLocation[loc] = g
		}
	}
	for _, n := range orphans {
		if g := byLocation[n.location(set)]; g != nil {
			g.nodes = append(g.nodes, n)
		}
	}
	return groups, rejs
}

func sortedNodes(ns []Node) []*Node {
	out := make([]*Node, 0, len(ns))
	for i := range ns {
		out = append(out, &ns[i])
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// electedWithWireGuardIP is the segment's leader by Kilo's rule when it
// published a WireGuard IP, else the first node of the segment that did,
// else nil.
func electedWithWireGuardIP(seg []*Node) *Node {
	if l := seg[findLeader(seg)]; l.WireGuardIP.IsValid() {
		return l
	}
	for _, n := range seg {
		if n.WireGuardIP.IsValid() {
			return n
		}
	}
	return nil
}

// remoteLeaderPeer is the WireGuard peer of one remote leader: its group's
// pod CIDRs, private IPs (where allowedNetworks covers them) and
// allowed-location-ips, its WireGuard IP, and for the first leader also the
// cluster's Peers and its allowedNetworks. WireGuard matches the longest
// prefix, so the more specific prefixes of the other leaders still win.
// What the cluster may not claim is left out and rejected (clip).
func remoteLeaderPeer(r Remote, rc *RemoteCluster, g *remoteGroup, first bool, cs *Claims, self *Node, discovered map[Key]netip.AddrPort, set Settings) (WireGuardPeer, []Rejection) {
	l := g.leader
	// A remote segment led by meshlet carries the second family too, in a
	// dual-stack mesh (docs/dual-stack.md#clustermesh).
	dual := set.DualStack() && l.MeshletVersion != ""
	var rejs []Rejection
	clipped := func(ref ObjectRef, field string, ps []netip.Prefix) []netip.Prefix {
		out, rs := clip(r, cs, ref, field, ps)
		rejs = append(rejs, rs...)
		return out
	}
	var ips []netip.Prefix
	for _, n := range g.nodes {
		nref := ObjectRef{Kind: "Node", Cluster: r.Entry.Name, Name: n.Name}
		ips = append(ips, clipped(nref, "podCIDRs", n.PodCIDRs)...)
		// Private IPs are routed only when the cluster lists its host
		// networks in allowedNetworks; otherwise they are left out quietly
		// (most meshes route pods and services only).
		if ip := host(n.InternalIP.Addr()); n.InternalIP.IsValid() {
			if _, in := r.allowed.covering(ip); in {
				ips = append(ips, clipped(nref, "internal-ip", []netip.Prefix{ip})...)
			}
		}
		ips = append(ips, clipped(nref, "allowed-location-ips", n.AllowedLocationIPs)...)
		if dual {
			ips = append(ips, remoteSecondFamily(r, n, clipped)...)
		}
	}
	ips = append(ips, host(l.WireGuardIP.Addr()))
	if dual && l.DualStackWireGuardIP.IsValid() && sameFamily(l.DualStackWireGuardIP.Addr(), set.DualStackSubnet.Addr()) {
		ips = append(ips, clipped(ObjectRef{Kind: "Node", Cluster: r.Entry.Name, Name: l.Name}, AnnotationDualStackWireGuardIP,
			[]netip.Prefix{host(l.DualStackWireGuardIP.Addr())})...)
	}
	if first {
		// Remote Peers and the allowedNetworks no node covers (service
		// CIDR, host networks) go through one deterministic leader.
		for _, peer := range sortedPeers(rc.Peers) {
			ips = append(ips, clipped(ObjectRef{Kind: "Peer", Cluster: r.Entry.Name, Name: peer.Name}, "spec.allowedIPs", peer.AllowedIPs)...)
		}
		ips = append(ips, r.Networks...)
	}
	ka, src := remoteKeepalive(r, self)
	configured, esrc := remoteEndpoint(l, r.Entry.WireGuardPort)
	roaming := roams(ka, 0, configured)
	ep, esrc := endpointFor(discovered, l.PublicKey, configured, esrc, roaming)
	return WireGuardPeer{
		Name: l.Name, Kind: KindRemote, Cluster: r.Entry.Name, Location: l.location(set),
		PublicKey: l.PublicKey, Endpoint: ep, EndpointSource: esrc, AllowedIPs: ips,
		PersistentKeepalive: ka, KeepaliveSource: src, Roaming: roaming,
		SessionProbe: sessionProbe(l, l.WireGuardIP.Addr()),
	}, rejs
}

// remoteSecondFamily is what a remote node adds of the dual-stack family:
// its pod CIDR, and its private IP where allowedNetworks covers it (as for
// the first family), each admitted by clipped.
func remoteSecondFamily(r Remote, n *Node, clipped func(ObjectRef, string, []netip.Prefix) []netip.Prefix) []netip.Prefix {
	nref := ObjectRef{Kind: "Node", Cluster: r.Entry.Name, Name: n.Name}
	var out []netip.Prefix
	if c := n.DualStackPodCIDR; c.IsValid() && len(n.PodCIDRs) > 0 && !sameFamily(c.Addr(), n.PodCIDRs[0].Addr()) {
		out = append(out, clipped(nref, "spec.podCIDRs", []netip.Prefix{c})...)
	}
	if ip := n.DualStackInternalIP; ip.IsValid() {
		if _, in := r.allowed.covering(host(ip.Addr())); in {
			out = append(out, clipped(nref, AnnotationDualStackInternalIP, []netip.Prefix{host(ip.Addr())})...)
		}
	}
	return out
}

// remoteSegmentKey is Kilo's segment of a remote node, with the remote
// cluster's own granularity (its nodes publish it; location by default).
func remoteSegmentKey(n *Node, set Settings) string {
	switch n.Granularity {
	case GranularityFull, GranularityCross:
		return nodePrefix + n.Name
	}
	if !n.InternalIP.IsValid() {
		return nodePrefix + n.Name
	}
	return locationPrefix + n.location(set)
}

func sortedPeers(ps []Peer) []Peer {
	out := append([]Peer(nil), ps...)
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// clip keeps the prefixes a remote cluster may claim: inside its
// allowedNetworks, not too broad, not overlapping what the local cluster or
// another remote cluster holds (claims.go). Everything else is rejected
// with the reason.
func clip(r Remote, cs *Claims, ref ObjectRef, field string, ps []netip.Prefix) ([]netip.Prefix, []Rejection) {
	var out []netip.Prefix
	var rejs []Rejection
	reject := func(reason Reason, msg string) {
		rejs = append(rejs, Rejection{Object: ref, Field: field, Reason: reason, Message: msg})
	}
	c := r.claimant
	if c.owner == "" {
		c = claimant{kind: claimRemote, owner: "cluster " + r.Entry.Name}
	}
	for _, x := range ps {
		x = x.Masked()
		if reason, why, bad := ClaimTooBroad(x); bad {
			reject(reason, why)
			continue
		}
		if why := cs.check(x, c); why != "" {
			reject(ReasonOverlapsLocal, why)
			continue
		}
		if _, inside := r.allowed.covering(x); !inside {
			reject(ReasonOutsideAllowed, x.String()+" is outside the cluster's allowedNetworks")
			continue
		}
		out = append(out, x)
	}
	return out, rejs
}

// remoteKeepalive is precedence rule 2: the smallest non-zero of the remote
// entry's, the local entry's and this node's annotation.
func remoteKeepalive(r Remote, self *Node) (int, KeepaliveSource) {
	best, src := 0, KeepaliveNone
	for _, c := range []struct {
		v int
		s KeepaliveSource
	}{
		{r.Entry.PersistentKeepalive, KeepaliveRemoteCluster},
		{r.Local.PersistentKeepalive, KeepaliveLocalCluster},
		{self.PersistentKeepalive, KeepaliveNodeAnnotation},
	} {
		if c.v > 0 && (best == 0 || c.v < best) {
			best, src = c.v, c.s
		}
	}
	return best, src
}

// remoteEndpoint is the endpoint chain for a remote leader:
// clustermesh-endpoint, force-endpoint, first ExternalIP with the cluster's
// WireGuard port, the endpoint annotation, else none (it roams).
func remoteEndpoint(n *Node, port int) (string, string) {
	if port == 0 {
		port = 51820
	}
	switch {
	case n.ClusterMeshEndpoint != "":
		return n.ClusterMeshEndpoint, "clustermesh-endpoint"
	case n.ForceEndpoint != "":
		return n.ForceEndpoint, "force-endpoint"
	}
	ext := append([]netip.Addr(nil), n.ExternalIPs...)
	sort.SliceStable(ext, func(i, j int) bool { return ext[i].Is4() && !ext[j].Is4() })
	if len(ext) > 0 {
		return joinHostPort(ext[0], port), "external-ip:" + strconv.Itoa(port)
	}
	if n.Endpoint != "" {
		return n.Endpoint, "annotation"
	}
	return "", ""
}

// RemoteAge is how old a remote node's last-seen is, by the remote
// cluster's own clock (docs/clustermesh.md#liveness), so a cluster whose
// clocks disagree with this one's stays in the mesh while a node that
// really stopped drops out after Kilo's window: the time since this agent
// saw the node's last-seen change (Heard, on this agent's clock), and for a
// node not seen changing yet, at least how far its last-seen is behind the
// newest of its cluster. Without Heard (a file read by meshlet plan, a
// test) it is last-seen against now, Kilo's rule. now is the snapshot's
// time, or the frozen time of an unreachable remote API.
func RemoteAge(n *Node, newest, now time.Time) time.Duration {
	if n.Heard.IsZero() {
		return now.Sub(n.LastSeen)
	}
	age := now.Sub(n.Heard)
	if !n.HeardChange {
		age = max(age, newest.Sub(n.LastSeen))
	}
	return age
}

// HeardOnce records every node of the cluster as first seen at t, for a
// cluster read once (a dump, a live read by meshlet diagnose): as right
// after an agent's first list, each node is judged against its cluster's
// newest last-seen, not against this cluster's clock.
func (rc *RemoteCluster) HeardOnce(t time.Time) {
	for i := range rc.Nodes {
		rc.Nodes[i].Heard, rc.Nodes[i].HeardChange = t, false
	}
}

func newestLastSeen(ns []Node) time.Time {
	var t time.Time
	for i := range ns {
		if ns[i].LastSeen.After(t) {
			t = ns[i].LastSeen
		}
	}
	return t
}
