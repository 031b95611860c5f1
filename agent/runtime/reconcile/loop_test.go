package reconcile

import (
	"context"
	"errors"
	"math"
	"net/netip"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	testingclock "k8s.io/utils/clock/testing"

	"github.com/meshlet/meshlet/agent/core/clustermesh"
	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/agent/runtime/metrics"
)

type fakeSnap struct {
	mu     sync.Mutex
	snap   topology.Snapshot
	synced bool
}

func (f *fakeSnap) Snapshot() (topology.Snapshot, []clustermesh.Kubeconfig) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.snap, nil
}
func (f *fakeSnap) Synced() bool { f.mu.Lock(); defer f.mu.Unlock(); return f.synced }

type fakeSelf struct{ self topology.Self }

func (f fakeSelf) Self(context.Context) (topology.Self, error) { return f.self, nil }

type fakeWG struct {
	mu      sync.Mutex
	applied []topology.Device
	err     error
	done    chan topology.Device
	// onApply runs inside every apply (a test steps the clock: a slow run).
	onApply func()
	// host is the loop's host actuator; greetedAfter records, per
	// InitiateHandshakes, how many host applies came before it.
	host         *fakeHost
	greetedAfter []int
	// acted records every ActOnSessions.
	acted []*topology.SessionActions
}

func (f *fakeWG) ActOnSessions(_ context.Context, a *topology.SessionActions) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.acted = append(f.acted, a)
	return nil
}
func (f *fakeWG) InitiateHandshakes(context.Context) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.greetedAfter = append(f.greetedAfter, f.host.plans)
	return 0, nil
}

func (f *fakeWG) Apply(_ context.Context, d topology.Device) (Changes, error) {
	if f.onApply != nil {
		f.onApply()
	}
	f.mu.Lock()
	f.applied = append(f.applied, d)
	err := f.err
	f.mu.Unlock()
	if f.done != nil {
		f.done <- d
	}
	return Changes{"peer": len(d.Peers)}, err
}

func (f *fakeWG) fail(err error) {
	f.mu.Lock()
	f.err = err
	f.mu.Unlock()
}

func (f *fakeWG) runs() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.applied)
}

type fakeHost struct {
	plans   int
	onApply func()
}

func (f *fakeHost) Apply(context.Context, topology.Plan) (Changes, error) {
	if f.onApply != nil {
		f.onApply()
	}
	f.plans++
	return nil, nil
}

type fakePub struct {
	last      map[string]string
	err       error
	unmarked  [][]string
	unmarkErr error
}

func (f *fakePub) Unmark(_ context.Context, nodes []string) (int, error) {
	f.unmarked = append(f.unmarked, nodes)
	return len(nodes), f.unmarkErr
}

func (f *fakePub) Publish(_ context.Context, a map[string]string) (bool, error) {
	changed := len(f.last) != len(a)
	f.last = a
	return changed, f.err
}

func twoNodes(now time.Time) []topology.Node {
	mk := func(i byte, name, loc, priv, pod string) topology.Node {
		var k topology.Key
		k[0] = i
		return topology.Node{Name: name, LocationAnnotation: loc, Endpoint: priv + ":51820", PublicKey: k,
			InternalIP: netip.MustParsePrefix(priv + "/24"), PodCIDRs: []netip.Prefix{netip.MustParsePrefix(pod)}, LastSeen: now}
	}
	return []topology.Node{mk(1, "a", "x", "10.0.0.1", "10.244.0.0/24"), mk(2, "b", "y", "10.0.1.1", "10.244.1.0/24")}
}

