package netlinkx

// Root integration tests. Each test creates throwaway network namespaces
// (ip netns add) and points a Host at /run/netns/<name>; the test process
// itself never changes namespace. The kernel here has no dummy links, so a
// veth pair stands in for kilo0.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces, routes, rules and iptables chains (CI runs as root)")
	}
	for _, tool := range []string{"ip", "iptables", "ip6tables"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s not found (apt-get install iproute2 iptables): %v", tool, err)
		}
	}
}

var seq atomic.Int32

func run(t testing.TB, args ...string) string {
	t.Helper()
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// testNS is a namespace with kilo0 (veth, peer kilo0p) and an underlay ul0
// (MTU 1450, 192.168.50.1/24, default route via .254).
type testNS struct {
	name string
	host *Host
}

func newTestNS(t testing.TB) *testNS {
	t.Helper()
	name := fmt.Sprintf("mlnl%d%d", os.Getpid()%100000, seq.Add(1))
	run(t, "ip", "netns", "add", name)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	ipn := func(args ...string) { run(t, append([]string{"ip", "-n", name}, args...)...) }
	ipn("link", "set", "lo", "up")
	ipn("link", "add", "kilo0", "type", "veth", "peer", "name", "kilo0p")
	ipn("link", "set", "kilo0p", "up")
	ipn("link", "add", "ul0", "mtu", "1450", "type", "veth", "peer", "name", "ul1", "mtu", "1450")
	ipn("link", "set", "ul0", "up")
	ipn("link", "set", "ul1", "up")
	ipn("addr", "add", "192.168.50.1/24", "dev", "ul0")
	ipn("route", "add", "default", "via", "192.168.50.254", "dev", "ul0")
	h, err := New(Options{NetNSPath: "/run/netns/" + name, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return &testNS{name: name, host: h}
}

func (n *testNS) ip(t testing.TB, args ...string) string {
	t.Helper()
	return run(t, append([]string{"ip", "-n", n.name}, args...)...)
}

func (n *testNS) exec(t testing.TB, args ...string) string {
	t.Helper()
	return run(t, append([]string{"ip", "netns", "exec", n.name}, args...)...)
}

func route(dst, gw, dev, src string, table int, onlink bool) Route {
	r := Route{Dst: netip.MustParsePrefix(dst), Dev: dev, Table: table, OnLink: onlink}
	if gw != "" {
		r.Gw = netip.MustParseAddr(gw)
	}
	if src != "" {
		r.Src = netip.MustParseAddr(src)
	}
	return r
}

func leaderSpec() Spec {
	return Spec{
		Link: LinkSpec{Name: "kilo0", Up: true, MTU: 1370, Addresses: pfx("10.4.0.1/16")},
		Routes: []Route{
			route("10.2.0.0/24", "10.4.0.2", "kilo0", "", 0, true),
			route("10.3.0.0/24", "", "kilo0", "10.4.0.1", 0, false),
			route("10.5.0.0/24", "", "kilo0", "", 1107, false),
			route("fd00:2::/64", "", "kilo0", "", 0, false),
		},
		Rules: []Rule{
			{Src: netip.MustParsePrefix("10.2.0.0/24"), Table: 1107},
			{Iif: "kilo0", Table: 1107},
		},
		Firewall: Firewall{
			NAT:     NAT{Sources: pfx("10.2.0.0/24", "fd00:2::/64"), Destinations: pfx("192.168.100.0/24"), Exceptions: pfx("10.0.0.0/8", "fd00::/8")},
			Forward: pfx("10.2.0.0/24"),
		},
	}
}

func TestHostApplyAndCleanup(t *testing.T) {
	requireRoot(t)
	ns := newTestNS(t)
	ctx := context.Background()
	// State left by others: a kg route meshlet must adopt, a foreign route
	// and rule it must keep, a stale meshlet route and rule it must remove,
	// a stale address on kilo0.
	ns.ip(t, "link", "set", "kilo0", "up")
	ns.ip(t, "addr", "add", "10.4.0.9/16", "dev", "kilo0")
	ns.ip(t, "route", "add", "10.3.0.0/24", "dev", "kilo0", "proto", "static")
	ns.ip(t, "route", "add", "10.8.0.0/24", "dev", "kilo0", "proto", "static")
	ns.ip(t, "route", "add", "10.9.0.0/24", "dev", "kilo0", "proto", "109")
	ns.ip(t, "rule", "add", "from", "10.7.0.0/24", "table", "1107", "protocol", "109")
	ns.ip(t, "rule", "add", "from", "10.6.0.0/24", "table", "100")
	ns.exec(t, "iptables", "-t", "nat", "-A", "POSTROUTING", "-s", "172.17.0.0/16", "-j", "MASQUERADE")
	ns.exec(t, "iptables", "-A", "FORWARD", "-j", "DROP") // a host that drops what it does not know

	rep, err := ns.host.Apply(ctx, leaderSpec())
	if err != nil {
		t.Fatal(err)
	}
	if rep.Link.MTU != 1370 || !rep.Link.MTUChanged {
		t.Errorf("MTU = %d (changed %v), want 1370", rep.Link.MTU, rep.Link.MTUChanged)
	}
	// What the planner derives the auto MTU from.
	if iface, mtu, err := ns.host.DefaultRoute(); err != nil || iface != "ul0" || mtu != 1450 {
		t.Errorf("DefaultRoute() = %q, %d, %v; want ul0 with MTU 1450", iface, mtu, err)
	}
	addrs, err := ns.host.Addresses("kilo0")
	if err != nil {
		t.Fatal(err)
	}
	addrs = slices.DeleteFunc(addrs, func(p netip.Prefix) bool { return p.Addr().IsLinkLocalUnicast() })
	if !slices.Equal(addrs, pfx("10.4.0.1/16")) {
		t.Errorf("kilo0 addresses = %v, want only 10.4.0.1/16", addrs)
	}

	routes := ns.ip(t, "route", "show", "table", "all", "proto", "109") + ns.ip(t, "-6", "route", "show", "table", "all", "proto", "109")
	for _, want := range []string{
		"10.2.0.0/24 via 10.4.0.2 dev kilo0 onlink",
		"10.3.0.0/24 dev kilo0 scope link src 10.4.0.1", // the kg route, adopted
		"10.5.0.0/24 dev kilo0 table 1107 scope link",
		"fd00:2::/64 dev kilo0",
	} {
		if !strings.Contains(routes, want) {
			t.Errorf("missing meshlet route %q in:\n%s", want, routes)
		}
	}
	if strings.Contains(routes, "10.9.0.0/24") {
		t.Errorf("stale meshlet route not removed:\n%s", routes)
	}
	if all := ns.ip(t, "route", "show"); !strings.Contains(all, "10.8.0.0/24 dev kilo0 proto static") || strings.Count(all, "10.3.0.0/24") != 1 {
		t.Errorf("foreign route touched or kg route duplicated:\n%s", all)
	}
	rules := ns.ip(t, "rule", "show")
	for _, want := range []string{"from 10.2.0.0/24 lookup 1107 proto 109", "from all iif kilo0 lookup 1107 proto 109", "from 10.6.0.0/24 lookup 100"} {
		if !strings.Contains(rules, want) {
			t.Errorf("missing rule %q in:\n%s", want, rules)
		}
	}
	if strings.Contains(rules, "10.7.0.0/24") {
		t.Errorf("stale meshlet rule not removed:\n%s", rules)
	}

	nat4 := ns.exec(t, "iptables", "-t", "nat", "-S")
	for _, want := range []string{
		"-A POSTROUTING -s 172.17.0.0/16 -j MASQUERADE",
		"-A POSTROUTING -s 10.2.0.0/24 -j MESHLET-NAT",
		"-A POSTROUTING ! -s 192.168.100.0/24 -d 192.168.100.0/24 -j MESHLET-NAT",
		"-A MESHLET-NAT -d 10.0.0.0/8 -j RETURN\n-A MESHLET-NAT -j MASQUERADE",
	} {
		if !strings.Contains(nat4, want) {
			t.Errorf("missing %q in IPv4 nat:\n%s", want, nat4)
		}
	}
	// The FORWARD accept chain goes first, ahead of a host's DROP rule.
	if fwd := ns.exec(t, "iptables", "-S", "FORWARD"); !strings.Contains(fwd, "-A FORWARD -j MESHLET-FORWARD\n-A FORWARD -j DROP") {
		t.Errorf("FORWARD:\n%s", fwd)
	}
	if fwd := ns.exec(t, "iptables", "-S", ChainForward); !strings.Contains(fwd, "-A MESHLET-FORWARD -s 10.2.0.0/24 -j ACCEPT\n-A MESHLET-FORWARD -d 10.2.0.0/24 -j ACCEPT") {
		t.Errorf("%s:\n%s", ChainForward, fwd)
	}
	if nat6 := ns.exec(t, "ip6tables", "-t", "nat", "-S"); !strings.Contains(nat6, "-A POSTROUTING -s fd00:2::/64 -j MESHLET-NAT") ||
		!strings.Contains(nat6, "-A MESHLET-NAT -d fd00::/8 -j RETURN\n-A MESHLET-NAT -j MASQUERADE") {
		t.Errorf("IPv6 nat:\n%s", nat6)
	}
	for key, want := range map[string]string{"net.ipv4.ip_forward": "1", "net.ipv4.conf.kilo0.rp_filter": "2"} {
		if got := strings.TrimSpace(ns.exec(t, "sysctl", "-n", key)); got != want {
			t.Errorf("%s = %s in the namespace, want %s", key, got, want)
		}
	}

	// Second apply: nothing to do, nothing done.
	rep, err = ns.host.Apply(ctx, leaderSpec())
	if err != nil || rep.Changed() {
		t.Fatalf("second apply changed %+v (err %v)", rep, err)
	}

	// One route changes: exactly one replace.
	spec := leaderSpec()
	spec.Routes[0].Gw = netip.MustParseAddr("10.4.0.3")
	spec.Firewall.NAT.Exceptions = pfx("10.0.0.0/8", "10.4.0.0/16", "fd00::/8")
	rep, err = ns.host.Apply(ctx, spec)
	if err != nil || len(rep.Routes.Replaced) != 1 || len(rep.Routes.Deleted) != 0 || len(rep.Firewall.Changes) != 1 {
		t.Fatalf("one-route change: %+v (err %v)", rep, err)
	}

	// Non-leader: kilo0 goes down.
	spec.Link.Up = false
	spec.Routes = nil
	if _, err := ns.host.Apply(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if l := ns.ip(t, "link", "show", "kilo0"); strings.Contains(l, ",UP") {
		t.Errorf("kilo0 still up: %s", l)
	}

	if err := ns.host.Cleanup(ctx, CleanupOptions{Interface: "kilo0", DeleteInterface: true}); err != nil {
		t.Fatal(err)
	}
	if r := ns.ip(t, "route", "show", "table", "all", "proto", "109"); r != "" {
		t.Errorf("routes left after cleanup:\n%s", r)
	}
	if r := ns.ip(t, "rule", "show"); strings.Contains(r, "proto 109") || !strings.Contains(r, "from 10.6.0.0/24 lookup 100") {
		t.Errorf("rules after cleanup:\n%s", r)
	}
	if s := ns.exec(t, "iptables", "-t", "nat", "-S") + ns.exec(t, "iptables", "-S") + ns.exec(t, "ip6tables", "-t", "nat", "-S"); strings.Contains(s, "MESHLET") ||
		!strings.Contains(s, "172.17.0.0/16") {
		t.Errorf("iptables after cleanup:\n%s", s)
	}
	if out, err := exec.Command("ip", "-n", ns.name, "link", "show", "kilo0").CombinedOutput(); err == nil {
		t.Errorf("kilo0 not deleted: %s", out)
	}
	if err := ns.host.Cleanup(ctx, CleanupOptions{Interface: "kilo0", DeleteInterface: true}); err != nil {
		t.Errorf("second cleanup: %v", err)
	}
}

func TestTunnel(t *testing.T) {
	requireRoot(t)
	ns := newTestNS(t)
	ctx := context.Background()
	if name, err := ns.host.FindTunnel("cilium_tunl", "tunl0"); err != nil || name != "" {
		t.Fatalf("FindTunnel = %q, %v; want none in a fresh namespace", name, err)
	}
	if _, err := ns.host.EnsureTunnel(ctx, Tunnel{Name: "cilium_tunl"}); err == nil {
		t.Error("missing cilium_tunl accepted")
	}
	if _, err := ns.host.EnsureTunnel(ctx, Tunnel{Name: "tunl0"}); err == nil {
		t.Error("missing tunl0 without Create accepted")
	}
	name, err := ns.host.EnsureTunnel(ctx, Tunnel{Name: "tunl0", Create: true})
	if haveIPIP() {
		if err != nil || name != "tunl0" {
			t.Fatalf("kernel has ipip but EnsureTunnel = %q, %v", name, err)
		}
		return
	}
	if !errors.Is(err, ErrIPIPUnavailable) {
		t.Fatalf("kernel without ipip: err = %v, want ErrIPIPUnavailable", err)
	}
	t.Logf("expected error on this kernel: %v", err)
	// Apply reports it and still does the rest.
	spec := leaderSpec()
	spec.Tunnel = Tunnel{Name: "tunl0", Create: true}
	rep, err := ns.host.Apply(ctx, spec)
	if !errors.Is(err, ErrIPIPUnavailable) || len(rep.Routes.Replaced) != len(spec.Routes) {
		t.Fatalf("Apply with impossible tunnel: err=%v, routes=%v", err, rep.Routes)
	}
}

func haveIPIP() bool {
	b, err := os.ReadFile("/proc/modules")
	if err == nil && strings.Contains(string(b), "ipip ") {
		return true
	}
	_, err = os.Stat("/sys/module/ipip")
	return err == nil
}

func TestWatchSignalsWithinASecond(t *testing.T) {
	requireRoot(t)
	ns := newTestNS(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	spec := leaderSpec()
	if _, err := ns.host.Apply(ctx, spec); err != nil {
		t.Fatal(err)
	}
	// Subscribe after the apply: events from before are not delivered.
	ch, err := ns.host.Watch(ctx, "kilo0")
	if err != nil {
		t.Fatal(err)
	}
	expect := func(what string) {
		t.Helper()
		select {
		case <-ch:
		case <-time.After(time.Second):
			t.Fatalf("no signal within 1s after %s", what)
		}
	}
	// Unrelated noise first (TestEventFilters checks it is ignored; here it
	// only must not break the subscription).
	ns.ip(t, "route", "add", "10.8.0.0/24", "dev", "kilo0")
	ns.ip(t, "route", "del", "10.8.0.0/24", "dev", "kilo0")

	ns.ip(t, "route", "del", "10.2.0.0/24", "dev", "kilo0")
	expect("a meshlet route was deleted")
	rep, err := ns.host.Apply(ctx, spec)
	if err != nil || len(rep.Routes.Replaced) != 1 {
		t.Fatalf("re-apply after deletion: %+v, %v", rep.Routes, err)
	}

	ns.ip(t, "link", "set", "kilo0", "down")
	expect("kilo0 went down")
	if rep, err = ns.host.Apply(ctx, spec); err != nil || !rep.Link.StateChanged {
		t.Fatalf("re-apply after link down: %+v, %v", rep, err)
	}
	ns.ip(t, "addr", "del", "10.4.0.1/16", "dev", "kilo0")
	expect("kilo0 lost its address")
	if rep, err = ns.host.Apply(ctx, spec); err != nil || len(rep.Link.AddedAddrs) != 1 {
		t.Fatalf("re-apply after address removal: %+v, %v", rep, err)
	}
	cancel()
	for range ch { // closed when ctx ends
	}
}

// BenchmarkReconcileRoutes: 5000 meshlet routes in a namespace, one of them
// changes per iteration.
func BenchmarkReconcileRoutes(b *testing.B) {
	requireRoot(b)
	ns := newTestNS(b)
	ctx := context.Background()
	if _, err := ns.host.EnsureLink(ctx, LinkSpec{Name: "kilo0", Up: true, MTU: 1420, Addresses: pfx("10.4.0.1/16")}); err != nil {
		b.Fatal(err)
	}
	const n = 5000
	routes := make([]Route, n)
	for i := range routes {
		routes[i] = Route{Dst: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 100 + byte(i>>8), byte(i), 0}), 24), Dev: "kilo0"}
	}
	if rep, err := ns.host.ReconcileRoutes(ctx, routes, ""); err != nil || len(rep.Replaced) != n {
		b.Fatalf("initial: %d replaced, %v", len(rep.Replaced), err)
	}
	b.Run("routes=5000/one-changed", func(b *testing.B) {
		i, changed := 0, 0
		for b.Loop() {
			if i%2 == 0 {
				routes[0].Src = netip.MustParseAddr("10.4.0.1")
			} else {
				routes[0].Src = netip.Addr{}
			}
			i++
			rep, err := ns.host.ReconcileRoutes(ctx, routes, "")
			if err != nil {
				b.Fatal(err)
			}
			changed = len(rep.Replaced) + len(rep.Deleted)
			if changed != 1 {
				b.Fatalf("%d routes changed, want 1", changed)
			}
		}
		b.ReportMetric(float64(changed), "routes-changed/op")
	})
	// Comparison: writing every route on every pass, as an agent without a
	// diff would.
	b.Run("routes=5000/replace-all", func(b *testing.B) {
		links := map[string]int{}
		specs := make([]kernelRoute, len(routes))
		for i, r := range routes {
			s, err := ns.host.routeSpec(r, links)
			if err != nil {
				b.Fatal(err)
			}
			specs[i] = s
		}
		for b.Loop() {
			for _, s := range specs {
				if err := ns.host.nl.RouteReplace(toNetlinkRoute(s)); err != nil {
					b.Fatal(err)
				}
			}
		}
		b.ReportMetric(float64(len(specs)), "routes-changed/op")
	})
}

// TestDrift: after an apply the host has no drift; each change made behind
// meshlet's back shows as one line, and Drift itself changes nothing.
func TestDrift(t *testing.T) {
	requireRoot(t)
	ns := newTestNS(t)
	ctx := context.Background()
	if _, err := ns.host.Apply(ctx, leaderSpec()); err != nil {
		t.Fatal(err)
	}
	if d, err := ns.host.Drift(ctx, leaderSpec()); err != nil || d.Changed() {
		t.Fatalf("drift right after apply: %v (err %v)", d.Lines(), err)
	}
	ns.ip(t, "route", "del", "10.2.0.0/24", "dev", "kilo0")
	ns.ip(t, "route", "add", "10.9.0.0/24", "dev", "kilo0", "proto", "109")
	ns.ip(t, "rule", "del", "iif", "kilo0", "table", "1107")
	ns.ip(t, "link", "set", "kilo0", "mtu", "1400")
	ns.ip(t, "addr", "add", "10.4.0.9/16", "dev", "kilo0")
	before := ns.ip(t, "route", "show", "table", "all", "proto", "109") + ns.ip(t, "rule", "show")

	d, err := ns.host.Drift(ctx, leaderSpec())
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(d.Lines(), "\n")
	for _, want := range []string{
		"link kilo0 MTU 1400, plan 1370",
		"link kilo0 has address 10.4.0.9/16 not in the plan",
		"route missing or different: 10.2.0.0/24 via 10.4.0.2",
		"route not in the plan: 10.9.0.0/24",
		"rule missing: ",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("drift lacks %q:\n%s", want, got)
		}
	}
	if n := len(d.Lines()); n != 5 {
		t.Errorf("drift has %d lines, want 5:\n%s", n, got)
	}
	if after := ns.ip(t, "route", "show", "table", "all", "proto", "109") + ns.ip(t, "rule", "show"); after != before {
		t.Errorf("Drift changed the host:\nbefore\n%s\nafter\n%s", before, after)
	}
	ns.ip(t, "link", "del", "kilo0")
	if d, err := ns.host.Drift(ctx, leaderSpec()); err != nil || !strings.Contains(strings.Join(d.Lines(), "\n"), "link kilo0 missing") {
		t.Errorf("deleted link: %v (err %v)", d.Lines(), err)
	}
}

// TestApplyKeepsWhatItVerified: while Watch runs, applying the spec the
// last Apply made true reads nothing — a rule removed behind meshlet's back
// with no netlink event (iptables) stays missing — until Options.Recheck
// has passed, when it is restored; a netlink event (a meshlet route
// deleted) makes the next Apply read and repair at once.
func TestApplyKeepsWhatItVerified(t *testing.T) {
	requireRoot(t)
	ns := newTestNS(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	clk := clocktesting.NewFakeClock(time.Now())
	h, err := New(Options{NetNSPath: "/run/netns/" + ns.name, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	ch, err := h.Watch(ctx, "kilo0")
	if err != nil {
		t.Fatal(err)
	}
	spec := leaderSpec()
	if rep, err := h.Apply(ctx, spec); err != nil || !rep.Changed() {
		t.Fatalf("first apply: %+v, %v", rep, err)
	}
	// Our own changes raised netlink events: the next Apply reads once
	// more and finds nothing to do; after that the host is as verified.
	if rep, err := h.Apply(ctx, spec); err != nil || rep.Changed() {
		t.Fatalf("second apply: %+v, %v", rep, err)
	}
	drain := func() {
		for {
			select {
			case <-ch:
			default:
				return
			}
		}
	}
	drain()
	ns.exec(t, "iptables", "-t", "nat", "-D", ChainNAT, "-j", "MASQUERADE")
	if rep, err := h.Apply(ctx, spec); err != nil || rep.Changed() {
		t.Fatalf("apply within Recheck: %+v, %v", rep, err)
	}
	if nat := ns.exec(t, "iptables", "-t", "nat", "-S", ChainNAT); strings.Contains(nat, "MASQUERADE") {
		t.Fatalf("within Recheck the apply read iptables and restored the rule:\n%s", nat)
	}
	clk.SetTime(clk.Now().Add(DefaultRecheck))
	rep, err := h.Apply(ctx, spec)
	if err != nil || len(rep.Firewall.Changes) != 1 {
		t.Fatalf("apply after Recheck: %+v, %v", rep.Firewall, err)
	}
	if nat := ns.exec(t, "iptables", "-t", "nat", "-S", ChainNAT); !strings.Contains(nat, "-A "+ChainNAT+" -j MASQUERADE") {
		t.Fatalf("rule not restored after Recheck:\n%s", nat)
	}
	// A deleted route is a netlink event: repaired without waiting.
	if rep, err := h.Apply(ctx, spec); err != nil || rep.Changed() {
		t.Fatalf("apply after the repair: %+v, %v", rep, err)
	}
	drain()
	ns.ip(t, "route", "del", "10.2.0.0/24", "dev", "kilo0")
	select {
	case <-ch:
	case <-ctx.Done():
	}
	if rep, err := h.Apply(ctx, spec); err != nil || len(rep.Routes.Replaced) != 1 {
		t.Fatalf("apply after a route was deleted: %+v, %v", rep.Routes, err)
	}
	// A changed spec is applied whatever the memo says.
	spec.Routes[0].Gw = netip.MustParseAddr("10.4.0.3")
	if rep, err := h.Apply(ctx, spec); err != nil || len(rep.Routes.Replaced) != 1 {
		t.Fatalf("apply of a changed spec: %+v, %v", rep.Routes, err)
	}
}
