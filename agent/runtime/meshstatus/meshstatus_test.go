package meshstatus

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/meshlet/meshlet/agent/core/clustermesh"
	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/agent/runtime/cluster"
	"github.com/meshlet/meshlet/e2e/apiserver"
)

const ns = "kilo-system"

func repoFile(rel string) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..", rel)
}

// mesh is valid under both CRDs: the operator's form, a key in the
// kubeconfigSecretRef, two clusters.
func mesh(name string) string {
	return `apiVersion: kilo.squat.ai/v1alpha1
kind: ClusterMesh
metadata: {name: ` + name + `, namespace: kilo-system}
spec:
  clusters:
  - {name: cluster-a, local: true, podCIDRs: [10.244.0.0/16], wireguardCIDR: 10.4.0.0/24}
  - {name: cluster-b, kubeconfigSecretRef: {name: cluster-b-kubeconfig, key: kubeconfig}, podCIDRs: [10.2.0.0/16], wireguardCIDR: 100.66.1.0/24}
`
}

// recorder counts one client's requests: status applies per ClusterMesh
// (and the last body sent), and reads of the CRD.
type recorder struct {
	rt      http.RoundTripper
	mu      sync.Mutex
	applies map[string]int
	sent    map[string][]byte
	crdGets int
}

func (r *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	p := req.URL.Path
	r.mu.Lock()
	switch {
	case req.Method == http.MethodPatch && strings.HasSuffix(p, "/status") && strings.Contains(p, "/clustermeshes/"):
		name := filepath.Base(filepath.Dir(p))
		body, _ := io.ReadAll(req.Body)
		req.Body = io.NopCloser(bytes.NewReader(body))
		r.applies[name]++
		r.sent[name] = body
	case req.Method == http.MethodGet && strings.HasSuffix(p, "/customresourcedefinitions/"+clustermesh.CRDName):
		r.crdGets++
	}
	r.mu.Unlock()
	return r.rt.RoundTrip(req)
}

func (r *recorder) count(name string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.applies[name]
}

func (r *recorder) lastSent(t *testing.T, name string) map[string]any {
	t.Helper()
	r.mu.Lock()
	b := r.sent[name]
	r.mu.Unlock()
	var obj map[string]any
	if err := json.Unmarshal(b, &obj); err != nil {
		t.Fatalf("apply body of %s: %v (%s)", name, err, b)
	}
	st, _ := obj["status"].(map[string]any)
	return st
}

// world is what the writers' agents know: the watchers' states, the plan.
type world struct {
	mu      sync.Mutex
	remotes []cluster.RemoteStatus
	plan    topology.Plan
}

func (wd *world) set(f func(*world)) {
	wd.mu.Lock()
	defer wd.mu.Unlock()
	f(wd)
}

func (wd *world) Remotes() []cluster.RemoteStatus {
	wd.mu.Lock()
	defer wd.mu.Unlock()
	return append([]cluster.RemoteStatus(nil), wd.remotes...)
}

func (wd *world) Plan() topology.Plan {
	wd.mu.Lock()
	defer wd.mu.Unlock()
	p := wd.plan
	p.Rejections = append([]topology.Rejection(nil), p.Rejections...)
	return p
}

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time  { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Set(t time.Time) { c.mu.Lock(); defer c.mu.Unlock(); c.t = t }

// fixture is one API server with a ClusterMesh CRD installed.
type fixture struct {
	srv   *apiserver.Server
	kilo  rest.Interface // admin's
	world *world
	clock *clock
}

// writer makes a Writer for node identity whose requests rec counts; its
// meshes are read from the server (as an up-to-date informer has them).
func (f *fixture) writer(t *testing.T, identity string, noCRD bool) (*Writer, *recorder) {
	t.Helper()
	rec := &recorder{applies: map[string]int{}, sent: map[string][]byte{}}
	cfg := f.srv.AdminConfig()
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { rec.rt = rt; return rec }
	cfg.UserAgent = "meshlet/test"
	kilo, err := cluster.KiloClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	w := &Writer{Kilo: kilo, NoCRD: noCRD,
		Meshes: func() []*clustermesh.ClusterMesh { return f.meshes(t) }, Remotes: f.world.Remotes, Now: f.clock.Now,
		Log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})).With("writer", identity)}
	return w, rec
}

