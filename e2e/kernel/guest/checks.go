package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/wg"
)

// planSteps are plan mode's checks in the order run prints them; run.sh
// requires a PASS line for every one.
var planSteps = []string{
	"fixture",
	"plan",
	"apply-leader",
	"apply-worker",
	"apply-remote",
	"kernel-wireguard-leader",
	"kernel-wireguard-remote",
	"worker-kilo0-down-no-peers",
	"worker-route-via-cilium_tunl",
	"pod-ping-worker-to-remote",
	"pod-ping6-worker-to-remote",
	"pod-ping6-remote-to-worker",
	"traffic-via-leader",
	"remote-handshake-with-leader",
	"leader-return-rule-table-1107",
	"private-ip-ping-returns-via-tunnel",
	"reapply-no-change",
	"session-kept",
	"return-rule-needed",
	"return-rule-restored",
}

// scenarioTimeout bounds the whole scenario inside the guest (run.sh has
// its own, larger, timeout around QEMU).
const scenarioTimeout = 4 * time.Minute

// pollTimeout bounds every wait for a condition (first ping, handshake).
const pollTimeout = 30 * time.Second

type reporter struct {
	steps  []string
	next   int // index in steps of the next expected step
	failed int
}

// step runs one check and prints its result line.
func (r *reporter) step(name string, fn func() error) bool {
	if r.next >= len(r.steps) || r.steps[r.next] != name {
		panic("check " + name + " is out of order with steps")
	}
	r.next++
	start := time.Now()
	err := fn()
	if err != nil {
		r.failed++
		fmt.Printf("FAIL %s: %s\n", name, oneLine(err.Error()))
		return false
	}
	fmt.Printf("PASS %s (%.1fs)\n", name, time.Since(start).Seconds())
	return true
}

