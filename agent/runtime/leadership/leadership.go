// Package leadership is this node's part in its location's Lease
// (docs/failover.md): it watches the Lease, takes a free or expired one in
// the order the plan gives (Leadership.Wait), renews it, gives it up when
// the plan says so, writes an Event for every change of leader and
// step-aside, and keeps the history of this node's role for /status. It
// writes only the Lease: the leader marks (Kilo's leader annotation with
// meshlet's value on the holder, removed from a former holder) are the
// plan's, written by the one writer of Nodes (cluster.Publisher).
//
// It talks to coordination.k8s.io directly rather than through client-go's
// leaderelection: candidates take a free Lease in Kilo's order (a delay per
// rank, decided by the planner), a holder gives it up in the middle of a
// term when it is degraded, recording why in the Lease, and the planner
// reads the Lease as an observation (its holder, and until when the holder
// is presumed alive). Like leaderelection, expiry is judged on this agent's
// own clock from when it saw the Lease change (never from the holder's
// renewTime, so clock skew between nodes does not matter), and every write
// is an update with the resourceVersion last seen, so two candidates never
// both take it.
package leadership

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"

	"github.com/meshlet/meshlet/agent/core/failover"
	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/agent/runtime/metrics"
)

// Annotations meshlet keeps on a location's Lease.
const (
	// AnnotationStepAsides: the nodes that gave leadership up for their
	// health, with reason and time (JSON), so every candidate skips them
	// while they cool down; entries older than the cool-down are dropped.
	AnnotationStepAsides = "meshlet.io/step-asides"
	// AnnotationReleased: who released the Lease last, and why.
	AnnotationReleased = "meshlet.io/released"
	// AnnotationRestarting: the holder's agent stopped for a restart at
	// this time (RFC 3339) and stretched the Lease's duration to the
	// restart grace, so its next process resumes it (docs/failover.md#restart).
	AnnotationRestarting = "meshlet.io/restarting"
)

// Reasons of a leader change (meshlet_leader_changes_total, Events).
const (
	ChangeFirst    = "First"
	ChangeReleased = "Released"
	ChangeExpired  = "Expired"
	// ChangeForeign: the holder was none of the location's Ready nodes
	// (failover.ForeignHolder), ignored and taken over.
	ChangeForeign = failover.ReasonForeignLeaseHolder
)

// Defaults (docs/failover.md#timing).
const (
	DefaultDuration = 3 * time.Second
	DefaultRenew    = time.Second
)

// Elector runs this node's part in its location's Lease.
type Elector struct {
	Client    kubernetes.Interface
	Namespace string
	Identity  string // this node
	// Duration is the Lease's duration: a holder that has not renewed for
	// this long, as a candidate sees, is presumed dead. Renew is how often
	// the holder renews.
	Duration, Renew time.Duration
	// NodeUID finds a Node's UID for Events.
	NodeUID  func(node string) (types.UID, bool)
	Recorder record.EventRecorder // nil: no Events
	Metrics  *metrics.Leadership  // nil: no metrics
	Notify   func(seen time.Time)
	Log      *slog.Logger
	Clock    clock.WithTicker

	mu        sync.Mutex
	ctx       context.Context
	wake      chan struct{}
	intent    *topology.Leadership
	name      string
	watching  bool               // Watch was called (name "" = none)
	cancel    context.CancelFunc // the watch of name
	informer  cache.SharedIndexInformer
	rec       *coordinationv1.Lease // as last seen or written; nil = none
	changedAt time.Time             // when rec was last seen or written
	broken    bool                  // the watch failed since the last delivery
	brokenAt  time.Time
	reread    bool      // broken by a failed write: read the Lease to mend the view
	freeSince time.Time // when rec was seen free (or absent)
	// candidateSince: when the plan last made this node a candidate for
	// the Lease it watches. A candidate's rank stagger counts from the
	// later of this and freeSince, so a node that becomes a candidate for a
	// Lease free for long (its location just became governed: every node
	// runs meshlet now) does not take it ahead of the nodes Kilo's order
	// puts first, which became candidates at the same moment.
	candidateSince time.Time
	// takesAt: when this candidate takes the free Lease unless something
	// changes first (zero: it does not wait for one).
	takesAt   time.Time
	renewedAt time.Time // this node's last successful renewal
	// expiryNoted: the loop was woken for the holder's presumed death in
	// this view (step); the next delivery clears it.
	expiryNoted bool
	stepAside   *topology.StepAside
	// leaving: the step-aside of a node going away was reported (it does
	// not cool down, so it is not a stepAside).
	leaving bool
	// suspend: the restart grace the next renewal writes, then renewals
	// stop (Suspend); suspended is closed once it was written.
	suspend   time.Duration
	suspended chan struct{}
	held      bool
	roles     []Role
	leading   bool
	haveRole  bool
	// governance is the location's last logged rule (location, Lease or
	// Kilo's rule, why).
	governance string
	// locationNodes are the Ready nodes of this node's location as the
	// last plan saw them (its segment): the only valid holders of its
	// Lease. reports: this node leads the location in that plan, so it
	// writes the Event about a foreign holder (one per location).
	locationNodes []string
	reports       bool
	// foreign is the holder last judged no node of the location, since
	// foreignSince: it is treated as a holder that stopped renewing then.
	foreign      string
	foreignSince time.Time
}

