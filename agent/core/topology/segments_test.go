package topology

import (
	"net/netip"
	"reflect"
	"testing"
	"time"
)

func TestFindLeader(t *testing.T) {
	mk := func(name, ep string, leader bool) *Node {
		return &Node{Name: name, Endpoint: ep, Leader: leader}
	}
	for _, tc := range []struct {
		name  string
		nodes []*Node
		want  string
	}{
		{"first when nothing stands out", []*Node{mk("a", "10.0.0.1:1", false), mk("b", "10.0.0.2:1", false)}, "a"},
		{"public endpoint wins", []*Node{mk("a", "10.0.0.1:1", false), mk("b", "1.2.3.4:1", false)}, "b"},
		{"annotation beats public", []*Node{mk("a", "1.2.3.4:1", false), mk("b", "10.0.0.2:1", true)}, "b"},
		{"annotated and public beats annotated", []*Node{mk("a", "10.0.0.1:1", true), mk("b", "1.2.3.4:1", true)}, "b"},
		{"DNS endpoint is not public", []*Node{mk("a", "10.0.0.1:1", false), mk("b", "vpn.example.com:1", false)}, "a"},
		{"IPv6 ULA is private", []*Node{mk("a", "[fd00::1]:1", false), mk("b", "[2001:db8::1]:1", false)}, "b"},
		{"172.16/12 is private", []*Node{mk("a", "172.20.0.1:1", false), mk("b", "172.32.0.1:1", false)}, "b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.nodes[findLeader(tc.nodes)].Name; got != tc.want {
				t.Errorf("leader = %s, want %s", got, tc.want)
			}
		})
	}
}

// TestNotReadyAgreesWithReady: the reasons diagnose prints are exactly the
// rule the planner applies.
func TestNotReadyAgreesWithReady(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	good := Node{Name: "n", Endpoint: "1.2.3.4:51820", PublicKey: Key{1}, PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.2.0.0/24")},
		LastSeen: now.Add(-10 * time.Second)}
	for _, tc := range []struct {
		name   string
		change func(*Node)
		want   []string
	}{
		{"ready", func(*Node) {}, nil},
		{"no endpoint", func(n *Node) { n.Endpoint = "" }, []string{"no endpoint"}},
		{"no key", func(n *Node) { n.PublicKey = Key{} }, []string{"no WireGuard public key"}},
		{"no pod CIDR", func(n *Node) { n.PodCIDRs = nil }, []string{"no pod CIDR"}},
		{"never seen", func(n *Node) { n.LastSeen = time.Time{} }, []string{"never seen (no last-seen)"}},
		{"stale", func(n *Node) { n.LastSeen = now.Add(-90 * time.Second) }, []string{"last seen 1m30s ago (Kilo's window is 1m0s)"}},
		{"at the window", func(n *Node) { n.LastSeen = now.Add(-ReadyWindow) }, []string{"last seen 1m0s ago (Kilo's window is 1m0s)"}},
		{"two reasons", func(n *Node) { n.Endpoint, n.PodCIDRs = "", nil }, []string{"no endpoint", "no pod CIDR"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := good
			tc.change(&n)
			got := NotReady(n, now)
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("NotReady = %q, want %q", got, tc.want)
			}
			if ready(&n, now) != (len(got) == 0) {
				t.Errorf("ready = %v but NotReady = %q", ready(&n, now), got)
			}
		})
	}
}

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }
func pfxs(ss ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		out[i] = pfx(s)
	}
	return out
}
