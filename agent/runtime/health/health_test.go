package health

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/meshlet/meshlet/agent/core/failover"
	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/wg"
)

// fakeDevice counts bytes received per peer and records the probes sent.
type fakeDevice struct {
	mu    sync.Mutex
	rx    map[topology.Key]int64
	sent  []netip.Addr
	reads int
}

func (d *fakeDevice) stats(context.Context) (wg.DeviceStats, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.reads++
	var st wg.DeviceStats
	for k, v := range d.rx {
		st.Peers = append(st.Peers, wg.PeerStats{PublicKey: wgtypes.Key(k), ReceiveBytes: v})
	}
	return st, nil
}

func (d *fakeDevice) echo(_ context.Context, _ netip.Addr, dsts []netip.Addr) error {
	d.mu.Lock()
	d.sent = append(d.sent, dsts...)
	d.mu.Unlock()
	return nil
}

func (d *fakeDevice) receive(k topology.Key) {
	d.mu.Lock()
	d.rx[k] += 100
	d.mu.Unlock()
}

func (d *fakeDevice) probed() []netip.Addr {
	d.mu.Lock()
	defer d.mu.Unlock()
	s := d.sent
	d.sent = nil
	return s
}

// twoTunnels is a prober over a fake device with two peers, a and b, and
// the plan that probes them (probing plans a alone when only is true).
func twoTunnels(only bool) (p *Prober, dev *fakeDevice, clk *testingclock.FakeClock, plan func(both bool), ka, kb topology.Key, a, b netip.Addr) {
	ka, kb = topology.Key{1}, topology.Key{2}
	a, b = netip.MustParseAddr("10.4.0.2"), netip.MustParseAddr("10.4.0.3")
	dev = &fakeDevice{rx: map[topology.Key]int64{ka: 0, kb: 0}}
	clk = testingclock.NewFakeClock(time.Unix(1_800_000_000, 0))
	p = &Prober{Stats: dev.stats, Echo: dev.echo, Clock: clk, Interval: time.Second}
	plan = func(both bool) {
		peers := []topology.ProbeTarget{{Name: "a", PublicKey: ka, Addr: a}}
		if both {
			peers = append(peers, topology.ProbeTarget{Name: "b", PublicKey: kb, Addr: b})
		}
		p.Follow(topology.Plan{Probes: &topology.Probes{Source: netip.MustParseAddr("10.4.0.1"), Peers: peers}})
	}
	plan(!only)
	return p, dev, clk, plan, ka, kb, a, b
}