// Role is one change of this node's role: from At on, it was (Leader) or
// was not configured as its location's leader. Changes to leader are
// stamped when the run that configured it started, changes away from it
// when the device was down: overlaps are never understated.
type Role struct {
	At     time.Time `json:"at"`
	Leader bool      `json:"leader"`
}

// maxRoles is how many role changes /status keeps.
const maxRoles = 64

func (e *Elector) clock() clock.WithTicker {
	if e.Clock == nil {
		return clock.RealClock{}
	}
	return e.Clock
}

func (e *Elector) log() *slog.Logger {
	if e.Log == nil {
		return slog.Default()
	}
	return e.Log
}

// Start runs the elector until ctx ends.
func (e *Elector) Start(ctx context.Context) {
	if e.Duration <= 0 {
		e.Duration = DefaultDuration
	}
	if e.Renew <= 0 {
		e.Renew = DefaultRenew
	}
	e.mu.Lock()
	e.ctx = ctx
	e.wake = make(chan struct{}, 1)
	e.mu.Unlock()
	go e.run(ctx)
}

// Watch makes the elector watch the Lease called name (the plan's, or at
// start the one of this node's location, so a restarted holder renews it
// before its first plan).
func (e *Elector) Watch(name string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ctx == nil || e.watching && name == e.name {
		return
	}
	e.watching = true
	if e.cancel != nil {
		e.cancel()
	}
	e.name, e.rec, e.informer, e.held = name, nil, nil, false
	e.changedAt, e.freeSince, e.reread = time.Time{}, time.Time{}, false
	if name == "" {
		e.cancel = nil
		return
	}
	ctx, cancel := context.WithCancel(e.ctx)
	e.cancel = cancel
	lw := cache.NewListWatchFromClient(e.Client.CoordinationV1().RESTClient(), "leases", e.Namespace,
		fields.OneTermEqualSelector("metadata.name", name))
	inf := cache.NewSharedIndexInformer(lw, &coordinationv1.Lease{}, 0, cache.Indexers{})
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { e.seen(name, obj, false) },
		UpdateFunc: func(_, obj any) { e.seen(name, obj, false) },
		DeleteFunc: func(obj any) { e.seen(name, obj, true) },
	})
	_ = inf.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
		e.mu.Lock()
		if e.name == name {
			e.broken, e.brokenAt = true, e.clock().Now()
		}
		e.mu.Unlock()
		e.log().Debug("Lease watch failed", "lease", e.Namespace+"/"+name, "error", err)
	})
	e.informer = inf
	go inf.Run(ctx.Done())
	go func() {
		if cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
			e.mu.Lock()
			if e.name == name && e.rec == nil && e.freeSince.IsZero() {
				e.freeSince = e.clock().Now() // listed: there is none
			}
			e.mu.Unlock()
			e.poke()
			e.notify()
		}
	}()
}

// Synced reports whether the watched Lease has been listed once (true
// when told to watch none).
func (e *Elector) Synced() bool {
	e.mu.Lock()
	inf, watching, name := e.informer, e.watching, e.name
	e.mu.Unlock()
	return watching && (name == "" || inf != nil && inf.HasSynced())
}

// Name is the Lease watched ("" before Watch).
func (e *Elector) Name() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.name
}

