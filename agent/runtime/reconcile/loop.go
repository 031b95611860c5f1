// Package reconcile is meshlet's one reconcile loop: event → debounce →
// snapshot → plan → apply (WireGuard, host) → publish annotations → remote
// watchers → rejections and metrics. The actuators sit behind small interfaces so the
// loop is tested with fakes and run with the real wg/ and netlinkx/.
package reconcile

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/utils/clock"

	"github.com/meshlet/meshlet/agent/core/clustermesh"
	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/agent/runtime/metrics"
)

// Snapshotter returns the current view of the clusters (without Now and
// Settings, which the loop fills in) and the remote clusters' credentials
// the accepted ClusterMeshes name.
type Snapshotter interface {
	Snapshot() (topology.Snapshot, []clustermesh.Kubeconfig)
	// Synced reports whether the local caches have been listed once; the
	// loop does not apply anything before, so a restart never removes state
	// because the caches are still empty.
	Synced() bool
}

// SelfSource observes this node (addresses, default route, tunnel device,
// the WireGuard device's peers, its public key).
type SelfSource interface {
	Self(ctx context.Context) (topology.Self, error)
}

// WireGuard applies the desired device and reports what it changed.
type WireGuard interface {
	Apply(ctx context.Context, dev topology.Device) (Changes, error)
}

// Host applies everything else: link, addresses, routes, rules, tunnel,
// iptables.
type Host interface {
	Apply(ctx context.Context, plan topology.Plan) (Changes, error)
}

// Publisher writes this node's annotations (only the ones that differ).
type Publisher interface {
	Publish(ctx context.Context, annotations map[string]string) (patched bool, err error)
}

// RemoteWatchers follow this node's role: remote clusters are watched while
// it leads its segment.
type RemoteWatchers interface {
	Reconcile(leader bool, kubeconfigs []clustermesh.Kubeconfig)
}

// MeshStatus follows this node's role too: a segment leader competes to
// write the ClusterMesh status (agent/runtime/meshstatus).
type MeshStatus interface {
	Follow(plan topology.Plan)
}

// Leadership follows the plan's decisions on this node's location Lease
// and its health probes (agent/runtime/leadership, agent/runtime/health).
// applied says the run applied and published without error; started is
// when it began (the history of roles never understates a leader).
type Leadership interface {
	Follow(ctx context.Context, plan topology.Plan, applied bool, started time.Time) error
}

// RejectionSink turns a plan's rejections into Events, logs and metrics,
// once each.
type RejectionSink interface {
	Report(ctx context.Context, plan topology.Plan)
}

// PeerLabels learns what the plan says of each peer (metric labels).
type PeerLabels interface {
	SetPeers(peers []topology.WireGuardPeer)
}

// Changes counts what an actuator changed, by kind of object ("peer",
// "route", ...), for logs and meshlet_dataplane_changes_total.
type Changes map[string]int

// Loop is the reconcile loop. Each run is one straight pass: observe this
// node, snapshot the clusters, plan, apply the device and the host, publish
// the annotations, let the remote watchers follow the role, report.
type Loop struct {
	Node       string
	Settings   topology.Settings
	Snapshots  Snapshotter
	Self       SelfSource
	WireGuard  WireGuard
	Host       Host
	Publisher  Publisher
	Remotes    RemoteWatchers // nil: no remote clusters
	MeshStatus MeshStatus     // nil: status not written
	Leadership Leadership     // nil: no Lease, Kilo's rule alone
	Rejections RejectionSink
	PeerLabels PeerLabels
	Metrics    *metrics.Agent
	Log        *slog.Logger
	// Debounce gathers a burst of events into one run (≤ 100 ms).
	Debounce time.Duration
	// Resync runs the loop periodically even without events.
	Resync time.Duration
	// Clock drives every timer of the loop (nil = the real clock).
	Clock clock.WithTicker

	mu          sync.Mutex
	firstChange time.Time
	wake        chan struct{}
	once        sync.Once

	ready   atomic.Bool
	lastErr atomic.Pointer[string]
	// nextChange is when the last snapshot's readiness changes by itself
	// (a last-seen ageing out), as unix nanoseconds; 0 = never.
	nextChange atomic.Int64
	last       atomic.Pointer[Run]
}

