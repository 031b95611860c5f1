package topology

import (
	"net/netip"
	"sort"
	"strconv"
)

// remote is one remote cluster this node routes to.
type remote struct {
	mesh  *Mesh
	local MeshCluster
	entry MeshCluster
	// networks are the entry's allowedNetworks that survived the checks
	// against the local cluster; everything this cluster may claim is inside.
	networks []netip.Prefix
	allowed  *prefixSet // networks, indexed
}

// remoteClusters resolves the ClusterMesh entries into remote clusters, and
// on a leader turns every remote leader into a WireGuard peer.
func (p *planner) remoteClusters() {
	meshes := append([]Mesh(nil), p.snap.Meshes...)
	sort.Slice(meshes, func(i, j int) bool {
		if meshes[i].Namespace != meshes[j].Namespace {
			return meshes[i].Namespace < meshes[j].Namespace
		}
		return meshes[i].Name < meshes[j].Name
	})
	seen := map[string]bool{}
	var remotes []*remote
	for mi := range meshes {
		m := &meshes[mi]
		local, ok := localEntry(m, p.set.ClusterName)
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
			r := &remote{mesh: m, local: local, entry: e}
			ref := ObjectRef{Kind: "ClusterMesh", Namespace: m.Namespace, Name: m.Name}
			for _, n := range e.AllowedNetworks {
				n = n.Masked()
				if n.Bits() == 0 {
					p.reject(ref, "spec.clusters["+e.Name+"].allowedNetworks", ReasonDefaultRoute, n.String()+" is a default route")
					continue
				}
				if o, bad := p.localPrefix.overlapping(n); bad {
					p.reject(ref, "spec.clusters["+e.Name+"].allowedNetworks", ReasonOverlapsLocal,
						n.String()+" overlaps the local cluster's "+o.String())
					continue
				}
				r.networks = append(r.networks, n)
			}
			r.allowed = newPrefixSet(r.networks)
			remotes = append(remotes, r)
		}
	}
	p.remotes = remotes
	for _, r := range remotes {
		info := RemoteInfo{Cluster: r.entry.Name, Mesh: r.mesh.Namespace + "/" + r.mesh.Name, AllowedNetworks: r.networks}
		rc := p.remoteState(r.entry.Name)
		if rc != nil {
			info.Synced = rc.Synced
		}
		switch {
		case !p.plan.Leader:
		case rc != nil && rc.Synced:
			info.Leaders, info.Segments = p.remotePeers(r, rc)
		default:
			p.preserve = append(p.preserve, r.networks...)
		}
		p.plan.Remotes = append(p.plan.Remotes, info)
	}
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

