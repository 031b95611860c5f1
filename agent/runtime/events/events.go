// Package events turns the planner's rejections into what a user sees: a
// Kubernetes Event on the object concerned (so `kubectl describe` shows it),
// a log line with the reason, and meshlet_rejections_total{reason}. Each
// rejection is reported once while it lasts, not at every resync; while it
// lasts it is counted in meshlet_rejections_active{reason,kind}.
//
// Every node computes the same rejections; the one the planner names as
// each rejection's Reporter writes its Event, so a cluster of a hundred nodes
// writes one Event, not a hundred. Events go through client-go's recorder
// (its correlator aggregates repeats).
package events

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"

	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/agent/runtime/metrics"
)

// Component is the Event source.
const Component = "meshlet"

// UIDs finds a local object's UID (kind "Node", "Peer" or "ClusterMesh");
// an Event with the UID is listed by `kubectl describe` of the object.
type UIDs func(kind, namespace, name string) (types.UID, bool)

// Sink reports rejections.
type Sink struct {
	Recorder record.EventRecorder // nil: log and metrics only
	UIDs     UIDs
	Node     string
	Metrics  *metrics.Agent
	Log      *slog.Logger
	// Clock stamps what is reported (nil: the real clock).
	Clock clock.PassiveClock

	mu     sync.Mutex
	active map[topology.Rejection]seen
	gauged map[[2]string]bool // label sets of meshlet_rejections_active set last
}

type seen struct {
	first    time.Time
	reported bool
}

// settleReasons are rejections that a healthy mesh shows for a moment: while
// agents start, two of them may briefly both claim the first WireGuard IP
// (Kilo allocates it by segment order, each agent alone). They are reported
// only if they outlast settleTime, so a normal start writes no Event.
var settleReasons = map[topology.Reason]bool{topology.ReasonDuplicateWireGuardIP: true}

const settleTime = 30 * time.Second

// Report records the plan's current set of rejections: new ones are
// reported, vanished ones forgotten (so they are reported again if they
// come back).
func (s *Sink) Report(ctx context.Context, plan topology.Plan) {
	t := clock.RealClock{}.Now()
	if s.Clock != nil {
		t = s.Clock.Now()
	}
	s.mu.Lock()
	current := make(map[topology.Rejection]seen, len(plan.Rejections))
	var due []topology.Rejection
	for _, r := range plan.Rejections {
		st, ok := s.active[r]
		if !ok {
			st = seen{first: t}
		}
		if !st.reported && (!settleReasons[r.Reason] || t.Sub(st.first) >= settleTime) {
			st.reported = true
			due = append(due, r)
		}
		current[r] = st
	}
	s.active = current
	s.setActive()
	s.mu.Unlock()
	for _, r := range due {
		s.report(ctx, plan, r)
	}
}

// setActive sets meshlet_rejections_active from the reported rejections in
// force, and deletes the label sets that no longer have one (a Reset would
// let a scrape in between see none). Call with s.mu held.
func (s *Sink) setActive() {
	if s.Metrics == nil {
		return
	}
	counts := map[[2]string]int{}
	for r, st := range s.active {
		if st.reported {
			counts[[2]string{string(r.Reason), r.Object.Kind}]++
		}
	}
	for l := range s.gauged {
		if counts[l] == 0 {
			s.Metrics.RejectionsActive.DeleteLabelValues(l[0], l[1])
		}
	}
	s.gauged = make(map[[2]string]bool, len(counts))
	for l, n := range counts {
		s.Metrics.RejectionsActive.WithLabelValues(l[0], l[1]).Set(float64(n))
		s.gauged[l] = true
	}
}

// Active returns how many rejections are currently in force.
func (s *Sink) Active() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.active)
}

func (s *Sink) report(ctx context.Context, plan topology.Plan, r topology.Rejection) {
	log := s.Log
	if log == nil {
		log = slog.Default()
	}
	log.LogAttrs(ctx, slog.LevelWarn, "rejected input", slog.String("object", r.Object.String()), slog.String("cluster", r.Object.Cluster),
		slog.String("field", r.Field), slog.String("reason", string(r.Reason)), slog.String("message", r.Message))
	if s.Metrics != nil {
		s.Metrics.Rejections.WithLabelValues(string(r.Reason)).Inc()
	}
	if s.Recorder == nil || r.Reporter != s.Node {
		return
	}
	ref, msg := s.involved(plan, r)
	s.Recorder.Event(ref, corev1.EventTypeWarning, string(r.Reason), msg)
}

// involved maps a rejection to the local object its Event is attached to:
// the object itself, or for a remote cluster's object the ClusterMesh that
// brought it in (meshlet cannot write to remote clusters).
func (s *Sink) involved(plan topology.Plan, r topology.Rejection) (*corev1.ObjectReference, string) {
	o := r.Object
	msg := r.Message
	if r.Field != "" {
		msg = r.Field + ": " + msg
	}
	ref := &corev1.ObjectReference{Kind: o.Kind, APIVersion: "v1", Name: o.Name}
	switch {
	case o.Cluster != "":
		msg = fmt.Sprintf("cluster %s: %s %s: %s", o.Cluster, o.Kind, o.Name, msg)
		ref = &corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: s.Node}
		for _, rem := range plan.Remotes {
			if ns, name, ok := strings.Cut(rem.Mesh, "/"); ok && rem.Cluster == o.Cluster {
				ref = &corev1.ObjectReference{Kind: "ClusterMesh", APIVersion: "kilo.squat.ai/v1alpha1", Namespace: ns, Name: name}
			}
		}
	case o.Kind == "ClusterMesh":
		ref = &corev1.ObjectReference{Kind: o.Kind, APIVersion: "kilo.squat.ai/v1alpha1", Namespace: o.Namespace, Name: o.Name}
	case o.Kind == "Peer":
		ref.APIVersion = "kilo.squat.ai/v1alpha1"
	}
	if s.UIDs != nil {
		ref.UID, _ = s.UIDs(ref.Kind, ref.Namespace, ref.Name)
	}
	return ref, msg
}