// Run is one reconcile as `meshlet status` shows it: the plan it computed
// and how applying it went.
type Run struct {
	Plan     topology.Plan
	At       time.Time
	Duration time.Duration
	Error    string // "" when everything applied
}

// Last returns the last run that computed a plan (false before the first).
func (l *Loop) Last() (Run, bool) {
	if r := l.last.Load(); r != nil {
		return *r, true
	}
	return Run{}, false
}

func (l *Loop) init() {
	l.once.Do(func() {
		l.wake = make(chan struct{}, 1)
		if l.Clock == nil {
			l.Clock = clock.RealClock{}
		}
		if l.Log == nil {
			l.Log = slog.Default()
		}
		if l.Debounce <= 0 {
			l.Debounce = 100 * time.Millisecond
		}
		if l.Resync <= 0 {
			l.Resync = 30 * time.Second
		}
	})
}

// Notify schedules a run. seen is when a watcher saw the change (zero for
// changes without an object, like a netlink event); the earliest pending
// one is the start of the convergence measurement.
func (l *Loop) Notify(seen time.Time) {
	l.init()
	l.mu.Lock()
	if !seen.IsZero() && (l.firstChange.IsZero() || seen.Before(l.firstChange)) {
		l.firstChange = seen
	}
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// Ready reports whether the caches synced and the last apply succeeded.
func (l *Loop) Ready() bool { return l.ready.Load() }

// LastError returns the error of the last run, or "".
func (l *Loop) LastError() string {
	if p := l.lastErr.Load(); p != nil {
		return *p
	}
	return ""
}

// timerC is a timer's channel, nil (never ready) for no timer.
func timerC(t clock.Timer) <-chan time.Time {
	if t == nil {
		return nil
	}
	return t.C()
}

func stop(t clock.Timer) {
	if t != nil {
		t.Stop()
	}
}

// Run runs the loop until ctx ends. It never tears the data plane down:
// on shutdown everything stays as it is, so a restart drops no session.
func (l *Loop) Run(ctx context.Context) error {
	l.init()
	resync := l.Clock.NewTicker(l.Resync)
	defer resync.Stop()
	// debounce gathers a burst; retry follows a failed run; expiry fires
	// when a node's last-seen ages out.
	var debounce, retry, expiry clock.Timer
	defer func() { stop(debounce); stop(retry); stop(expiry) }()
	l.Notify(time.Time{})
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-l.wake:
			if debounce == nil {
				debounce = l.Clock.NewTimer(l.Debounce)
			}
		case <-resync.C():
			l.Notify(time.Time{})
		case <-timerC(retry):
			retry = nil
			l.Notify(time.Time{})
		case <-timerC(expiry):
			expiry = nil
			l.Notify(time.Time{})
		case <-timerC(debounce):
			debounce = nil
			l.mu.Lock()
			first := l.firstChange
			l.firstChange = time.Time{}
			l.mu.Unlock()
			stop(retry)
			retry = nil
			if err := l.RunOnce(ctx, first); err != nil && ctx.Err() == nil {
				l.Log.Error("reconcile failed", "error", err)
				// Retry soon: a transient failure (API server, netlink busy)
				// should not wait for the resync period.
				retry = l.Clock.NewTimer(time.Second)
			}
			// Re-plan when a node's last-seen ages out (see
			// topology.NextReadinessChange); a little after, so the
			// planner sees it stale.
			stop(expiry)
			expiry = nil
			if next := l.nextChange.Load(); next != 0 {
				wait := time.Duration(next-l.Clock.Now().UnixNano()) + 100*time.Millisecond
				expiry = l.Clock.NewTimer(max(wait, 0))
			}
		}
	}
}

