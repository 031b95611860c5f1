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

	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"

	"github.com/meshlet/meshlet/agent/core/clustermesh"
	"github.com/meshlet/meshlet/agent/core/planner"
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
// InitiateHandshakes runs after the host is applied (the link up): it greets
// the peers the apply added, so a session the other side still holds is
// replaced at once (wg.Manager.InitiateHandshakes). ActOnSessions carries
// out the plan's half-dead session actions (probe, re-create; nil: none).
type WireGuard interface {
	Apply(ctx context.Context, dev topology.Device) (Changes, error)
	InitiateHandshakes(ctx context.Context) (int, error)
	ActOnSessions(ctx context.Context, acts *topology.SessionActions) error
}

// Host applies everything else: link, addresses, routes, rules, tunnel,
// iptables.
type Host interface {
	Apply(ctx context.Context, plan topology.Plan) (Changes, error)
}

// Publisher is the one writer of Nodes: this node's annotations (only the
// ones that differ), and the removal of meshlet's leader mark from the
// nodes the plan names.
type Publisher interface {
	Publish(ctx context.Context, annotations map[string]string) (patched bool, err error)
	Unmark(ctx context.Context, nodes []string) (removed int, err error)
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
	// Debounce bounds the window that gathers a burst of events into one
	// run (default 100 ms; see schedule).
	Debounce time.Duration
	// Resync runs the loop periodically even without events.
	Resync time.Duration
	// Clock drives every timer of the loop (nil = the real clock).
	Clock clock.WithTicker

	mu          sync.Mutex
	firstChange time.Time
	changes     int  // notifications since the last run started
	urgent      bool // a NotifyNow since the last run started
	wake        chan struct{}
	once        sync.Once
	sched       schedule
	// retries spaces the runs that follow failed ones (client-go's
	// per-item exponential limiter; one item: the node's plan).
	retries workqueue.TypedRateLimiter[string]
	// runDone, when set (tests), gets a value after every run of Run has
	// finished, timers included.
	runDone chan struct{}

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
		l.sched.max = l.Debounce
		l.retries = workqueue.NewTypedItemExponentialFailureRateLimiter[string](retryFirst, retryMax)
		if l.Resync <= 0 {
			l.Resync = 30 * time.Second
		}
	})
}

// Notify schedules a run. seen is when a watcher saw the change (zero for
// changes without an object, like a netlink event); the earliest pending
// one is the start of the convergence measurement.
func (l *Loop) Notify(seen time.Time) { l.notify(seen, false) }

// NotifyNow schedules a run that does not wait for a storm's window, only
// minWindow after the last run: for what the node itself reports (a route
// deleted, the device drifted, a half-dead session's reading to judge),
// which comes one at a time and costs traffic while it waits; a storm of
// cluster events keeps its window.
func (l *Loop) NotifyNow(seen time.Time) { l.notify(seen, true) }

