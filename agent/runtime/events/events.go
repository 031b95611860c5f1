// Package events turns the planner's rejections into what a user sees: a
// Kubernetes Event on the object concerned, a log line with the reason, and
// meshlet_rejections_total{reason}. Each rejection is reported once while it
// lasts, not at every resync; the Event's name is derived from the
// rejection, so every node of the cluster writes the same Event instead of
// one each.
package events

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/agent/runtime/metrics"
)

// Component is the Event source.
const Component = "meshlet"

// MeshResolver returns the local ClusterMesh that declares a remote cluster,
// so rejections of remote objects (which meshlet cannot write to) land on it.
type MeshResolver func(cluster string) (namespace, name string, ok bool)

// Sink reports rejections.
type Sink struct {
	Client  kubernetes.Interface // nil: log and metrics only (meshlet plan)
	Node    string
	Metrics *metrics.Agent
	Log     *slog.Logger
	Meshes  MeshResolver
	Now     func() time.Time

	mu     sync.Mutex
	active map[topology.Rejection]seen
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

// Report records the current set of rejections: new ones are reported,
// vanished ones forgotten (so they are reported again if they come back).
func (s *Sink) Report(ctx context.Context, rs []topology.Rejection) {
	now := time.Now
	if s.Now != nil {
		now = s.Now
	}
	t := now()
	s.mu.Lock()
	current := make(map[topology.Rejection]seen, len(rs))
	var due []topology.Rejection
	for _, r := range rs {
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
	s.mu.Unlock()
	for _, r := range due {
		s.report(ctx, r)
	}
}

// Active returns how many rejections are currently in force.
func (s *Sink) Active() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.active)
}

func (s *Sink) report(ctx context.Context, r topology.Rejection) {
	log := s.Log
	if log == nil {
		log = slog.Default()
	}
	log.Warn("rejected input", "node", s.Node, "object", r.Object.String(), "cluster", r.Object.Cluster,
		"field", r.Field, "reason", string(r.Reason), "message", r.Message)
	if s.Metrics != nil {
		s.Metrics.Rejections.WithLabelValues(string(r.Reason)).Inc()
	}
	if s.Client == nil {
		return
	}
	if err := s.event(ctx, r); err != nil {
		log.Error("writing event", "node", s.Node, "object", r.Object.String(), "err", err)
	}
}

// involved maps a rejection to the local object its Event is attached to.
func (s *Sink) involved(r topology.Rejection) (corev1.ObjectReference, string, string) {
	o := r.Object
	msg := r.Message
	if r.Field != "" {
		msg = r.Field + ": " + msg
	}
	if o.Cluster != "" {
		// A remote object: attach to the ClusterMesh that brought it in.
		msg = fmt.Sprintf("cluster %s: %s %s: %s", o.Cluster, o.Kind, o.Name, msg)
		if s.Meshes != nil {
			if ns, name, ok := s.Meshes(o.Cluster); ok {
				return corev1.ObjectReference{Kind: "ClusterMesh", APIVersion: "kilo.squat.ai/v1alpha1", Namespace: ns, Name: name}, ns, msg
			}
		}
		return corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: s.Node}, metav1.NamespaceDefault, msg
	}
	switch o.Kind {
	case "ClusterMesh":
		return corev1.ObjectReference{Kind: "ClusterMesh", APIVersion: "kilo.squat.ai/v1alpha1", Namespace: o.Namespace, Name: o.Name}, o.Namespace, msg
	case "Peer":
		return corev1.ObjectReference{Kind: "Peer", APIVersion: "kilo.squat.ai/v1alpha1", Name: o.Name}, metav1.NamespaceDefault, msg
	default:
		// Cluster-scoped objects' Events live in "default", as the kubelet's do.
		return corev1.ObjectReference{Kind: o.Kind, APIVersion: "v1", Name: o.Name}, metav1.NamespaceDefault, msg
	}
}

// EventName is deterministic per rejection, so all nodes share one Event.
func EventName(r topology.Rejection) string {
	h := sha256.Sum256([]byte(r.Object.String() + "\x00" + r.Field + "\x00" + string(r.Reason) + "\x00" + r.Message))
	name := strings.ToLower(r.Object.Name)
	if len(name) > 200 {
		name = name[:200]
	}
	return name + ".meshlet-" + hex.EncodeToString(h[:6])
}

func (s *Sink) event(ctx context.Context, r topology.Rejection) error {
	now := time.Now
	if s.Now != nil {
		now = s.Now
	}
	ref, ns, msg := s.involved(r)
	t := metav1.NewTime(now())
	ev := &corev1.Event{
		ObjectMeta:          metav1.ObjectMeta{Name: EventName(r), Namespace: ns},
		InvolvedObject:      ref,
		Reason:              string(r.Reason),
		Message:             msg,
		Type:                corev1.EventTypeWarning,
		Source:              corev1.EventSource{Component: Component, Host: s.Node},
		FirstTimestamp:      t,
		LastTimestamp:       t,
		Count:               1,
		ReportingController: "meshlet.io/agent",
		ReportingInstance:   s.Node,
	}
	_, err := s.Client.CoreV1().Events(ns).Create(ctx, ev, metav1.CreateOptions{})
	if !apierrors.IsAlreadyExists(err) {
		return err
	}
	// Another node (or an earlier occurrence) wrote it: refresh its time,
	// so `kubectl get events` shows it is still current.
	patch := fmt.Sprintf(`{"lastTimestamp":%q}`, t.UTC().Format(time.RFC3339))
	_, err = s.Client.CoreV1().Events(ns).Patch(ctx, ev.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	return err
}
