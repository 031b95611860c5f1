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

	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/agent/runtime/metrics"
)

type fakeSnap struct {
	mu     sync.Mutex
	snap   topology.Snapshot
	synced bool
}

func (f *fakeSnap) Snapshot() topology.Snapshot { f.mu.Lock(); defer f.mu.Unlock(); return f.snap }
func (f *fakeSnap) Synced() bool                { f.mu.Lock(); defer f.mu.Unlock(); return f.synced }

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

func newLoop(t *testing.T, now time.Time) (*Loop, *fakeSnap, *fakeWG, *prometheus.Registry) {
	t.Helper()
	nodes := twoNodes(now)
	var k topology.Key
	k[0] = 1
	snap := &fakeSnap{snap: topology.Snapshot{Nodes: nodes}, synced: true}
	wg := &fakeWG{done: make(chan topology.Device, 16)}
	reg := prometheus.NewRegistry()
	l := &Loop{
		Node: "a", Snapshots: snap, Self: fakeSelf{topology.Self{PublicKey: k, DefaultInterface: "eth0",
			Addresses: []topology.HostAddress{{Interface: "eth0", Prefix: nodes[0].InternalIP}}}},
		WireGuard: wg, Host: &fakeHost{}, Publisher: &fakePub{}, Metrics: metrics.NewAgent(reg),
		Now: func() time.Time { return now }, Debounce: 10 * time.Millisecond, Resync: time.Hour,
	}
	return l, snap, wg, reg
}

func TestRunOnceAppliesPlan(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	l, _, wg, reg := newLoop(t, now)
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
	l, snap, wg, _ := newLoop(t, now)
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
	l, _, wg, _ := newLoop(t, now)
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

func TestEventsAreDebouncedIntoOneRun(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	l, _, wg, _ := newLoop(t, now)
	l.Debounce = 50 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() { _ = l.Run(ctx); close(done) }()
	<-wg.done // the initial run
	for i := 0; i < 20; i++ {
		l.Notify(now)
	}
	<-wg.done
	// Wait for the loop to be idle again: a further notify must produce
	// exactly one more run, proving the burst was merged.
	l.Notify(now)
	<-wg.done
	cancel()
	<-done
	// Count applies, not runs: the initial run, the burst, the last event.
	if got := len(wg.applied); got != 3 {
		t.Fatalf("applies = %d, want 3 (initial, one for the burst of 20, one for the last event)", got)
	}
}

// A node whose last-seen ages out is noticed when it does, not at the next
// resync (an hour here): the loop re-plans by itself.
func TestReplansWhenANodeGoesStale(t *testing.T) {
	start := time.Now()
	l, snap, wg, _ := newLoop(t, start)
	l.Now = time.Now
	// b's last-seen leaves Kilo's 60 s window 300 ms from now.
	snap.mu.Lock()
	snap.snap.Nodes[1].LastSeen = start.Add(-60*time.Second + 300*time.Millisecond)
	snap.mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() { _ = l.Run(ctx); close(done) }()
	first := <-wg.done
	if len(first.Peers) != 1 {
		t.Fatalf("initial plan has %d peers, want b", len(first.Peers))
	}
	select {
	case d := <-wg.done:
		if len(d.Peers) != 0 {
			t.Errorf("re-plan after b went stale still has peers %+v", d.Peers)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no re-plan when b's last-seen aged out (resync is an hour)")
	}
	cancel()
	<-done
}