func TestTunnelProbes(t *testing.T) {
	p, dev, clk, _, ka, kb, a, b := twoTunnels(false)
	ctx := context.Background()
	start := clk.Now()
	states := func() map[topology.Key]string {
		out := map[topology.Key]string{}
		for _, tp := range p.Health().Peers {
			out[tp.PublicKey] = failover.TunnelState(tp, clk.Now())
		}
		return out
	}
	steps := []struct {
		name       string
		answer     []topology.Key // peers whose answers arrive before the round
		wantProbed []netip.Addr
		wantA      string
		wantB      string
	}{
		// The first reading is a baseline: both are probed.
		{"first round", nil, []netip.Addr{a, b}, failover.TunnelNew, failover.TunnelNew},
		// a answers its probe; b does not.
		{"a answers", []topology.Key{ka}, []netip.Addr{b}, failover.TunnelAlive, failover.TunnelNew},
		{"a sends again", []topology.Key{ka}, []netip.Addr{b}, failover.TunnelAlive, failover.TunnelNew},
		// b turns dead: probed once now, then two rounds later.
		{"nothing", nil, []netip.Addr{a, b}, failover.TunnelAlive, failover.TunnelDead},
		{"still nothing", nil, []netip.Addr{a}, failover.TunnelAlive, failover.TunnelDead},
		{"a silent for 3 s", nil, []netip.Addr{a, b}, failover.TunnelDead, failover.TunnelDead},
		// Both dead, neither due: nothing is read, b's traffic waits for
		// the next read (a's turn), which brings it back.
		{"b sends, nothing due", []topology.Key{kb}, nil, failover.TunnelDead, failover.TunnelDead},
		{"a due", nil, []netip.Addr{a}, failover.TunnelDead, failover.TunnelAlive},
		{"b silent a round", nil, []netip.Addr{b}, failover.TunnelDead, failover.TunnelAlive},
	}
	for i, s := range steps {
		for _, k := range s.answer {
			dev.receive(k)
		}
		p.round(ctx)
		got := dev.probed()
		if len(got) != len(s.wantProbed) {
			t.Errorf("%s: probed %v, want %v", s.name, got, s.wantProbed)
		} else {
			for _, w := range s.wantProbed {
				found := false
				for _, g := range got {
					found = found || g == w
				}
				if !found {
					t.Errorf("%s: probed %v, want %v", s.name, got, s.wantProbed)
				}
			}
		}
		st := states()
		if st[ka] != s.wantA || st[kb] != s.wantB {
			t.Errorf("%s (t+%v): a %s b %s, want %s %s", s.name, clk.Now().Sub(start), st[ka], st[kb], s.wantA, s.wantB)
		}
		if i < len(steps)-1 {
			clk.Step(time.Second)
		}
	}
	// A peer that leaves the plan leaves the probes; no plan, no health.
	p.Follow(topology.Plan{})
	if h := p.Health(); h != nil {
		t.Errorf("health without probes: %+v", h)
	}
}

// TestDeadTunnelBacksOff: a dead tunnel is probed at gaps doubling from two
// rounds to DeadProbeMax, and a round with nothing due reads nothing; its
// traffic, seen in a read another tunnel makes, brings it back at once and
// to probes every round.
func TestDeadTunnelBacksOff(t *testing.T) {
	p, dev, clk, plan, ka, kb, a, b := twoTunnels(true)
	ctx := context.Background()
	start := clk.Now()
	var probedAt []time.Duration
	reads := 0
	for i := 0; i <= 120; i++ {
		p.round(ctx)
		if len(dev.probed()) > 0 {
			probedAt = append(probedAt, clk.Now().Sub(start))
		}
		clk.Step(time.Second)
	}
	reads = dev.reads
	// New for 3 s (probed every round), dead at 3 s: then 5, 9, 17, 33,
	// 63, 93.
	want := []time.Duration{0, time.Second, 2 * time.Second, 3 * time.Second, 5 * time.Second, 9 * time.Second,
		17 * time.Second, 33 * time.Second, 63 * time.Second, 93 * time.Second}
	if fmt.Sprint(probedAt) != fmt.Sprint(want) {
		t.Errorf("dead tunnel probed at %v, want %v", probedAt, want)
	}
	if reads != len(want) {
		t.Errorf("%d device reads in 121 rounds, want one per probing round (%d)", reads, len(want))
	}
	// Another tunnel keeps the counters read every round: a's own traffic
	// is seen in the next round, and a is probed every round again.
	plan(true)
	dev.receive(kb)
	p.round(ctx)
	dev.probed()
	dev.receive(ka)
	dev.receive(kb)
	clk.Step(time.Second)
	p.round(ctx)
	if st := failover.TunnelState(p.tunnels[ka].probe, clk.Now()); st != failover.TunnelAlive {
		t.Fatalf("a after its traffic: %s", st)
	}
	clk.Step(time.Second)
	p.round(ctx)
	if got := dev.probed(); fmt.Sprint(got) != fmt.Sprint([]netip.Addr{a, b}) && fmt.Sprint(got) != fmt.Sprint([]netip.Addr{b, a}) {
		t.Errorf("after a came back, probed %v, want both", got)
	}
}

