package topology

import (
	"encoding/json"
	"net/netip"
	"reflect"
	"testing"
	"time"
)

// Shared by the stage tests of this package: hand-built inputs (nodes,
// segments, a Local) and one comparison that prints both sides as JSON.

// now is the snapshot time of every test.
var now = time.Unix(1_800_000_000, 0)

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }
func addr(s string) netip.Addr  { return netip.MustParseAddr(s) }
func pfxs(ss ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		out[i] = pfx(s)
	}
	return out
}

// key is a distinct public key per i (i > 0).
func key(i int) Key { return Key{byte(i), 0x42} }

// mk is a node that passes Kilo's readiness rule: location loc, private IP
// priv ("" = none), endpoint ep, pod CIDR pod, last seen 5 s ago, run by
// meshlet unless changed.
func mk(i int, name, loc, priv, ep, pod string) Node {
	n := Node{Name: name, LocationAnnotation: loc, Endpoint: ep, PublicKey: key(i), PodCIDRs: pfxs(pod),
		LastSeen: now.Add(-5 * time.Second), Ready: true, MeshletVersion: "v1"}
	if priv != "" {
		n.InternalIP = pfx(priv)
	}
	return n
}

// with returns v changed by f.
func with[T any](v T, f func(*T)) T {
	f(&v)
	return v
}

// seg builds a segment by hand: its key, location, WireGuard IP ("" =
// none), the name of its leader and its nodes (in the order given).
func seg(key, loc, wgIP, leader string, nodes ...Node) *Segment {
	s := &Segment{Key: key, Location: loc}
	if wgIP != "" {
		s.WireGuardIP = addr(wgIP)
	}
	for i := range nodes {
		n := nodes[i]
		s.Nodes = append(s.Nodes, &n)
		if n.Name == leader {
			s.Leader = i
		}
	}
	return s
}

// local is the topology seen by node self ("" = not Ready) over segs.
func local(self string, segs ...*Segment) Local {
	l := Local{Segments: segs}
	for _, s := range segs {
		for _, n := range s.Nodes {
			if n.Name == self {
				l.Self, l.SelfSegment = n, s
			}
		}
	}
	return l
}

// twoLocations: location a (a-1 leads with 10.4.0.1, a-2) and b (b-1
// leads with 10.4.0.2 and a public endpoint, b-2).
func twoLocations() (a1, a2, b1, b2 Node) {
	return mk(1, "a-1", "a", "10.0.1.1/24", "10.0.1.1:51820", "10.244.1.0/24"),
		mk(2, "a-2", "a", "10.0.1.2/24", "10.0.1.2:51820", "10.244.2.0/24"),
		mk(3, "b-1", "b", "10.0.2.1/24", "198.51.100.1:51820", "10.244.3.0/24"),
		mk(4, "b-2", "b", "10.0.2.2/24", "10.0.2.2:51820", "10.244.4.0/24")
}

// twoLocationsSeen is twoLocations as node self sees it.
func twoLocationsSeen(self string) Local {
	a1, a2, b1, b2 := twoLocations()
	return local(self, seg("location:a", "a", "10.4.0.1", "a-1", a1, a2), seg("location:b", "b", "10.4.0.2", "b-1", b1, b2))
}

// nodesOf are the nodes of l's segments, as the snapshot would list them.
func nodesOf(l Local) []Node {
	var out []Node
	for _, s := range l.Segments {
		for _, n := range s.Nodes {
			out = append(out, *n)
		}
	}
	return out
}

// check fails the test when got is not want, printing both as JSON.
func check(t *testing.T, what string, got, want any) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Errorf("%s:\n got %s\nwant %s", what, js(got), js(want))
	}
}

func js(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return err.Error()
	}
	return string(b)
}

// localView is what a Local says, by name: Local holds pointers, and
// tests compare what the stages decided.
type localView struct {
	Segments          []segmentView
	Self, SelfSegment string
	Rejections        []Rejection
}

type segmentView struct {
	Key, Location, Leader string
	Nodes                 []string
	WireGuardIP           netip.Addr
	AllowedLocationIPs    []netip.Prefix
}

func view(l Local) localView {
	var v localView
	for _, s := range l.Segments {
		v.Segments = append(v.Segments, segmentView{Key: s.Key, Location: s.Location, Leader: s.LeaderNode().Name,
			Nodes: nodeNames(s.Nodes), WireGuardIP: s.WireGuardIP, AllowedLocationIPs: s.AllowedLocationIPs})
	}
	if l.Self != nil {
		v.Self = l.Self.Name
	}
	if l.SelfSegment != nil {
		v.SelfSegment = l.SelfSegment.Key
	}
	v.Rejections = l.Rejections
	return v
}

// owns are claims holding the prefixes given, as pod CIDRs of node
// "local".
func owns(ps ...string) *Claims {
	cs := NewClaims()
	for _, p := range pfxs(ps...) {
		cs.hold(p, claimant{kind: claimPodCIDR, owner: "node local"})
	}
	return cs
}

// remote is remote cluster name of mesh kilo/mesh (this cluster: "here"),
// its allowedNetworks all accepted.
func remote(name string, networks ...string) Remote {
	r := Remote{Mesh: &Mesh{Namespace: "kilo", Name: "mesh"}, Local: MeshCluster{Name: "here", Local: true},
		Entry: MeshCluster{Name: name, AllowedNetworks: pfxs(networks...)}, Networks: pfxs(networks...)}
	r.allowed = newPrefixSet(r.Networks)
	return r
}

// rnode is a node of a remote cluster that its agents made a leader with
// WireGuard IP wg ("" = none).
func rnode(i int, name, loc, priv, wg, pod string) Node {
	n := mk(i, name, loc, priv, "", pod)
	if priv != "" {
		n.Endpoint = n.InternalIP.Addr().String() + ":51820"
	}
	if wg != "" {
		n.WireGuardIP = pfx(wg)
	}
	return n
}