// seen records a delivery of the watched Lease: any delivery (a relist
// included) is proof the view is current, and the holder is presumed alive
// for a Lease duration from it.
func (e *Elector) seen(name string, obj any, deleted bool) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	l, ok := obj.(*coordinationv1.Lease)
	if !ok {
		return
	}
	now := e.clock().Now()
	e.mu.Lock()
	if e.name != name {
		e.mu.Unlock()
		return
	}
	// A delivery after a broken view, or after the holder was presumed
	// dead, changes the plan even when it is only a renewal.
	prev, before, stale := holderOf(e.rec), planView(e.rec), e.broken || e.expiryNoted
	if deleted {
		e.rec = nil
	} else if e.rec == nil || e.rec.ResourceVersion != l.ResourceVersion || e.broken {
		e.rec = l.DeepCopy()
	}
	e.changedAt, e.broken, e.reread, e.expiryNoted = now, false, false, false
	cur := holderOf(e.rec)
	if cur == "" && (prev != "" || e.freeSince.IsZero()) {
		e.freeSince = now
	}
	e.held = cur == e.Identity
	replan := stale || planView(e.rec) != before
	e.mu.Unlock()
	if cur != prev {
		e.log().Info("location Lease", "lease", e.Namespace+"/"+name, "holder", cur, "previous", prev)
	}
	e.poke()
	// A renewal only moves the holder's freshness, which changes no plan
	// until it runs out (step wakes the loop then): every node of the
	// location would otherwise plan once a renewal, once a second
	// (docs/performance.md#idle).
	if replan {
		e.notify()
	}
}

// planView is what of a Lease the planner sees besides its freshness
// (State): the holder, the duration and the step-asides.
func planView(l *coordinationv1.Lease) string {
	if l == nil {
		return "none"
	}
	var d int32
	if l.Spec.LeaseDurationSeconds != nil {
		d = *l.Spec.LeaseDurationSeconds
	}
	return fmt.Sprintf("%s|%d|%s", holderOf(l), d, l.Annotations[AnnotationStepAsides])
}

func holderOf(l *coordinationv1.Lease) string {
	if l == nil || l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

func (e *Elector) poke() {
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

func (e *Elector) notify() {
	if e.Notify != nil {
		e.Notify(time.Time{})
	}
}

// State is the Lease as this agent sees it, for the planner's snapshot.
func (e *Elector) State() *topology.LeaseState {
	e.mu.Lock()
	defer e.mu.Unlock()
	st := &topology.LeaseState{Name: e.name, Exists: e.rec != nil, Holder: holderOf(e.rec), Duration: e.leaseDuration(), Fresh: e.fresh()}
	st.StepAsides = stepAsides(e.rec)
	if sa := e.stepAside; sa != nil {
		if st.StepAsides == nil {
			st.StepAsides = map[string]topology.StepAside{}
		}
		if cur, ok := st.StepAsides[e.Identity]; !ok || cur.At.Before(sa.At) {
			st.StepAsides[e.Identity] = *sa
		}
	}
	return st
}

// fresh: the holder is presumed alive until fresh + duration; while the
// watch is broken, nothing can be concluded and it moves with the clock.
// Call with e.mu held.
func (e *Elector) fresh() time.Time {
	if e.broken {
		return e.clock().Now()
	}
	return e.changedAt
}

// leaseDuration is the duration the holder wrote (all agents agree on it
// even when their flags differ), else this agent's. Call with e.mu held.
func (e *Elector) leaseDuration() time.Duration {
	if e.rec != nil && e.rec.Spec.LeaseDurationSeconds != nil && *e.rec.Spec.LeaseDurationSeconds > 0 {
		return time.Duration(*e.rec.Spec.LeaseDurationSeconds) * time.Second
	}
	return e.Duration
}

func stepAsides(l *coordinationv1.Lease) map[string]topology.StepAside {
	if l == nil || l.Annotations[AnnotationStepAsides] == "" {
		return nil
	}
	var m map[string]topology.StepAside
	if err := json.Unmarshal([]byte(l.Annotations[AnnotationStepAsides]), &m); err != nil {
		return nil
	}
	return m
}

// Roles returns this node's role changes, oldest first.
func (e *Elector) Roles() []Role {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]Role(nil), e.roles...)
}

// Status is what /status shows of the elector.
type Status struct {
	Lease  string `json:"lease,omitempty"`
	Holder string `json:"holder,omitempty"`
	Held   bool   `json:"held"`
	// TakesAt: when this candidate takes the free Lease, its rank's
	// stagger counted out, unless something changes first.
	TakesAt   time.Time           `json:"takesAt,omitzero"`
	RenewedAt time.Time           `json:"renewedAt,omitzero"`
	Roles     []Role              `json:"roles"`
	StepAside *topology.StepAside `json:"stepAside,omitempty"`
}

// Status returns the elector's state.
func (e *Elector) Status() Status {
	e.mu.Lock()
	defer e.mu.Unlock()
	st := Status{Lease: e.name, Holder: holderOf(e.rec), Held: e.held, TakesAt: e.takesAt, RenewedAt: e.renewedAt, Roles: append([]Role{}, e.roles...), StepAside: e.stepAside}
	if st.Lease != "" {
		st.Lease = e.Namespace + "/" + st.Lease
	}
	return st
}

