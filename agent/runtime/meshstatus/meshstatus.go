// Package meshstatus writes the status of this cluster's ClusterMeshes:
// per remote cluster synced / ready / nodes / peers and a Ready condition
// (agent/core/clustermesh BuildStatus decides it). One agent per cluster
// writes at a time — the holder of a Lease, which only segment leaders
// (the agents that watch the remote clusters) compete for — and only on
// the local cluster. It never fights another writer: a status field owned
// by someone else (kilo-clustermesh-operator) is a conflict of
// server-side apply, and meshlet then leaves that ClusterMesh alone
// (docs/clustermesh.md).
package meshstatus

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/utils/clock"

	"github.com/meshlet/meshlet/agent/core/clustermesh"
	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/agent/runtime/cluster"
)

// LeaseName is the Lease (in meshlet's namespace) whose holder writes.
const LeaseName = "meshlet-clustermesh-status"

// FieldManager is meshlet's server-side apply field manager for status.
const FieldManager = "meshlet"

// Writer writes ClusterMesh status while it holds the Lease.
type Writer struct {
	Client      kubernetes.Interface // Leases
	Kilo        rest.Interface       // clustermeshes/status
	Namespace   string
	Identity    string // this node
	ClusterName string // "" = the entry marked local
	Meshes      func() []*clustermesh.ClusterMesh
	Remotes     func() []cluster.RemoteStatus
	Log         *slog.Logger
	// Clock stamps the status (nil: the real clock).
	Clock clock.PassiveClock
	// Lease timing (defaults 15 s, 10 s, 2 s: client-go's usual values).
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration

	mu         sync.Mutex
	ctx        context.Context
	cancel     context.CancelFunc // the running election, nil when not a candidate
	rejections []topology.Rejection
	wake       chan struct{}
	leading    bool
	foreign    map[string]bool // meshes whose status another manager owns
}

// Start sets the context that bounds the elections.
func (w *Writer) Start(ctx context.Context) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.ctx = ctx
	w.wake = make(chan struct{}, 1)
	w.foreign = map[string]bool{}
	if w.Log == nil {
		w.Log = slog.Default()
	}
}

// Follow is called after every reconcile: a segment leader is a candidate
// for the Lease, any other node gives it up; the holder re-writes what
// changed.
func (w *Writer) Follow(plan topology.Plan) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ctx == nil {
		return
	}
	w.rejections = plan.Rejections
	switch {
	case plan.Leader && w.cancel == nil:
		ctx, cancel := context.WithCancel(w.ctx)
		w.cancel = cancel
		go w.elect(ctx)
	case !plan.Leader && w.cancel != nil:
		w.cancel() // releases the Lease (ReleaseOnCancel)
		w.cancel = nil
	}
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// Leading reports whether this agent holds the Lease.
func (w *Writer) Leading() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.leading
}

func (w *Writer) elect(ctx context.Context) {
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: w.Namespace, Name: LeaseName},
		Client:     w.Client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: w.Identity},
	}
	cfg := leaderelection.LeaderElectionConfig{
		Lock: lock, ReleaseOnCancel: true, Name: LeaseName,
		LeaseDuration: or(w.LeaseDuration, 15*time.Second), RenewDeadline: or(w.RenewDeadline, 10*time.Second),
		RetryPeriod: or(w.RetryPeriod, 2*time.Second),
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: w.lead,
			OnStoppedLeading: func() {
				w.setLeading(false)
			},
		},
	}
	el, err := leaderelection.NewLeaderElector(cfg)
	if err != nil {
		w.Log.Error("ClusterMesh status election", "error", err)
		return
	}
	// Run returns when the lease is lost or ctx ends; a leader that loses
	// it (API outage) competes again while it still leads its segment.
	for ctx.Err() == nil {
		el.Run(ctx)
	}
}

func (w *Writer) now() time.Time {
	if w.Clock == nil {
		return clock.RealClock{}.Now()
	}
	return w.Clock.Now()
}

func or(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

func (w *Writer) setLeading(v bool) {
	w.mu.Lock()
	changed := w.leading != v
	w.leading = v
	w.mu.Unlock()
	if !changed {
		return
	}
	w.Log.Info("ClusterMesh status writer", "leading", v, "lease", w.Namespace+"/"+LeaseName)
}

// lead writes while the Lease is held: at once, then at every Follow.
func (w *Writer) lead(ctx context.Context) {
	w.setLeading(true)
	for {
		w.writeAll(ctx)
		select {
		case <-ctx.Done():
			return
		case <-w.wake:
		}
	}
}

func (w *Writer) writeAll(ctx context.Context) {
	remotes := map[string]clustermesh.RemoteState{}
	for _, r := range w.Remotes() {
		remotes[r.Cluster] = clustermesh.RemoteState{Watched: true, Synced: r.Synced, Ready: r.Ready, Nodes: r.Nodes, Peers: r.Peers, Error: r.Error}
	}
	w.mu.Lock()
	rejections := w.rejections
	w.mu.Unlock()
	for _, m := range w.Meshes() {
		key := m.Namespace + "/" + m.Name
		w.mu.Lock()
		foreign := w.foreign[key]
		w.mu.Unlock()
		if foreign {
			continue
		}
		st := clustermesh.BuildStatus(m, w.ClusterName, remotes, rejections, w.now())
		if equality.Semantic.DeepEqual(st, m.Status) {
			continue
		}
		err := w.apply(ctx, m, st)
		switch {
		case apierrors.IsConflict(err):
			w.mu.Lock()
			w.foreign[key] = true
			w.mu.Unlock()
			w.Log.Warn("ClusterMesh status is written by another manager (kilo-clustermesh-operator?): meshlet leaves it", "clustermesh", key, "error", err)
		case err != nil && ctx.Err() == nil:
			w.Log.Warn("writing ClusterMesh status", "clustermesh", key, "error", err)
		case err == nil:
			w.Log.Debug("ClusterMesh status written", "clustermesh", key)
		}
	}
}

// apply server-side-applies the status without force: fields another
// manager owns are a conflict, not overwritten.
func (w *Writer) apply(ctx context.Context, m *clustermesh.ClusterMesh, st clustermesh.ClusterMeshStatus) error {
	body, err := json.Marshal(map[string]any{
		"apiVersion": clustermesh.SchemeGroupVersion.String(), "kind": "ClusterMesh",
		"metadata": map[string]any{"name": m.Name, "namespace": m.Namespace},
		"status":   st,
	})
	if err != nil {
		return fmt.Errorf("encoding status: %w", err)
	}
	return w.Kilo.Patch(types.ApplyPatchType).Namespace(m.Namespace).Resource("clustermeshes").Name(m.Name).
		SubResource("status").Param("fieldManager", FieldManager).Body(body).Do(ctx).Error()
}
