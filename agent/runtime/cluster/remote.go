package cluster

import (
	"context"
	"crypto/sha256"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"

	"github.com/meshlet/meshlet/agent/core/clustermesh"
	"github.com/meshlet/meshlet/agent/core/kilo"
	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/agent/runtime/metrics"
)

// Remotes runs one read-only watcher per remote cluster while this node
// leads its segment. A watcher keeps the last known state through API
// outages and credential rotations: nothing is forgotten because a remote
// API server is briefly unreachable.
type Remotes struct {
	// Secrets reads the kubeconfig Secrets the ClusterMeshes name.
	Secrets SecretSource
	Notify  func(seen time.Time)
	Log     *slog.Logger
	// Metrics may be nil.
	Metrics *metrics.Agent
	// ProbeInterval is how often a remote API server's /readyz is checked.
	ProbeInterval time.Duration
	// Policy is what a kubeconfig may carry beyond inline credentials.
	Policy KubeconfigPolicy
	// Clock stamps what is heard and times the probes (nil: the real
	// clock).
	Clock clock.WithTicker
	// Limits bound each remote cluster's input (zero: none).
	Limits kilo.Limits

	mu       sync.Mutex
	ctx      context.Context
	watchers map[string]*remote
	missing  map[string]bool // clusters whose Secret (key) is known missing: warned once
}

// Start sets the context that bounds every watcher.
func (rs *Remotes) Start(ctx context.Context) {
	rs.mu.Lock()
	rs.ctx = ctx
	rs.watchers = map[string]*remote{}
	rs.missing = map[string]bool{}
	rs.mu.Unlock()
}

// Reconcile starts, restarts (rotated kubeconfig) and stops watchers to
// match the remote clusters of the accepted ClusterMeshes, or stops all of
// them when this node does not lead. It is cheap when nothing changed, so
// the loop runs it after every plan.
func (rs *Remotes) Reconcile(leader bool, kcs []clustermesh.Kubeconfig) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.ctx == nil {
		return
	}
	want := map[string][]byte{}
	refs := map[string]clustermesh.Kubeconfig{}
	var names []string
	if leader {
		for _, k := range kcs {
			if _, dup := refs[k.Cluster]; dup {
				continue // the same cluster in two meshes: one watcher
			}
			refs[k.Cluster] = k
			names = append(names, k.Name)
		}
	}
	// Only the Secrets named, only while leading (SecretWatch).
	rs.Secrets.Want(names)
	secretErrs := map[string]error{}
	missing := map[string]bool{}
	for cluster, k := range refs {
		data, synced, ok, err := rs.Secrets.Data(k.Name, k.Key)
		secretErrs[cluster] = err
		missing[cluster] = synced && !ok && err == nil
		if !ok && err == nil {
			if synced && !rs.missing[cluster] {
				rs.log().Warn("kubeconfig secret missing", "cluster", k.Cluster, "secret", k.Namespace+"/"+k.Name, "key", k.Key)
			}
			rs.missing[cluster] = synced
		} else {
			delete(rs.missing, cluster)
		}
		want[cluster] = data
	}
	for name, w := range rs.watchers {
		if _, ok := want[name]; !ok {
			rs.log().Info("stopping remote watcher", "cluster", name, "leader", leader)
			w.stop()
			delete(rs.watchers, name)
			rs.forgetMetrics(name)
		}
	}
	for name, data := range want {
		w := rs.watchers[name]
		if w == nil {
			w = &remote{name: name, rs: rs, objs: newObjects(name, rs.Limits)}
			rs.watchers[name] = w
		}
		w.mu.Lock()
		w.ref, w.secretErr, w.secretMissing = refs[name], secretErrs[name], missing[name]
		w.mu.Unlock()
		if data == nil {
			continue // keep what we have until the Secret exists again
		}
		if h := sha256.Sum256(data); h != w.hash {
			if w.hash != ([32]byte{}) {
				rs.log().Info("kubeconfig changed: reconnecting", "cluster", name)
			}
			w.hash = h
			w.connect(rs.ctx, data)
		}
	}
}

func (rs *Remotes) clock() clock.WithTicker { return orReal(rs.Clock) }

func (rs *Remotes) log() *slog.Logger {
	if rs.Log == nil {
		return slog.Default()
	}
	return rs.Log
}

