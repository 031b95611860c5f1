package topology

import (
	"testing"
	"time"
)

// TestClaims: the rule itself — too broad per family, overlap in both
// directions, an owner's own prefixes, and the two exceptions (a
// location's allowed-location-ips beside its own nodes' addresses; only
// they keep out of a private network).
func TestClaims(t *testing.T) {
	node := func(name, group string) claimant {
		return claimant{kind: claimPodCIDR, owner: "node " + name, group: group}
	}
	alip := func(group string) claimant {
		return claimant{kind: claimLocationIP, owner: "location " + group, group: "location:" + group}
	}
	peer := func(name string) claimant { return claimant{kind: claimPeer, owner: "Peer " + name} }
	type held struct {
		p string
		c claimant
	}
	for _, tc := range []struct {
		name   string
		held   []held
		p      string
		by     claimant
		reason Reason
		want   string // "" = admitted
	}{
		{name: "a default route", p: "0.0.0.0/0", by: peer("x"), reason: ReasonDefaultRoute, want: "0.0.0.0/0 is a default route"},
		{name: "IPv6's default route", p: "::/0", by: peer("x"), reason: ReasonDefaultRoute, want: "::/0 is a default route"},
		{name: "half of IPv4", p: "128.0.0.0/1", by: peer("x"), reason: ReasonTooBroad, want: "128.0.0.0/1 is broader than /8, the widest prefix meshlet routes for anyone"},
		{name: "IPv4's bound itself", p: "10.0.0.0/8", by: peer("x")},
		{name: "broader than IPv6's bound", p: "fd00::/8", by: peer("x"), reason: ReasonTooBroad, want: "fd00::/8 is broader than /16, the widest prefix meshlet routes for anyone"},
		{name: "IPv6's bound itself", p: "fd00::/16", by: peer("x")},
		{name: "equal", held: []held{{"10.1.0.0/24", node("a", "location:a")}}, p: "10.1.0.0/24", by: peer("x"),
			want: "10.1.0.0/24 is the pod CIDR 10.1.0.0/24 of node a"},
		{name: "inside", held: []held{{"10.1.0.0/24", node("a", "location:a")}}, p: "10.1.0.7/32", by: peer("x"),
			want: "10.1.0.7/32 lies inside the pod CIDR 10.1.0.0/24 of node a"},
		{name: "containing", held: []held{{"10.1.0.0/24", node("a", "location:a")}}, p: "10.0.0.0/8", by: peer("x"),
			want: "10.0.0.0/8 contains the pod CIDR 10.1.0.0/24 of node a"},
		{name: "beside: admitted", held: []held{{"10.1.0.0/24", node("a", "location:a")}}, p: "10.1.1.0/24", by: peer("x")},
		{name: "the other family: admitted", held: []held{{"10.1.0.0/24", node("a", "location:a")}}, p: "fd10::/64", by: peer("x")},
		{name: "an owner's own prefixes overlap freely", held: []held{{"10.5.0.0/16", peer("x")}}, p: "10.5.1.0/24", by: peer("x")},
		{name: "a location's allowed-location-ips around its own nodes' addresses and private network",
			held: []held{{"10.0.1.0/24", node("a-1", "location:a")}, {"192.168.1.5/32", claimant{kind: claimPrivateIP, owner: "node a-1", group: "location:a"}},
				{"192.168.1.0/24", claimant{kind: claimPrivateRange, owner: "node a-1", group: "location:a"}}},
			p: "192.168.0.0/16", by: alip("a")},
		{name: "... not around another location's", held: []held{{"10.0.1.0/24", node("b-1", "location:b")}}, p: "10.0.0.0/16", by: alip("a"),
			want: "10.0.0.0/16 contains the pod CIDR 10.0.1.0/24 of node b-1"},
		{name: "... nor inside another location's private network",
			held: []held{{"192.168.1.0/24", claimant{kind: claimPrivateRange, owner: "node b-1", group: "location:b"}}}, p: "192.168.1.128/25", by: alip("a"),
			want: "192.168.1.128/25 lies inside the private network 192.168.1.0/24 of node b-1"},
		{name: "a Peer may claim inside a private network (it is not a node's address)",
			held: []held{{"192.168.1.0/24", claimant{kind: claimPrivateRange, owner: "node b-1", group: "location:b"}}}, p: "192.168.1.200/32", by: peer("x")},
		{name: "nor may a Peer claim an allowed-location-ips of a location",
			held: []held{{"172.16.0.0/16", alip("a")}}, p: "172.16.5.0/24", by: peer("x"),
			want: "172.16.5.0/24 lies inside allowed-location-ips 172.16.0.0/16 of location a"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cs := NewClaims()
			for _, h := range tc.held {
				cs.hold(pfx(h.p), h.c)
			}
			reason, why, ok := cs.claim(pfx(tc.p), tc.by)
			if ok != (tc.want == "") || why != tc.want || reason != tc.reason {
				t.Errorf("claim %s: %v %q %q, want %q %q", tc.p, ok, reason, why, tc.reason, tc.want)
			}
			if ok {
				if h := cs.conflict(pfx(tc.p), claimant{kind: claimPeer, owner: "someone else"}); h == nil {
					t.Errorf("%s admitted but not held", tc.p)
				}
			}
		})
	}
}

