package e2e

import (
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"sort"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/meshlet/meshlet/agent/core/sessions"
	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/e2e/harness"
)

// The images of Kilo's DaemonSet before and after the switch (only their
// repositories matter: docs/dropin.md#the-way-back).
const (
	kgImage      = "docker.io/squat/kilo:0.7.0"
	meshletImage = "ghcr.io/meshlet/meshlet:v0.1.0"
)

// Scenario (issue 23): the rolling switch, both ways, under traffic.
// Location s (a-s1 leads by Kilo's rule, a-s2, a-s3) starts on kg
// (harness.Kg: Kilo's rules, the whole device rewritten whenever kg's own
// comparison finds a difference, at every change and every 5 s resync) in
// a cluster whose locations x (a-x1, a-x2) and y (a-y1) run meshlet. A
// roaming laptop (a Peer without endpoint that pings a-s1's pod) makes a
// kg leader rewrite its device at a resync whenever its device has learned
// the laptop's address; a new Peer is added every 10 s; a 10/s ping runs
// between every pair of locations, leader and non-leader pods, from x and
// y (answered from s).
//
// kg → meshlet, node by node, leader last, as docs/migration.md's lossless
// order does it: the DaemonSet's image set to meshlet's, kg stopped
// without clean-up (SIGKILL), its pod replaced, meshlet started with kg's
// command line and key. meshlet → kg, the way back, without `meshlet
// cleanup`: the image set back to kg's, meshlet stopped with SIGTERM (it
// reads its pod and DaemonSet, sees kg's image and leaves the node:
// routes, rules, chains and annotations go), the pod replaced, kg started
// with its defaults.
//
// Asserted in each direction: no ping gap longer than a repaired session
// takes at worst (maxSwitchGap) on any pair; no leader
// change but those the switch makes (a-s1 leaves and comes back); no
// meshlet annotation on a node that runs kg; after every step, every
// node's kilo0 equals kgctl's view (Kilo's rules on the API's state). The
// loss is reported.
func TestRollingSwitch(t *testing.T) {
	start := time.Now()
	env, ctx := newEnv(t)
	a, err := env.AddCluster(ctx, harness.ClusterSpec{Name: "cluster-a",
		PodNet: netip.MustParsePrefix("10.1.0.0/16"), WGSubnet: netip.MustParsePrefix("100.66.0.0/24")})
	must(t, err)
	must(t, a.GrantLifecycle(ctx))
	laptop, err := env.AddPeerHost(ctx, "laptop", netip.MustParseAddr("10.9.0.1"))
	must(t, err)
	var nodes []*harness.Node
	for _, spec := range []harness.NodeSpec{{Name: "a-s1", Location: "s"}, {Name: "a-s2", Location: "s"}, {Name: "a-s3", Location: "s"},
		{Name: "a-x1", Location: "x"}, {Name: "a-x2", Location: "x"}, {Name: "a-y1", Location: "y"}} {
		n, err := a.AddNode(ctx, spec)
		must(t, err)
		nodes = append(nodes, n)
	}
	s1, s2, s3, x1, x2, y1 := nodes[0], nodes[1], nodes[2], nodes[3], nodes[4], nodes[5]
	switched := []*harness.Node{s1, s2, s3}

	// The roaming Peer, before anything runs.
	_, err = a.ApplyPeer(ctx, "laptop", netip.PrefixFrom(laptop.Addr, 32).String(), laptop.Public)
	must(t, err)
	// Kilo's DaemonSet with kg's image, its pods on location s.
	ds, err := a.CreateDaemonSet(ctx, "kilo", kgImage)
	must(t, err)
	var kgs []*harness.Kg // every kg run, for its rewrites
	runKg := func(n *harness.Node) {
		t.Helper()
		must(t, ds.RollPod(ctx, n.Name))
		k, err := n.RunKg(ctx, harness.KgOptions{})
		must(t, err)
		kgs = append(kgs, k)
	}
	// meshlet's locations first, then kg's, so that a-s1's first
	// configuration has x and y complete: kg 0.7 misses changes to the
	// peers sorted after one without an endpoint on both sides (its
	// Conf.Equal, docs/kilo-compatibility.md#mixed) — the laptop's, until
	// a-s1 has learned where the laptop is.
	must(t, harness.StartAll(ctx, x1, x2, y1))
	for _, n := range switched {
		runKg(n)
	}
	// The laptop talks to a-s1, which learns its address (the roaming).
	must(t, laptop.SetPeer(ctx, s1.KgRunning().Key(), netip.AddrPortFrom(s1.IP.Addr(), 51820).String(), []netip.Prefix{a.PodNet}))
	lping := exec.CommandContext(ctx, "ip", "netns", "exec", laptop.NS, "ping", "-q", "-i", "0.2", "-I", laptop.Addr.String(), s1.PodIP.String())
	must(t, lping.Start())
	t.Cleanup(func() { _ = lping.Process.Kill(); _ = lping.Wait() })

	// settle waits until every node's kilo0 is what kgctl would show.
	settle := func(what string) time.Duration {
		t.Helper()
		from := time.Now()
		must(t, harness.Poll(ctx, 30*time.Second, 100*time.Millisecond, what+": every kilo0 as kgctl's view", func() (bool, error) {
			for _, n := range switched {
				if k := n.KgRunning(); k != nil && k.Err() != nil {
					return false, k.Err()
				}
			}
			view, err := a.KgctlView(ctx, nodes...)
			if err != nil {
				return false, err
			}
			var errs []error
			for _, n := range nodes {
				errs = append(errs, n.MatchesView(ctx, view[n.Name]))
			}
			for n, want := range map[*harness.Node]string{s1: "s", x1: "x", y1: "y"} {
				if pl := view[n.Name]; !pl.Leader {
					errs = append(errs, fmt.Errorf("%s does not lead %s", n.Name, want))
				}
			}
			err = errors.Join(errs...)
			return err == nil, err
		}))
		return time.Since(from)
	}
	// noMeshletMarks checks a node that runs kg carries no annotation of
	// meshlet's (key or value meshlet.io/...).
	noMeshletMarks := func(n *harness.Node) {
		t.Helper()
		ann, err := a.Annotations(ctx, n.Name)
		must(t, err)
		for k, v := range ann {
			if strings.HasPrefix(k, "meshlet.io/") || strings.HasPrefix(v, "meshlet.io/") {
				t.Errorf("%s runs kg but carries meshlet's annotation %s=%q", n.Name, k, v)
			}
		}
	}
	settle("kg on location s")
	for _, n := range switched {
		noMeshletMarks(n)
	}

	type pair struct {
		from, to *harness.Node
		p        *harness.Pinger
	}
	// Every pair of locations, leaders and non-leaders; each ping starts
	// on meshlet's side (x, y) and is answered from s. A flow that a kg
	// node starts heals the session kg forgot on its own (its first packet
	// makes it handshake), which would hide the half-dead sessions this
	// test is about (docs/kilo-compatibility.md#half-dead); the answers
	// take every path from s back.
	pairs := []*pair{{from: x1, to: s1}, {from: x2, to: s3}, {from: y1, to: s1}, {from: y1, to: s2}, {from: x1, to: y1}, {from: x2, to: y1}}
	for _, p := range pairs {
		_, err := p.from.WaitReachable(ctx, p.to.PodIP, 30*time.Second)
		must(t, err)
	}
	for _, p := range pairs {
		p.p = startPinging(t, ctx, p.from, p.to)
	}
	sMon := harness.WatchLeadership(ctx, s1, s2, s3)
	xMon := harness.WatchLeadership(ctx, x1, x2)
	yMon := harness.WatchLeadership(ctx, y1)

	// A new Peer every 10 s, until the end.
	var added atomic.Int32
	adderDone := make(chan struct{})
	stopAdding := make(chan struct{})
	go func() {
		defer close(adderDone)
		tick := time.NewTicker(10 * time.Second)
		defer tick.Stop()
		for i := 1; ; i++ {
			select {
			case <-stopAdding:
				return
			case <-tick.C:
			}
			_, pub := harness.NewKeyPair()
			err := a.Apply(ctx, fmt.Sprintf(`{"apiVersion":"kilo.squat.ai/v1alpha1","kind":"Peer","metadata":{"name":"peer-%d"},
"spec":{"allowedIPs":["10.9.9.%d/32"],"publicKey":"%s","endpoint":{"dnsOrIP":{"ip":"192.0.2.%d"},"port":51820}}}`, i, i, pub, i))
			if err != nil {
				t.Errorf("adding peer-%d: %v", i, err)
				return
			}
			added.Add(1)
		}
	}()

	// Each step ends once a Peer was added in the state it left and every
	// kilo0 took it in, so every mixed state goes through a change (and a
	// kg resync: 5 s).
	type step struct {
		node          *harness.Node
		dir           string
		from, settled time.Time
		took          time.Duration
	}
	var steps []step
	dwell := func(st *step) {
		t.Helper()
		st.took = settle(st.dir + " " + st.node.Name)
		st.settled = time.Now()
		n := added.Load()
		must(t, harness.Poll(ctx, 15*time.Second, 100*time.Millisecond, "a Peer added", func() (bool, error) {
			return added.Load() > n, nil
		}))
		settle(st.dir + " " + st.node.Name + ", a Peer added")
		steps = append(steps, *st)
	}

	keyOf := map[*harness.Node]string{}
	for _, n := range switched {
		keyOf[n] = n.KgRunning().Key()
	}

	// kg → meshlet, leader last.
	p1 := time.Now()
	must(t, ds.SetImage(ctx, meshletImage))
	for _, n := range []*harness.Node{s3, s2, s1} {
		st := step{node: n, dir: "kg→meshlet", from: time.Now()}
		must(t, n.StopKg(false))
		must(t, ds.RollPod(ctx, n.Name))
		n.DropIn = true
		must(t, n.Start(ctx))
		dwell(&st)
		ann, err := a.Annotations(ctx, n.Name)
		must(t, err)
		if ann[topology.AnnotationVersion] == "" {
			t.Errorf("%s runs meshlet but publishes no %s", n.Name, topology.AnnotationVersion)
		}
		if k := ann[topology.AnnotationKey]; k != keyOf[n] {
			t.Errorf("%s: key %s with meshlet, kg's was %s (kg's key file not used)", n.Name, k, keyOf[n])
		}
	}
	// Every node of s runs meshlet: the Lease governs it, a-s1 keeps it.
	awaitMark(t, ctx, s1, s2, s3)
	p1end := time.Now()

	// meshlet → kg, the way back, leader last.
	must(t, ds.SetImage(ctx, kgImage))
	for _, n := range []*harness.Node{s3, s2, s1} {
		st := step{node: n, dir: "meshlet→kg", from: time.Now()}
		must(t, n.Stop(syscall.SIGTERM))
		must(t, ds.RollPod(ctx, n.Name))
		n.DropIn = false
		k, err := n.RunKg(ctx, harness.KgOptions{})
		must(t, err)
		kgs = append(kgs, k)
		if k.Key() != keyOf[n] {
			t.Errorf("%s: kg came back with key %s, had %s", n.Name, k.Key(), keyOf[n])
		}
		if log := n.LogTail(30); !strings.Contains(log, "the node is left") || !strings.Contains(log, kgImage) {
			t.Errorf("%s: meshlet did not leave the node for kg's image on SIGTERM; log:\n%s", n.Name, log)
		}
		dwell(&st)
		noMeshletMarks(n)
		if rs, err := n.Routes(ctx); err != nil || len(rs) > 0 {
			t.Errorf("%s runs kg with meshlet's routes left: %v %v", n.Name, rs, err)
		}
		if out, err := n.Exec(ctx, "iptables-save"); err != nil || strings.Contains(out, "MESHLET-") {
			t.Errorf("%s runs kg with meshlet's chains left (%v):\n%s", n.Name, err, out)
		}
		// (iproute2 6.1 ignores `ip rule show proto`: read them all.)
		if out, err := n.Exec(ctx, "ip", "rule", "show"); err != nil || strings.Contains(out, "proto "+harness.RouteProtocol) {
			t.Errorf("%s runs kg with meshlet's rules left (%v): %s", n.Name, err, out)
		}
	}
	p2end := time.Now()
	close(stopAdding)
	<-adderDone
	sMon.Stop()
	xMon.Stop()
	yMon.Stop()
	var tls []harness.PingTimeline
	for _, p := range pairs {
		tls = append(tls, p.p.Stop())
	}
	for _, n := range switched {
		noMeshletMarks(n)
	}

	// Leaders: x and y never change; s is a-s1's throughout. (a-s1's own
	// way back is tolerated: the departing agent keeps Kilo's annotations
	// for kg, so Kilo's rule keeps a-s1 — the count is reported; before,
	// it handed s to a-s2 for ~0.3 s and back.)
	var back step
	for _, st := range steps {
		if st.node == s1 && st.dir == "meshlet→kg" {
			back = st
		}
	}
	changes := 0
	var seen []string
	prev := "a-s1"
	for _, smp := range sMon.Samples() {
		got := strings.Join(smp.Leaders, "+")
		if got == "" {
			got = "none"
		}
		in := !smp.At.Before(back.from) && !smp.At.After(back.settled)
		if !in && got != "a-s1" {
			t.Errorf("location s led by %s at %s, outside a-s1's own switch: a leader change the switch did not make", got, smp.At.Format("15:04:05.000"))
		}
		if got != prev {
			changes++
			seen = append(seen, smp.At.Format("15:04:05.000")+" "+got)
			prev = got
		}
	}
	for loc, m := range map[string]*harness.LeadershipMonitor{"x": xMon, "y": yMon} {
		want := map[string]string{"x": "a-x1", "y": "a-y1"}[loc]
		for _, smp := range m.Samples() {
			if got := strings.Join(smp.Leaders, "+"); got != want {
				t.Errorf("location %s led by %q at %s, want %s throughout", loc, got, smp.At.Format("15:04:05.000"), want)
				break
			}
		}
		if r := m.Result(); r.Check() != nil {
			t.Error(r.Check())
		}
	}

	// Traffic, by direction.
	type figures struct {
		sent, lost int
		gap        time.Duration
		worst      string
	}
	phases := []struct {
		name     string
		from, to time.Time
	}{{"kg→meshlet", p1, p1end}, {"meshlet→kg", p1end, p2end}}
	var fig [2]figures
	// during names the step a time falls in.
	during := func(at time.Time) string {
		what := "between steps"
		for _, st := range steps {
			if !at.Before(st.from) {
				what = st.dir + " " + st.node.Name
				if at.After(st.settled) {
					what += ", after it settled"
				}
			}
		}
		return what
	}
	for i, ph := range phases {
		for j, p := range pairs {
			w := tls[j].Window(ph.from, ph.to)
			fig[i].sent += w.Sent
			fig[i].lost += w.Lost
			name := p.from.Name + "→" + p.to.Name
			if w.Gap > fig[i].gap {
				fig[i].gap, fig[i].worst = w.Gap, name
			}
			t.Logf("%s %s: %d/%d lost, longest gap %v after the reply at %s (%s)", ph.name, name, w.Lost, w.Sent,
				w.Gap.Round(time.Millisecond), w.GapFrom.Format("15:04:05.000"), during(w.GapFrom))
			if w.Gap > maxSwitchGap {
				t.Errorf("%s: %s went %v without a reply (> %v)", ph.name, name, w.Gap.Round(time.Millisecond), maxSwitchGap)
			}
		}
	}
	rewrites, reasons := 0, map[string]int{}
	for _, k := range kgs {
		var h []string
		for _, r := range k.History() {
			h = append(h, r.At.Format("15:04:05.000")+" "+r.Why+" ("+during(r.At)+")")
		}
		if len(h) > 0 {
			t.Logf("kg on %s rewrote kilo0: %s", k.Node(), strings.Join(h, "; "))
		}
		rewrites += k.Rewrites()
		for r, c := range k.RewriteReasons() {
			reasons[r] += c
		}
	}
	var rs []string
	for r, c := range reasons {
		rs = append(rs, fmt.Sprintf("%s %d", r, c))
	}
	sort.Strings(rs)
	var repairs float64
	for _, n := range nodes {
		if m, err := n.Metrics(ctx); err == nil {
			v, _ := m.Value("meshlet_session_repairs_total")
			repairs += v
		}
	}
	// Each step from its start until it settled: what the switch of one
	// node costs, and how many of kg's rewrites (which cost what they cost
	// in any mixed cluster) fell in that time.
	var took []string
	for _, st := range steps {
		var gap time.Duration
		lost := 0
		for j := range pairs {
			w := tls[j].Window(st.from, st.settled)
			gap, lost = max(gap, w.Gap), lost+w.Lost
		}
		rw := 0
		for _, k := range kgs {
			for _, r := range k.History() {
				if !r.At.Before(st.from) && !r.At.After(st.settled) {
					rw++
				}
			}
		}
		took = append(took, fmt.Sprintf("%s %s settled in %v, %d pings lost, longest gap %v, %d kg rewrites meanwhile", st.dir, st.node.Name,
			st.took.Round(10*time.Millisecond), lost, gap.Round(time.Millisecond), rw))
	}
	t.Logf("steps (settled: every kilo0 as kgctl's view): %s", strings.Join(took, "; "))
	t.Logf("location s leadership (kilo0 samples), changes: %s", strings.Join(seen, ", "))
	report(t, "rolling switch of location s (3 nodes) under %d pings/s on %d pairs, a Peer added every 10 s (%d), a roaming Peer: kg→meshlet %d/%d pings lost (%.2f%%), longest gap %v (%s); meshlet→kg %d/%d lost (%.2f%%), longest gap %v (%s); leader changes in s: %d, none outside a-s1's own way back; %d kg rewrites (%s), %v session repairs by meshlet nodes still running; test wall time %v",
		10*len(pairs), len(pairs), added.Load(), fig[0].lost, fig[0].sent, pct(fig[0].lost, fig[0].sent), fig[0].gap.Round(time.Millisecond), fig[0].worst,
		fig[1].lost, fig[1].sent, pct(fig[1].lost, fig[1].sent), fig[1].gap.Round(time.Millisecond), fig[1].worst,
		changes, rewrites, strings.Join(rs, ", "), repairs, time.Since(start).Round(time.Second))
}

// maxSwitchGap bounds a pair's longest ping gap during the switch. Each
// kg rewrite forgets the sessions of kg's device; meshlet's side repairs its
// half (docs/kilo-compatibility.md#half-dead) after SuspectAfter and
// ProbeTimeout, and when kg's next rewrite eats the fresh handshake too it
// re-creates the peer once more RetryAfter after the repair. Add 0.5 s for
// the counters' sampling, the ping interval and the handshake: a gap longer
// than that is a session left to WireGuard's own timers (5 s
// REKEY_TIMEOUT, or 15 s), which is what this test is there to catch. (It
// was 1 s, the single repair's figure, 0.6–0.7 s, which a retry exceeds by
// design.)
var maxSwitchGap = sessions.DefaultPolicy.SuspectAfter + sessions.DefaultPolicy.ProbeTimeout +
	sessions.DefaultPolicy.RetryAfter + 500*time.Millisecond

func pct(a, b int) float64 {
	if b == 0 {
		return 0
	}
	return 100 * float64(a) / float64(b)
}
