package reconcile

import (
	"context"
	"errors"
	"net/netip"
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
}

func (f *fakeWG) Apply(_ context.Context, d topology.Device) (Changes, error) {
	f.mu.Lock()
	f.applied = append(f.applied, d)
	f.mu.Unlock()
	if f.done != nil {
		f.done <- d
	}
	return Changes{"peer": len(d.Peers)}, f.err
}

type fakeHost struct{ plans int }

func (f *fakeHost) Apply(context.Context, topology.Plan) (Changes, error) { f.plans++; return nil, nil }

type fakePub struct{ last map[string]string }

func (f *fakePub) Publish(_ context.Context, a map[string]string) (bool, error) {
	changed := len(f.last) != len(a)
	f.last = a
	return changed, nil
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

func newLoop(t *testing.T, now time.Time) (*Loop, *fakeSnap, *fakeWG, *prometheus.Registry, *testingclock.FakeClock) {
	t.Helper()
	nodes := twoNodes(now)
	var k topology.Key
	k[0] = 1
	snap := &fakeSnap{snap: topology.Snapshot{Nodes: nodes}, synced: true}
	wg := &fakeWG{done: make(chan topology.Device, 16)}
	reg := prometheus.NewRegistry()
	clk := testingclock.NewFakeClock(now)
	l := &Loop{
		Node: "a", Snapshots: snap, Self: fakeSelf{topology.Self{PublicKey: k, DefaultInterface: "eth0",
			Addresses: []topology.HostAddress{{Interface: "eth0", Prefix: nodes[0].InternalIP}}}},
		WireGuard: wg, Host: &fakeHost{}, Publisher: &fakePub{}, Metrics: metrics.NewAgent(reg),
		Clock: clk, Debounce: 10 * time.Millisecond, Resync: time.Hour,
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

// TestBurstIsOneRun: a burst of events inside the debounce window becomes
// exactly one run, started when the window closes and not before; nothing
// of the burst is left over for a second run.
func TestBurstIsOneRun(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	l, _, wg, _, clk := newLoop(t, now)
	l.Debounce = 50 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() { _ = l.Run(ctx); close(done) }()
	// Timers of an idle loop: the resync ticker and the re-plan for the
	// nodes' last-seen (set by the first run); a burst adds the debounce.
	eventually(t, "the first debounce", func() bool { return clk.Waiters() == 2 })
	clk.Step(l.Debounce)
	<-wg.done
	eventually(t, "an idle loop", func() bool { return clk.Waiters() == 2 })
	for i := 0; i < 20; i++ {
		l.Notify(now)
		if i < 5 {
			clk.Step(l.Debounce / 10) // the burst spans half the window
		}
	}
	eventually(t, "the burst's debounce", func() bool { return clk.Waiters() == 3 })
	if n := len(wg.done); n != 0 {
		t.Fatalf("%d runs before the window closed", n)
	}
	clk.Step(l.Debounce)
	<-wg.done
	// One run took the whole burst: no event left in the queue, no second
	// window armed.
	eventually(t, "an idle loop after the burst", func() bool { return len(l.wake) == 0 && clk.Waiters() == 2 })
	cancel()
	<-done
	if got := len(wg.applied); got != 2 {
		t.Fatalf("applies = %d, want 2 (the first, one for the burst of 20)", got)
	}
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
	eventually(t, "the first debounce", func() bool { return clk.Waiters() == 2 })
	clk.Step(l.Debounce)
	first := <-wg.done
	if len(first.Peers) != 1 {
		t.Fatalf("initial plan has %d peers, want b", len(first.Peers))
	}
	eventually(t, "the re-plan timer", func() bool { return clk.Waiters() == 2 })
	// b is stale 300 ms from the start; the loop looks 100 ms later. The
	// step fires the re-plan timer (it leaves the waiters at once); the
	// loop then arms a debounce.
	clk.Step(400 * time.Millisecond)
	eventually(t, "the re-plan's debounce", func() bool { return clk.Waiters() == 2 })
	if len(wg.done) != 0 {
		t.Fatal("re-planned before the debounce")
	}
	clk.Step(l.Debounce)
	if d := <-wg.done; len(d.Peers) != 0 {
		t.Errorf("re-plan after b went stale still has peers %+v", d.Peers)
	}
	cancel()
	<-done
}