func newLoop(t testing.TB, now time.Time) (*Loop, *fakeSnap, *fakeWG, *prometheus.Registry, *testingclock.FakeClock) {
	t.Helper()
	nodes := twoNodes(now)
	var k topology.Key
	k[0] = 1
	snap := &fakeSnap{snap: topology.Snapshot{Nodes: nodes}, synced: true}
	host := &fakeHost{}
	wg := &fakeWG{done: make(chan topology.Device, 16), host: host}
	reg := prometheus.NewRegistry()
	clk := testingclock.NewFakeClock(now)
	l := &Loop{
		Node: "a", Snapshots: snap, Self: fakeSelf{topology.Self{PublicKey: k, DefaultInterface: "eth0",
			Addresses: []topology.HostAddress{{Interface: "eth0", Prefix: nodes[0].InternalIP}}}},
		WireGuard: wg, Host: host, Publisher: &fakePub{}, Metrics: metrics.NewAgent(reg),
		Clock: clk, Debounce: 100 * time.Millisecond, Resync: time.Hour, runDone: make(chan struct{}, 16),
	}
	return l, snap, wg, reg, clk
}

func TestRunOnceAppliesPlan(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	l, _, wg, reg, _ := newLoop(t, now)
	if err := l.RunOnce(context.Background(), now.Add(-50*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if len(wg.applied) != 1 || len(wg.applied[0].Peers) != 1 || wg.applied[0].Peers[0].Name != "b" {
		t.Fatalf("applied = %+v", wg.applied)
	}
	if !l.Ready() {
		t.Fatal("not ready after a successful apply")
	}
	if got := testutil.ToFloat64(l.Metrics.Leader); got != 1 {
		t.Errorf("meshlet_leader = %v", got)
	}
	if n, _ := testutil.GatherAndCount(reg, "meshlet_convergence_seconds"); n != 1 {
		t.Errorf("convergence not observed")
	}
	// Handshakes start once, after the host (the link up) is applied.
	if len(wg.greetedAfter) != 1 || wg.greetedAfter[0] != 1 {
		t.Errorf("InitiateHandshakes after host applies %v, want [1]", wg.greetedAfter)
	}
}

// TestRunOnceActsOnSessions: the plan's half-dead session actions, judged
// from what the device's watch saw (Self.Sessions), go to the WireGuard
// actuator in the same run, after the device is applied, and also when the
// apply failed (they touch only peers already on the device).
func TestRunOnceActsOnSessions(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	l, snap, wg, _, _ := newLoop(t, now)
	kg := snap.snap.Nodes[1].PublicKey // b runs kg (no meshlet.io/version)
	self := l.Self.(fakeSelf).self
	self.Sessions = []topology.SessionObservation{{PublicKey: kg, At: now, Rx: 1, Tx: 9, Handshake: now.Add(-time.Minute),
		UnansweredFrom: now.Add(-time.Second), UnansweredSeen: now.Add(-900 * time.Millisecond)}}
	l.Self = fakeSelf{self}
	if err := l.RunOnce(context.Background(), time.Time{}); err != nil {
		t.Fatal(err)
	}
	if len(wg.acted) != 1 || wg.acted[0] == nil || len(wg.acted[0].Probe) != 1 || wg.acted[0].Probe[0] != kg {
		t.Fatalf("acted %+v, want one probe of b", wg.acted)
	}
	wg.err = errors.New("device gone")
	if err := l.RunOnce(context.Background(), time.Time{}); err == nil {
		t.Fatal("a failed apply did not fail the run")
	}
	if len(wg.acted) != 2 || wg.acted[1] == nil || len(wg.acted[1].Probe) != 1 {
		t.Errorf("after a failed apply, acted %+v, want the probe again (the actuator acts once per fact)", wg.acted)
	}
}

// TestRunOnceClearsLeaderMarks: the leader marks the plan names go to the
// Node writer, after the node's annotations; its failure fails the run.
// Here location x holds a kg node beside a, which carries meshlet's mark:
// Kilo's rule alone, so a's own mark goes.
func TestRunOnceClearsLeaderMarks(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	l, snap, _, _, _ := newLoop(t, now)
	kg := snap.snap.Nodes[1]
	kg.Name, kg.LocationAnnotation, kg.PublicKey[0] = "a-kg", "x", 3
	kg.InternalIP, kg.PodCIDRs = netip.MustParsePrefix("10.0.0.2/24"), []netip.Prefix{netip.MustParsePrefix("10.244.2.0/24")}
	snap.snap.Nodes[0].MeshletVersion, snap.snap.Nodes[0].Leader, snap.snap.Nodes[0].LeaderMark = "v1", true, true
	snap.snap.Nodes = append(snap.snap.Nodes, kg)
	snap.snap.Lease = &topology.LeaseState{Name: "meshlet-leader-x"}
	pub := l.Publisher.(*fakePub)
	if err := l.RunOnce(context.Background(), now); err != nil {
		t.Fatal(err)
	}
	if want := [][]string{{"a"}}; !reflect.DeepEqual(pub.unmarked, want) {
		t.Fatalf("unmarked %v, want %v", pub.unmarked, want)
	}
	pub.unmarkErr = errors.New("API server down")
	if err := l.RunOnce(context.Background(), now); err == nil || !strings.Contains(err.Error(), "leader marks") {
		t.Fatalf("run error %v, want the marks' failure", err)
	}
}

func TestNotSyncedAppliesNothing(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	l, snap, wg, _, _ := newLoop(t, now)
	snap.synced = false
	if err := l.RunOnce(context.Background(), time.Time{}); err == nil {
		t.Fatal("want an error before the caches synced")
	}
	if len(wg.applied) != 0 || l.Ready() {
		t.Fatal("applied before sync")
	}
}

func TestApplyErrorNotReady(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	l, _, wg, _, _ := newLoop(t, now)
	wg.err = errors.New("device busy")
	if err := l.RunOnce(context.Background(), time.Time{}); err == nil {
		t.Fatal("error swallowed")
	}
	if l.Ready() || l.LastError() == "" {
		t.Fatal("ready after a failed apply")
	}
	if len(wg.greetedAfter) != 0 {
		t.Error("handshakes started after a failed apply")
	}
	if got := testutil.ToFloat64(l.Metrics.Reconciles.WithLabelValues("error")); got != 1 {
		t.Errorf("error reconciles = %v", got)
	}
}

// eventually waits (real time) until cond holds: the loop runs in its own
// goroutine, and the fake clock only moves when the test says so.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// startLoop runs l until the test ends and returns after its first run
// (the loop notifies itself at start), with the loop idle: its timers are
// the resync ticker and the re-plan for the nodes' last-seen.
func startLoop(t *testing.T, l *Loop, wg *fakeWG, clk *testingclock.FakeClock) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = l.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	waitRun(t, l, wg)
	waitIdle(t, l, clk)
}

func waitIdle(t *testing.T, l *Loop, clk *testingclock.FakeClock) {
	t.Helper()
	eventually(t, "an idle loop", func() bool { return clk.Waiters() == 2 && len(l.wake) == 0 })
}

// waitHeld waits until the loop took every notification and holds a run
// back for the window (a third timer).
func waitHeld(t *testing.T, l *Loop, clk *testingclock.FakeClock) {
	t.Helper()
	eventually(t, "a run held back", func() bool { return clk.Waiters() == 3 && len(l.wake) == 0 })
}

// waitRun waits for a run of the loop to finish and returns what it
// applied.
func waitRun(t *testing.T, l *Loop, wg *fakeWG) topology.Device {
	t.Helper()
	var d topology.Device
	select {
	case d = <-wg.done:
	case <-time.After(5 * time.Second):
		t.Fatal("no run")
	}
	select {
	case <-l.runDone:
	case <-time.After(5 * time.Second):
		t.Fatal("a run did not finish")
	}
	return d
}

// TestLoneChangeRunsAtOnce: a change that comes after a quiet window is
// applied as soon as it is seen, without waiting for any timer.
func TestLoneChangeRunsAtOnce(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	l, _, wg, reg, clk := newLoop(t, now)
	startLoop(t, l, wg, clk)
	clk.Step(minWindow)
	l.Notify(clk.Now())
	waitRun(t, l, wg) // the clock did not move
	if n, _ := testutil.GatherAndCount(reg, "meshlet_convergence_seconds"); n != 1 {
		t.Errorf("convergence not observed for the lone change")
	}
}

// TestBurstCoalesced: changes that arrive within the window after a run
// wait for its end and become one run, not before and not split; a change
// after that run waits for the next window, doubled by the burst; a change
// after a quiet window runs at once again.
func TestBurstCoalesced(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	l, _, wg, _, clk := newLoop(t, now)
	startLoop(t, l, wg, clk) // run 1 at 0 ms; the window (the run took 0) is minWindow
	clk.Step(10 * time.Millisecond)
	for range 5 {
		l.Notify(clk.Now())
	}
	waitHeld(t, l, clk)
	clk.Step(minWindow - 10*time.Millisecond - time.Millisecond) // 1 ms before the window ends
	for range 5 {
		l.Notify(clk.Now())
	}
	waitHeld(t, l, clk)
	if n := wg.runs(); n != 1 {
		t.Fatalf("%d runs before the window ended, want 1", n)
	}
	clk.Step(time.Millisecond)
	waitRun(t, l, wg) // run 2: the ten changes
	waitIdle(t, l, clk)
	if n := wg.runs(); n != 2 {
		t.Fatalf("%d runs for one burst, want 2 (the first, then the burst)", n)
	}
	// Within the window after run 2, which gathered several changes: that
	// window is twice as long, and the change is held until it ends.
	clk.Step(5 * time.Millisecond)
	l.Notify(clk.Now())
	waitHeld(t, l, clk)
	clk.Step(2*minWindow - 5*time.Millisecond - time.Millisecond)
	waitHeld(t, l, clk)
	clk.Step(time.Millisecond)
	waitRun(t, l, wg) // run 3
	waitIdle(t, l, clk)
	// Late and alone: at once.
	clk.Step(time.Second)
	l.Notify(clk.Now())
	waitRun(t, l, wg) // run 4
	waitIdle(t, l, clk)
	if n := wg.runs(); n != 4 {
		t.Fatalf("%d runs, want 4", n)
	}
}

// startTimedLoop starts a loop with a 100 ms Debounce whose every run
// takes *took on its clock.
func startTimedLoop(t *testing.T, took *time.Duration) (*Loop, *fakeWG, *testingclock.FakeClock) {
	t.Helper()
	l, _, wg, _, clk := newLoop(t, time.Unix(1_800_000_000, 0))
	l.Debounce = 100 * time.Millisecond
	wg.onApply = func() { clk.Step(*took) }
	startLoop(t, l, wg, clk)
	return l, wg, clk
}

// TestWindowFollowsRunTime: after a run that took 60 ms the window is
// 60 ms (the loop runs at most about half the time during a storm), and
// never more than Debounce.
func TestWindowFollowsRunTime(t *testing.T) {
	took := 60 * time.Millisecond
	l, wg, clk := startTimedLoop(t, &took)
	clk.Step(30 * time.Millisecond)
	l.Notify(clk.Now())
	waitHeld(t, l, clk)
	clk.Step(29 * time.Millisecond)
	waitHeld(t, l, clk)
	if n := wg.runs(); n != 1 {
		t.Fatalf("ran %d times before the 60 ms window ended", n)
	}
	took = 500 * time.Millisecond
	clk.Step(time.Millisecond)
	waitRun(t, l, wg) // took 500 ms: the next window is Debounce
	waitIdle(t, l, clk)
	l.Notify(clk.Now())
	waitHeld(t, l, clk)
	clk.Step(99 * time.Millisecond)
	waitHeld(t, l, clk)
	clk.Step(time.Millisecond)
	waitRun(t, l, wg)
}

// TestNotifyNowSkipsTheStormWindow: a change held for a long window (the
// last run took 500 ms) runs minWindow after that run once an urgent one
// comes, taking the held change with it.
func TestNotifyNowSkipsTheStormWindow(t *testing.T) {
	took := 500 * time.Millisecond
	l, wg, clk := startTimedLoop(t, &took)
	took = 0
	waitIdle(t, l, clk)
	l.Notify(clk.Now())
	waitHeld(t, l, clk)
	clk.Step(10 * time.Millisecond)
	waitHeld(t, l, clk)
	l.NotifyNow(clk.Now())
	waitHeld(t, l, clk) // until minWindow (20 ms) after the last run
	clk.Step(10 * time.Millisecond)
	waitRun(t, l, wg)
	if n := wg.runs(); n != 2 {
		t.Fatalf("%d runs, want the first and one for both changes", n)
	}
}

// TestConvergenceIsWatchToDataPlane: meshlet_convergence_seconds runs from
// the watch event to the data plane written (device and host), whatever
// comes after (publishing), and is not observed when the data plane failed.
func TestConvergenceIsWatchToDataPlane(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	l, _, wg, reg, clk := newLoop(t, now)
	wg.onApply = func() { clk.Step(5 * time.Millisecond) }
	l.Host.(*fakeHost).onApply = func() { clk.Step(3 * time.Millisecond) }
	pub := l.Publisher.(*fakePub)
	pub.err = errors.New("API server down")
	if err := l.RunOnce(context.Background(), now.Add(-50*time.Millisecond)); err == nil {
		t.Fatal("publish error swallowed")
	}
	<-wg.done
	if got := convergence(t, reg); got.count != 1 || got.sum != 0.058 {
		t.Fatalf("convergence %+v, want one observation of 50+5+3 ms", got)
	}
	pub.err = nil
	wg.err = errors.New("device busy")
	_ = l.RunOnce(context.Background(), clk.Now())
	<-wg.done
	if got := convergence(t, reg); got.count != 1 {
		t.Fatalf("convergence observed for a failed apply: %+v", got)
	}
}

type histogram struct {
	count uint64
	sum   float64
}

func convergence(t *testing.T, reg *prometheus.Registry) histogram {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == "meshlet_convergence_seconds" {
			h := f.GetMetric()[0].GetHistogram()
			return histogram{count: h.GetSampleCount(), sum: math.Round(h.GetSampleSum()*1e6) / 1e6}
		}
	}
	return histogram{}
}

