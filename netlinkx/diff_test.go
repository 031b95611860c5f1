package netlinkx

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

func pfx(ss ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

func TestDiffAddrs(t *testing.T) {
	tests := []struct {
		name             string
		desired, current []netip.Prefix
		wantAdd, wantDel []netip.Prefix
	}{
		{"empty", nil, nil, nil, nil},
		{"add", pfx("10.4.0.1/16"), nil, pfx("10.4.0.1/16"), nil},
		{"same", pfx("10.4.0.1/16"), pfx("10.4.0.1/16"), nil, nil},
		{"replace WireGuard IP", pfx("10.4.0.2/16"), pfx("10.4.0.1/16"), pfx("10.4.0.2/16"), pfx("10.4.0.1/16")},
		{"prefix length differs", pfx("10.4.0.1/16"), pfx("10.4.0.1/24"), pfx("10.4.0.1/16"), pfx("10.4.0.1/24")},
		{"link-local kept", nil, pfx("fe80::1/64", "fd00::1/64"), nil, pfx("fd00::1/64")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			add, del := DiffAddrs(tt.desired, tt.current)
			if !reflect.DeepEqual(add, tt.wantAdd) || !reflect.DeepEqual(del, tt.wantDel) {
				t.Errorf("add=%v del=%v, want add=%v del=%v", add, del, tt.wantAdd, tt.wantDel)
			}
		})
	}
}

func rs(table int, dst, gw string, link int, src string, onlink bool) kernelRoute {
	r := kernelRoute{Table: table, Dst: netip.MustParsePrefix(dst), LinkIndex: link, OnLink: onlink}
	if gw != "" {
		r.Gw = netip.MustParseAddr(gw)
	}
	if src != "" {
		r.Src = netip.MustParseAddr(src)
	}
	return r
}

func TestDiffRoutes(t *testing.T) {
	a := rs(254, "10.2.0.0/24", "10.4.0.1", 5, "", true)
	b := rs(254, "10.3.0.0/24", "", 5, "10.4.0.2", false)
	b1107 := rs(1107, "10.3.0.0/24", "", 5, "", false)
	tests := []struct {
		name              string
		desired, current  []kernelRoute
		wantRepl, wantDel []kernelRoute
	}{
		{"all new", []kernelRoute{a, b}, nil, []kernelRoute{a, b}, nil},
		{"in sync", []kernelRoute{a, b}, []kernelRoute{b, a}, nil, nil},
		{"stale removed", []kernelRoute{a}, []kernelRoute{a, b}, nil, []kernelRoute{b}},
		{"same dst other table is another route", []kernelRoute{b, b1107}, []kernelRoute{b}, []kernelRoute{b1107}, nil},
		{"gateway changed", []kernelRoute{rs(254, "10.2.0.0/24", "10.4.0.9", 5, "", true)}, []kernelRoute{a},
			[]kernelRoute{rs(254, "10.2.0.0/24", "10.4.0.9", 5, "", true)}, nil},
		{"onlink changed", []kernelRoute{rs(254, "10.2.0.0/24", "10.4.0.1", 5, "", false)}, []kernelRoute{a},
			[]kernelRoute{rs(254, "10.2.0.0/24", "10.4.0.1", 5, "", false)}, nil},
		{"src changed", []kernelRoute{rs(254, "10.3.0.0/24", "", 5, "", false)}, []kernelRoute{b},
			[]kernelRoute{rs(254, "10.3.0.0/24", "", 5, "", false)}, nil},
		{"everything removed", nil, []kernelRoute{a, b}, nil, []kernelRoute{a, b}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			repl, del := diffRoutes(tt.desired, tt.current)
			if !reflect.DeepEqual(repl, tt.wantRepl) || !reflect.DeepEqual(del, tt.wantDel) {
				t.Errorf("replace=%v delete=%v\nwant replace=%v delete=%v", repl, del, tt.wantRepl, tt.wantDel)
			}
		})
	}
}