// Follow takes the plan's decisions (after the loop applied the data
// plane; applied is false when that failed, started is when the run
// began): the Lease to watch and what to do with it, the role history. It
// writes nothing itself (the Lease is written on the elector's own
// schedule, whose failures it logs and retries), so it returns no error;
// the error is reconcile.Leadership's, which the health prober shares.
func (e *Elector) Follow(ctx context.Context, plan topology.Plan, applied bool, started time.Time) error {
	e.recordRole(plan.Leader, applied, started)
	l := plan.Leadership
	if l == nil {
		return nil
	}
	if l.Lease != "" || l.Release == "" {
		e.Watch(l.Lease)
	}
	e.mu.Lock()
	if candidate := l.Candidate && l.Lease != ""; !candidate {
		e.candidateSince = time.Time{}
	} else if prev := e.intent; e.candidateSince.IsZero() || prev == nil || !prev.Candidate || prev.Lease != l.Lease {
		e.candidateSince = e.clock().Now()
	}
	e.intent = l
	e.locationNodes, e.reports = nil, plan.Leader
	for _, s := range plan.Segments {
		if s.Name == plan.Segment {
			e.locationNodes = s.Nodes
		}
	}
	g := fmt.Sprint(l.Location, l.Governed, l.Why)
	logGov := g != e.governance && l.Location != ""
	e.governance = g
	e.mu.Unlock()
	if logGov {
		// A location that also holds kg nodes keeps Kilo's rule: kg cannot
		// follow a Lease (docs/failover.md#governed).
		e.log().Info("location leadership", "location", l.Location, "governed", l.Governed, "lease", e.Namespace+"/"+l.Lease, "why", l.Why)
	}
	if l.StepAside != "" {
		e.stepAsideOnce(ctx, *l)
	}
	if l.StepAside != failover.ReasonLeaving {
		e.mu.Lock()
		e.leaving = false // uncordoned, say: the next one is reported again
		e.mu.Unlock()
	}
	if e.Metrics != nil {
		for _, r := range []string{failover.ReasonWireGuardDegraded, failover.ReasonGatewayUnreachable} {
			v := 0.0
			if l.Degraded == r {
				v = 1
			}
			e.Metrics.Degraded.WithLabelValues(r).Set(v)
		}
	}
	e.poke()
	return nil
}

// recordRole keeps the history of this node's role: a change to leader
// from when the run started (applied or not: it may be configured), a
// change away only once the apply succeeded.
func (e *Elector) recordRole(leader, applied bool, started time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.haveRole && leader == e.leading {
		return
	}
	var at time.Time
	switch {
	case leader:
		at = started
	case applied:
		at = e.clock().Now()
	default:
		return
	}
	e.haveRole, e.leading = true, leader
	e.roles = append(e.roles, Role{At: at, Leader: leader})
	if len(e.roles) > maxRoles {
		e.roles = e.roles[len(e.roles)-maxRoles:]
	}
}

// stepAsideOnce records a step-aside (once per cool-down): the planner
// keeps saying StepAside while this node still carries its mark.
func (e *Elector) stepAsideOnce(ctx context.Context, l topology.Leadership) {
	now := e.clock().Now()
	e.mu.Lock()
	switch {
	case l.StepAside == failover.ReasonLeaving:
		// Going away is no fault of the node's: no cool-down to record.
		if e.leaving {
			e.mu.Unlock()
			return
		}
		e.leaving = true
	case e.stepAside != nil && now.Before(e.stepAside.At.Add(failover.StepAsideCoolDown)):
		e.mu.Unlock()
		return
	default:
		e.stepAside = &topology.StepAside{Reason: l.StepAside, At: now}
	}
	e.mu.Unlock()
	e.log().LogAttrs(ctx, slog.LevelWarn, "giving leadership of the location up",
		slog.String("location", l.Location), slog.String("reason", l.StepAside), slog.String("lease", e.Namespace+"/"+l.Lease))
	if e.Metrics != nil {
		e.Metrics.StepAsides.WithLabelValues(l.StepAside).Inc()
	}
	e.event(corev1.EventTypeWarning, "LeaderSteppedAside", fmt.Sprintf("%s gives leadership of location %s up: %s (%s)",
		e.Identity, l.Location, l.StepAside, stepAsideWhy(l.StepAside)))
}

func stepAsideWhy(reason string) string {
	switch reason {
	case failover.ReasonGatewayUnreachable:
		return "its underlay gateway stopped answering"
	case failover.ReasonWireGuardDegraded:
		return "its tunnels to the other leaders are dead while theirs to each other are alive"
	case failover.ReasonLeaving:
		return "its node is going away (cordoned, being deleted, or its agent stops for good)"
	}
	return reason
}