// A node whose last-seen ages out is noticed when it does, not at the next
// resync (an hour here): the loop re-plans by itself.
func TestReplansWhenANodeGoesStale(t *testing.T) {
	start := time.Unix(1_800_000_000, 0)
	l, snap, wg, _, clk := newLoop(t, start)
	// b's last-seen leaves Kilo's 60 s window 300 ms from now.
	snap.mu.Lock()
	snap.snap.Nodes[1].LastSeen = start.Add(-60*time.Second + 300*time.Millisecond)
	snap.mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() { _ = l.Run(ctx); close(done) }()
	if first := waitRun(t, l, wg); len(first.Peers) != 1 {
		t.Fatalf("initial plan has %d peers, want b", len(first.Peers))
	}
	waitIdle(t, l, clk)
	// b is stale 300 ms from the start; the loop looks 100 ms later, and
	// runs at once (it has been idle for longer than a window).
	clk.Step(399 * time.Millisecond)
	waitIdle(t, l, clk)
	if n := wg.runs(); n != 1 {
		t.Fatal("re-planned before the node went stale")
	}
	clk.Step(time.Millisecond)
	if d := waitRun(t, l, wg); len(d.Peers) != 0 {
		t.Errorf("re-plan after b went stale still has peers %+v", d.Peers)
	}
	cancel()
	<-done
}