func TestRouteConversionRoundTrip(t *testing.T) {
	for _, s := range []kernelRoute{
		rs(254, "10.2.0.0/24", "10.4.0.1", 5, "", true),
		rs(1107, "10.3.0.0/24", "", 7, "10.4.0.2", false),
		rs(254, "fd00:1::/64", "", 7, "", false),
		rs(254, "0.0.0.0/0", "192.0.2.1", 2, "", false),
	} {
		r := toNetlinkRoute(s)
		if r.Protocol != Protocol {
			t.Errorf("%s: protocol %d", s, r.Protocol)
		}
		if wantScope := netlink.SCOPE_LINK; !s.Gw.IsValid() && r.Scope != wantScope {
			t.Errorf("%s: scope %v, want link", s, r.Scope)
		}
		if got := fromNetlinkRoute(*r); got != s {
			t.Errorf("round trip %s -> %s", s, got)
		}
	}
	// The kernel reports a default route with a nil Dst.
	if got := fromNetlinkRoute(netlink.Route{Family: unix.AF_INET, Gw: net.ParseIP("192.0.2.1"), Table: 254}); got.Dst != netip.MustParsePrefix("0.0.0.0/0") {
		t.Errorf("default route dst = %v", got.Dst)
	}
}

func TestDiffRules(t *testing.T) {
	r1 := kernelRuleOf(Rule{Src: netip.MustParsePrefix("10.2.0.0/24"), Table: 1107})
	r2 := kernelRuleOf(Rule{Iif: "kilo0", Table: 1107})
	r6 := kernelRuleOf(Rule{Dst: netip.MustParsePrefix("fd00::/64"), Table: 1107})
	if r2.Family != unix.AF_INET || r6.Family != unix.AF_INET6 || r1.Table != 1107 {
		t.Fatalf("families/table wrong: %+v %+v %+v", r1, r2, r6)
	}
	if kernelRuleOf(Rule{Src: netip.MustParsePrefix("10.2.0.0/24")}).Table != unix.RT_TABLE_MAIN {
		t.Error("table 0 must mean main")
	}
	tests := []struct {
		name             string
		desired, current []kernelRule
		wantAdd, wantDel []kernelRule
	}{
		{"add", []kernelRule{r1, r2}, nil, []kernelRule{r1, r2}, nil},
		{"in sync", []kernelRule{r1, r2, r6}, []kernelRule{r6, r2, r1}, nil, nil},
		{"stale", []kernelRule{r1}, []kernelRule{r1, r2}, nil, []kernelRule{r2}},
		{"duplicate on host removed once", []kernelRule{r1}, []kernelRule{r1, r1}, nil, []kernelRule{r1}},
		{"duplicate desired added once", []kernelRule{r1, r1}, nil, []kernelRule{r1}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			add, del := diffRules(tt.desired, tt.current)
			if !reflect.DeepEqual(add, tt.wantAdd) || !reflect.DeepEqual(del, tt.wantDel) {
				t.Errorf("add=%v del=%v, want add=%v del=%v", add, del, tt.wantAdd, tt.wantDel)
			}
		})
	}
}

func TestDesiredChains(t *testing.T) {
	fw := Firewall{NAT: NAT{Sources: pfx("10.2.0.0/24", "fd00:2::/64"), Destinations: pfx("192.168.100.0/24"),
		Exceptions: pfx("10.0.0.0/8", "10.4.0.0/16", "fd00::/8")}, Forward: pfx("10.2.0.0/24")}
	v4 := desiredChains(fw, ipv4)
	want4 := []chainSpec{
		{table: "nat", chain: ChainNAT, parent: "POSTROUTING",
			rules: []string{"-d 10.0.0.0/8 -j RETURN", "-d 10.4.0.0/16 -j RETURN", "-j MASQUERADE"},
			jumps: []string{"-s 10.2.0.0/24 -j MESHLET-NAT", "! -s 192.168.100.0/24 -d 192.168.100.0/24 -j MESHLET-NAT"}},
		{table: "filter", chain: ChainForward, parent: "FORWARD", first: true,
			rules: []string{"-s 10.2.0.0/24 -j ACCEPT", "-d 10.2.0.0/24 -j ACCEPT"},
			jumps: []string{"-j MESHLET-FORWARD"}},
	}
	if !reflect.DeepEqual(v4, want4) {
		t.Errorf("IPv4:\n got %+v\nwant %+v", v4, want4)
	}
	v6 := desiredChains(fw, ipv6)
	if !reflect.DeepEqual(v6[0].rules, []string{"-d fd00::/8 -j RETURN", "-j MASQUERADE"}) || !reflect.DeepEqual(v6[0].jumps, []string{"-s fd00:2::/64 -j MESHLET-NAT"}) {
		t.Errorf("IPv6: %+v", v6)
	}
	if len(v6[1].rules) != 0 || len(v6[1].jumps) != 0 {
		t.Errorf("IPv6 forward (no IPv6 prefix): %+v", v6[1])
	}
	// No sources: no chain, no jumps, even with exceptions.
	none := desiredChains(Firewall{NAT: NAT{Exceptions: pfx("10.0.0.0/8")}}, ipv4)
	if len(none[0].rules) != 0 || len(none[0].jumps) != 0 {
		t.Errorf("no sources: %+v", none[0])
	}
}