func (l *Loop) notify(seen time.Time, urgent bool) {
	l.init()
	l.mu.Lock()
	if !seen.IsZero() && (l.firstChange.IsZero() || seen.Before(l.firstChange)) {
		l.firstChange = seen
	}
	l.changes++
	l.urgent = l.urgent || urgent
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

// schedule decides when a run starts for a change seen at a given time:
// at once when the loop has been idle for a window, else when the window
// after the last run ends. A lone change is thus applied as soon as it is
// seen, and a run held back takes everything that arrived meanwhile. The
// window is as long as the last run took (during a storm the loop runs at
// most about half the time), at least minWindow, doubled after every held
// run that gathered several changes (a storm becomes a few runs a second,
// while a sequence of single changes keeps the short window), never more
// than max; a run started at once resets it.
type schedule struct {
	max      time.Duration
	ran      bool
	lastEnd  time.Time
	lastTook time.Duration
	grown    time.Duration // the storm's window; 0 = minWindow
}

// minWindow is the shortest trailing window: the events of one change
// (a Node and the Peers it brings, a ClusterMesh and its Secret) arrive
// within a few milliseconds of each other.
const minWindow = 20 * time.Millisecond

// start is when a run for a change seen at now starts (urgent: minWindow
// after the last run, whatever the storm's window).
func (s *schedule) start(now time.Time, urgent bool) time.Time {
	if !s.ran {
		return now
	}
	w := s.window()
	if urgent {
		w = minWindow
	}
	if end := s.lastEnd.Add(w); end.After(now) {
		return end
	}
	return now
}

func (s *schedule) window() time.Duration {
	return min(max(s.lastTook, minWindow, s.grown), s.max)
}

// done records a run from start to end; held says it waited for a window,
// changes how many notifications it took.
func (s *schedule) done(start, end time.Time, held bool, changes int) {
	switch {
	case !held:
		s.grown = 0
	case changes > 1:
		s.grown = min(2*max(s.grown, minWindow), s.max)
	}
	s.ran, s.lastEnd, s.lastTook = true, end, end.Sub(start)
}

// The backoff of runs after failures (Run).
const (
	retryItem  = "plan"
	retryFirst = time.Second
	retryMax   = 5 * time.Second
)

// Run runs the loop until ctx ends. It never tears the data plane down:
// on shutdown everything stays as it is, so a restart drops no session.
func (l *Loop) Run(ctx context.Context) error {
	l.init()
	resync := l.Clock.NewTicker(l.Resync)
	defer resync.Stop()
	// pending holds a change back for the schedule; retry follows a failed
	// run; expiry fires when a node's last-seen ages out.
	var pending, retry, expiry clock.Timer
	var pendingAt time.Time // when pending fires
	defer func() { stop(pending); stop(retry); stop(expiry) }()
	run := func() {
		held := pending != nil
		stop(pending)
		pending = nil
		l.mu.Lock()
		first, changes := l.firstChange, l.changes
		l.firstChange, l.changes, l.urgent = time.Time{}, 0, false
		l.mu.Unlock()
		stop(retry)
		retry = nil
		start := l.Clock.Now()
		if err := l.RunOnce(ctx, first); err != nil && ctx.Err() == nil {
			// Retry soon: a transient failure (API server, netlink busy)
			// should not wait for the resync period; one that persists is
			// retried less and less often (1 s doubling up to 5 s), so a
			// down API server sees no retry storm, and a recovered one is
			// caught up with within 5 s even when no event says so. A
			// success resets it.
			wait := l.retries.When(retryItem)
			l.Log.Error("reconcile failed", "error", err, "retry", wait, "failures", l.retries.NumRequeues(retryItem))
			retry = l.Clock.NewTimer(wait)
		} else {
			l.retries.Forget(retryItem)
		}
		l.sched.done(start, l.Clock.Now(), held, changes)
		// Re-plan when the plan changes with time alone (a node's
		// last-seen ageing out, this node's due for its refresh: see
		// planner.NextChange); a little after, so the planner sees it.
		stop(expiry)
		expiry = nil
		if next := l.nextChange.Load(); next != 0 {
			wait := time.Duration(next-l.Clock.Now().UnixNano()) + topology.ExpirySlack
			expiry = l.Clock.NewTimer(max(wait, 0))
		}
		if l.runDone != nil {
			l.runDone <- struct{}{}
		}
	}
	l.Notify(time.Time{})
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-l.wake:
			l.mu.Lock()
			urgent := l.urgent
			l.mu.Unlock()
			now := l.Clock.Now()
			at := l.sched.start(now, urgent)
			if pending != nil && !at.Before(pendingAt) {
				break // the pending run takes this change too
			}
			if at.After(now) {
				stop(pending) // an urgent change moves it earlier
				pending, pendingAt = l.Clock.NewTimer(at.Sub(now)), at
			} else {
				run() // takes a pending run with it
			}
		case <-resync.C():
			l.Notify(time.Time{})
		case <-timerC(retry):
			retry = nil
			l.Notify(time.Time{})
		case <-timerC(expiry):
			expiry = nil
			l.Notify(time.Time{})
		case <-timerC(pending):
			run()
		}
	}
}

