package health

import (
	"context"
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
	mu   sync.Mutex
	rx   map[topology.Key]int64
	sent []netip.Addr
}

func (d *fakeDevice) stats(context.Context) (wg.DeviceStats, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var st wg.DeviceStats
	for k, v := range d.rx {
		st.Peers = append(st.Peers, wg.PeerStats{PublicKey: wgtypes.Key(k), ReceiveBytes: v})
	}
	return st, nil
}

func (d *fakeDevice) echo(_ context.Context, _, dst netip.Addr) error {
	d.mu.Lock()
	d.sent = append(d.sent, dst)
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

func TestTunnelProbes(t *testing.T) {
	ka, kb := topology.Key{1}, topology.Key{2}
	a, b := netip.MustParseAddr("10.4.0.2"), netip.MustParseAddr("10.4.0.3")
	dev := &fakeDevice{rx: map[topology.Key]int64{ka: 0, kb: 0}}
	clk := testingclock.NewFakeClock(time.Unix(1_800_000_000, 0))
	p := &Prober{Stats: dev.stats, Echo: dev.echo, Clock: clk, Interval: time.Second}
	ctx := context.Background()
	p.Follow(topology.Plan{Probes: &topology.Probes{Source: netip.MustParseAddr("10.4.0.1"),
		Peers: []topology.ProbeTarget{{Name: "a", PublicKey: ka, Addr: a}, {Name: "b", PublicKey: kb, Addr: b}}}})
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
		{"nothing", nil, []netip.Addr{a, b}, failover.TunnelAlive, failover.TunnelDead},
		{"still nothing", nil, []netip.Addr{a, b}, failover.TunnelAlive, failover.TunnelDead},
		{"a silent for 3 s", nil, []netip.Addr{a, b}, failover.TunnelDead, failover.TunnelDead},
		{"b answers again", []topology.Key{kb}, []netip.Addr{a}, failover.TunnelDead, failover.TunnelAlive},
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