func (rs *Remotes) forgetMetrics(name string) {
	if rs.Metrics != nil {
		rs.Metrics.RemoteClusterReady.DeleteLabelValues(name)
		rs.Metrics.RemoteClusterNodes.DeleteLabelValues(name)
		rs.Metrics.RemoteClusterClockSkew.DeleteLabelValues(name)
	}
}

func (rs *Remotes) notify() {
	if rs.Notify != nil {
		rs.Notify(rs.clock().Now())
	}
}

// sorted returns the watchers by cluster name.
func (rs *Remotes) sorted() []*remote {
	rs.mu.Lock()
	ws := make([]*remote, 0, len(rs.watchers))
	for _, w := range rs.watchers {
		ws = append(ws, w)
	}
	rs.mu.Unlock()
	sort.Slice(ws, func(i, j int) bool { return ws[i].name < ws[j].name })
	return ws
}

// State returns every remote cluster's converted objects, sorted by name.
func (rs *Remotes) State() ([]topology.RemoteCluster, []topology.Rejection) {
	ws := rs.sorted()
	var out []topology.RemoteCluster
	var rejs []topology.Rejection
	for _, w := range ws {
		rc, r := w.state()
		out = append(out, rc)
		rejs = append(rejs, r...)
	}
	return out, rejs
}

// remote is the watcher of one remote cluster. Its state outlives
// connections: a new connection (rotated kubeconfig) writes into the same
// maps and prunes what vanished once it has synced.
type remote struct {
	name string
	rs   *Remotes
	hash [32]byte

	mu sync.Mutex
	// ref is where the kubeconfig comes from: the ClusterMesh entry and
	// its Secret.
	ref        clustermesh.Kubeconfig
	cancel     context.CancelFunc
	gen        int
	objs       objects
	synced     bool      // listed once (ever)
	ready      bool      // last probe succeeded
	lastReady  time.Time // last time the API answered
	connectErr error
	secretErr  error // the kubeconfig Secret cannot be read (no grant)
	// secretMissing: the Secret (or its key) is known not to exist.
	secretMissing bool
	lastErr       error // the last watch or probe failure, until the API answers again
	skewWarned    bool  // the clock skew warning is in force
}

// RemoteStatus is one remote cluster's watcher as `meshlet status` and the
// ClusterMesh status show it.
type RemoteStatus struct {
	Cluster string    `json:"cluster"`
	Synced  bool      `json:"synced"` // listed once (ever)
	Ready   bool      `json:"ready"`  // its API answers and it is synced
	Nodes   int       `json:"nodes"`
	Peers   int       `json:"peers"`
	Seen    time.Time `json:"lastReady,omitzero"` // last time its API answered
	Error   string    `json:"error,omitempty"`
	// ClockSkew is how far the cluster's clock (its nodes' last-seen) is
	// ahead of this agent's, ±1 s; absent before a last-seen change was
	// heard.
	ClockSkew *time.Duration `json:"clockSkew,omitempty"`
}

// Status returns every watched remote cluster's state, sorted by name
// (none on a node that does not lead).
func (rs *Remotes) Status() []RemoteStatus {
	ws := rs.sorted()
	out := make([]RemoteStatus, 0, len(ws))
	for _, w := range ws {
		w.mu.Lock()
		st := RemoteStatus{Cluster: w.name, Synced: w.synced, Ready: w.ready, Nodes: len(w.objs.nodes), Peers: len(w.objs.peers), Seen: w.lastReady}
		if d, ok := w.objs.clockSkew(); ok {
			st.ClockSkew = &d
		}
		switch {
		case w.secretErr != nil:
			st.Error = w.secretErr.Error()
		case w.connectErr != nil:
			st.Error = "kubeconfig unusable: " + w.connectErr.Error()
		case w.hash == ([32]byte{}) && w.secretMissing:
			st.Error = "kubeconfig Secret missing"
		case w.hash == ([32]byte{}):
			st.Error = "kubeconfig Secret not read yet"
		case w.lastErr != nil && !w.ready:
			st.Error = w.lastErr.Error()
		}
		w.mu.Unlock()
		out = append(out, st)
	}
	return out
}

func (w *remote) stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.cancel != nil {
		w.cancel()
		w.cancel = nil
	}
}

