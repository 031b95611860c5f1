// Package health probes what a leader needs to be fit to lead
// (docs/failover.md#health) and reports what it saw; the planner judges
// it (agent/core/topology). Two probes, both every Interval:
//
//   - the tunnels to the other leaders: one ICMP echo from this leader's
//     WireGuard IP to each peer's WireGuard IP, through kilo0, unless the
//     peer sent something since the last round. The peer's kernel answers
//     through the tunnel, so the answer shows as bytes received on that
//     WireGuard peer: a tunnel answers when its receive counter grows.
//     Nothing else is read, so kernel and userspace WireGuard look alike,
//     and no reply needs to be matched. A tunnel found dead is probed less
//     and less often, 2, 4, 8, 16 and then every DeadProbeMax seconds:
//     whether it is dead decides nothing more (failover's rule judges it at
//     full rate until then), only when it comes back, which its own traffic
//     shows at once while any other tunnel keeps the counters read. A
//     round with only dead tunnels, none due, reads nothing.
//   - the underlay gateway (the default route's): one ICMP echo, and its
//     reply, so a node cut off from its network is seen as such. A gateway
//     that never answered is not judged (some drop pings).
//
// On a leader, every PathMTUInterval, each live tunnel also gets one echo
// as big as the WireGuard interface's MTU, its reply awaited: small probes
// answered and the full-size one not is a path whose MTU is smaller than
// the interface assumes (pings pass, big transfers stall). Not judged by
// the planner: `meshlet status` reports it. One MTU-sized echo per tunnel
// per 15 s.
//
// And on a non-leader, every LeaderPathInterval, the path through its
// leader (topology.LeaderPathProbe): one echo to the leader's WireGuard
// IP, routed through the leader as everything this node sends to the mesh;
// only when that goes unanswered, one to the leader's private IP. Not
// judged by the planner: `meshlet status` reports it (a finding when the
// first fails and the second answers). One 84-byte echo per 5 s on a
// healthy mesh.
//
// Probing makes traffic on every tunnel between leaders (a probe a second
// at most), so WireGuard renews those sessions about every two minutes,
// as with a persistent keepalive.
package health

import (
	"context"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/utils/clock"

	"github.com/meshlet/meshlet/agent/core/failover"
	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/agent/runtime/metrics"
	"github.com/meshlet/meshlet/netlinkx"
	"github.com/meshlet/meshlet/wg"
)

// DefaultInterval is how often the probes run.
const DefaultInterval = time.Second

// LeaderPathInterval is how often a non-leader probes the path through
// its leader; LeaderPathTimeout is how long it waits for each answer.
const (
	LeaderPathInterval = 5 * time.Second
	LeaderPathTimeout  = time.Second
)

// DeadProbeMax is the longest time between two probes of a dead tunnel:
// one that comes back unseen by its own traffic is seen within it (Kilo's
// resync period). Before, a leader whose remote locations were gone sent
// each of them an echo a second, and its device tried a handshake for each.
const DeadProbeMax = 30 * time.Second

// PathMTUInterval is how often a leader sends each live tunnel a full-size
// echo.
const PathMTUInterval = 15 * time.Second

// PathMTU is what the full-size probes of one tunnel saw.
type PathMTU struct {
	Name, Cluster string
	Addr          netip.Addr
	// MTU is the size of the probe (the interface's MTU).
	MTU int
	// Unanswered counts the full-size probes in a row that went
	// unanswered while the tunnel was alive; Answered is when one last
	// came back (zero: never).
	Unanswered int
	Answered   time.Time
}

// LeaderPath is what a non-leader's probes of the path through its leader
// saw.
type LeaderPath struct {
	topology.LeaderPathProbe
	// Probed: at least one round ran.
	Probed bool
	// Unanswered counts the rounds in a row whose echo to the leader's
	// WireGuard IP went unanswered; DirectAnswered says whether, in the
	// last of them, the leader's private IP answered.
	Unanswered     int
	DirectAnswered bool
	// LastAnswered is when the WireGuard IP last answered (zero: never).
	LastAnswered time.Time
}