func (f *fixture) meshes(t *testing.T) []*clustermesh.ClusterMesh {
	var l clustermesh.ClusterMeshList
	if err := f.kilo.Get().Namespace(ns).Resource("clustermeshes").Do(context.Background()).Into(&l); err != nil {
		t.Logf("listing ClusterMeshes: %v", err)
		return nil
	}
	out := make([]*clustermesh.ClusterMesh, len(l.Items))
	for i := range l.Items {
		out[i] = &l.Items[i]
	}
	return out
}

// stored is a ClusterMesh as the server holds it: typed, and its status
// as JSON.
func (f *fixture) stored(t *testing.T, name string) (*clustermesh.ClusterMesh, map[string]any) {
	t.Helper()
	raw, err := f.kilo.Get().Namespace(ns).Resource("clustermeshes").Name(name).Do(context.Background()).Raw()
	if err != nil {
		t.Fatal(err)
	}
	var cm clustermesh.ClusterMesh
	var obj map[string]any
	if err := json.Unmarshal(raw, &cm); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &obj); err != nil {
		t.Fatal(err)
	}
	st, _ := obj["status"].(map[string]any)
	return &cm, st
}

// pass runs one more write pass of a leading writer after the world
// changed (Follow), and waits for it to end.
func pass(t *testing.T, w *Writer, wd *world) {
	t.Helper()
	settle(t, w)
	before := w.passes.Load()
	w.Follow(wd.Plan())
	waitFor(t, "a write pass", func() bool { return w.passes.Load() > before })
}

// settle waits until no pass runs or is due: none ended for 200 ms and no
// wake is pending.
func settle(t *testing.T, w *Writer) {
	t.Helper()
	n, since := w.passes.Load(), time.Now()
	waitFor(t, "the writer idle", func() bool {
		if m := w.passes.Load(); m != n || len(w.wake) > 0 {
			n, since = m, time.Now()
		}
		return time.Since(since) > 200*time.Millisecond
	})
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond) // poll interval
	}
}

var t0 = time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC)

// leaderPlan is a segment leader's plan peering with cluster-b's leader b-1
// (registeredPeers 1).
func leaderPlan() topology.Plan {
	return topology.Plan{Node: "a-1", Leader: true, StatusWriter: true, Remotes: []topology.RemoteInfo{{Cluster: "cluster-b", Mesh: ns + "/prod", Leaders: []string{"b-1"}, Synced: true}}}
}

func goodRemote() []cluster.RemoteStatus {
	return []cluster.RemoteStatus{{Cluster: "cluster-b", Synced: true, Ready: true, Nodes: 2, Peers: 1}}
}