// RunOnce computes and applies one plan. first is the time the oldest
// change behind this run was seen (zero when unknown). The flow is
// straight: compute, write the data plane, publish, let the followers
// (remote watchers, ClusterMesh status, the Lease, Events) act on the
// plan, record.
func (l *Loop) RunOnce(ctx context.Context, first time.Time) (err error) {
	l.init()
	start := l.Clock.Now()
	var planned *topology.Plan
	defer func() { l.finish(start, planned, err) }()
	plan, kubeconfigs, err := l.compute(ctx)
	if err != nil {
		return err
	}
	planned = &plan

	wgChanges, hostChanges, errs := l.applyDataPlane(ctx, plan, first)
	patched, err := l.Publisher.Publish(ctx, plan.Annotations)
	if err != nil {
		errs = append(errs, fmt.Errorf("publishing annotations: %w", err))
	}
	errs = append(errs, l.follow(ctx, plan, kubeconfigs, len(errs) == 0, start)...)
	if changed := l.record(plan, wgChanges, hostChanges, patched); changed > 0 {
		l.Log.Info("applied plan", "leader", plan.Leader, "segment", plan.Segment,
			"peers", len(plan.WireGuard.Peers), "routes", len(plan.Routes), "wireguard", map[string]int(wgChanges),
			"host", map[string]int(hostChanges), "annotations", patched)
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	l.ready.Store(true)
	return nil
}

// compute reads the node's facts and the snapshot and plans.
func (l *Loop) compute(ctx context.Context) (topology.Plan, []clustermesh.Kubeconfig, error) {
	if !l.Snapshots.Synced() {
		return topology.Plan{}, nil, errors.New("caches not synced yet")
	}
	self, err := l.Self.Self(ctx)
	if err != nil {
		return topology.Plan{}, nil, fmt.Errorf("reading this node's facts: %w", err)
	}
	self.Name = l.Node
	snap, kubeconfigs := l.Snapshots.Snapshot()
	snap.Now = l.Clock.Now()
	snap.Settings = l.Settings
	plan := planner.Compute(snap, self)
	if next := planner.NextChange(snap, self); next.IsZero() {
		l.nextChange.Store(0)
	} else {
		l.nextChange.Store(next.UnixNano())
	}
	return plan, kubeconfigs, nil
}

// applyDataPlane writes the device, the sessions' actions and the host,
// and starts handshakes once all of it is written.
func (l *Loop) applyDataPlane(ctx context.Context, plan topology.Plan, first time.Time) (wgChanges, hostChanges Changes, errs []error) {
	wgChanges, err := l.WireGuard.Apply(ctx, plan.WireGuard)
	if err != nil {
		errs = append(errs, fmt.Errorf("applying WireGuard device: %w", err))
	}
	// The half-dead sessions of kg-run peers, whatever else failed (the
	// actions touch only peers already on the device).
	if err := l.WireGuard.ActOnSessions(ctx, plan.Sessions); err != nil {
		errs = append(errs, fmt.Errorf("acting on WireGuard sessions: %w", err))
	}
	hostChanges, err = l.Host.Apply(ctx, plan)
	if err != nil {
		errs = append(errs, fmt.Errorf("applying host network: %w", err))
	}
	if len(errs) > 0 {
		return wgChanges, hostChanges, errs
	}
	if !first.IsZero() && l.Metrics != nil {
		// From the watch event to the data plane written; publishing the
		// annotations and reporting come after and are not part of it.
		l.Metrics.Convergence.Observe(l.Clock.Since(first).Seconds())
	}
	if _, err := l.WireGuard.InitiateHandshakes(ctx); err != nil {
		errs = append(errs, fmt.Errorf("starting WireGuard handshakes: %w", err))
	}
	return wgChanges, hostChanges, errs
}

// follow hands the plan to what acts on it beside the data plane: leader
// marks, remote watchers, ClusterMesh status, the Lease (told whether the
// run so far succeeded), Events and the per-peer metric labels.
func (l *Loop) follow(ctx context.Context, plan topology.Plan, kubeconfigs []clustermesh.Kubeconfig, ok bool, start time.Time) []error {
	var errs []error
	if ld := plan.Leadership; ld != nil && len(ld.Unmark) > 0 {
		n, err := l.Publisher.Unmark(ctx, ld.Unmark)
		if err != nil {
			errs = append(errs, fmt.Errorf("removing leader marks: %w", err))
		}
		if n > 0 {
			l.Log.Info("removed meshlet's leader marks", "nodes", ld.Unmark, "removed", n, "location", ld.Location)
		}
	}
	if l.Remotes != nil {
		l.Remotes.Reconcile(plan.Leader, kubeconfigs)
	}
	if l.MeshStatus != nil {
		l.MeshStatus.Follow(plan)
	}
	if l.Leadership != nil {
		if err := l.Leadership.Follow(ctx, plan, ok && len(errs) == 0, start); err != nil {
			errs = append(errs, fmt.Errorf("leadership: %w", err))
		}
	}
	if l.Rejections != nil {
		l.Rejections.Report(ctx, plan)
	}
	if l.PeerLabels != nil {
		l.PeerLabels.SetPeers(plan.WireGuard.Peers)
	}
	return errs
}

// finish records a run's outcome: the last plan, readiness, metrics.
func (l *Loop) finish(start time.Time, planned *topology.Plan, err error) {
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
	v4 := 0
	for _, r := range plan.Routes {
		if r.Dst.Addr().Is4() {
			v4++
		}
	}
	l.Metrics.Routes.WithLabelValues("ipv4").Set(float64(v4))
	l.Metrics.Routes.WithLabelValues("ipv6").Set(float64(len(plan.Routes) - v4))
	if patched {
		l.Metrics.AnnotationPatches.Inc()
	}
	return n
}