func TestGatewayProbe(t *testing.T) {
	gw := netip.MustParseAddr("192.168.1.1")
	clk := testingclock.NewFakeClock(time.Unix(1_800_000_000, 0))
	answers := true
	notified := 0
	p := &Prober{Clock: clk, Interval: time.Second, Notify: func(time.Time) { notified++ },
		Ping: func(context.Context, netip.Addr, time.Duration) (bool, error) { return answers, nil }}
	p.Follow(topology.Plan{Probes: &topology.Probes{Gateway: gw}})
	ctx := context.Background()
	p.gatewayRound(ctx)
	if g := p.Health().Gateway; !g.Answered.Equal(clk.Now()) || !g.Recovered.IsZero() {
		t.Fatalf("after an answer: %+v", g)
	}
	answers = false
	var downAt time.Time
	for i := 0; i < 8; i++ {
		clk.Step(time.Second)
		p.gatewayRound(ctx)
		if p.gwDown && downAt.IsZero() {
			downAt = clk.Now()
		}
	}
	if got := downAt.Sub(p.Health().Gateway.Answered); got != failover.GatewayDeadAfter {
		t.Errorf("down %v after the last answer, want %v", got, failover.GatewayDeadAfter)
	}
	answers = true
	clk.Step(time.Second)
	p.gatewayRound(ctx)
	if g := p.Health().Gateway; !g.Recovered.Equal(clk.Now()) || p.gwDown {
		t.Errorf("after it answered again: %+v down %v", g, p.gwDown)
	}
	if notified == 0 {
		t.Error("the loop was never woken")
	}
}

// TestLeaderPathProbe: a non-leader's rounds through its leader — answered,
// then the WireGuard IP silent while the leader's own address answers
// (the path drops what is not addressed to the nodes), then both silent
// (the leader down: not that), then a new leader's path starting afresh.
func TestLeaderPathProbe(t *testing.T) {
	via, direct := netip.MustParseAddr("10.4.0.1"), netip.MustParseAddr("172.20.0.11")
	answers := map[netip.Addr]bool{via: true, direct: true}
	var pinged []netip.Addr
	clk := testingclock.NewFakeClock(time.Unix(1_800_000_000, 0))
	p := &Prober{Clock: clk, Ping: func(_ context.Context, dst netip.Addr, _ time.Duration) (bool, error) {
		pinged = append(pinged, dst)
		return answers[dst], nil
	}}
	ctx := context.Background()
	if p.LeaderPath() != nil {
		t.Fatal("a path before any plan asked for one")
	}
	target := topology.LeaderPathProbe{Leader: "a-x1", Via: via, Direct: direct}
	p.Follow(topology.Plan{Probes: &topology.Probes{LeaderPath: &target}})
	type want struct {
		unanswered int
		direct     bool
		pinged     int
	}
	round := func(step string, w want) {
		t.Helper()
		pinged = nil
		clk.Step(LeaderPathInterval)
		p.leaderPathRound(ctx)
		got := p.LeaderPath()
		if got == nil || !got.Probed || got.Unanswered != w.unanswered || got.DirectAnswered != w.direct || len(pinged) != w.pinged {
			t.Fatalf("%s: %+v after pinging %v; want %d unanswered, direct answered %v, %d pings", step, got, pinged, w.unanswered, w.direct, w.pinged)
		}
	}
	round("healthy", want{0, false, 1})
	answered := clk.Now()
	answers[via] = false
	for i := 1; i <= 3; i++ {
		round("the path dropping", want{i, true, 2})
	}
	if got := p.LeaderPath(); !got.LastAnswered.Equal(answered) {
		t.Errorf("last answered %v, want %v", got.LastAnswered, answered)
	}
	answers[direct] = false
	round("the leader gone", want{4, false, 2})
	p.Follow(topology.Plan{Probes: &topology.Probes{LeaderPath: &topology.LeaderPathProbe{Leader: "a-x2", Via: via, Direct: netip.MustParseAddr("172.20.0.12")}}})
	if got := p.LeaderPath(); got.Probed || got.Unanswered != 0 || got.Leader != "a-x2" {
		t.Fatalf("a new leader's path: %+v, want a fresh start", got)
	}
	p.Follow(topology.Plan{})
	if p.LeaderPath() != nil {
		t.Error("a path while the plan asks for none (this node leads)")
	}
}