func (e *Elector) event(typ, reason, msg string) {
	if e.Recorder == nil {
		return
	}
	ref := &corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: e.Identity}
	if e.NodeUID != nil {
		ref.UID, _ = e.NodeUID(e.Identity)
	}
	e.Recorder.Event(ref, typ, reason, msg)
}

// Suspend keeps this node's Lease across a restart of its agent
// (docs/failover.md#restart): if it holds the Lease, one last renewal
// writes grace as the Lease's duration, so the candidates presume the
// holder alive that long and the next process of this node (the same
// identity) resumes the Lease with the usual duration; then the elector
// stops renewing. It reports whether the Lease was held and suspended.
func (e *Elector) Suspend(ctx context.Context, grace time.Duration) (bool, error) {
	e.mu.Lock()
	if e.ctx == nil || !e.held || holderOf(e.rec) != e.Identity || grace < time.Second {
		e.mu.Unlock()
		return false, nil
	}
	done := make(chan struct{})
	e.suspend, e.suspended = grace, done
	e.mu.Unlock()
	e.poke()
	select {
	case <-done:
		return true, nil
	case <-ctx.Done():
		e.mu.Lock()
		e.suspend = 0 // stays suspended: no renewal after this
		e.mu.Unlock()
		return false, fmt.Errorf("stretching the location Lease for the restart: %w", ctx.Err())
	}
}

// Held reports whether this node holds its location's Lease as last seen.
func (e *Elector) Held() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.held && holderOf(e.rec) == e.Identity
}

// run acts on the Lease: renew while held, take it when free for long
// enough, give it up when told.
func (e *Elector) run(ctx context.Context) {
	var timer clock.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		next := e.step(ctx)
		if timer != nil {
			timer.Stop()
		}
		var tc <-chan time.Time
		if !next.IsZero() {
			timer = e.clock().NewTimer(max(next.Sub(e.clock().Now()), time.Millisecond))
			tc = timer.C()
		}
		select {
		case <-ctx.Done():
			return
		case <-e.wake:
		case <-tc:
		}
	}
}

// action is what step decided to do.
type action int

const (
	none action = iota
	renew
	acquire
	release
	// reread: a candidate whose view failed reads the Lease before it may
	// judge its holder again.
	reread
)

// step does what is due and returns when to look again (zero: at the next
// wake): it decides under the lock (decide), reports what it saw, and then
// writes the Lease without it.
func (e *Elector) step(ctx context.Context) time.Time {
	t, ok := e.decide(e.clock().Now())
	if !ok {
		return time.Time{}
	}
	if t.expired {
		e.notify()
	}
	if t.reportForeign != "" {
		e.foreignHolder(ctx, t.loc, t.name, t.reportForeign, t.rec, t.reports)
	}
	switch t.act {
	case renew:
		return e.renew(ctx, t)
	case acquire:
		return e.acquire(ctx, t)
	case reread:
		if _, err := e.read(ctx, t.name); err != nil {
			return t.now.Add(e.Renew / 4)
		}
		return t.now
	case release:
		return e.release(ctx, t)
	}
	return topology.Earliest(t.expiry, t.due)
}

// turn is what one step read of the Elector and decided.
type turn struct {
	now     time.Time
	name    string
	in      *topology.Leadership
	rec     *coordinationv1.Lease
	suspend time.Duration
	loc     string
	reports bool
	// foreign: the holder is no Ready node of the location; reportForeign:
	// first seen so in this step.
	foreign       bool
	reportForeign string
	act           action
	due           time.Time
	reason        string
	// expiry: when the holder's Lease runs out in this view; expired: it
	// just did.
	expiry  time.Time
	expired bool
}

// decide reads the Elector's state and decides this step's action; false
// when there is nothing to do until the next wake (no Lease watched yet,
// or suspended for the next process).
func (e *Elector) decide(now time.Time) (turn, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	t := turn{now: now, name: e.name, in: e.intent, rec: e.rec, suspend: e.suspend, reports: e.reports}
	if t.name == "" || e.informer == nil || !e.informer.HasSynced() {
		return t, false
	}
	if e.suspended != nil && t.suspend == 0 {
		// Suspended: the next process renews.
		return t, false
	}
	if t.in != nil {
		t.loc = t.in.Location
	}
	e.takesAt = time.Time{}
	e.noteForeign(&t)
	held := holderOf(t.rec) == e.Identity
	switch {
	case held && t.in != nil && t.in.Release != "":
		t.act, t.reason = release, t.in.Release
	case held:
		e.renewDue(&t)
	case t.in != nil && t.in.Candidate && t.in.Lease == t.name && e.broken && e.reread:
		t.act = reread
	case t.in != nil && t.in.Candidate && t.in.Lease == t.name && !e.broken:
		e.acquireDue(&t)
	}
	e.noteExpiry(&t)
	return t, true
}