// TestWriter runs the writer against a real API server with meshlet's CRD,
// then kilo-clustermesh-operator's (manifests/testdata), then meshlet's
// again with the CRD unreadable to the writer (no grant): what it writes
// is what the server keeps, so an unchanged status is not written again;
// conditions keep their transition times; another manager's status is left
// alone; one writer at a time, the node the plan names.
func TestWriter(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a kube-apiserver")
	}
	ctx := context.Background()
	srv := apiserver.Start(t, apiserver.Options{})
	admin := srv.AdminConfig()
	cs := kubernetes.NewForConfigOrDie(admin)
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	kilo, err := cluster.KiloClient(admin)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, crd string
		noCRD     bool
		// fields the stored status has, besides clusters[].name,
		// registeredPeers, skippedNodes and the conditions.
		meshletFields bool
	}{
		{name: "meshlet's CRD", crd: "manifests/crds/clustermeshes.kilo.squat.ai.yaml", meshletFields: true},
		{name: "the operator's CRD", crd: "manifests/testdata/kilo-clustermesh-operator/kilo.squat.ai_clustermeshes.yaml"},
		{name: "meshlet's CRD, unreadable", crd: "manifests/crds/clustermeshes.kilo.squat.ai.yaml", noCRD: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := apiserver.ApplyFile(ctx, admin, repoFile(tc.crd), apiserver.ApplyOptions{}); err != nil {
				t.Fatal(err)
			}
			defer deleteCRD(t, admin)
			if _, err := apiserver.Apply(ctx, admin, []byte(mesh("prod")), apiserver.ApplyOptions{}); err != nil {
				t.Fatal(err)
			}
			f := &fixture{srv: srv, kilo: kilo, world: &world{remotes: goodRemote(), plan: leaderPlan()}, clock: &clock{t: t0}}
			wctx, cancel := context.WithCancel(ctx)
			defer cancel()
			w, rec := f.writer(t, "a-1", tc.noCRD)
			w.Start(wctx)
			w.Follow(f.world.Plan())
			waitFor(t, "a-1 leading and a first pass", func() bool { return w.Leading() && w.passes.Load() > 0 })
			settle(t, w)

			t.Run("what is written is what the server keeps", func(t *testing.T) {
				cm, st := f.stored(t, "prod")
				if rec.count("prod") != 1 {
					t.Fatalf("%d status writes, want 1", rec.count("prod"))
				}
				if sent := rec.lastSent(t, "prod"); !reflect.DeepEqual(sent, st) {
					t.Errorf("the server kept\n%v\nof\n%v", st, sent)
				}
				c := cm.Status.Clusters
				if len(c) != 1 || c[0].Name != "cluster-b" || c[0].RegisteredPeers != 1 || c[0].SkippedNodes != 0 ||
					!meta.IsStatusConditionTrue(cm.Status.Conditions, clustermesh.ConditionReady) ||
					!meta.IsStatusConditionFalse(cm.Status.Conditions, clustermesh.ConditionNetworksOverlap) {
					t.Errorf("status %+v, want cluster-b with 1 registered peer, Ready, no overlap", cm.Status)
				}
				// meshlet's own fields, where the CRD keeps them.
				if got := cm.Status.ReadyClusters == "1/1" && c[0].Synced && c[0].Ready && c[0].Nodes == 2 && c[0].Peers == 1; got != tc.meshletFields {
					t.Errorf("meshlet's fields stored: %v, want %v (%+v)", got, tc.meshletFields, cm.Status)
				}
				if _, ok := st["readyClusters"]; ok != tc.meshletFields {
					t.Errorf("readyClusters stored: %v, want %v", ok, tc.meshletFields)
				}
				if !tc.meshletFields && !tc.noCRD {
					// Why this matters: the whole status, applied as the
					// writer did before it read the schema, is refused —
					// server-side apply does not prune, it fails on a field
					// the schema lacks (server-side dry-run).
					full, err := json.Marshal(map[string]any{"apiVersion": clustermesh.SchemeGroupVersion.String(), "kind": "ClusterMesh",
						"metadata": map[string]any{"name": "prod", "namespace": ns}, "status": buildStatus(w, cm)})
					if err != nil {
						t.Fatal(err)
					}
					err = kilo.Patch(types.ApplyPatchType).Namespace(ns).Resource("clustermeshes").Name("prod").SubResource("status").
						Param("fieldManager", FieldManager).Param("dryRun", "All").Body(full).Do(ctx).Error()
					if err == nil || !strings.Contains(err.Error(), "field not declared in schema") {
						t.Errorf("the whole status applied under %s: %v, want it refused (field not declared in schema)", tc.name, err)
					}
					t.Logf("the whole status, applied: %v", err)
				}
			})

			t.Run("an unchanged status is not written again", func(t *testing.T) {
				before, _ := f.stored(t, "prod")
				for i := 0; i < 3; i++ {
					f.clock.Set(t0.Add(time.Duration(i+1) * time.Minute))
					pass(t, w, f.world)
				}
				after, _ := f.stored(t, "prod")
				if n := rec.count("prod"); n != 1 || after.ResourceVersion != before.ResourceVersion {
					t.Errorf("%d status writes, resourceVersion %s → %s: want 1 write, no change", n, before.ResourceVersion, after.ResourceVersion)
				}
				if want := map[bool]int{false: 1, true: 0}[tc.noCRD]; rec.crdGets != want {
					t.Errorf("the CRD was read %d times, want %d (once per process, never without the grant)", rec.crdGets, want)
				}
			})

			t.Run("conditions keep their transition times", func(t *testing.T) {
				// A change both CRDs keep (a skipped node), Ready unchanged.
				f.clock.Set(t0.Add(time.Hour))
				f.world.set(func(wd *world) {
					wd.plan.Rejections = []topology.Rejection{{Object: topology.ObjectRef{Kind: "Node", Cluster: "cluster-b", Name: "b-9"}, Reason: topology.ReasonNoPublicKey}}
				})
				pass(t, w, f.world)
				cm, st := f.stored(t, "prod")
				if rec.count("prod") != 2 || len(cm.Status.Clusters) != 1 || cm.Status.Clusters[0].SkippedNodes != 1 {
					t.Fatalf("%d writes, status %+v: want a second write with 1 skipped node", rec.count("prod"), cm.Status)
				}
				if sent := rec.lastSent(t, "prod"); !reflect.DeepEqual(sent, st) {
					t.Errorf("the server kept\n%v\nof\n%v", st, sent)
				}
				for _, c := range cm.Status.Conditions {
					if !c.LastTransitionTime.Time.Equal(t0) {
						t.Errorf("%s changed its transition time to %v without a transition", c.Type, c.LastTransitionTime)
					}
				}
				// cluster-b unreachable: Ready turns False, now.
				f.clock.Set(t0.Add(2 * time.Hour))
				f.world.set(func(wd *world) { wd.remotes[0].Ready, wd.remotes[0].Error = false, "connection refused" })
				pass(t, w, f.world)
				cm, _ = f.stored(t, "prod")
				ready := meta.FindStatusCondition(cm.Status.Conditions, clustermesh.ConditionReady)
				overlap := meta.FindStatusCondition(cm.Status.Conditions, clustermesh.ConditionNetworksOverlap)
				if ready == nil || ready.Status != metav1.ConditionFalse || ready.Reason != clustermesh.ReasonNotReady || !ready.LastTransitionTime.Time.Equal(t0.Add(2*time.Hour)) {
					t.Errorf("Ready %+v, want False RemoteClusterNotReady since t0+2h", ready)
				}
				if overlap == nil || !overlap.LastTransitionTime.Time.Equal(t0) {
					t.Errorf("NetworksOverlap %+v, want its transition time kept", overlap)
				}
				// And back, then nothing more to write.
				f.world.set(func(wd *world) { wd.remotes, wd.plan = goodRemote(), leaderPlan() })
				pass(t, w, f.world)
				n := rec.count("prod")
				pass(t, w, f.world)
				if rec.count("prod") != n {
					t.Errorf("written again without a change")
				}
			})

			t.Run("another manager's status is left alone", func(t *testing.T) {
				if _, err := apiserver.Apply(ctx, admin, []byte(mesh("a-operator")), apiserver.ApplyOptions{}); err != nil {
					t.Fatal(err)
				}
				// As the operator writes it: an update of the status
				// subresource.
				cm, _ := f.stored(t, "a-operator")
				cm.APIVersion, cm.Kind = clustermesh.SchemeGroupVersion.String(), "ClusterMesh"
				cm.Status = clustermesh.ClusterMeshStatus{
					Clusters: []clustermesh.ClusterStatus{{Name: "cluster-b", RegisteredPeers: 7}},
					Conditions: []metav1.Condition{{Type: clustermesh.ConditionReady, Status: metav1.ConditionTrue, Reason: "Reconciled", Message: "ok",
						LastTransitionTime: metav1.NewTime(t0)}},
				}
				body, err := json.Marshal(cm)
				if err != nil {
					t.Fatal(err)
				}
				if err := kilo.Put().Namespace(ns).Resource("clustermeshes").Name("a-operator").SubResource("status").
					Param("fieldManager", "kilo-clustermesh-operator").Body(body).Do(ctx).Error(); err != nil {
					t.Fatal(err)
				}
				_, want := f.stored(t, "a-operator")
				pass(t, w, f.world)
				pass(t, w, f.world)
				after, got := f.stored(t, "a-operator")
				if !reflect.DeepEqual(got, want) {
					t.Errorf("the operator's status became\n%v\nwas\n%v", got, want)
				}
				for _, mf := range after.ManagedFields {
					if mf.Manager == FieldManager {
						t.Errorf("meshlet manages fields of a-operator: %s", mf.FieldsV1.GetRawString())
					}
				}
				if n := rec.count("a-operator"); n != 1 {
					t.Errorf("%d applies to a-operator, want 1 (refused: a conflict), then none", n)
				}
				if err := kilo.Delete().Namespace(ns).Resource("clustermeshes").Name("a-operator").Do(ctx).Error(); err != nil {
					t.Fatal(err)
				}
			})

			t.Run("the plan names one writer", func(t *testing.T) {
				w2, rec2 := f.writer(t, "a-2", tc.noCRD)
				w2.Start(wctx)
				// a-2's plan names a-1: it never writes, though the status
				// changes.
				notNamed := f.world.Plan()
				notNamed.StatusWriter = false
				w2.Follow(notNamed)
				f.world.set(func(wd *world) { wd.remotes[0].Nodes, wd.remotes[0].Peers = 3, 2 })
				pass(t, w, f.world)
				w2.Follow(notNamed)
				if w2.Leading() || !w.Leading() {
					t.Fatalf("a-1 writing %v, a-2 writing %v: want a-1 only", w.Leading(), w2.Leading())
				}
				if n := rec2.count("prod"); n != 0 || w2.passes.Load() != 0 {
					t.Errorf("a-2 wrote %d times (%d passes) while its plan named a-1", n, w2.passes.Load())
				}
				// Leadership moves: a-1's plan names a-2, a-2's names
				// itself; a-2 writes what changed since, a-1 stops.
				w.Follow(notNamed)
				f.world.set(func(wd *world) {
					wd.plan.Rejections = []topology.Rejection{{Object: topology.ObjectRef{Kind: "Node", Cluster: "cluster-b", Name: "b-8"}, Reason: topology.ReasonNoPublicKey}}
				})
				w2.Follow(f.world.Plan())
				if !w2.Leading() || w.Leading() {
					t.Fatalf("a-1 writing %v, a-2 writing %v: want a-2 only", w.Leading(), w2.Leading())
				}
				waitFor(t, "a-2's write", func() bool {
					cm, _ := f.stored(t, "prod")
					return len(cm.Status.Clusters) == 1 && cm.Status.Clusters[0].SkippedNodes == 1 && rec2.count("prod") > 0
				})
				n1 := rec.count("prod")
				pass(t, w2, f.world)
				if rec.count("prod") != n1 {
					t.Errorf("a-1 wrote after its plan named a-2")
				}
				cm, st := f.stored(t, "prod")
				if sent := rec2.lastSent(t, "prod"); !reflect.DeepEqual(sent, st) {
					t.Errorf("a-2's write: the server kept\n%v\nof\n%v", st, sent)
				}
				if got := len(cm.Status.Clusters) == 1 && cm.Status.Clusters[0].Nodes == 3; got != tc.meshletFields {
					t.Errorf("cluster-b's 3 nodes stored: %v, want %v", got, tc.meshletFields)
				}
				w2.Follow(notNamed)
				if w2.Leading() {
					t.Errorf("a-2 still writing after its plan named another node")
				}
			})
		})
	}
}

// buildStatus is the whole status the writer would build for cm now.
func buildStatus(w *Writer, cm *clustermesh.ClusterMesh) clustermesh.ClusterMeshStatus {
	remotes := map[string]clustermesh.RemoteState{}
	for _, r := range w.Remotes() {
		remotes[r.Cluster] = clustermesh.RemoteState{Watched: true, Synced: r.Synced, Ready: r.Ready, Nodes: r.Nodes, Peers: r.Peers, Leaders: 1}
	}
	return clustermesh.BuildStatus(cm, "", remotes, nil, w.Now())
}

// deleteCRD deletes the ClusterMesh CRD (and so every ClusterMesh) and waits
// until it is gone, for the next CRD.
func deleteCRD(t *testing.T, cfg *rest.Config) {
	t.Helper()
	ctx := context.Background()
	crds := dynamic.NewForConfigOrDie(cfg).Resource(schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"})
	if err := crds.Delete(ctx, clustermesh.CRDName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the CRD gone", func() bool {
		_, err := crds.Get(ctx, clustermesh.CRDName, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
}