// Prober runs the probes the last plan asked for.
type Prober struct {
	// Stats reads the WireGuard device's counters.
	Stats func(ctx context.Context) (wg.DeviceStats, error)
	// Echo sends one ICMP echo request from src to each of dsts and
	// returns at once (nil: ICMP through the host's raw socket).
	Echo func(ctx context.Context, src netip.Addr, dsts []netip.Addr) error
	// Ping sends one echo to dst and reports whether it answered within
	// timeout (nil: ICMP through the host's raw socket).
	Ping func(ctx context.Context, dst netip.Addr, timeout time.Duration) (bool, error)
	// PingFrom sends one echo with payload as its data from src to dst and
	// reports whether it answered within timeout (nil: the raw socket).
	PingFrom func(ctx context.Context, src, dst netip.Addr, timeout time.Duration, payload string) (bool, error)
	Interval time.Duration
	// Notify wakes the reconcile loop when what the probes saw can change
	// the plan.
	Notify  func(seen time.Time)
	Metrics *metrics.Leadership // nil: none
	Log     *slog.Logger
	Clock   clock.WithTicker

	mu      sync.Mutex
	probes  topology.Probes
	tunnels map[topology.Key]*tunnel
	gw      topology.GatewayProbe
	gwDown  bool
	path    LeaderPath
	mtu     int // the WireGuard interface's, for the full-size probes
	wake    chan struct{}
}

type tunnel struct {
	probe topology.TunnelProbe
	name  string
	rx    int64
	seen  bool // rx is a reading
	state string
	// A dead tunnel's next probe, and the gap after it (zero: probed
	// every round).
	next time.Time
	gap  time.Duration
	// The full-size probes (PathMTU; MTU 0: none ran).
	mtu PathMTU
}

func (p *Prober) clock() clock.WithTicker {
	if p.Clock == nil {
		return clock.RealClock{}
	}
	return p.Clock
}

// Follow takes the plan's probes (after every reconcile).
func (p *Prober) Follow(plan topology.Plan) {
	now := p.clock().Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	var pr topology.Probes
	if plan.Probes != nil {
		pr = *plan.Probes
	}
	if p.tunnels == nil {
		p.tunnels = map[topology.Key]*tunnel{}
	}
	keep := map[topology.Key]bool{}
	for _, t := range pr.Peers {
		keep[t.PublicKey] = true
	}
	for k := range p.tunnels {
		if !keep[k] || pr.Source != p.probes.Source {
			delete(p.tunnels, k) // a new source is a new set of sessions
		}
	}
	for _, t := range pr.Peers {
		if _, ok := p.tunnels[t.PublicKey]; !ok {
			p.tunnels[t.PublicKey] = &tunnel{probe: topology.TunnelProbe{PublicKey: t.PublicKey, Since: now}, name: t.Name}
		}
	}
	if pr.Gateway != p.gw.Addr {
		p.gw, p.gwDown = topology.GatewayProbe{Addr: pr.Gateway, Since: now}, false
	}
	var lp topology.LeaderPathProbe
	if pr.LeaderPath != nil {
		lp = *pr.LeaderPath
	}
	if lp != p.path.LeaderPathProbe {
		p.path = LeaderPath{LeaderPathProbe: lp} // a new leader is a new path
	}
	p.probes = pr
	p.mtu = plan.WireGuard.MTU
	if p.wake != nil {
		select {
		case p.wake <- struct{}{}:
		default:
		}
	}
}

// Health is what the probes saw, for the planner (nil before any plan
// asked for probes).
func (p *Prober) Health() *topology.Health {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.tunnels) == 0 && !p.gw.Addr.IsValid() {
		return nil
	}
	h := &topology.Health{Gateway: p.gw}
	for _, t := range p.tunnels {
		h.Peers = append(h.Peers, t.probe)
	}
	return h
}

// Run probes until ctx ends.
func (p *Prober) Run(ctx context.Context) {
	if p.Interval <= 0 {
		p.Interval = DefaultInterval
	}
	if p.Echo == nil {
		p.Echo = func(ctx context.Context, src netip.Addr, dsts []netip.Addr) error {
			return netlinkx.Echo(ctx, src, dsts, "meshlet tunnel probe")
		}
	}
	if p.PingFrom == nil {
		p.PingFrom = func(ctx context.Context, src, dst netip.Addr, timeout time.Duration, payload string) (bool, error) {
			return netlinkx.PingFrom(ctx, src, dst, timeout, payload)
		}
	}
	if p.Ping == nil {
		p.Ping = func(ctx context.Context, dst netip.Addr, timeout time.Duration) (bool, error) {
			return netlinkx.Ping(ctx, dst, timeout, "meshlet gateway probe")
		}
	}
	p.mu.Lock()
	p.wake = make(chan struct{}, 1)
	p.mu.Unlock()
	go p.runGateway(ctx)
	go p.every(ctx, LeaderPathInterval, p.leaderPathRound)
	go p.every(ctx, PathMTUInterval, p.pathMTURound)
	t := p.clock().NewTicker(p.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		case <-p.wake:
		}
		if p.round(ctx) {
			p.notify()
		}
	}
}

func (p *Prober) notify() {
	if p.Notify != nil {
		p.Notify(time.Time{})
	}
}