// noteForeign: a holder that is no Ready node of the location
// (failover.ForeignHolder) is presumed dead one Lease duration — this
// agent's, not the one it wrote — after this agent first saw it so,
// however it renews: the grace covers a plan that does not know a new
// node of the location yet.
func (e *Elector) noteForeign(t *turn) {
	holder := holderOf(t.rec)
	t.foreign = t.in != nil && t.in.Governed && t.in.Lease == t.name && holder != e.Identity &&
		failover.ForeignHolder(holder, e.locationNodes)
	switch {
	case !t.foreign:
		e.foreign = ""
	case e.foreign != holder:
		e.foreign, e.foreignSince, t.reportForeign = holder, t.now, holder
	}
}

// renewDue: a holder renews every Renew (at once when stretching the Lease
// for a restart), unless the plan no longer wants it to hold. Before the
// first plan a restarted holder keeps its Lease.
func (e *Elector) renewDue(t *turn) {
	in := t.in
	if in != nil && !in.Hold && (in.Lease != t.name || !in.Candidate) {
		return
	}
	t.due = e.renewedAt.Add(e.Renew)
	if !e.renewedAt.IsZero() && t.now.Before(t.due) && t.suspend == 0 {
		return
	}
	t.act = renew
}

// acquireDue: a candidate takes a free Lease once it has been free (or its
// holder presumed dead) for the plan's wait, counted from when this node
// became a candidate at the earliest.
func (e *Elector) acquireDue(t *turn) {
	holder := holderOf(t.rec)
	var since time.Time
	switch {
	case holder == "":
		since = e.freeSince
	case t.foreign:
		since = e.foreignSince.Add(e.Duration)
	default:
		since = e.changedAt.Add(e.leaseDuration())
	}
	if since.IsZero() {
		return
	}
	if e.candidateSince.After(since) {
		since = e.candidateSince
	}
	t.due = since.Add(t.in.Wait)
	if t.now.Before(t.due) {
		e.takesAt = t.due
		return
	}
	t.act = acquire
	switch {
	case t.rec == nil:
		t.reason = ChangeFirst
	case holder == "":
		t.reason = ChangeReleased
	case t.foreign:
		t.reason = ChangeForeign
	default:
		t.reason = ChangeExpired
	}
}

// noteExpiry: the holder is presumed dead once its Lease runs out in this
// view (failover's holderAlive): the loop plans again then, once, as no
// renewal wakes it.
func (e *Elector) noteExpiry(t *turn) {
	if holderOf(t.rec) == "" || e.broken {
		return
	}
	t.expiry = e.changedAt.Add(e.leaseDuration())
	if !t.now.Before(t.expiry) {
		t.expiry, t.expired = time.Time{}, !e.expiryNoted
		e.expiryNoted = true
	}
}

// renew writes the held Lease's renewal (stretched while suspending for a
// restart).
func (e *Elector) renew(ctx context.Context, t turn) time.Time {
	now, suspend := t.now, t.suspend
	stamp := func(l *coordinationv1.Lease) {
		e.stamp(l, now, false)
		if suspend > 0 {
			secs := int32(suspend / time.Second)
			l.Spec.LeaseDurationSeconds = &secs
			if l.Annotations == nil {
				l.Annotations = map[string]string{}
			}
			l.Annotations[AnnotationRestarting] = now.UTC().Format(time.RFC3339)
		}
	}
	err := e.write(ctx, t.name, t.rec, stamp)
	if apierrors.IsConflict(err) {
		// The Lease changed since this node last saw it — often its own
		// renewal, applied while the answer was lost (an API server
		// restarting): read it now rather than wait for the watch, and
		// renew again if this node still holds it.
		if cur, gerr := e.read(ctx, t.name); gerr == nil && holderOf(cur) == e.Identity {
			err = e.write(ctx, t.name, cur, stamp)
		}
	}
	if err != nil {
		e.log().Warn("renewing the location Lease", "lease", e.Namespace+"/"+t.name, "error", err)
		return now.Add(e.Renew / 4)
	}
	e.mu.Lock()
	e.renewedAt = now
	if suspend > 0 && e.suspend == suspend {
		e.suspend = 0
		close(e.suspended)
	}
	e.mu.Unlock()
	e.setHeld(true)
	return now.Add(e.Renew)
}

