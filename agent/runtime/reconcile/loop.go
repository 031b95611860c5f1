// Package reconcile is meshlet's one reconcile loop: event → debounce →
// snapshot → plan → apply (WireGuard, host) → publish annotations →
// rejections and metrics. The actuators sit behind small interfaces so the
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

	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/agent/runtime/metrics"
)

// Snapshotter returns the current view of the clusters (without Now and
// Settings, which the loop fills in).
type Snapshotter interface {
	Snapshot() topology.Snapshot
	// Synced reports whether the local caches have been listed once; the
	// loop does not apply anything before, so a restart never removes state
	// because the caches are still empty.
	Synced() bool
}

// SelfSource reads this node's live facts (addresses, tunnel device, the
// endpoints the device learned, its public key).
type SelfSource interface {
	Self(ctx context.Context) (topology.Self, error)
}

// WireGuard applies the desired device and reports how many peers changed.
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

// RejectionSink turns rejections into Events, logs and metrics, once each.
type RejectionSink interface {
	Report(ctx context.Context, rejections []topology.Rejection)
}

// Changes counts what an actuator changed, by kind of object ("peer",
// "route", ...), for logs and meshlet_dataplane_changes_total.
type Changes map[string]int

// Loop is the reconcile loop.
type Loop struct {
	Node       string
	Settings   topology.Settings
	Snapshots  Snapshotter
	Self       SelfSource
	WireGuard  WireGuard
	Host       Host
	Publisher  Publisher
	Rejections RejectionSink
	Metrics    *metrics.Agent
	Log        *slog.Logger
	// OnPlan is called with every computed plan before it is applied (e.g.
	// to start remote watchers on a new leader, or label peer metrics).
	OnPlan func(topology.Plan)
	// Debounce gathers a burst of events into one run (≤ 100 ms).
	Debounce time.Duration
	// Resync runs the loop periodically even without events.
	Resync time.Duration
	Now    func() time.Time

	mu          sync.Mutex
	pending     bool
	firstChange time.Time
	wake        chan struct{}
	once        sync.Once

	ready   atomic.Bool
	lastErr atomic.Pointer[string]
	runs    atomic.Int64
	// nextChange is when the last snapshot's readiness changes by itself
	// (a last-seen ageing out), as unix nanoseconds; 0 = never.
	nextChange atomic.Int64
}

func (l *Loop) init() {
	l.once.Do(func() {
		l.wake = make(chan struct{}, 1)
		if l.Now == nil {
			l.Now = time.Now
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
	l.pending = true
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// Ready reports whether the caches synced and the last apply succeeded.
func (l *Loop) Ready() bool { return l.ready.Load() }

// Runs returns the number of completed runs (for tests and status).
func (l *Loop) Runs() int64 { return l.runs.Load() }

// LastError returns the error of the last run, or "".
func (l *Loop) LastError() string {
	if p := l.lastErr.Load(); p != nil {
		return *p
	}
	return ""
}

// Run runs the loop until ctx ends. It never tears the data plane down:
// on shutdown everything stays as it is, so a restart drops no session.
func (l *Loop) Run(ctx context.Context) error {
	l.init()
	resync := time.NewTicker(l.Resync)
	defer resync.Stop()
	var debounce <-chan time.Time
	var retry, expiry *time.Timer
	defer func() {
		if retry != nil {
			retry.Stop()
		}
		if expiry != nil {
			expiry.Stop()
		}
	}()
	l.Notify(time.Time{})
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-l.wake:
			if debounce == nil {
				debounce = time.After(l.Debounce)
			}
		case <-resync.C:
			l.Notify(time.Time{})
		case <-debounce:
			debounce = nil
			l.mu.Lock()
			first := l.firstChange
			l.firstChange = time.Time{}
			l.pending = false
			l.mu.Unlock()
			if err := l.RunOnce(ctx, first); err != nil && ctx.Err() == nil {
				l.Log.Error("reconcile failed", "node", l.Node, "err", err)
				// Retry soon: a transient failure (API server, netlink busy)
				// should not wait for the resync period.
				if retry != nil {
					retry.Stop()
				}
				retry = time.AfterFunc(time.Second, func() { l.Notify(time.Time{}) })
			}
			// Re-plan when a node's last-seen ages out (see
			// topology.NextReadinessChange); a little after, so the
			// planner sees it stale.
			if expiry != nil {
				expiry.Stop()
				expiry = nil
			}
			if next := l.nextChange.Load(); next != 0 {
				wait := time.Duration(next-l.Now().UnixNano()) + 100*time.Millisecond
				expiry = time.AfterFunc(max(wait, 0), func() { l.Notify(time.Time{}) })
			}
		}
	}
}

// RunOnce computes and applies one plan. first is the time the oldest
// change behind this run was seen (zero when unknown).
func (l *Loop) RunOnce(ctx context.Context, first time.Time) (err error) {
	l.init()
	start := l.Now()
	defer func() {
		l.runs.Add(1)
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
			l.Metrics.ReconcileDuration.Observe(l.Now().Sub(start).Seconds())
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
	snap := l.Snapshots.Snapshot()
	snap.Now = l.Now()
	snap.Settings = l.Settings
	plan := topology.Compute(snap, self)
	if next := topology.NextReadinessChange(snap); next.IsZero() {
		l.nextChange.Store(0)
	} else {
		l.nextChange.Store(next.UnixNano())
	}
	if l.OnPlan != nil {
		l.OnPlan(plan)
	}
	if l.Rejections != nil {
		l.Rejections.Report(ctx, plan.Rejections)
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
	changed := l.record(plan, wgChanges, hostChanges, patched)
	if changed > 0 {
		l.Log.Info("applied plan", "node", l.Node, "leader", plan.Leader, "segment", plan.Segment,
			"peers", len(plan.WireGuard.Peers), "routes", len(plan.Routes), "wireguard", map[string]int(wgChanges),
			"host", map[string]int(hostChanges), "annotations", patched)
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	if !first.IsZero() && l.Metrics != nil {
		l.Metrics.Convergence.Observe(l.Now().Sub(first).Seconds())
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