// applyOps simulates iptables semantics for chain ops.
func applyOps(cur []string, ops []chainOp) []string {
	cur = slices.Clone(cur)
	for _, op := range ops {
		if op.insert {
			cur = slices.Insert(cur, op.pos-1, op.rule)
		} else {
			cur = slices.Delete(cur, op.pos-1, op.pos)
		}
	}
	return cur
}

func TestPlanChain(t *testing.T) {
	tests := []struct {
		name             string
		current, desired []string
		wantOps          int
	}{
		{"same", []string{"a", "b", "M"}, []string{"a", "b", "M"}, 0},
		{"from empty", nil, []string{"a", "M"}, 2},
		{"one exception added in the middle", []string{"a", "c", "M"}, []string{"a", "b", "c", "M"}, 1},
		{"exception removed", []string{"a", "b", "M"}, []string{"a", "M"}, 1},
		{"reordered", []string{"b", "a", "M"}, []string{"a", "b", "M"}, 2},
		{"emptied", []string{"a", "M"}, nil, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ops := planChain(tt.current, tt.desired)
			if got := applyOps(tt.current, ops); !slices.Equal(got, tt.desired) {
				t.Fatalf("ops %+v turn %v into %v, want %v", ops, tt.current, got, tt.desired)
			}
			if len(ops) != tt.wantOps {
				t.Errorf("%d ops, want %d: %+v", len(ops), tt.wantOps, ops)
			}
			// A MASQUERADE rule that stays wanted is never missing in
			// between: no packet escapes un-masqueraded during a rewrite.
			if slices.Contains(tt.current, "M") && slices.Contains(tt.desired, "M") {
				cur := tt.current
				for i := range ops {
					cur = applyOps(cur, ops[i:i+1])
					if !slices.Contains(cur, "M") {
						t.Errorf("after op %d %+v the chain has no MASQUERADE: %v", i, ops[i], cur)
					}
				}
			}
		})
	}
}

// fakeIPT is an in-memory iptables with -S style listing.
type fakeIPT struct {
	chains map[string][]string // "table/chain" -> rules
	calls  []string            // writes
	reads  int                 // Lists and ChainExists: each an iptables fork
}

// exitStatus is an iptables exit as go-iptables reports it.
type exitStatus int

func (e exitStatus) Error() string   { return fmt.Sprintf("iptables exited %d", int(e)) }
func (e exitStatus) ExitStatus() int { return int(e) }

func (f *fakeIPT) k(t, c string) string { return t + "/" + c }