func (p *planner) remoteState(name string) *RemoteCluster {
	for i := range p.snap.Remotes {
		if p.snap.Remotes[i].Name == name {
			return &p.snap.Remotes[i]
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

// remotePeers adds one WireGuard peer per remote leader and returns their
// names and the remote segments.
func (p *planner) remotePeers(r *remote, rc *RemoteCluster) ([]string, []SegmentInfo) {
	var names []string
	var segs []SegmentInfo
	first := true
	for _, g := range p.remoteGroups(r, rc) {
		l := g.leader
		segs = append(segs, SegmentInfo{Name: g.key, Location: l.location(p.set), Leader: l.Name, Nodes: nodeNames(g.nodes),
			WireGuardIP: l.WireGuardIP})
		ref := ObjectRef{Kind: "Node", Cluster: r.entry.Name, Name: l.Name}
		if l.MalformedEndpoint {
			p.reject(ref, "endpoint", ReasonInvalidEndpoint, "malformed clustermesh-endpoint or force-endpoint: node skipped")
			continue
		}
		if p.addPeer(ref, p.remoteLeaderPeer(r, rc, g, first)) {
			names = append(names, l.Name)
			first = false
		}
	}
	return names, segs
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
func (p *planner) remoteGroups(r *remote, rc *RemoteCluster) []*remoteGroup {
	now := rc.ObservedAt
	if now.IsZero() {
		now = p.snap.Now
	}
	bySeg := map[string][]*Node{}
	var keys []string
	for _, n := range sortedNodes(rc.Nodes) {
		// Kilo's readiness without the endpoint: other clusters reach a
		// node through the endpoint chain (clustermesh-endpoint,
		// force-endpoint, ExternalIP), and a NATed one through none.
		if n.PublicKey.IsZero() || len(n.PodCIDRs) == 0 || n.LastSeen.IsZero() || now.Sub(n.LastSeen) >= readyWindow {
			continue
		}
		k := remoteSegmentKey(n, p.set)
		if _, ok := bySeg[k]; !ok {
			keys = append(keys, k)
		}
		bySeg[k] = append(bySeg[k], n)
	}
	sort.Strings(keys)
	var groups []*remoteGroup
	byLocation := map[string]*remoteGroup{}
	var orphans []*Node
	wgIPs := map[netip.Addr]string{}
	for _, k := range keys {
		seg := bySeg[k]
		l := electedWithWireGuardIP(seg)
		if l == nil {
			orphans = append(orphans, seg...)
			continue
		}
		ref := ObjectRef{Kind: "Node", Cluster: r.entry.Name, Name: l.Name}
		ip := l.WireGuardIP.Addr()
		if _, in := r.allowed.covering(host(ip)); !in {
			p.reject(ref, "wireguard-ip", ReasonOutsideAllowed, ip.String()+" is outside the cluster's allowedNetworks")
			continue
		}
		if other, dup := wgIPs[ip]; dup {
			p.reject(ref, "wireguard-ip", ReasonDuplicateWireGuardIP, ip.String()+" already used by node "+other)
			continue
		}
		wgIPs[ip] = l.Name
		g := &remoteGroup{key: k, leader: l, nodes: seg}
		groups = append(groups, g)
		if loc := l.location(p.set); byLocation[loc] == nil || !byLocation[loc].leader.InternalIP.IsValid() && l.InternalIP.IsValid() {
			byLocation[loc] = g
		}
	}
	for _, n := range orphans {
		if g := byLocation[n.location(p.set)]; g != nil {
			g.nodes = append(g.nodes, n)
		}
	}
	return groups
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
func (p *planner) remoteLeaderPeer(r *remote, rc *RemoteCluster, g *remoteGroup, first bool) WireGuardPeer {
	l := g.leader
	var ips []netip.Prefix
	for _, n := range g.nodes {
		nref := ObjectRef{Kind: "Node", Cluster: r.entry.Name, Name: n.Name}
		ips = append(ips, p.clip(r, nref, "podCIDRs", n.PodCIDRs)...)
		// Private IPs are routed only when the cluster lists its host
		// networks in allowedNetworks; otherwise they are left out quietly
		// (most meshes route pods and services only).
		if ip := host(n.InternalIP.Addr()); n.InternalIP.IsValid() {
			if _, in := r.allowed.covering(ip); in {
				ips = append(ips, p.clip(r, nref, "internal-ip", []netip.Prefix{ip})...)
			}
		}
		ips = append(ips, p.clip(r, nref, "allowed-location-ips", n.AllowedLocationIPs)...)
	}
	ips = append(ips, host(l.WireGuardIP.Addr()))
	if first {
		// Remote Peers and the allowedNetworks no node covers (service
		// CIDR, host networks) go through one deterministic leader.
		for _, peer := range sortedPeers(rc.Peers) {
			ips = append(ips, p.clip(r, ObjectRef{Kind: "Peer", Cluster: r.entry.Name, Name: peer.Name}, "spec.allowedIPs", peer.AllowedIPs)...)
		}
		ips = append(ips, r.networks...)
	}
	ka, src := p.remoteKeepalive(r)
	configured, esrc := remoteEndpoint(l, r.entry.WireGuardPort)
	roaming := roams(ka, 0, configured)
	ep, esrc := p.endpointFor(l.PublicKey, configured, esrc, roaming)
	return WireGuardPeer{
		Name: l.Name, Kind: KindRemote, Cluster: r.entry.Name, Location: l.location(p.set),
		PublicKey: l.PublicKey, Endpoint: ep, EndpointSource: esrc, AllowedIPs: ips,
		PersistentKeepalive: ka, KeepaliveSource: src, Roaming: roaming,
		SessionProbe: sessionProbe(l, l.WireGuardIP.Addr()),
	}
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
// allowedNetworks, not a default route, not overlapping the local cluster.
// Everything else is rejected with the reason.
func (p *planner) clip(r *remote, ref ObjectRef, field string, ps []netip.Prefix) []netip.Prefix {
	var out []netip.Prefix
	for _, x := range ps {
		x = x.Masked()
		_, inside := r.allowed.covering(x)
		switch o, overlap := p.localPrefix.overlapping(x); {
		case x.Bits() == 0:
			p.reject(ref, field, ReasonDefaultRoute, x.String()+" is a default route")
		case overlap:
			p.reject(ref, field, ReasonOverlapsLocal, x.String()+" overlaps the local cluster's "+o.String())
		case !inside:
			p.reject(ref, field, ReasonOutsideAllowed, x.String()+" is outside the cluster's allowedNetworks")
		default:
			out = append(out, x)
		}
	}
	return out
}

// remoteKeepalive is precedence rule 2: the smallest non-zero of the remote
// entry's, the local entry's and this node's annotation.
func (p *planner) remoteKeepalive(r *remote) (int, KeepaliveSource) {
	best, src := 0, KeepaliveNone
	for _, c := range []struct {
		v int
		s KeepaliveSource
	}{
		{r.entry.PersistentKeepalive, KeepaliveRemoteCluster},
		{r.local.PersistentKeepalive, KeepaliveLocalCluster},
		{p.selfNode.PersistentKeepalive, KeepaliveNodeAnnotation},
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