// acquire takes the Lease.
func (e *Elector) acquire(ctx context.Context, t turn) time.Time {
	now, name := t.now, t.name
	prev := holderOf(t.rec)
	if err := e.write(ctx, name, t.rec, func(l *coordinationv1.Lease) { e.stamp(l, now, true) }); err != nil {
		if !apierrors.IsConflict(err) && !apierrors.IsAlreadyExists(err) {
			e.log().Warn("taking the location Lease", "lease", e.Namespace+"/"+name, "error", err)
			// The API did not answer: nothing seen since proves the
			// holder dead (its renewals may have failed alike, and an
			// established watch that ends reports nothing). The holder
			// is presumed alive for a Lease duration from when this
			// node reads the Lease again.
			e.mu.Lock()
			if e.name == name {
				e.broken, e.brokenAt, e.reread = true, now, true
			}
			e.mu.Unlock()
		}
		return now.Add(e.Renew / 4)
	}
	e.mu.Lock()
	e.renewedAt = now
	e.mu.Unlock()
	e.setHeld(true)
	e.changed(t.loc, name, prev, t.reason, t.rec)
	e.notify()
	return now.Add(e.Renew)
}

// release gives the held Lease up, recording why.
func (e *Elector) release(ctx context.Context, t turn) time.Time {
	if err := e.write(ctx, t.name, t.rec, func(l *coordinationv1.Lease) { e.giveUp(l, t.now, t.reason) }); err != nil {
		e.log().Warn("releasing the location Lease", "lease", e.Namespace+"/"+t.name, "error", err)
		return t.now.Add(e.Renew / 4)
	}
	e.setHeld(false)
	e.log().Info("released the location Lease", "lease", e.Namespace+"/"+t.name, "reason", t.reason)
	e.notify()
	return topology.Earliest(t.expiry, t.due)
}

// foreignHolder reports a holder of the location's Lease that is none of
// the location's Ready nodes: a log line on every node that sees it, and a
// Warning Event on the Lease from the location's leader.
func (e *Elector) foreignHolder(ctx context.Context, loc, name, holder string, l *coordinationv1.Lease, reports bool) {
	e.log().LogAttrs(ctx, slog.LevelWarn, "the location Lease is held by no node of the location: ignored",
		slog.String("lease", e.Namespace+"/"+name), slog.String("holder", holder), slog.String("location", loc),
		slog.String("reason", failover.ReasonForeignLeaseHolder))
	if e.Recorder == nil || !reports || l == nil {
		return
	}
	ref := &corev1.ObjectReference{Kind: "Lease", APIVersion: "coordination.k8s.io/v1", Namespace: l.Namespace, Name: l.Name, UID: l.UID}
	e.Recorder.Event(ref, corev1.EventTypeWarning, failover.ReasonForeignLeaseHolder, fmt.Sprintf(
		"holder %s is not a Ready node of location %s: ignored; its candidates take the Lease over (docs/security.md#admission)", holder, loc))
}

func (e *Elector) setHeld(v bool) {
	e.mu.Lock()
	e.held = v
	e.mu.Unlock()
	if e.Metrics != nil {
		x := 0.0
		if v {
			x = 1
		}
		e.Metrics.LeaseHeld.Set(x)
	}
}

// changed reports a leader change this node made: a log line, an Event
// and meshlet_leader_changes_total with the reason.
func (e *Elector) changed(loc, name, prev, reason string, old *coordinationv1.Lease) {
	why := "no Lease existed"
	switch reason {
	case ChangeReleased:
		why = "the Lease was free"
		if old != nil && old.Annotations[AnnotationReleased] != "" {
			why = "released by " + old.Annotations[AnnotationReleased]
		}
	case ChangeExpired:
		why = fmt.Sprintf("%s stopped renewing it for %s", prev, e.leaseDurationOf(old))
	case ChangeForeign:
		why = fmt.Sprintf("%s held it, which is not a Ready node of the location", prev)
	}
	e.log().Info("this node leads its location now", "location", loc, "lease", e.Namespace+"/"+name, "reason", reason, "previous", prev, "why", why)
	if e.Metrics != nil {
		e.Metrics.Changes.WithLabelValues(reason).Inc()
	}
	e.event(corev1.EventTypeNormal, "LeaderChanged", fmt.Sprintf("%s leads location %s (Lease %s/%s): %s", e.Identity, loc, e.Namespace, name, why))
}

func (e *Elector) leaseDurationOf(l *coordinationv1.Lease) time.Duration {
	if l != nil && l.Spec.LeaseDurationSeconds != nil {
		return time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
	}
	return e.Duration
}