func (f *fakeIPT) List(t, c string) ([]string, error) {
	f.reads++
	rules, ok := f.chains[f.k(t, c)]
	if !ok {
		return nil, fmt.Errorf("running iptables -S %s: %w", c, exitStatus(1))
	}
	out := []string{"-N " + c}
	for _, r := range rules {
		out = append(out, "-A "+c+" "+r)
	}
	return out, nil
}
func (f *fakeIPT) ChainExists(t, c string) (bool, error) {
	f.reads++
	_, ok := f.chains[f.k(t, c)]
	return ok, nil
}
func (f *fakeIPT) NewChain(t, c string) error {
	f.calls = append(f.calls, "new "+c)
	f.chains[f.k(t, c)] = []string{}
	return nil
}
func (f *fakeIPT) ClearAndDeleteChain(t, c string) error {
	f.calls = append(f.calls, "delete-chain "+c)
	delete(f.chains, f.k(t, c))
	return nil
}
func (f *fakeIPT) Insert(t, c string, pos int, r ...string) error {
	f.calls = append(f.calls, "insert "+c)
	f.chains[f.k(t, c)] = slices.Insert(f.chains[f.k(t, c)], pos-1, strings.Join(r, " "))
	return nil
}
func (f *fakeIPT) Append(t, c string, r ...string) error {
	f.calls = append(f.calls, "append "+c)
	f.chains[f.k(t, c)] = append(f.chains[f.k(t, c)], strings.Join(r, " "))
	return nil
}
func (f *fakeIPT) Delete(t, c string, r ...string) error {
	f.calls = append(f.calls, "delete "+c)
	i := slices.Index(f.chains[f.k(t, c)], strings.Join(r, " "))
	if i < 0 {
		return fmt.Errorf("no rule %v", r)
	}
	f.chains[f.k(t, c)] = slices.Delete(f.chains[f.k(t, c)], i, i+1)
	return nil
}
func (f *fakeIPT) DeleteById(t, c string, id int) error {
	f.calls = append(f.calls, "delete-id "+c)
	f.chains[f.k(t, c)] = slices.Delete(f.chains[f.k(t, c)], id-1, id)
	return nil
}

func TestReconcileChain(t *testing.T) {
	f := &fakeIPT{chains: map[string][]string{"nat/POSTROUTING": {"-s 172.17.0.0/16 ! -o docker0 -j MASQUERADE", "-s 10.9.0.0/24 -j MESHLET-NAT"}}}
	spec := desiredChains(Firewall{NAT: NAT{Sources: pfx("10.2.0.0/24"), Exceptions: pfx("10.4.0.0/16")}}, ipv4)[0]
	if _, err := reconcileChain(f, spec); err != nil {
		t.Fatal(err)
	}
	wantPost := []string{"-s 172.17.0.0/16 ! -o docker0 -j MASQUERADE", "-s 10.2.0.0/24 -j MESHLET-NAT"}
	if got := f.chains["nat/POSTROUTING"]; !slices.Equal(got, wantPost) {
		t.Errorf("POSTROUTING = %v, want %v (stale jump gone, foreign rule kept)", got, wantPost)
	}
	if got := f.chains["nat/MESHLET-NAT"]; !slices.Equal(got, spec.rules) {
		t.Errorf("MESHLET-NAT = %v", got)
	}
	// Idempotent: a second pass issues no writes.
	f.calls = nil
	changes, err := reconcileChain(f, spec)
	if err != nil || len(changes) != 0 || len(f.calls) != 0 {
		t.Errorf("second pass: changes=%v calls=%v err=%v", changes, f.calls, err)
	}
	// Removal: chain and jump go, the foreign rule stays.
	if _, err := reconcileChain(f, chainSpec{table: "nat", chain: ChainNAT, parent: "POSTROUTING"}); err != nil {
		t.Fatal(err)
	}
	if _, ok := f.chains["nat/MESHLET-NAT"]; ok || len(f.chains["nat/POSTROUTING"]) != 1 {
		t.Errorf("after removal: %v", f.chains)
	}
}

