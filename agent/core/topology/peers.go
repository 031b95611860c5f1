package topology

import (
	"net/netip"
	"sort"
)

// The local cluster's Kilo Peers as a set, the endpoints learned, what the
// local cluster owns, and the per-peer rules (endpoint, keepalive,
// roaming) every kind of WireGuard peer shares.

// ValidatePeers validates Peer objects as a set, oldest first (creation
// time, then name): a public key already used (this node's, a segment
// leader's, or an older Peer's) rejects the Peer; each allowed IP is a
// claim (claims.go): one too broad, or overlapping a node's address, a
// remote cluster's reservation or an older Peer's allowed IP, is dropped
// with its reason, and the Peer keeps the rest.
func ValidatePeers(objs []Peer, l Local, selfName string, selfKey Key, cs *Claims) ([]Peer, []Rejection) {
	peers := append([]Peer(nil), objs...)
	sort.SliceStable(peers, func(i, j int) bool {
		if c := peers[i].Created.Compare(peers[j].Created); c != 0 {
			return c < 0
		}
		return peers[i].Name < peers[j].Name
	})
	keys := map[Key]string{}
	for _, s := range l.Segments {
		keys[s.LeaderNode().PublicKey] = "node " + s.LeaderNode().Name
	}
	var out []Peer
	var rejs []Rejection
	for _, peer := range peers {
		ref := ObjectRef{Kind: "Peer", Name: peer.Name}
		if peer.PublicKey == selfKey && !peer.PublicKey.IsZero() {
			rejs = append(rejs, Rejection{Object: ref, Field: "spec.publicKey", Reason: ReasonOwnKey, Message: "peer uses the public key of node " + selfName})
			continue
		}
		if other, ok := keys[peer.PublicKey]; ok {
			rejs = append(rejs, Rejection{Object: ref, Field: "spec.publicKey", Reason: ReasonDuplicateKey, Message: "public key already used by " + other})
			continue
		}
		keys[peer.PublicKey] = "peer " + peer.Name
		c := claimant{kind: claimPeer, owner: "Peer " + peer.Name}
		// Broadest first, so the Peer's own prefixes inside one it holds
		// are found at once; the kept ones in the Peer's order.
		order := make([]netip.Prefix, len(peer.AllowedIPs))
		for i, a := range peer.AllowedIPs {
			order[i] = a.Masked()
		}
		sort.SliceStable(order, func(i, j int) bool { return order[i].Bits() < order[j].Bits() })
		keep := map[netip.Prefix]bool{}
		refused := map[netip.Prefix]Rejection{}
		for _, a := range order {
			if _, seen := refused[a]; keep[a] || seen {
				continue
			}
			if reason, why, ok := cs.claim(a, c); !ok {
				refused[a] = Rejection{Object: ref, Field: "spec.allowedIPs", Reason: reasonOr(reason, ReasonDuplicateAllowedIP), Message: why}
				continue
			}
			keep[a] = true
		}
		var ips []netip.Prefix
		for _, a := range peer.AllowedIPs {
			a = a.Masked()
			if r, bad := refused[a]; bad {
				rejs = append(rejs, r)
				delete(refused, a)
			} else if keep[a] {
				ips = append(ips, a)
				delete(keep, a)
			}
		}
		peer.AllowedIPs = ips
		out = append(out, peer)
	}
	return out, rejs
}

// Discovered are the endpoints learned from handshakes: this node's live
// device first, then the discovered-endpoints annotations of this node and
// of every segment's nodes in segment order (Kilo's order); first wins.
func Discovered(self Self, l Local) map[Key]netip.AddrPort {
	out := map[Key]netip.AddrPort{}
	add := func(m map[Key]netip.AddrPort) {
		for k, v := range m {
			if _, ok := out[k]; !ok && usableDiscovered(v) {
				out[k] = v
			}
		}
	}
	add(deviceEndpoints(self))
	if l.Self != nil {
		add(l.Self.DiscoveredEndpoints)
	}
	for _, s := range l.Segments {
		for _, n := range s.Nodes {
			add(n.DiscoveredEndpoints)
		}
	}
	return out
}

func usableDiscovered(ap netip.AddrPort) bool {
	a := ap.Addr()
	return ap.IsValid() && ap.Port() != 0 && !a.IsLoopback() && !a.IsLinkLocalUnicast() && !a.IsUnspecified()
}

// roams tells whether the actuator must keep a peer's learned endpoint
// instead of writing the planned one: the peer is NATed (its keepalive > 0),
// this side keeps the session alive, or there is no endpoint to configure.
// It is wider than Kilo's rule on purpose (docs/kilo-compatibility.md): it
// changes what is written to the device, never the planned endpoint.
func roams(ourKeepalive, theirKeepalive int, endpoint string) bool {
	return ourKeepalive > 0 || theirKeepalive > 0 || endpoint == ""
}

// endpointFor returns the endpoint to plan for a peer: the one discovered
// by a handshake when useDiscovered and one is known, else the configured
// one. In-cluster segments and Peers use Kilo's rule (updateEndpoint):
// discovered only when the target itself keeps a keepalive, because an
// address learned by one node through a NAT is wrong for another; remote
// clusters use roams (docs/kilo-compatibility.md).
func endpointFor(discovered map[Key]netip.AddrPort, k Key, configured, source string, useDiscovered bool) (string, string) {
	if useDiscovered {
		if d, ok := discovered[k]; ok {
			return d.String(), "discovered"
		}
	}
	if configured == "" {
		return "", ""
	}
	return configured, source
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
func peerKeepalive(peer Peer, self *Node, set Settings) (int, KeepaliveSource) {
	loc := self.location(set)
	for _, r := range peer.NodeKeepalive {
		if r.Location != "" && r.Location == loc || len(r.NodeSelector) > 0 && matchLabels(r.NodeSelector, self.Labels) {
			return r.Value, KeepalivePeerAnnotation
		}
	}
	if peer.PersistentKeepalive > 0 {
		return peer.PersistentKeepalive, KeepalivePeerSpec
	}
	if ka := self.PersistentKeepalive; ka > 0 {
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