// round reads the device's counters, records answers, and probes the
// tunnels that sent nothing since the last round (dead ones when due). It
// reports whether a tunnel's state changed; the timings of the rule after
// that (a dead tunnel's step-aside) are the plan's own moments
// (planner.NextChange), so a dead tunnel does not wake the loop on every
// round.
func (p *Prober) round(ctx context.Context) bool {
	now := p.clock().Now()
	p.mu.Lock()
	pr := p.probes
	n := len(p.tunnels)
	due := false
	for _, t := range p.tunnels {
		due = due || t.state != failover.TunnelDead || !now.Before(t.next)
	}
	p.mu.Unlock()
	if n == 0 || !pr.Source.IsValid() || !due {
		return false
	}
	st, err := p.Stats(ctx)
	if err != nil {
		p.log().Debug("health probe: reading the device", "error", err)
		return false
	}
	rx := make(map[topology.Key]int64, len(st.Peers))
	for _, s := range st.Peers {
		rx[topology.Key(s.PublicKey)] = s.ReceiveBytes
	}
	var send []netip.Addr
	wakeLoop := false
	counts := map[string]int{failover.TunnelAlive: 0, failover.TunnelDead: 0, failover.TunnelNew: 0}
	p.mu.Lock()
	addrs := map[topology.Key]netip.Addr{}
	for _, t := range pr.Peers {
		addrs[t.PublicKey] = t.Addr
	}
	for k, t := range p.tunnels {
		got, ok := rx[k]
		if ok && t.seen && got > t.rx {
			t.probe.Answered = now
		}
		if ok {
			t.rx, t.seen = got, true
		}
		state := failover.TunnelState(t.probe, now)
		if t.probeNow(state, now, p.Interval) {
			if a, ok := addrs[k]; ok {
				send = append(send, a)
			}
		}
		if state != t.state {
			if t.state != "" {
				p.log().Info("tunnel probe", "peer", t.name, "state", state, "previous", t.state)
			}
			t.state = state
			wakeLoop = true
		}
		counts[state]++
	}
	p.mu.Unlock()
	if p.Metrics != nil {
		for s, v := range counts {
			p.Metrics.Tunnels.WithLabelValues(s).Set(float64(v))
		}
	}
	if len(send) > 0 {
		if err := p.Echo(ctx, pr.Source, send); err != nil && ctx.Err() == nil {
			p.log().Debug("health probe: sending", "error", err)
		}
	}
	return wakeLoop
}

// probeNow reports whether the tunnel, in state at now, gets an echo this
// round: not when it answered in this round; every round while it is alive
// or new; when dead, at gaps doubling from two rounds to DeadProbeMax.
func (t *tunnel) probeNow(state string, now time.Time, interval time.Duration) bool {
	if state != failover.TunnelDead {
		t.next, t.gap = time.Time{}, 0
		return !t.probe.Answered.Equal(now)
	}
	if now.Before(t.next) {
		return false
	}
	t.gap = min(max(2*t.gap, 2*interval), DeadProbeMax)
	t.next = now.Add(t.gap)
	return true
}

// runGateway pings the underlay gateway every Interval.
func (p *Prober) runGateway(ctx context.Context) {
	t := p.clock().NewTicker(p.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
		p.gatewayRound(ctx)
	}
}

// gatewayRound pings the gateway once and records the answer.
func (p *Prober) gatewayRound(ctx context.Context) {
	p.mu.Lock()
	gw := p.gw.Addr
	p.mu.Unlock()
	if !gw.IsValid() {
		return
	}
	ok, err := p.Ping(ctx, gw, p.Interval*3/4)
	if err != nil && ctx.Err() == nil {
		p.log().Debug("health probe: gateway", "gateway", gw.String(), "error", err)
	}
	now := p.clock().Now()
	p.mu.Lock()
	if p.gw.Addr != gw {
		p.mu.Unlock()
		return
	}
	changed := false
	if ok {
		if p.gwDown {
			p.gw.Recovered, p.gwDown, changed = now, false, true
		}
		p.gw.Answered = now
	} else if !p.gw.Answered.IsZero() && !p.gwDown && now.Sub(p.gw.Answered) >= failover.GatewayDeadAfter {
		p.gwDown, changed = true, true
	}
	down := p.gwDown
	p.mu.Unlock()
	if changed {
		// Down and recovering have timings of their own after this:
		// the plan's moments (failover.HealthChange).
		p.log().Info("underlay gateway probe", "gateway", gw.String(), "reachable", !down)
		p.notify()
	}
}

// PathMTUs are what the full-size probes of the tunnels saw (those probed
// at least once), by peer name.
func (p *Prober) PathMTUs() []PathMTU {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []PathMTU
	for _, t := range p.tunnels {
		if t.mtu.MTU > 0 {
			out = append(out, t.mtu)
		}
	}
	slices.SortFunc(out, func(a, b PathMTU) int { return strings.Compare(a.Cluster+"/"+a.Name, b.Cluster+"/"+b.Name) })
	return out
}