// connect starts a new connection with a kubeconfig, replacing the old one.
func (w *remote) connect(parent context.Context, kubeconfig []byte) {
	w.stop()
	cfg, err := RemoteConfig(kubeconfig, w.rs.Policy)
	var client kubernetes.Interface
	var rc, nodes rest.Interface
	if err == nil {
		// The informers' clients have no client-side timeout: it would cut
		// every watch after it (the reflector then re-watches; the scale
		// lane counted one watch request per 15 s on each API server). The
		// server ends watches after 5–10 min; a dead connection is closed
		// by client-go's HTTP/2 health check (a ping after 30 s without a
		// frame, 15 s for its answer); the probe's client has the timeout
		// and says at once that the API server is gone.
		cfg.UserAgent = "meshlet-remote"
		rc, err = KiloClient(cfg)
	}
	if err == nil {
		nodes, err = nodeRESTClient(cfg)
	}
	if err == nil {
		probeCfg := rest.CopyConfig(cfg)
		probeCfg.Timeout = 15 * time.Second
		client, err = kubernetes.NewForConfig(probeCfg)
	}
	err = clientBuildError(err)
	w.mu.Lock()
	w.connectErr = err
	w.gen++
	gen := w.gen
	w.mu.Unlock()
	if err != nil {
		w.mu.Lock()
		secret := w.ref.Namespace + "/" + w.ref.Name
		w.mu.Unlock()
		w.rs.log().Error("remote kubeconfig refused", "cluster", w.name, "secret", secret, "error", err)
		w.setReady(false)
		return
	}
	ctx, cancel := context.WithCancel(parent)
	w.mu.Lock()
	w.cancel = cancel
	w.mu.Unlock()

	nodeInf := informerFor(nodes, "nodes", metav1.NamespaceAll, &corev1.Node{}, w.rs.Limits.TransformNode)
	peerInf := informerFor(rc, "peers", metav1.NamespaceAll, &kilo.Peer{}, w.rs.Limits.TransformPeer)
	nodeReg, regErr := nodeInf.AddEventHandler(handler(func(obj interface{}, deleted bool) {
		n, ok := obj.(*corev1.Node)
		if !ok {
			return
		}
		w.mu.Lock()
		changed := gen == w.gen && w.objs.setNode(n, deleted, w.rs.clock().Now())
		w.mu.Unlock()
		if changed {
			w.rs.notify()
		}
	}))
	_, _ = peerInf.AddEventHandler(handler(func(obj interface{}, deleted bool) {
		p, ok := obj.(*kilo.Peer)
		if !ok {
			return
		}
		w.mu.Lock()
		if gen == w.gen {
			w.objs.setPeer(p, deleted)
		}
		w.mu.Unlock()
		w.rs.notify()
	}))
	// A watch failing (API down, credentials revoked) marks the cluster not
	// ready at once; the reflector retries with backoff by itself.
	for _, inf := range []cache.SharedIndexInformer{nodeInf, peerInf} {
		_ = inf.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
			w.rs.log().Warn("remote watch failed", "cluster", w.name, "error", err)
			w.mu.Lock()
			w.lastErr = err
			w.mu.Unlock()
			w.setReady(false)
		})
	}
	go nodeInf.Run(ctx.Done())
	go peerInf.Run(ctx.Done())
	go func() {
		// Nodes are required; a cluster without Kilo's Peer CRD still meshes.
		// Synced once the handler has every listed Node, not only the
		// store: before, the planner would see part of the list (with
		// --max-remote-nodes, the wrong part).
		if regErr != nil || !cache.WaitForCacheSync(ctx.Done(), nodeReg.HasSynced) {
			return
		}
		w.mu.Lock()
		if gen == w.gen {
			w.prune(nodeInf.GetStore(), peerInf)
			w.synced = true
		}
		w.mu.Unlock()
		w.setReady(true)
		w.rs.log().Info("remote cluster synced", "cluster", w.name, "nodes", len(nodeInf.GetStore().ListKeys()))
	}()
	go w.probe(ctx, client)
}

// prune drops objects the new connection does not know (deleted while the
// previous connection was down or being replaced).
func (w *remote) prune(nodes cache.Store, peerInf cache.SharedIndexInformer) {
	retain(w.objs.nodes, nodes.ListKeys())
	retain(w.objs.skews, nodes.ListKeys())
	if peerInf.HasSynced() {
		retain(w.objs.peers, peerInf.GetStore().ListKeys())
	}
}