// TestEnsureFirewallReads follows the iptables forks (reads) of a host's
// checks: everything at the first, then only the chains wanted; a drift
// of a wanted chain is still mended, a chain no longer wanted is removed
// and then not read again, and Cleanup reads everything.
func TestEnsureFirewallReads(t *testing.T) {
	v4 := &fakeIPT{chains: map[string][]string{"nat/POSTROUTING": {"-s 172.17.0.0/16 ! -o docker0 -j MASQUERADE"}, "filter/FORWARD": {"-j DROP"}}}
	v6 := &fakeIPT{chains: map[string][]string{"nat/POSTROUTING": {}, "filter/FORWARD": {}}}
	h := &Host{log: slog.New(slog.DiscardHandler), ipt: map[family]iptablesClient{ipv4: v4, ipv6: v6}}
	nat := Firewall{NAT: NAT{Sources: pfx("10.2.0.0/24")}}
	both := Firewall{NAT: nat.NAT, Forward: pfx("10.2.0.0/24")}
	for _, step := range []struct {
		name    string
		fw      Firewall
		drift   func()
		cleanup bool
		reads4  int // forks per family
		reads6  int
		changes int
	}{
		{name: "first check: every chain", fw: nat, reads4: 1 + 1 + 2, reads6: 2 + 2, changes: 3},
		{name: "recheck: the wanted chain and its parent", fw: nat, reads4: 2},
		{name: "a rule removed behind meshlet's back", fw: nat, drift: func() { v4.chains["nat/"+ChainNAT] = nil }, reads4: 2, changes: 1},
		{name: "forward rules wanted", fw: both, reads4: 2 + 2, changes: 4},
		{name: "recheck of both", fw: both, reads4: 4},
		{name: "NAT no longer wanted", fw: Firewall{Forward: both.Forward}, reads4: 2 + 2, changes: 2},
		{name: "recheck: the removed chain is not read", fw: Firewall{Forward: both.Forward}, reads4: 2},
		{name: "cleanup reads everything", cleanup: true, reads4: 2 + 2, reads6: 2 + 2, changes: 2},
	} {
		if step.drift != nil {
			step.drift()
		}
		v4.reads, v6.reads = 0, 0
		var rep FirewallReport
		var err error
		if step.cleanup {
			h.forgetAbsent()
		}
		rep, err = h.EnsureFirewall(context.Background(), step.fw)
		if err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		if v4.reads != step.reads4 || v6.reads != step.reads6 || len(rep.Changes) != step.changes {
			t.Errorf("%s: %d IPv4 and %d IPv6 reads, %d changes %v; want %d, %d, %d", step.name, v4.reads, v6.reads, len(rep.Changes), rep.Changes, step.reads4, step.reads6, step.changes)
		}
	}
	if len(v4.chains) != 2 || len(v4.chains["nat/POSTROUTING"]) != 1 || len(v4.chains["filter/FORWARD"]) != 1 {
		t.Errorf("after cleanup: %v", v4.chains)
	}
}

func TestSysctlPath(t *testing.T) {
	for key, want := range map[string]string{
		"net.ipv4.ip_forward":              "/proc/sys/net/ipv4/ip_forward",
		"net.ipv4.conf.kilo0.rp_filter":    "/proc/sys/net/ipv4/conf/kilo0/rp_filter",
		"net.ipv4.conf.eth0.100.rp_filter": "/proc/sys/net/ipv4/conf/eth0.100/rp_filter",
	} {
		if got := sysctlPath(key); got != want {
			t.Errorf("sysctlPath(%q) = %q, want %q", key, got, want)
		}
	}
	for _, tc := range []struct {
		tunnel string
		ipv6   bool
		want   []Sysctl
	}{
		{"", false, []Sysctl{{"net.ipv4.ip_forward", "1"}, {"net.ipv4.conf.kilo0.rp_filter", "2"}}},
		{"", true, []Sysctl{{"net.ipv4.ip_forward", "1"}, {"net.ipv6.conf.all.forwarding", "1"}, {"net.ipv4.conf.kilo0.rp_filter", "2"}}},
		// The tunnel has no address: loose mode would still drop pod traffic
		// decapsulated there, so filtering is off on it.
		{"cilium_tunl", false, []Sysctl{{"net.ipv4.ip_forward", "1"}, {"net.ipv4.conf.kilo0.rp_filter", "2"}, {"net.ipv4.conf.cilium_tunl.rp_filter", "0"}}},
	} {
		if got := DesiredSysctls("kilo0", tc.tunnel, tc.ipv6); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("DesiredSysctls(kilo0, %q, %v) = %v, want %v", tc.tunnel, tc.ipv6, got, tc.want)
		}
	}
}