// every runs round every d until ctx ends.
func (p *Prober) every(ctx context.Context, d time.Duration, round func(context.Context)) {
	t := p.clock().NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
		round(ctx)
	}
}

// pathMTURound sends every live tunnel one full-size echo, one after the
// other, and records the answers.
func (p *Prober) pathMTURound(ctx context.Context) {
	now := p.clock().Now()
	p.mu.Lock()
	src, mtu := p.probes.Source, p.mtu
	type target struct {
		key  topology.Key
		name string
		addr netip.Addr
	}
	var ts []target
	for _, pt := range p.probes.Peers {
		if t, ok := p.tunnels[pt.PublicKey]; ok && failover.TunnelState(t.probe, now) == failover.TunnelAlive {
			ts = append(ts, target{pt.PublicKey, pt.Name, pt.Addr})
		}
	}
	clusters := map[topology.Key]string{}
	for _, pt := range p.probes.Peers {
		clusters[pt.PublicKey] = pt.Cluster
	}
	p.mu.Unlock()
	// An IPv4 echo of mtu bytes: 20 of IP header, 8 of ICMP, the rest data.
	if !src.IsValid() || mtu < 68 || len(ts) == 0 {
		return
	}
	payload := strings.Repeat("m", mtu-28)
	for _, tg := range ts {
		ok, err := p.PingFrom(ctx, src, tg.addr, LeaderPathTimeout, payload)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			p.log().Debug("path MTU probe", "peer", tg.name, "error", err)
			continue
		}
		at := p.clock().Now()
		p.mu.Lock()
		t, live := p.tunnels[tg.key]
		if live {
			if t.mtu.MTU != mtu {
				t.mtu = PathMTU{} // a new size is a new question
			}
			before := t.mtu.Unanswered
			t.mtu.Name, t.mtu.Cluster, t.mtu.Addr, t.mtu.MTU = tg.name, clusters[tg.key], tg.addr, mtu
			if ok {
				t.mtu.Unanswered, t.mtu.Answered = 0, at
			} else {
				t.mtu.Unanswered++
			}
			if (before >= pathMTUUnanswered) != (t.mtu.Unanswered >= pathMTUUnanswered) {
				p.log().Info("path MTU probe", "peer", tg.name, "mtu", mtu, "answered", ok)
			}
		}
		p.mu.Unlock()
	}
}

// pathMTUUnanswered is how many full-size probes in a row, unanswered on
// a live tunnel, are logged (the finding's bound too: agent/core/diagnose).
const pathMTUUnanswered = 2

// LeaderPath is what the probes of the path through the leader saw (nil
// when the plan asks for none: a leader, or no plan yet).
func (p *Prober) LeaderPath() *LeaderPath {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.path.Via.IsValid() {
		return nil
	}
	lp := p.path
	return &lp
}

// leaderPathDropped is how many unanswered rounds in a row, with the
// leader answering directly, are logged as the path dropping traffic (the
// finding's bound too: agent/core/diagnose).
const leaderPathDropped = 3

// leaderPathRound probes once and records the answers.
func (p *Prober) leaderPathRound(ctx context.Context) {
	p.mu.Lock()
	target := p.path.LeaderPathProbe
	p.mu.Unlock()
	if !target.Via.IsValid() {
		return
	}
	via, err := p.Ping(ctx, target.Via, LeaderPathTimeout)
	if err != nil && ctx.Err() == nil {
		p.log().Debug("leader path probe", "leader", target.Leader, "to", target.Via.String(), "error", err)
	}
	direct := false
	if !via && target.Direct.IsValid() {
		direct, _ = p.Ping(ctx, target.Direct, LeaderPathTimeout)
	}
	now := p.clock().Now()
	p.mu.Lock()
	if p.path.LeaderPathProbe != target {
		p.mu.Unlock()
		return
	}
	was := p.path.Unanswered >= leaderPathDropped && p.path.DirectAnswered
	p.path.Probed = true
	if via {
		p.path.Unanswered, p.path.DirectAnswered, p.path.LastAnswered = 0, false, now
	} else {
		p.path.Unanswered++
		p.path.DirectAnswered = direct
	}
	is := p.path.Unanswered >= leaderPathDropped && p.path.DirectAnswered
	p.mu.Unlock()
	if is != was {
		p.log().Info("leader path probe", "leader", target.Leader, "via", target.Via.String(), "direct", target.Direct.String(),
			"dropped", is)
	}
}

func (p *Prober) log() *slog.Logger {
	if p.Log == nil {
		return slog.Default()
	}
	return p.Log
}