// probe asks the remote API server's /readyz periodically: a watch that
// is merely quiet is not an error, an unreachable server is.
func (w *remote) probe(ctx context.Context, client kubernetes.Interface) {
	interval := w.rs.ProbeInterval
	if interval <= 0 {
		interval = 5 * time.Second
	}
	t := w.rs.clock().NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
		pctx, cancel := context.WithTimeout(ctx, interval)
		err := client.Discovery().RESTClient().Get().AbsPath("/readyz").Do(pctx).Error()
		cancel()
		if ctx.Err() != nil {
			return
		}
		w.mu.Lock()
		synced := w.synced
		if err != nil {
			w.lastErr = fmt.Errorf("API server /readyz: %w", err)
		}
		w.mu.Unlock()
		w.setReady(err == nil && synced)
		w.reportSkew()
	}
}

// reportSkew exports the cluster's clock skew and warns while it is larger
// than meshlet diagnose allows (topology.ClockSkewWarn): the mesh does not
// depend on it (remote liveness is judged by the remote clock), but a
// cluster whose clocks are off breaks other things.
func (w *remote) reportSkew() {
	w.mu.Lock()
	d, ok := w.objs.clockSkew()
	warn := ok && (d > topology.ClockSkewWarn || d < -topology.ClockSkewWarn)
	changed := warn != w.skewWarned
	w.skewWarned = warn
	w.mu.Unlock()
	if !ok {
		return
	}
	if m := w.rs.Metrics; m != nil {
		m.RemoteClusterClockSkew.WithLabelValues(w.name).Set(d.Seconds())
	}
	switch {
	case changed && warn:
		w.rs.log().Warn("remote cluster's clock is off this node's: its liveness is judged by its own clock, but run NTP on both clusters",
			"cluster", w.name, "skew", d.Round(time.Second).String())
	case changed:
		w.rs.log().Info("remote cluster's clock agrees with this node's again", "cluster", w.name, "skew", d.Round(time.Second).String())
	}
}

func (w *remote) setReady(ok bool) {
	w.mu.Lock()
	changed := w.ready != ok
	w.ready = ok
	if ok {
		w.lastReady = w.rs.clock().Now()
	}
	n := len(w.objs.nodes)
	w.mu.Unlock()
	if m := w.rs.Metrics; m != nil {
		v := 0.0
		if ok {
			v = 1
		}
		m.RemoteClusterReady.WithLabelValues(w.name).Set(v)
		m.RemoteClusterNodes.WithLabelValues(w.name).Set(float64(n))
	}
	if changed {
		w.rs.log().Info("remote cluster readiness", "cluster", w.name, "ready", ok)
		w.rs.notify()
	}
}

// kubeconfigRejection is a remote cluster's kubeconfig refused (or
// unusable), reported on the ClusterMesh entry that names its Secret.
func kubeconfigRejection(ref clustermesh.Kubeconfig, err error) topology.Rejection {
	reason := topology.ReasonInvalidClusterMesh
	if _, ok := AsKubeconfigError(err); ok {
		reason = topology.ReasonUnsafeKubeconfig
	}
	obj := ref.Mesh
	if obj.Kind == "" {
		obj = topology.ObjectRef{Kind: "Secret", Cluster: ref.Cluster, Name: "kubeconfig"}
	}
	return topology.Rejection{Object: obj, Field: ref.Field, Reason: reason,
		Message: fmt.Sprintf("cluster %s: kubeconfig in Secret %s/%s key %q refused: %v (the cluster is not connected)", ref.Cluster, ref.Namespace, ref.Name, ref.Key, err)}
}

func (w *remote) state() (topology.RemoteCluster, []topology.Rejection) {
	w.mu.Lock()
	defer w.mu.Unlock()
	rc := topology.RemoteCluster{Name: w.name, Synced: w.synced}
	if !w.ready {
		// Freeze time for this cluster: last-seen ages stop growing while
		// its API is unreachable, so no remote leader is dropped for it.
		rc.ObservedAt = w.lastReady
	}
	var rejs []topology.Rejection
	rc.Nodes, rc.Peers, rejs = w.objs.state()
	if !w.synced {
		// While the first list arrives the oldest objects left out are
		// not known yet (the list comes in name order): a count
		// rejection now would name a different object at each step, an
		// Event each. An unsynced cluster plans none of its peers anyway.
		rejs = slices.DeleteFunc(rejs, isCountRejection)
	}
	if w.connectErr != nil {
		rejs = append(rejs, kubeconfigRejection(w.ref, w.connectErr))
	}
	return rc, rejs
}
