package cluster

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"

	"github.com/meshlet/meshlet/agent/core/clustermesh"
	"github.com/meshlet/meshlet/agent/core/kilo"
	"github.com/meshlet/meshlet/agent/core/topology"
)

// Local watches the local cluster.
type Local struct {
	client    kubernetes.Interface
	namespace string
	notify    func(seen time.Time)
	log       *slog.Logger
	clock     clock.WithTicker

	// meshInf is nil when ClusterMeshes are not watched.
	nodeInf, peerInf, meshInf cache.SharedIndexInformer
	infs                      []cache.SharedIndexInformer
	// regs are the handlers' registrations: synced once the handlers (not
	// only the informers' stores) have every object of the first list.
	regs []cache.ResourceEventHandlerRegistration

	mu       sync.RWMutex
	objs     objects
	keeper   clustermesh.Keeper
	meshes   map[string]*clustermesh.ClusterMesh
	self     *corev1.Node // this node as last seen
	selfName string
}

// LocalOptions configure the local watcher.
type LocalOptions struct {
	Config    *rest.Config
	Client    kubernetes.Interface
	Namespace string // of ClusterMeshes
	// NoClusterMeshes: do not watch ClusterMeshes (no grant, or no CRD:
	// agent/runtime/grants); the cluster then meshes on its own.
	NoClusterMeshes bool
	Node            string // this node
	Notify          func(seen time.Time)
	Log             *slog.Logger
	// Clock stamps what is heard (nil: the real clock).
	Clock clock.WithTicker
	// Limits bound the local Nodes' and Peers' input (zero: none).
	Limits kilo.Limits
}

// NewLocal creates the local watcher; Start runs it.
func NewLocal(o LocalOptions) (*Local, error) {
	rc, err := KiloClient(o.Config)
	if err != nil {
		return nil, err
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	l := &Local{
		client: o.Client, namespace: o.Namespace, notify: o.Notify, log: o.Log, selfName: o.Node, clock: orReal(o.Clock),
		objs:   newObjects("", o.Limits),
		meshes: map[string]*clustermesh.ClusterMesh{},
	}
	nodes, err := nodeRESTClient(o.Config)
	if err != nil {
		return nil, err
	}
	l.nodeInf = informerFor(nodes, "nodes", metav1.NamespaceAll, &corev1.Node{}, o.Limits.TransformNode)
	l.peerInf = informerFor(rc, "peers", metav1.NamespaceAll, &kilo.Peer{}, o.Limits.TransformPeer)
	l.addHandler(l.nodeInf, l.onNode)
	l.addHandler(l.peerInf, l.onPeer)
	byKind := map[string]cache.SharedIndexInformer{"nodes": l.nodeInf, "peers": l.peerInf}
	if !o.NoClusterMeshes {
		l.meshInf = informerFor(rc, "clustermeshes", o.Namespace, &clustermesh.ClusterMesh{}, nil)
		l.addHandler(l.meshInf, l.onMesh)
		byKind["clustermeshes"] = l.meshInf
	}
	for kind, inf := range byKind {
		l.infs = append(l.infs, inf)
		_ = inf.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
			// The reflector lists again and retries by itself (a 410 Gone
			// it handles without calling this); nothing is removed
			// meanwhile: the caches keep their objects.
			l.log.Debug("local watch failed", "resource", kind, "error", err)
		})
	}
	return l, nil
}

// Start runs the informers until ctx ends.
func (l *Local) Start(ctx context.Context) {
	for _, inf := range l.infs {
		go inf.Run(ctx.Done())
	}
}

func (l *Local) addHandler(inf cache.SharedIndexInformer, fn func(obj interface{}, deleted bool)) {
	if reg, err := inf.AddEventHandler(handler(fn)); err == nil {
		l.regs = append(l.regs, reg)
	}
}

// WaitForSync blocks until every informer listed once and its handler has
// every listed object, or ctx ends.
func (l *Local) WaitForSync(ctx context.Context) bool {
	synced := make([]cache.InformerSynced, len(l.regs))
	for i, reg := range l.regs {
		synced[i] = reg.HasSynced
	}
	return cache.WaitForCacheSync(ctx.Done(), synced...)
}