// TestPathMTUProbe: a leader's full-size probes — sent only on live
// tunnels, MTU bytes each from the leader's WireGuard IP; a path that
// drops them counts up while the small probes keep the tunnel alive, an
// answer resets it, a new MTU starts afresh.
func TestPathMTUProbe(t *testing.T) {
	ka, kb := topology.Key{1}, topology.Key{2}
	a, b := netip.MustParseAddr("10.4.0.2"), netip.MustParseAddr("10.4.0.3")
	src := netip.MustParseAddr("10.4.0.1")
	dev := &fakeDevice{rx: map[topology.Key]int64{ka: 0, kb: 0}}
	clk := testingclock.NewFakeClock(time.Unix(1_800_000_000, 0))
	big := map[netip.Addr]bool{a: true, b: false} // b's path drops full-size packets
	var sizes []int
	var pinged []netip.Addr
	p := &Prober{Stats: dev.stats, Echo: dev.echo, Clock: clk, Interval: time.Second,
		PingFrom: func(_ context.Context, from, dst netip.Addr, _ time.Duration, payload string) (bool, error) {
			if from != src {
				t.Errorf("full-size probe from %s, want %s", from, src)
			}
			sizes, pinged = append(sizes, len(payload)+28), append(pinged, dst)
			return big[dst], nil
		}}
	ctx := context.Background()
	plan := topology.Plan{WireGuard: topology.Device{MTU: 1420}, Probes: &topology.Probes{Source: src,
		Peers: []topology.ProbeTarget{{Name: "a", PublicKey: ka, Addr: a}, {Name: "b", Cluster: "cluster-b", PublicKey: kb, Addr: b}}}}
	p.Follow(plan)
	p.round(ctx) // the baseline reading
	// Only a answers the small probes: b's tunnel is not alive, so it
	// gets no full-size probe.
	clk.Step(time.Second)
	dev.receive(ka)
	p.round(ctx)
	p.pathMTURound(ctx)
	if fmt.Sprint(pinged) != "[10.4.0.2]" || sizes[0] != 1420 {
		t.Fatalf("full-size probes to %v of %v bytes; want one to a of 1420", pinged, sizes)
	}
	// Both alive now: b's full-size probes go unanswered.
	for i := 1; i <= 2; i++ {
		clk.Step(time.Second)
		dev.receive(ka)
		dev.receive(kb)
		p.round(ctx)
		pinged = nil
		p.pathMTURound(ctx)
		if len(pinged) != 2 {
			t.Fatalf("round %d: full-size probes to %v, want both", i, pinged)
		}
	}
	got := p.PathMTUs()
	if len(got) != 2 || got[0].Name != "a" || got[0].Unanswered != 0 || got[0].Answered.IsZero() ||
		got[1].Name != "b" || got[1].Cluster != "cluster-b" || got[1].Unanswered != 2 || got[1].MTU != 1420 || !got[1].Answered.IsZero() {
		t.Fatalf("path MTUs %+v", got)
	}
	big[b] = true
	clk.Step(time.Second)
	dev.receive(ka)
	dev.receive(kb)
	p.round(ctx)
	p.pathMTURound(ctx)
	if got := p.PathMTUs(); got[1].Unanswered != 0 {
		t.Errorf("after an answer: %+v", got[1])
	}
	big[b] = false
	p.pathMTURound(ctx)
	plan.WireGuard.MTU = 1380
	p.Follow(plan)
	p.pathMTURound(ctx)
	if got := p.PathMTUs(); got[1].Unanswered != 1 || got[1].MTU != 1380 || sizes[len(sizes)-1] != 1380 {
		t.Errorf("after the MTU changed: %+v (last probe %d bytes); want a fresh count at 1380", got[1], sizes[len(sizes)-1])
	}
}