func TestEventFilters(t *testing.T) {
	up := &netlink.Device{LinkAttrs: netlink.LinkAttrs{Name: "kilo0", Index: 7, Flags: net.FlagUp}}
	down := &netlink.Device{LinkAttrs: netlink.LinkAttrs{Name: "kilo0", Index: 7}}
	other := &netlink.Device{LinkAttrs: netlink.LinkAttrs{Name: "eth0", Index: 2}}
	linkUpd := func(typ uint16, l netlink.Link) netlink.LinkUpdate {
		u := netlink.LinkUpdate{Link: l}
		u.Header.Type = typ
		return u
	}
	for _, tt := range []struct {
		name string
		got  bool
		want bool
	}{
		{"meshlet route deleted", routeEventRelevant(netlink.RouteUpdate{Type: unix.RTM_DELROUTE, Route: netlink.Route{Protocol: Protocol}}), true},
		{"meshlet route added", routeEventRelevant(netlink.RouteUpdate{Type: unix.RTM_NEWROUTE, Route: netlink.Route{Protocol: Protocol}}), false},
		{"foreign route deleted", routeEventRelevant(netlink.RouteUpdate{Type: unix.RTM_DELROUTE, Route: netlink.Route{Protocol: unix.RTPROT_BOOT}}), false},
		{"kilo0 down", linkEventRelevant(linkUpd(unix.RTM_NEWLINK, down), "kilo0"), true},
		{"kilo0 up", linkEventRelevant(linkUpd(unix.RTM_NEWLINK, up), "kilo0"), false},
		{"kilo0 deleted", linkEventRelevant(linkUpd(unix.RTM_DELLINK, up), "kilo0"), true},
		{"other link down", linkEventRelevant(linkUpd(unix.RTM_NEWLINK, other), "kilo0"), false},
		{"address removed from kilo0", addrEventRelevant(netlink.AddrUpdate{LinkIndex: 7}, 7), true},
		{"address added to kilo0", addrEventRelevant(netlink.AddrUpdate{LinkIndex: 7, NewAddr: true}, 7), false},
		{"address removed elsewhere", addrEventRelevant(netlink.AddrUpdate{LinkIndex: 2}, 7), false},
	} {
		if tt.got != tt.want {
			t.Errorf("%s: got %v, want %v", tt.name, tt.got, tt.want)
		}
	}
}

func TestEqualSpec(t *testing.T) {
	base := func() Spec {
		return Spec{Link: LinkSpec{Name: "kilo0", Up: true, MTU: 1420, Addresses: pfx("10.4.0.1/16")},
			Routes:   []Route{{Dst: netip.MustParsePrefix("10.2.0.0/24"), Dev: "kilo0"}},
			Rules:    []Rule{{Iif: "kilo0", Table: 1107}},
			Firewall: Firewall{NAT: NAT{Sources: pfx("10.2.0.0/24")}, Forward: pfx("10.2.0.0/24")}}
	}
	for _, tc := range []struct {
		name string
		edit func(*Spec)
		want bool
	}{
		{"same", func(*Spec) {}, true},
		{"nil and empty slices alike", func(s *Spec) { s.Firewall.NAT.Exceptions = []netip.Prefix{} }, true},
		{"MTU", func(s *Spec) { s.Link.MTU = 1370 }, false},
		{"link down", func(s *Spec) { s.Link.Up = false }, false},
		{"address", func(s *Spec) { s.Link.Addresses = pfx("10.4.0.2/16") }, false},
		{"route gateway", func(s *Spec) { s.Routes[0].Gw = netip.MustParseAddr("10.4.0.3") }, false},
		{"route added", func(s *Spec) { s.Routes = append(s.Routes, Route{Dst: netip.MustParsePrefix("10.3.0.0/24")}) }, false},
		{"rule", func(s *Spec) { s.Rules = nil }, false},
		{"tunnel", func(s *Spec) { s.Tunnel = Tunnel{Name: "tunl0", Create: true} }, false},
		{"NAT exception", func(s *Spec) { s.Firewall.NAT.Exceptions = pfx("10.0.0.0/8") }, false},
		{"NAT destination", func(s *Spec) { s.Firewall.NAT.Destinations = pfx("192.168.0.0/24") }, false},
		{"forward", func(s *Spec) { s.Firewall.Forward = nil }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := base()
			kept := cloneSpec(a)
			b := base()
			tc.edit(&b)
			if got := equalSpec(kept, b); got != tc.want {
				t.Errorf("equalSpec = %v, want %v", got, tc.want)
			}
			// What was kept does not follow the caller's later edits.
			tc.edit(&a)
			if !equalSpec(kept, base()) {
				t.Errorf("the kept copy changed with the caller's spec")
			}
		})
	}
}