// Synced reports whether every informer has listed once and its handler
// has every listed object (a plan before that would see part of a list:
// with a count limit, the wrong part).
func (l *Local) Synced() bool {
	for _, reg := range l.regs {
		if !reg.HasSynced() {
			return false
		}
	}
	return len(l.regs) > 0
}

func (l *Local) changed() {
	if l.notify != nil {
		l.notify(l.clock.Now())
	}
}

func (l *Local) onNode(obj interface{}, deleted bool) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return
	}
	l.mu.Lock()
	changed := l.objs.setNode(n, deleted, l.clock.Now())
	if n.Name == l.selfName {
		l.self = n
		if deleted {
			l.self = nil
		}
	}
	l.mu.Unlock()
	if changed {
		l.changed()
	}
}

func (l *Local) onPeer(obj interface{}, deleted bool) {
	p, ok := obj.(*kilo.Peer)
	if !ok {
		return
	}
	l.mu.Lock()
	l.objs.setPeer(p, deleted)
	l.mu.Unlock()
	l.changed()
}

func (l *Local) onMesh(obj interface{}, deleted bool) {
	m, ok := obj.(*clustermesh.ClusterMesh)
	if !ok {
		return
	}
	l.mu.Lock()
	old := l.meshes[m.Name]
	if deleted {
		delete(l.meshes, m.Name)
	} else {
		l.meshes[m.Name] = m
	}
	l.mu.Unlock()
	// A status write (meshstatus) changes nothing the planner reads.
	if !deleted && old != nil && old.Generation == m.Generation && old.Generation != 0 {
		return
	}
	l.changed()
}

// Meshes returns the ClusterMeshes of the watched namespace as last seen
// (shared: read only), sorted by name.
func (l *Local) Meshes() []*clustermesh.ClusterMesh {
	l.mu.RLock()
	defer l.mu.RUnlock()
	out := make([]*clustermesh.ClusterMesh, 0, len(l.meshes))
	for _, m := range l.meshes {
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// SelfNode returns this node's object as last seen (nil before it exists).
func (l *Local) SelfNode() *corev1.Node {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.self
}

// NodeAnnotations returns a node's annotations as last seen (shared: read
// only), and whether the node is known.
func (l *Local) NodeAnnotations(name string) (map[string]string, bool) {
	obj, ok, err := l.nodeInf.GetStore().GetByKey(name)
	if err != nil || !ok {
		return nil, false
	}
	n, ok := obj.(*corev1.Node)
	if !ok {
		return nil, false
	}
	return n.Annotations, true
}

// LocalState is the local part of a snapshot.
type LocalState struct {
	Nodes      []topology.Node
	Peers      []topology.Peer
	Mesh       clustermesh.Result
	Rejections []topology.Rejection
}

// State returns the converted local objects, sorted by name.
func (l *Local) State(clusterName string) LocalState {
	l.mu.Lock() // the keeper remembers accepted ClusterMeshes
	defer l.mu.Unlock()
	var st LocalState
	st.Nodes, st.Peers, st.Rejections = l.objs.state()
	meshes := make([]*clustermesh.ClusterMesh, 0, len(l.meshes))
	for _, m := range l.meshes {
		meshes = append(meshes, m)
	}
	// A ClusterMesh edit that fails validation changes nothing on the data
	// plane: its last accepted version stays in force (docs/clustermesh.md).
	st.Mesh = l.keeper.Resolve(meshes, clusterName)
	st.Rejections = append(st.Rejections, st.Mesh.Rejections...)
	return st
}

// UID returns the UID of a watched object (kind Node, Peer or ClusterMesh),
// for Events that `kubectl describe` lists.
func (l *Local) UID(kind, namespace, name string) (types.UID, bool) {
	var store cache.Store
	key := name
	switch kind {
	case "Node":
		store = l.nodeInf.GetStore()
	case "Peer":
		store = l.peerInf.GetStore()
	case "ClusterMesh":
		if l.meshInf == nil {
			return "", false
		}
		store, key = l.meshInf.GetStore(), namespace+"/"+name
	default:
		return "", false
	}
	obj, ok, err := store.GetByKey(key)
	if err != nil || !ok {
		return "", false
	}
	m, err := meta.Accessor(obj)
	if err != nil {
		return "", false
	}
	return m.GetUID(), true
}

// String is for logs.
func (l *Local) String() string { return fmt.Sprintf("local cluster (namespace %s)", l.namespace) }