// TestFailedRunsBackOff: a run that fails is retried after 1 s, then
// after twice as long each time it fails again (up to 5 s), never
// earlier; a success resets the backoff, so the next failure is retried
// after 1 s again.
func TestFailedRunsBackOff(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	l, _, wg, _, clk := newLoop(t, now)
	wg.fail(errors.New("device busy"))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = l.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	waitRun(t, l, wg)
	// idle with a retry pending: the resync ticker, the re-plan for the
	// nodes' last-seen and the retry.
	retrying := func() {
		t.Helper()
		eventually(t, "a retry pending", func() bool { return clk.Waiters() == 3 && len(l.wake) == 0 })
	}
	retrying()
	for i, wait := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 5 * time.Second, 5 * time.Second} {
		runs := wg.runs()
		clk.Step(wait - time.Millisecond)
		retrying()
		if wg.runs() != runs {
			t.Fatalf("failure %d retried before %v", i+1, wait)
		}
		if i == 4 {
			wg.fail(nil)
		}
		clk.Step(time.Millisecond)
		waitRun(t, l, wg)
		if i < 4 {
			retrying()
		}
	}
	waitIdle(t, l, clk) // the success left no retry
	if !l.Ready() {
		t.Fatal("not ready after a successful run")
	}
	wg.fail(errors.New("device busy again"))
	clk.Step(minWindow)
	l.Notify(clk.Now())
	waitRun(t, l, wg)
	retrying()
	runs := wg.runs()
	clk.Step(time.Second)
	waitRun(t, l, wg)
	if wg.runs() != runs+1 {
		t.Fatal("the backoff did not start again at 1 s after a success")
	}
}