// RunOnce computes and applies one plan. first is the time the oldest
// change behind this run was seen (zero when unknown).
func (l *Loop) RunOnce(ctx context.Context, first time.Time) (err error) {
	l.init()
	start := l.Clock.Now()
	var planned *topology.Plan
	defer func() {
		if planned != nil {
			r := Run{Plan: *planned, At: start, Duration: l.Clock.Since(start)}
			if err != nil {
				r.Error = err.Error()
			}
			l.last.Store(&r)
		}
		result := "success"
		if err != nil {
			result = "error"
			msg := err.Error()
			l.lastErr.Store(&msg)
			l.ready.Store(false)
		} else {
			empty := ""
			l.lastErr.Store(&empty)
		}
		if l.Metrics != nil {
			l.Metrics.Reconciles.WithLabelValues(result).Inc()
			l.Metrics.ReconcileDuration.Observe(l.Clock.Since(start).Seconds())
		}
	}()
	if !l.Snapshots.Synced() {
		return errors.New("caches not synced yet")
	}
	self, err := l.Self.Self(ctx)
	if err != nil {
		return fmt.Errorf("reading this node's facts: %w", err)
	}
	self.Name = l.Node
	snap, kubeconfigs := l.Snapshots.Snapshot()
	snap.Now = l.Clock.Now()
	snap.Settings = l.Settings
	plan := topology.Compute(snap, self)
	planned = &plan
	if next := topology.NextReadinessChange(snap); next.IsZero() {
		l.nextChange.Store(0)
	} else {
		l.nextChange.Store(next.UnixNano())
	}

	var errs []error
	wgChanges, err := l.WireGuard.Apply(ctx, plan.WireGuard)
	if err != nil {
		errs = append(errs, fmt.Errorf("applying WireGuard device: %w", err))
	}
	hostChanges, err := l.Host.Apply(ctx, plan)
	if err != nil {
		errs = append(errs, fmt.Errorf("applying host network: %w", err))
	}
	patched, err := l.Publisher.Publish(ctx, plan.Annotations)
	if err != nil {
		errs = append(errs, fmt.Errorf("publishing annotations: %w", err))
	}
	if l.Remotes != nil {
		l.Remotes.Reconcile(plan.Leader, kubeconfigs)
	}
	if l.MeshStatus != nil {
		l.MeshStatus.Follow(plan)
	}
	if l.Leadership != nil {
		if err := l.Leadership.Follow(ctx, plan, len(errs) == 0, start); err != nil {
			errs = append(errs, fmt.Errorf("leadership: %w", err))
		}
	}
	if l.Rejections != nil {
		l.Rejections.Report(ctx, plan)
	}
	if l.PeerLabels != nil {
		l.PeerLabels.SetPeers(plan.WireGuard.Peers)
	}
	if changed := l.record(plan, wgChanges, hostChanges, patched); changed > 0 {
		l.Log.Info("applied plan", "leader", plan.Leader, "segment", plan.Segment,
			"peers", len(plan.WireGuard.Peers), "routes", len(plan.Routes), "wireguard", map[string]int(wgChanges),
			"host", map[string]int(hostChanges), "annotations", patched)
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	if !first.IsZero() && l.Metrics != nil {
		l.Metrics.Convergence.Observe(l.Clock.Since(first).Seconds())
	}
	l.ready.Store(true)
	return nil
}

func (l *Loop) record(plan topology.Plan, wg, host Changes, patched bool) int {
	n := 0
	for _, c := range []Changes{wg, host} {
		for kind, v := range c {
			n += v
			if l.Metrics != nil && v > 0 {
				l.Metrics.DataPlaneChanges.WithLabelValues(kind).Add(float64(v))
			}
		}
	}
	if patched {
		n++
	}
	if l.Metrics == nil {
		return n
	}
	if plan.Leader {
		l.Metrics.Leader.Set(1)
	} else {
		l.Metrics.Leader.Set(0)
	}
	counts := map[topology.PeerKind]int{topology.KindSegment: 0, topology.KindPeer: 0, topology.KindRemote: 0}
	for _, p := range plan.WireGuard.Peers {
		counts[p.Kind]++
	}
	for k, v := range counts {
		l.Metrics.Peers.WithLabelValues(string(k)).Set(float64(v))
	}
	if patched {
		l.Metrics.AnnotationPatches.Inc()
	}
	return n
}
