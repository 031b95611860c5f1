// Package meshstatus writes the status of this cluster's ClusterMeshes:
// per remote cluster synced / ready / nodes / peers and a Ready condition
// (agent/core/clustermesh BuildStatus decides it). One agent per cluster
// writes — the one the plan names (Plan.StatusWriter: the leader of the
// first segment that runs meshlet, one of the agents that watch the remote
// clusters) — and only on the local cluster. It never fights another writer: a status field owned
// by someone else (kilo-clustermesh-operator) is a conflict of
// server-side apply, and meshlet then leaves that ClusterMesh alone
// (docs/clustermesh.md).
//
// It writes only the fields the installed ClusterMesh CRD keeps: it reads
// the CRD once per process (get customresourcedefinitions, as kg may) and
// projects the status onto its schema (clustermesh.StatusSchema): under
// kilo-clustermesh-operator's CRD, which lacks meshlet's own fields, an
// apply of them is refused ("field not declared in schema") and would be
// tried at every pass; projected, it is accepted, what it wrote is what it
// reads back, and an unchanged status is not written again. Without the CRD it writes the fields every ClusterMesh
// CRD has (clustermesh.CommonStatus).
package meshstatus

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	kclock "k8s.io/utils/clock"

	"github.com/meshlet/meshlet/agent/core/clustermesh"
	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/agent/runtime/cluster"
)

// FieldManager is meshlet's server-side apply field manager for status.
const FieldManager = "meshlet"

// Writer writes ClusterMesh status while the plan names this node.
type Writer struct {
	Kilo        rest.Interface // clustermeshes/status, and the CRD (AbsPath)
	ClusterName string         // "" = the entry marked local
	Meshes      func() []*clustermesh.ClusterMesh
	Remotes     func() []cluster.RemoteStatus
	Log         *slog.Logger
	// NoCRD: the agent may not read the ClusterMesh CRD (grants); the
	// writer then writes the fields every ClusterMesh CRD has.
	NoCRD bool
	// Now is the clock of condition transition times (default: the real clock).
	Now func() time.Time

	mu         sync.Mutex
	ctx        context.Context
	cancel     context.CancelFunc // the running writer, nil when the plan names another node
	rejections []topology.Rejection
	leaders    map[string]int // remote leaders peered, by mesh and cluster (leadersKey)
	wake       chan struct{}
	foreign    map[string]bool     // meshes whose status another manager owns
	schema     *clustermesh.Schema // of status in the installed CRD; nil until read
	passes     atomic.Int64        // writeAll runs (tests)
}

// crdPath is the ClusterMesh CRD's URL path.
const crdPath = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/" + clustermesh.CRDName

// Start sets the context that bounds the writer.
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

// Follow is called after every reconcile: the node the plan names writes
// (at once, then what changed after every reconcile), any other stops.
func (w *Writer) Follow(plan topology.Plan) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ctx == nil {
		return
	}
	w.rejections = plan.Rejections
	w.leaders = map[string]int{}
	for _, r := range plan.Remotes {
		w.leaders[leadersKey(r.Mesh, r.Cluster)] = len(r.Leaders)
	}
	switch {
	case plan.StatusWriter && w.cancel == nil:
		ctx, cancel := context.WithCancel(w.ctx)
		w.cancel = cancel
		w.Log.Info("ClusterMesh status writer", "leading", true)
		go w.lead(ctx)
	case !plan.StatusWriter && w.cancel != nil:
		w.cancel()
		w.cancel = nil
		w.Log.Info("ClusterMesh status writer", "leading", false)
	}
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// Leading reports whether this agent writes.
func (w *Writer) Leading() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.cancel != nil
}

// lead writes while the plan names this node: at once, then at every
// Follow.
func (w *Writer) lead(ctx context.Context) {
	for {
		w.writeAll(ctx)
		select {
		case <-ctx.Done():
			return
		case <-w.wake:
		}
	}
}

func leadersKey(mesh, cluster string) string { return mesh + "\x00" + cluster }

// statusSchema is the schema of status in the installed CRD, read once: a
// CRD that cannot be read (no grant, none installed) gives the fields
// every ClusterMesh CRD has; an error that may pass (the API server is
// unreachable) gives them for this pass only.
func (w *Writer) statusSchema(ctx context.Context) *clustermesh.Schema {
	w.mu.Lock()
	s := w.schema
	w.mu.Unlock()
	if s != nil {
		return s
	}
	var why string
	if w.NoCRD {
		why = "the agent may not get customresourcedefinitions"
	} else {
		raw, err := w.Kilo.Get().AbsPath(crdPath).Do(ctx).Raw()
		switch {
		case apierrors.IsForbidden(err) || apierrors.IsNotFound(err):
			why = err.Error()
		case err != nil:
			w.Log.Warn("reading the ClusterMesh CRD; writing the fields every ClusterMesh CRD has for now", "error", err)
			return clustermesh.CommonStatus
		default:
			if s, err = clustermesh.StatusSchema(raw); err != nil {
				why = "the installed CRD: " + err.Error()
			} else {
				w.Log.Info("ClusterMesh status: writing the fields the installed CRD keeps", "crd", clustermesh.CRDName,
					"fields", strings.Join(clustermesh.KeptFields(s), ","))
			}
		}
	}
	if s == nil {
		s = clustermesh.CommonStatus
		w.Log.Warn("ClusterMesh status: cannot read the installed CRD, writing the fields every ClusterMesh CRD has", "reason", why,
			"fields", strings.Join(clustermesh.KeptFields(s), ","))
	}
	w.mu.Lock()
	w.schema = s
	w.mu.Unlock()
	return s
}

func (w *Writer) writeAll(ctx context.Context) {
	defer w.passes.Add(1)
	w.mu.Lock()
	rejections, leaders := w.rejections, w.leaders
	w.mu.Unlock()
	now := kclock.RealClock{}.Now
	if w.Now != nil {
		now = w.Now
	}
	schema := w.statusSchema(ctx)
	watched := w.Remotes()
	for _, m := range w.Meshes() {
		key := m.Namespace + "/" + m.Name
		w.mu.Lock()
		foreign := w.foreign[key]
		w.mu.Unlock()
		if foreign {
			continue
		}
		remotes := map[string]clustermesh.RemoteState{}
		for _, r := range watched {
			remotes[r.Cluster] = clustermesh.RemoteState{Watched: true, Synced: r.Synced, Ready: r.Ready, Nodes: r.Nodes, Peers: r.Peers,
				Leaders: leaders[leadersKey(key, r.Cluster)], Error: r.Error}
		}
		st, err := clustermesh.ProjectStatus(clustermesh.BuildStatus(m, w.ClusterName, remotes, rejections, now()), schema)
		if err != nil {
			w.Log.Error("encoding ClusterMesh status", "clustermesh", key, "error", err)
			continue
		}
		// What the server holds is what it kept of the last write: the same
		// projection of an unchanged status is equal, and not written.
		if have, err := clustermesh.ProjectStatus(m.Status, schema); err == nil && reflect.DeepEqual(st, have) {
			continue
		}
		err = w.apply(ctx, m, st)
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
func (w *Writer) apply(ctx context.Context, m *clustermesh.ClusterMesh, st map[string]any) error {
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