// TestClaimNodeAddresses: the rule's first owners. Pod CIDRs: the older
// node keeps one that overlaps. Private IPs: one that is another node's
// address (its status.addresses, or its own private IP) is routed to
// neither from other locations — unless the claiming node is the only one
// to report it in status.addresses; the node stays in its segment.
func TestClaimNodeAddresses(t *testing.T) {
	a1, a2, b1, b2 := twoLocations()
	older := func(n Node, minutes int) Node {
		n.Created = time.Unix(0, 0).Add(time.Duration(minutes) * time.Minute)
		return n
	}
	reports := func(n Node, ips ...string) Node {
		for _, ip := range ips {
			n.ReportedIPs = append(n.ReportedIPs, addr(ip))
		}
		return n
	}
	priv := func(n Node, p string) Node { n.InternalIP = pfx(p); return n }
	pods := func(n Node, p string) Node { n.PodCIDRs = pfxs(p); return n }
	rej := func(name, field string, reason Reason, msg string) Rejection {
		return Rejection{Object: ObjectRef{Kind: "Node", Name: name}, Field: field, Reason: reason, Message: msg}
	}
	for _, tc := range []struct {
		name       string
		a1, a2, b1 Node
		b2         Node
		others     []Node // not Ready
		refused    []string
		noPods     []string
		want       []Rejection
	}{
		{name: "nothing claimed twice", a1: a1, a2: a2, b1: b1, b2: b2},
		{name: "a node takes another location's node's address (its status.addresses): refused, the owner keeps it",
			a1: priv(a1, "10.0.2.2/24"), a2: a2, b1: b1, b2: reports(b2, "10.0.2.2"),
			refused: []string{"a-1"},
			want:    []Rejection{rej("a-1", "internal-ip", ReasonDuplicatePrivateIP, "10.0.2.2 is the address node b-2 reports in status.addresses: routed to neither from other locations")}},
		{name: "the claimer reports it too: both refused (who is right cannot be told)",
			a1: reports(priv(a1, "10.0.2.2/24"), "10.0.2.2"), a2: a2, b1: b1, b2: reports(b2, "10.0.2.2"),
			refused: []string{"a-1", "b-2"},
			want: []Rejection{
				rej("a-1", "internal-ip", ReasonDuplicatePrivateIP, "10.0.2.2 is the address node b-2 reports in status.addresses: routed to neither from other locations"),
				rej("b-2", "internal-ip", ReasonDuplicatePrivateIP, "10.0.2.2 is the address node a-1 reports in status.addresses: routed to neither from other locations"),
			}},
		{name: "only the owner reports it: the owner keeps it",
			a1: priv(a1, "10.0.2.2/24"), a2: a2, b1: b1, b2: reports(b2, "10.0.2.2", "198.51.100.9"),
			refused: []string{"a-1"},
			want:    []Rejection{rej("a-1", "internal-ip", ReasonDuplicatePrivateIP, "10.0.2.2 is the address node b-2 reports in status.addresses: routed to neither from other locations")}},
		{name: "two annotations, nobody reports it: both refused",
			a1: priv(a1, "10.0.2.2/24"), a2: a2, b1: b1, b2: b2,
			refused: []string{"a-1", "b-2"},
			want: []Rejection{
				rej("a-1", "internal-ip", ReasonDuplicatePrivateIP, "10.0.2.2 is the private IP of node b-2 too: routed to neither from other locations"),
				rej("b-2", "internal-ip", ReasonDuplicatePrivateIP, "10.0.2.2 is the private IP of node a-1 too: routed to neither from other locations"),
			}},
		{name: "the address of a node that is not Ready counts too",
			a1: priv(a1, "10.0.9.9/24"), a2: a2, b1: b1, b2: b2, others: []Node{reports(Node{Name: "c-1"}, "10.0.9.9")},
			refused: []string{"a-1"},
			want:    []Rejection{rej("a-1", "internal-ip", ReasonDuplicatePrivateIP, "10.0.9.9 is the address node c-1 reports in status.addresses: routed to neither from other locations")}},
		{name: "a private IP inside another node's pod CIDR: refused",
			a1: priv(a1, "10.244.3.7/24"), a2: a2, b1: b1, b2: b2,
			refused: []string{"a-1"},
			want:    []Rejection{rej("a-1", "internal-ip", ReasonDuplicatePrivateIP, "10.244.3.7/32 lies inside the pod CIDR 10.244.3.0/24 of node b-1: not routed to this node from other locations")}},
		{name: "a pod CIDR overlapping an older node's: the older keeps it",
			a1: older(a1, 2), a2: a2, b1: older(pods(b1, "10.244.1.128/25"), 1), b2: b2,
			noPods: []string{"a-1"},
			want:   []Rejection{rej("a-1", "spec.podCIDR", ReasonNetworksOverlap, "10.244.1.0/24 contains the pod CIDR 10.244.1.128/25 of node b-1: not routed to this node")}},
		{name: "a pod CIDR that is a default route",
			a1: pods(a1, "0.0.0.0/0"), a2: a2, b1: b1, b2: b2,
			noPods: []string{"a-1"},
			want:   []Rejection{rej("a-1", "spec.podCIDR", ReasonDefaultRoute, "0.0.0.0/0 is a default route: not routed to this node")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := local("a-1", seg("location:a", "a", "10.4.0.1", "a-1", tc.a1, tc.a2), seg("location:b", "b", "10.4.0.2", "b-1", tc.b1, tc.b2))
			_, rejs := ClaimNodeAddresses(l, append(nodesOf(l), tc.others...), Settings{})
			check(t, "rejections", rejs, tc.want)
			for _, s := range l.Segments {
				for _, n := range s.Nodes {
					wantRefused := contains(tc.refused, n.Name)
					if n.PrivateIPRefused != wantRefused {
						t.Errorf("%s: private IP refused %v, want %v", n.Name, n.PrivateIPRefused, wantRefused)
					}
					if !n.InternalIP.IsValid() {
						t.Errorf("%s lost its private IP: it stays the node's inside its location", n.Name)
					}
					if got := len(n.PodCIDRs) == 0; got != contains(tc.noPods, n.Name) {
						t.Errorf("%s: pod CIDRs %v", n.Name, n.PodCIDRs)
					}
					if _, routed := n.routedPrivateIP(); routed == wantRefused {
						t.Errorf("%s: private IP routed %v", n.Name, routed)
					}
				}
			}
		})
	}
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}