// stamp makes l this node's: holder, renew time, duration; on a take-over
// also the acquire time and the transition count. Step-asides older than
// the cool-down are dropped.
func (e *Elector) stamp(l *coordinationv1.Lease, now time.Time, take bool) {
	id := e.Identity
	secs := int32(e.Duration / time.Second)
	if secs < 1 {
		secs = 1
	}
	t := metav1.NewMicroTime(now)
	if take {
		l.Spec.AcquireTime = &t
		n := int32(0)
		if l.Spec.LeaseTransitions != nil {
			n = *l.Spec.LeaseTransitions
		}
		n++
		l.Spec.LeaseTransitions = &n
	}
	l.Spec.HolderIdentity, l.Spec.RenewTime, l.Spec.LeaseDurationSeconds = &id, &t, &secs
	delete(l.Annotations, AnnotationRestarting) // back: the usual duration again
	setStepAsides(l, now, nil)
}

// giveUp releases l: no holder, and for a health reason this node's
// step-aside recorded.
func (e *Elector) giveUp(l *coordinationv1.Lease, now time.Time, reason string) {
	empty := ""
	t := metav1.NewMicroTime(now)
	l.Spec.HolderIdentity, l.Spec.RenewTime = &empty, &t
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	l.Annotations[AnnotationReleased] = e.Identity + " (" + reason + ")"
	delete(l.Annotations, AnnotationRestarting)
	var add *topology.StepAside
	if reason == failover.ReasonWireGuardDegraded || reason == failover.ReasonGatewayUnreachable {
		add = &topology.StepAside{Reason: reason, At: now}
		e.mu.Lock()
		if e.stepAside != nil {
			add.At = e.stepAside.At
		}
		e.mu.Unlock()
	}
	if add != nil {
		setStepAsides(l, now, map[string]topology.StepAside{e.Identity: *add})
	} else {
		setStepAsides(l, now, nil)
	}
}

// setStepAsides writes the Lease's step-asides: the current ones still
// cooling down, plus add.
func setStepAsides(l *coordinationv1.Lease, now time.Time, add map[string]topology.StepAside) {
	m := stepAsides(l)
	for k, v := range add {
		if m == nil {
			m = map[string]topology.StepAside{}
		}
		m[k] = v
	}
	for k, v := range m {
		if !now.Before(v.At.Add(failover.StepAsideCoolDown)) {
			delete(m, k)
		}
	}
	if len(m) == 0 {
		delete(l.Annotations, AnnotationStepAsides)
		return
	}
	b, _ := json.Marshal(m) // encoding/json sorts map keys
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	l.Annotations[AnnotationStepAsides] = string(b)
}

// read gets the Lease from the API server and records it as a delivery
// (seen): a fresh read is as current as the watch. A Lease that does not
// exist is nil.
func (e *Elector) read(ctx context.Context, name string) (*coordinationv1.Lease, error) {
	ctx, cancel := context.WithTimeout(ctx, e.Renew*2)
	defer cancel()
	l, err := e.Client.CoordinationV1().Leases(e.Namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		e.seen(name, &coordinationv1.Lease{}, true)
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading Lease %s/%s: %w", e.Namespace, name, err)
	}
	e.seen(name, l, false)
	return l, nil
}

// write creates the Lease (rec nil) or updates rec with mutate applied,
// with rec's resourceVersion: a Lease that changed since is a conflict.
// The result becomes the Lease as last seen.
func (e *Elector) write(ctx context.Context, name string, rec *coordinationv1.Lease, mutate func(*coordinationv1.Lease)) error {
	ctx, cancel := context.WithTimeout(ctx, e.Renew*2)
	defer cancel()
	leases := e.Client.CoordinationV1().Leases(e.Namespace)
	var out *coordinationv1.Lease
	var err error
	if rec == nil {
		l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.Namespace,
			Labels: map[string]string{"app.kubernetes.io/part-of": "meshlet"}}}
		mutate(l)
		out, err = leases.Create(ctx, l, metav1.CreateOptions{})
	} else {
		l := rec.DeepCopy()
		mutate(l)
		out, err = leases.Update(ctx, l, metav1.UpdateOptions{})
	}
	if err != nil {
		return err
	}
	e.mu.Lock()
	if e.name == name && (e.rec == nil || e.rec.ResourceVersion != out.ResourceVersion) {
		e.rec, e.changedAt = out, e.clock().Now()
		if holderOf(out) == "" {
			e.freeSince = e.changedAt
		}
	}
	e.mu.Unlock()
	return nil
}