// skipRest fails every step not run yet.
func (r *reporter) skipRest(why string) {
	for ; r.next < len(r.steps); r.next++ {
		r.failed++
		fmt.Printf("FAIL %s: skipped: %s\n", r.steps[r.next], why)
	}
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

func info(format string, args ...any) { fmt.Printf("INFO "+format+"\n", args...) }

// runPlanMode is `guest run` in plan mode.
// datapathSteps are the kernel datapath checks both modes share, in order.
// converge wraps the checks of state that an agent builds up as the others
// publish their annotations (agent mode polls them; plan mode applied
// everything already). It reports whether the device and route checks held.
func datapathSteps(ctx context.Context, r *reporter, ks keys, ps map[string]topology.Plan, converge func(func() error) func() error) bool {
	ok := r.step("kernel-wireguard-leader", converge(func() error { return checkKernelDevice(ctx, leaderNode, ps[leaderNode.Name]) }))
	ok = r.step("kernel-wireguard-remote", converge(func() error { return checkKernelDevice(ctx, remoteNode, ps[remoteNode.Name]) })) && ok
	ok = r.step("worker-kilo0-down-no-peers", converge(func() error { return checkIdle(ctx, workerNode) })) && ok
	ok = r.step("worker-route-via-cilium_tunl", converge(func() error { return checkWorkerRoute(ctx) })) && ok

	remotePod := remoteNode.Pod.String()
	if !r.step("pod-ping-worker-to-remote", func() error {
		err := pingUntil(ctx, podNS(workerNode), remotePod)
		if err != nil {
			err = fmt.Errorf("%w%s", err, leaderDropCause(ctx))
		}
		return err
	}) {
		diagnose(ctx)
	}
	r.step("pod-ping6-worker-to-remote", func() error { return pingUntil(ctx, podNS(workerNode), remoteNode.Pod6.String()) })
	r.step("pod-ping6-remote-to-worker", func() error { return pingUntil(ctx, podNS(remoteNode), workerNode.Pod6.String()) })
	r.step("traffic-via-leader", func() error { return checkTrafficViaLeader(ctx, remotePod) })
	r.step("remote-handshake-with-leader", func() error {
		_, err := handshakes(ctx, ks, true)
		return err
	})
	r.step("leader-return-rule-table-1107", converge(func() error { return checkReturnPath(ctx) }))
	r.step("private-ip-ping-returns-via-tunnel", func() error { return checkPrivateIPPing(ctx, remotePod) })
	return ok
}

func runPlanMode() int {
	ctx, cancel := context.WithTimeout(context.Background(), scenarioTimeout)
	defer cancel()
	r := &reporter{steps: planSteps}
	if !r.step("fixture", func() error { return setupFixture(ctx) }) {
		r.skipRest("no fixture")
		return 1
	}

	ks, err := generateKeys()
	if err != nil {
		fmt.Println("FAIL keys:", err)
		return 1
	}
	ps := plans(ks, time.Now())
	for _, n := range scenarioNodes {
		describePlan(ps[n.Name])
	}
	r.step("plan", func() error { return checkPlans(ps, ks) })

	var d driver
	if d, err = newPlanDriver("/run/meshlet", ks, ps); err != nil {
		r.skipRest(err.Error())
		return 1
	}
	// Every node is applied before any traffic flows, so whichever side
	// sends first finds its peer configured (no 5 s handshake retry).
	applied := true
	for _, n := range scenarioNodes {
		ok := r.step("apply-"+n.Name, func() error {
			res, err := d.apply(ctx, n)
			if err != nil {
				return err
			}
			if res.DeviceKind != wg.KindKernel {
				return fmt.Errorf("device kind %q, want %q", res.DeviceKind, wg.KindKernel)
			}
			info("%s applied: wg +%d peers, host routes %d, rules %d, tunnel %q, mtu %d", n.Name,
				len(res.WG.Added), len(res.Host.Routes.Replaced), len(res.Host.Rules.Added), res.Host.Tunnel, res.Host.Link.MTU)
			return nil
		})
		applied = applied && ok
	}
	if !applied {
		r.skipRest("apply failed")
		return 1
	}

	// Applied once, the state is there: no need to wait for convergence.
	datapathSteps(ctx, r, ks, ps, func(fn func() error) func() error { return fn })
	remotePod := remoteNode.Pod.String()

	var hs1 [2]time.Time
	r.step("reapply-no-change", func() error {
		if hs1, err = handshakes(ctx, ks, false); err != nil {
			return err
		}
		var errs []error
		for _, n := range scenarioNodes {
			res, err := d.apply(ctx, n)
			switch {
			case err != nil:
				errs = append(errs, err)
			case res.WGChanged || res.HostChanged:
				errs = append(errs, fmt.Errorf("%s: second apply changed something: wg %+v host %+v", n.Name, res.WG, res.Host))
			}
		}
		return errors.Join(errs...)
	})
	r.step("session-kept", func() error {
		hs2, err := handshakes(ctx, ks, false)
		if err != nil {
			return err
		}
		if hs1 != hs2 {
			return fmt.Errorf("handshake times moved: %v -> %v", hs1, hs2)
		}
		info("handshake times unchanged after re-apply: leader %s, remote %s", hs1[0].Format(time.RFC3339Nano), hs1[1].Format(time.RFC3339Nano))
		return nil
	})

	returnRule := []string{"iif", "kilo0", "to", workerNode.Private.Addr().String() + "/32", "lookup", strconv.Itoa(topology.KiloTable)}
	r.step("return-rule-needed", func() error {
		if _, err := ip(ctx, append([]string{"-n", leaderNode.Name, "rule", "del"}, returnRule...)...); err != nil {
			return err
		}
		return checkReturnRuleNeeded(ctx, remotePod)
	})
	r.step("return-rule-restored", func() error {
		res, err := d.apply(ctx, leaderNode)
		if err != nil {
			return err
		}
		if len(res.Host.Rules.Added) != 1 || res.WGChanged {
			return fmt.Errorf("re-apply on the leader: rules added %v, wg changed %v; want exactly the return rule", res.Host.Rules.Added, res.WGChanged)
		}
		info("leader re-apply restored %v", res.Host.Rules.Added)
		if err := checkReturnPath(ctx); err != nil {
			return err
		}
		return pingAll(ctx, workerNode.Name, remotePod, 2)
	})

	fmt.Printf("SUMMARY %d passed, %d failed\n", len(planSteps)-r.failed, r.failed)
	if r.failed > 0 {
		return 1
	}
	return 0
}

func describePlan(p topology.Plan) {
	info("plan %s: leader=%v segment=%s wg up=%v addrs=%v peers=%d tunnel=%q rejections=%d",
		p.Node, p.Leader, p.Segment, p.WireGuard.Up, p.WireGuard.Addresses, len(p.WireGuard.Peers), p.Tunnel.Name, len(p.Rejections))
	for _, rt := range p.Routes {
		info("plan %s route %s gw=%s dev=%s src=%s table=%d onlink=%v", p.Node, rt.Dst, rt.Gw, rt.Dev, rt.Src, rt.Table, rt.OnLink)
	}
	for _, ru := range p.Rules {
		info("plan %s rule iif=%s src=%s dst=%s table=%d", p.Node, ru.Iif, ru.Src, ru.Dst, ru.Table)
	}
}

// checkPlans verifies the planner's output is what the datapath checks
// assume, so a planner change fails here, by name, rather than as a lost
// ping.
func checkPlans(ps map[string]topology.Plan, ks keys) error {
	var errs []error
	fail := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	for name, p := range ps {
		if len(p.Rejections) > 0 {
			fail("%s: rejections %+v", name, p.Rejections)
		}
	}
	l, w, rm := ps[leaderNode.Name], ps[workerNode.Name], ps[remoteNode.Name]
	if !l.Leader || !l.WireGuard.Up || !rm.Leader || !rm.WireGuard.Up {
		fail("leader and remote must lead their segments with kilo0 up")
	}
	if w.Leader || w.WireGuard.Up || len(w.WireGuard.Peers) > 0 {
		fail("worker must be a non-leader with kilo0 down and no peers")
	}
	if keysOf(l.WireGuard.Peers) != ks.public(remoteNode.Name).String() {
		fail("leader peers %s, want only remote", keysOf(l.WireGuard.Peers))
	}
	if keysOf(rm.WireGuard.Peers) != ks.public(leaderNode.Name).String() {
		fail("remote peers %s, want only leader", keysOf(rm.WireGuard.Peers))
	}
	wantWorker := topology.Route{Dst: remoteNode.PodCIDR, Gw: leaderNode.CiliumHost.Addr(), Dev: tunnelDev,
		Src: workerNode.Private.Addr(), OnLink: true}
	if !slices.Contains(w.Routes, wantWorker) {
		fail("worker has no route %+v", wantWorker)
	}
	wantReturn := topology.Route{Dst: netip.PrefixFrom(workerNode.Private.Addr(), 32), Gw: workerNode.CiliumHost.Addr(),
		Dev: tunnelDev, OnLink: true, Table: topology.KiloTable}
	if !slices.Contains(l.Routes, wantReturn) {
		fail("leader has no route %+v", wantReturn)
	}
	wantRule := topology.Rule{Iif: "kilo0", Dst: netip.PrefixFrom(workerNode.Private.Addr(), 32), Table: topology.KiloTable}
	if !slices.Contains(l.Rules, wantRule) {
		fail("leader has no rule %+v", wantRule)
	}
	return errors.Join(errs...)
}

func keysOf(ps []topology.WireGuardPeer) string {
	var ks []string
	for _, p := range ps {
		ks = append(ks, p.PublicKey.String())
	}
	return strings.Join(ks, ",")
}

type ipLink struct {
	Flags     []string `json:"flags"`
	Operstate string   `json:"operstate"`
	Linkinfo  struct {
		InfoKind string `json:"info_kind"`
	} `json:"linkinfo"`
	Stats64 struct {
		Rx struct {
			Packets uint64 `json:"packets"`
		} `json:"rx"`
		Tx struct {
			Packets uint64 `json:"packets"`
		} `json:"tx"`
	} `json:"stats64"`
}

func showLink(ctx context.Context, ns, dev string, extra ...string) (ipLink, error) {
	var ls []ipLink
	args := append(append([]string{"-n", ns}, extra...), "link", "show", "dev", dev)
	if err := ipJSON(ctx, &ls, args...); err != nil {
		return ipLink{}, err
	}
	if len(ls) != 1 {
		return ipLink{}, fmt.Errorf("%s: %d links named %s", ns, len(ls), dev)
	}
	return ls[0], nil
}

// checkKernelDevice: kilo0 is a kernel WireGuard link, wgctrl reads it as
// the Linux kernel implementation, and its peers are the planned ones.
func checkKernelDevice(ctx context.Context, n nodeDef, p topology.Plan) error {
	l, err := showLink(ctx, n.Name, "kilo0", "-d")
	if err != nil {
		return err
	}
	if l.Linkinfo.InfoKind != "wireguard" {
		return fmt.Errorf("kilo0 link type %q, want wireguard", l.Linkinfo.InfoKind)
	}
	if !slices.Contains(l.Flags, "UP") {
		return fmt.Errorf("kilo0 is not up: %v", l.Flags)
	}
	st, err := wgShow(ctx, n)
	if err != nil {
		return err
	}
	if st.Type != "Linux kernel" {
		return fmt.Errorf("wgctrl device type %q, want Linux kernel", st.Type)
	}
	if st.ListenPort != wgPort {
		return fmt.Errorf("listen port %d, want %d", st.ListenPort, wgPort)
	}
	if len(st.Peers) != len(p.WireGuard.Peers) {
		return fmt.Errorf("%d peers on the device, %d planned", len(st.Peers), len(p.WireGuard.Peers))
	}
	for _, want := range p.WireGuard.Peers {
		i := slices.IndexFunc(st.Peers, func(ps wg.PeerStats) bool { return topology.Key(ps.PublicKey) == want.PublicKey })
		if i < 0 {
			return fmt.Errorf("planned peer %s (%s) is not on the device", want.Name, want.PublicKey)
		}
		got := prefixStrings(st.Peers[i].AllowedIPs)
		if w := prefixStrings(want.AllowedIPs); got != w {
			return fmt.Errorf("peer %s allowed IPs %s, planned %s", want.Name, got, w)
		}
		if st.Peers[i].Endpoint.String() != want.Endpoint {
			return fmt.Errorf("peer %s endpoint %s, planned %s", want.Name, st.Peers[i].Endpoint, want.Endpoint)
		}
	}
	return nil
}

func prefixStrings(ps []netip.Prefix) string {
	var s []string
	for _, p := range ps {
		s = append(s, p.Masked().String())
	}
	slices.Sort(s)
	return strings.Join(s, ",")
}

// checkIdle: a non-leader's kilo0 exists (kernel) but is down and has no
// peers.
func checkIdle(ctx context.Context, n nodeDef) error {
	l, err := showLink(ctx, n.Name, "kilo0", "-d")
	if err != nil {
		return err
	}
	if l.Linkinfo.InfoKind != "wireguard" {
		return fmt.Errorf("%s kilo0 link type %q, want wireguard", n.Name, l.Linkinfo.InfoKind)
	}
	if slices.Contains(l.Flags, "UP") {
		return fmt.Errorf("%s kilo0 is up: %v", n.Name, l.Flags)
	}
	st, err := wgShow(ctx, n)
	if err != nil {
		return err
	}
	if len(st.Peers) != 0 {
		return fmt.Errorf("%s kilo0 has %d peers, want 0", n.Name, len(st.Peers))
	}
	return nil
}

type ipRoute struct {
	Dst      string   `json:"dst"`
	Gateway  string   `json:"gateway"`
	Dev      string   `json:"dev"`
	Prefsrc  string   `json:"prefsrc"`
	Protocol any      `json:"protocol"`
	Flags    []string `json:"flags"`
}

// checkWorkerRoute: the kernel sends the pod's traffic for the remote pod
// out cilium_tunl to the leader's cilium_host IP, by meshlet's route.
func checkWorkerRoute(ctx context.Context) error {
	var rs []ipRoute
	if err := ipJSON(ctx, &rs, "-n", workerNode.Name, "route", "show", remoteNode.PodCIDR.String()); err != nil {
		return err
	}
	gw := leaderNode.CiliumHost.Addr().String()
	if len(rs) != 1 || rs[0].Dev != tunnelDev || rs[0].Gateway != gw || !slices.Contains(rs[0].Flags, "onlink") ||
		fmt.Sprint(rs[0].Protocol) != "109" {
		return fmt.Errorf("worker route to %s: %+v, want via %s dev %s onlink proto 109", remoteNode.PodCIDR, rs, gw, tunnelDev)
	}
	// What the kernel does with a packet the pod sends (input route
	// lookup, as for forwarded traffic).
	var got []ipRoute
	if err := ipJSON(ctx, &got, "-n", workerNode.Name, "route", "get", remoteNode.Pod.String(),
		"from", workerNode.Pod.String(), "iif", "lxc0"); err != nil {
		return err
	}
	if len(got) != 1 || got[0].Dev != tunnelDev || got[0].Gateway != gw {
		return fmt.Errorf("route get %s from the pod: %+v, want via %s dev %s", remoteNode.Pod, got, gw, tunnelDev)
	}
	return nil
}

type ipRule struct {
	Priority int    `json:"priority"`
	Iif      string `json:"iif"`
	Dst      string `json:"dst"`
	Dstlen   int    `json:"dstlen"`
	Table    any    `json:"table"`
}

// checkReturnPath: the leader's rule `iif kilo0 to <worker>/32 lookup 1107`
// and table 1107's route to the worker's private IP via its cilium_host IP
// through cilium_tunl.
func checkReturnPath(ctx context.Context) error {
	worker := workerNode.Private.Addr().String()
	table := strconv.Itoa(topology.KiloTable)
	var rules []ipRule
	if err := ipJSON(ctx, &rules, "-n", leaderNode.Name, "rule", "show"); err != nil {
		return err
	}
	if !slices.ContainsFunc(rules, func(r ipRule) bool {
		dst := r.Dst
		if r.Dstlen != 0 && r.Dstlen != 32 {
			return false
		}
		return r.Iif == "kilo0" && strings.TrimSuffix(dst, "/32") == worker && fmt.Sprint(r.Table) == table
	}) {
		return fmt.Errorf("leader has no rule iif kilo0 to %s lookup %s: %+v", worker, table, rules)
	}
	var rs []ipRoute
	if err := ipJSON(ctx, &rs, "-n", leaderNode.Name, "route", "show", "table", table); err != nil {
		return err
	}
	cgw := workerNode.CiliumHost.Addr().String()
	if !slices.ContainsFunc(rs, func(r ipRoute) bool {
		return r.Dst == worker && r.Gateway == cgw && r.Dev == tunnelDev && slices.Contains(r.Flags, "onlink")
	}) {
		return fmt.Errorf("leader table %s has no %s via %s dev %s onlink: %+v", table, worker, cgw, tunnelDev, rs)
	}
	return nil
}

type linkCounters struct{ rx, tx uint64 }

func linkStats(ctx context.Context, ns, dev string) (linkCounters, error) {
	l, err := showLink(ctx, ns, dev, "-s")
	if err != nil {
		return linkCounters{}, err
	}
	return linkCounters{rx: l.Stats64.Rx.Packets, tx: l.Stats64.Tx.Packets}, nil
}

type pathCounters struct{ leaderTunlRx, leaderWGTx, workerWGTx uint64 }

func (a pathCounters) sub(b pathCounters) pathCounters {
	return pathCounters{a.leaderTunlRx - b.leaderTunlRx, a.leaderWGTx - b.leaderWGTx, a.workerWGTx - b.workerWGTx}
}

func counters(ctx context.Context) (pathCounters, error) {
	lt, err := linkStats(ctx, leaderNode.Name, tunnelDev)
	if err != nil {
		return pathCounters{}, err
	}
	lw, err := linkStats(ctx, leaderNode.Name, "kilo0")
	if err != nil {
		return pathCounters{}, err
	}
	ww, err := linkStats(ctx, workerNode.Name, "kilo0")
	if err != nil {
		return pathCounters{}, err
	}
	return pathCounters{leaderTunlRx: lt.rx, leaderWGTx: lw.tx, workerWGTx: ww.tx}, nil
}

// handshakes returns the last handshake of the leader with the remote and of
// the remote with the leader. With wait it polls until both happened.
func handshakes(ctx context.Context, ks keys, wait bool) ([2]time.Time, error) {
	deadline := time.Now().Add(pollTimeout)
	for {
		var out [2]time.Time
		var missing []string
		for i, pair := range [][2]nodeDef{{leaderNode, remoteNode}, {remoteNode, leaderNode}} {
			st, err := wgShow(ctx, pair[0])
			if err != nil {
				return out, err
			}
			want := ks.public(pair[1].Name)
			j := slices.IndexFunc(st.Peers, func(p wg.PeerStats) bool { return topology.Key(p.PublicKey) == want })
			if j < 0 {
				return out, fmt.Errorf("%s has no peer %s", pair[0].Name, pair[1].Name)
			}
			out[i] = st.Peers[j].LastHandshake
			if out[i].IsZero() {
				missing = append(missing, pair[0].Name+"->"+pair[1].Name)
			}
		}
		if len(missing) == 0 {
			return out, nil
		}
		if !wait || time.Now().After(deadline) {
			return out, fmt.Errorf("no handshake yet: %v", missing)
		}
		select {
		case <-ctx.Done():
			return out, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

var pingStats = regexp.MustCompile(`(\d+) packets transmitted, (\d+) packets received`)

// pingAll sends count pings from namespace ns and requires every reply.
func pingAll(ctx context.Context, ns, dst string, count int) error {
	out, err := inNS(ctx, ns, busybox, "ping", "-c", strconv.Itoa(count), "-W", "2", dst)
	m := pingStats.FindStringSubmatch(out)
	if m == nil {
		return fmt.Errorf("ping %s from %s: %v: %s", dst, ns, err, out)
	}
	if m[2] != strconv.Itoa(count) {
		return fmt.Errorf("ping %s from %s: %s of %s replies", dst, ns, m[2], m[1])
	}
	return nil
}

// pingUntil pings once at a time until a reply comes (the first packet may
// wait for ARP and the WireGuard handshake), within pollTimeout.
func pingUntil(ctx context.Context, ns, dst string) error {
	deadline := time.Now().Add(pollTimeout)
	for tries := 1; ; tries++ {
		err := pingAll(ctx, ns, dst, 1)
		if err == nil {
			info("first reply from %s to %s after %d tries", ns, dst, tries)
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("no reply within %s: %w", pollTimeout, err)
		}
	}
}

// leaderDropCause explains a lost pod packet when the leader's kernel
// refuses to forward what it decapsulated from cilium_tunl.
func leaderDropCause(ctx context.Context) string {
	_, err := ip(ctx, "-n", leaderNode.Name, "route", "get", remoteNode.Pod.String(),
		"from", workerNode.Pod.String(), "iif", tunnelDev)
	if err == nil {
		return ""
	}
	rpf, _ := inNS(ctx, leaderNode.Name, busybox, "cat", "/proc/sys/net/ipv4/conf/"+tunnelDev+"/rp_filter")
	return fmt.Sprintf("; on the leader, `ip route get %s from %s iif %s` fails (%v) with %s rp_filter=%s: "+
		"the reverse-path filter drops decapsulated packets whose source is not routed back through %s, "+
		"and the kernel applies even loose mode (2) that way on a device without an IPv4 address",
		remoteNode.Pod, workerNode.Pod, tunnelDev, oneLine(err.Error()), tunnelDev, strings.TrimSpace(rpf), tunnelDev)
}

// checkTrafficViaLeader: during 3 pings from the worker's pod the leader's
// cilium_tunl received and its kilo0 sent >= 3 packets; the worker's kilo0
// sent none.
func checkTrafficViaLeader(ctx context.Context, remotePod string) error {
	before, err := counters(ctx)
	if err != nil {
		return err
	}
	if err := pingAll(ctx, podNS(workerNode), remotePod, 3); err != nil {
		return err
	}
	after, err := counters(ctx)
	if err != nil {
		return err
	}
	delta := after.sub(before)
	info("counter deltas over 3 pings: leader cilium_tunl rx %d, leader kilo0 tx %d, worker kilo0 tx %d",
		delta.leaderTunlRx, delta.leaderWGTx, delta.workerWGTx)
	if delta.leaderTunlRx < 3 || delta.leaderWGTx < 3 {
		return fmt.Errorf("leader cilium_tunl rx +%d and kilo0 tx +%d packets, want >= 3 each", delta.leaderTunlRx, delta.leaderWGTx)
	}
	if delta.workerWGTx != 0 {
		return fmt.Errorf("worker kilo0 sent %d packets, want 0", delta.workerWGTx)
	}
	return nil
}

// checkPrivateIPPing: pings from the worker's private IP get every reply,
// and the replies came back through the worker's cilium_tunl.
func checkPrivateIPPing(ctx context.Context, remotePod string) error {
	before, err := linkStats(ctx, workerNode.Name, tunnelDev)
	if err != nil {
		return err
	}
	if err := pingAll(ctx, workerNode.Name, remotePod, 3); err != nil {
		return err
	}
	after, err := linkStats(ctx, workerNode.Name, tunnelDev)
	if err != nil {
		return err
	}
	if got := after.rx - before.rx; got < 3 {
		return fmt.Errorf("worker cilium_tunl received %d packets during 3 pings from its private IP, want >= 3", got)
	}
	return nil
}

// checkReturnRuleNeeded (the leader's return rule just deleted): pings from
// the worker's private IP fail although the requests still pass the
// leader's cilium_tunl and kilo0.
func checkReturnRuleNeeded(ctx context.Context, remotePod string) error {
	before, err := counters(ctx)
	if err != nil {
		return err
	}
	if err := pingAll(ctx, workerNode.Name, remotePod, 2); err == nil {
		return errors.New("ping from the worker's private IP succeeded without the leader's table-1107 rule")
	}
	after, err := counters(ctx)
	if err != nil {
		return err
	}
	// The requests must still have reached kilo0 on the leader: it is
	// the replies that got lost.
	if d := after.sub(before); d.leaderTunlRx < 2 || d.leaderWGTx < 2 {
		return fmt.Errorf("the requests did not pass the leader either (cilium_tunl rx +%d, kilo0 tx +%d): "+
			"the failure is not about the return path", d.leaderTunlRx, d.leaderWGTx)
	}
	info("without the rule the requests still went out kilo0 and no reply came back")
	return nil
}

// pingSeq is one reply line of busybox ping.
var pingSeq = regexp.MustCompile(`seq=(\d+) `)

// pingDuring pings dst from namespace ns ten times a second while fn runs
// and returns how many pings were sent and how many of them got no reply.
// The ping still in flight when fn returns (sent within a round trip of
// the interrupt) is not counted as lost: it is the last sequence number,
// and only earlier gaps are.
func pingDuring(ctx context.Context, ns, dst string, fn func() error) (sent, lost int, err error) {
	cmd := exec.CommandContext(ctx, ipBin, "netns", "exec", ns, busybox, "ping", "-i", "0.1", "-W", "1", dst)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return 0, 0, fmt.Errorf("ping %s from %s: %w", dst, ns, err)
	}
	ferr := fn()
	// ip netns exec execs ping: the interrupt reaches it, and it prints
	// its statistics.
	_ = cmd.Process.Signal(os.Interrupt)
	_ = cmd.Wait()
	if ferr != nil {
		return 0, 0, ferr
	}
	m := pingStats.FindStringSubmatch(out.String())
	if m == nil {
		return 0, 0, fmt.Errorf("ping %s from %s: no statistics: %s", dst, ns, out.String())
	}
	sent, _ = strconv.Atoi(m[1])
	answered := map[int]bool{}
	for _, s := range pingSeq.FindAllStringSubmatch(out.String(), -1) {
		n, _ := strconv.Atoi(s[1])
		answered[n] = true
	}
	for seq := 0; seq < sent-1; seq++ {
		if !answered[seq] {
			lost++
		}
	}
	return sent, lost, nil
}