// TestSchedule: when a run for a change starts, against the runs before.
func TestSchedule(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	type run struct {
		start, end time.Time
		held       bool
		changes    int
	}
	for _, tc := range []struct {
		name   string
		runs   []run
		now    time.Time
		want   time.Time
		urgent bool
	}{
		{"first change: at once", nil, ms(5), ms(5), false},
		{"after a quiet window: at once", []run{{ms(0), ms(5), false, 1}}, ms(25), ms(25), false},
		{"within the window after a quick run: its end", []run{{ms(0), ms(5), false, 1}}, ms(10), ms(25), false},
		{"after a 60 ms run: a 60 ms window", []run{{ms(0), ms(60), false, 1}}, ms(70), ms(120), false},
		{"after a 2 s run: the window is Debounce", []run{{ms(0), ms(2000), false, 1}}, ms(2001), ms(2100), false},
		{"single changes in sequence keep the short window",
			[]run{{ms(0), ms(5), false, 1}, {ms(25), ms(30), true, 1}, {ms(50), ms(55), true, 1}}, ms(60), ms(75), false},
		{"a storm doubles the window per held run",
			[]run{{ms(0), ms(5), false, 1}, {ms(25), ms(30), true, 4}, {ms(70), ms(75), true, 8}}, ms(80), ms(155), false},
		{"up to Debounce",
			[]run{{ms(0), ms(5), false, 1}, {ms(25), ms(30), true, 4}, {ms(70), ms(75), true, 8}, {ms(155), ms(160), true, 8}}, ms(170), ms(260), false},
		{"a run at once after the storm resets it",
			[]run{{ms(0), ms(5), false, 1}, {ms(25), ms(30), true, 4}, {ms(70), ms(75), true, 8}, {ms(500), ms(505), false, 1}}, ms(510), ms(525), false},
		{"urgent in a storm: minWindow after the last run",
			[]run{{ms(0), ms(5), false, 1}, {ms(25), ms(30), true, 4}, {ms(70), ms(75), true, 8}}, ms(80), ms(95), true},
		{"urgent after a 2 s run: minWindow, not Debounce", []run{{ms(0), ms(2000), false, 1}}, ms(2001), ms(2020), true},
		{"urgent after a quiet window: at once", []run{{ms(0), ms(5), false, 1}}, ms(25), ms(25), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := schedule{max: 100 * time.Millisecond}
			for _, r := range tc.runs {
				s.done(r.start, r.end, r.held, r.changes)
			}
			if got := s.start(tc.now, tc.urgent); !got.Equal(tc.want) {
				t.Errorf("start(%v) = %v, want %v", tc.now.Sub(t0), got.Sub(t0), tc.want.Sub(t0))
			}
		})
	}
}
