package runner_test

// The agent against two real kube-apiservers (local and remote), with the
// shipped RBAC and an injected fake data plane: watchers, planner, loop,
// annotation publishing, Events, remote watchers, Secret rotation and an
// API outage, for real.

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"

	"github.com/meshlet/meshlet/agent/core/clustermesh"
	"github.com/meshlet/meshlet/agent/core/kilo"
	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/agent/runtime/cluster"
	"github.com/meshlet/meshlet/agent/runtime/config"
	"github.com/meshlet/meshlet/agent/runtime/meshstatus"
	"github.com/meshlet/meshlet/agent/runtime/reconcile"
	"github.com/meshlet/meshlet/agent/runtime/runner"
	"github.com/meshlet/meshlet/e2e/apiserver"
	"github.com/meshlet/meshlet/wg"
)

// fakeWG records every applied device; tests wait on it.
type fakeWG struct {
	mu      sync.Mutex
	applied []applied
	wake    chan struct{}
}

type applied struct {
	at  time.Time
	dev topology.Device
}

func newFakeWG() *fakeWG { return &fakeWG{wake: make(chan struct{}, 1)} }

func (f *fakeWG) ActOnSessions(context.Context, *topology.SessionActions) error { return nil }
func (f *fakeWG) InitiateHandshakes(context.Context) (int, error)               { return 0, nil }

func (f *fakeWG) Apply(_ context.Context, d topology.Device) (reconcile.Changes, error) {
	f.mu.Lock()
	f.applied = append(f.applied, applied{time.Now(), d})
	f.mu.Unlock()
	select {
	case f.wake <- struct{}{}:
	default:
	}
	return reconcile.Changes{}, nil
}

func (f *fakeWG) Stats(context.Context) (wg.DeviceStats, error) { return wg.DeviceStats{}, nil }

func (f *fakeWG) count() int { f.mu.Lock(); defer f.mu.Unlock(); return len(f.applied) }

func (f *fakeWG) since(i int) []applied {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]applied(nil), f.applied[i:]...)
}

// waitFor returns the first device applied after index from that satisfies
// ok, failing at the deadline.
func (f *fakeWG) waitFor(t *testing.T, from int, timeout time.Duration, what string, ok func(topology.Device) bool) applied {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		for _, a := range f.since(from) {
			if ok(a.dev) {
				return a
			}
		}
		select {
		case <-f.wake:
		case <-deadline.C:
			last := f.since(0)
			t.Fatalf("timed out after %v waiting for %s; last device: %+v", timeout, what, last[len(last)-1].dev.Peers)
		}
	}
}

type fakeHost struct{}

func (fakeHost) Apply(context.Context, topology.Plan) (reconcile.Changes, error) { return nil, nil }

type fakeSelf struct{ self topology.Self }

func (f fakeSelf) Self(context.Context) (topology.Self, error) { return f.self, nil }

func repoFile(t *testing.T, rel string) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..", rel)
}

func applyFiles(t *testing.T, cfg *rest.Config, files ...string) {
	t.Helper()
	for _, f := range files {
		if _, err := apiserver.ApplyFile(context.Background(), cfg, repoFile(t, f), apiserver.ApplyOptions{}); err != nil {
			t.Fatalf("applying %s: %v", f, err)
		}
	}
}

func key(i byte) topology.Key {
	var k topology.Key
	k[0], k[31] = i, 0x42
	return k
}

func node(name, loc, priv, pod string, k topology.Key, extra map[string]string) *corev1.Node {
	ann := map[string]string{
		topology.AnnotationKey:        k.String(),
		topology.AnnotationEndpoint:   strings.Split(priv, "/")[0] + ":51820",
		topology.AnnotationInternalIP: priv,
		topology.AnnotationLastSeen:   fmt.Sprint(time.Now().Unix()),
		topology.AnnotationLocation:   loc,
	}
	for k, v := range extra {
		ann[k] = v
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: ann},
		Spec:       corev1.NodeSpec{PodCIDR: pod, PodCIDRs: []string{pod}},
	}
}

func peerNamed(d topology.Device, name string) (topology.WireGuardPeer, bool) {
	for _, p := range d.Peers {
		if p.Name == name {
			return p, true
		}
	}
	return topology.WireGuardPeer{}, false
}

func patchAnnotations(t *testing.T, cs kubernetes.Interface, name string, ann map[string]string) {
	t.Helper()
	b, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": ann}})
	if _, err := cs.CoreV1().Nodes().Patch(context.Background(), name, types.MergePatchType, b, metav1.PatchOptions{}); err != nil {
		t.Fatalf("patching %s: %v", name, err)
	}
}

// remoteKubeconfig puts the kubeconfig of remote's read-only ServiceAccount
// (the shipped remote ClusterRole) in the local Secret name, and returns
// its configuration.
func remoteKubeconfig(ctx context.Context, t *testing.T, ladmin kubernetes.Interface, remote *apiserver.Server, name string) *rest.Config {
	t.Helper()
	ro := remote.ServiceAccountConfig(ctx, "kilo-system", "meshlet-remote")
	if _, err := ladmin.CoreV1().Secrets("kilo-system").Create(ctx, kubeconfigSecret(t, ro, name), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return ro
}

func kubeconfigSecret(t *testing.T, cfg *rest.Config, name string) *corev1.Secret {
	t.Helper()
	kc, err := apiserver.Kubeconfig(cfg, "cluster-b")
	if err != nil {
		t.Fatal(err)
	}
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "kilo-system"}, Data: map[string][]byte{"kubeconfig": kc}}
}

// agentConfig is the agents' configuration in these tests: kg's defaults.
func agentConfig() config.Config {
	var cfg config.Config
	cfg.Interface, cfg.Port, cfg.Subnet, cfg.Granularity, cfg.Encapsulate, cfg.MTU = "kilo0", 51820, "10.4.0.0/16", "location", "always", "auto"
	cfg.Namespace, cfg.ResyncPeriod, cfg.Local, cfg.TopologyLabel = "kilo-system", 30*time.Second, true, "topology.kubernetes.io/region"
	return cfg
}

// a1Options run the agent of a-1 (key 1, 192.168.1.1/24 on eth0) with a
// fake data plane.
func a1Options(cfg config.Config, rc *rest.Config, w runner.WireGuard, level slog.Level) runner.Options {
	return runner.Options{
		Config: cfg, Node: "a-1", RestConfig: rc,
		WireGuard: w, Host: fakeHost{},
		Self: fakeSelf{topology.Self{PublicKey: key(1), DefaultInterface: "eth0", Version: "v1",
			Addresses: []topology.HostAddress{{Interface: "eth0", Prefix: netip.MustParsePrefix("192.168.1.1/24")}}}},
		Log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})), RemoteProbe: 300 * time.Millisecond,
	}
}

func TestAgentAgainstRealAPIServers(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two kube-apiservers")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	local := apiserver.Start(t, apiserver.Options{})
	remote := apiserver.Start(t, apiserver.Options{})
	applyFiles(t, local.AdminConfig(), "manifests/namespace/namespace.yaml", "manifests/crds/peers.kilo.squat.ai.yaml",
		"manifests/crds/clustermeshes.kilo.squat.ai.yaml", "manifests/base/rbac.yaml")
	// The Secrets its ClusterMeshes name, by name (the base grants none).
	grantSecrets(t, local, "cluster-b-kubeconfig", "cluster-c-kubeconfig")
	applyFiles(t, remote.AdminConfig(), "manifests/remote/namespace.yaml", "manifests/crds/peers.kilo.squat.ai.yaml", "manifests/remote/rbac.yaml")
	ladmin := kubernetes.NewForConfigOrDie(local.AdminConfig())
	radmin := kubernetes.NewForConfigOrDie(remote.AdminConfig())

	// Local cluster: a-1 (this node, location x) and a-2 (location y).
	// Remote cluster-b: leader b-1 and non-leader b-2.
	for _, n := range []*corev1.Node{
		node("a-1", "x", "192.168.1.1/24", "10.244.1.0/24", key(1), nil),
		node("a-2", "y", "192.168.2.1/24", "10.244.2.0/24", key(2), nil),
	} {
		if _, err := ladmin.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// The agent refreshes its own last-seen; the harness keeps a-2 and the
	// remote nodes fresh like their agents would.
	go keepFresh(ctx, ladmin, "a-2")
	for _, n := range []*corev1.Node{
		node("b-1", "z", "172.16.0.1/24", "10.2.1.0/24", key(11), map[string]string{topology.AnnotationWireGuardIP: "100.66.1.1/24"}),
		node("b-2", "z", "172.16.0.2/24", "10.2.2.0/24", key(12), nil),
	} {
		if _, err := radmin.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	go keepFresh(ctx, radmin, "b-1", "b-2")

	// The remote credentials: a read-only ServiceAccount bound to the shipped
	// remote ClusterRole.
	remoteRO := remoteKubeconfig(ctx, t, ladmin, remote, "cluster-b-kubeconfig")
	mesh := []byte(`
apiVersion: kilo.squat.ai/v1alpha1
kind: ClusterMesh
metadata: {name: prod, namespace: kilo-system}
spec:
  clusters:
  - name: cluster-a
    local: true
    allowedNetworks: [10.244.0.0/16, 10.4.0.0/24]
  - name: cluster-b
    kubeconfigSecretRef: {name: cluster-b-kubeconfig, key: kubeconfig}
    allowedNetworks: [10.2.0.0/16, 100.66.1.0/24]
    persistentKeepalive: 25
`)
	if _, err := apiserver.Apply(ctx, local.AdminConfig(), mesh, apiserver.ApplyOptions{}); err != nil {
		t.Fatal(err)
	}

	// The agent runs with exactly the shipped local RBAC.
	cfg := agentConfig()
	cfg.ClusterMeshStatus = true
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	wg := newFakeWG()
	agentCfg := local.ServiceAccountConfig(ctx, "kilo-system", "meshlet")
	if err := apiserver.WaitAuthorized(ctx, agentCfg, apiserver.AgentGrants("kilo-system")...); err != nil {
		t.Fatal(err)
	}
	if err := apiserver.WaitAuthorized(ctx, remoteRO, apiserver.RemoteGrants()...); err != nil {
		t.Fatal(err)
	}
	agentCfg.UserAgent = "meshlet/test" // as meshlet run's: apiserver.ByMeshlet
	agent, err := runner.New(a1Options(cfg, agentCfg, wg, slog.LevelInfo))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- agent.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	first := wg.waitFor(t, 0, 60*time.Second, "the remote leader b-1 as a peer", func(d topology.Device) bool {
		p, ok := peerNamed(d, "b-1")
		return ok && p.Kind == topology.KindRemote && p.PersistentKeepalive == 25
	})
	b1, _ := peerNamed(first.dev, "b-1")
	wantIPs := []netip.Prefix{netip.MustParsePrefix("10.2.0.0/16"), netip.MustParsePrefix("10.2.1.0/24"),
		netip.MustParsePrefix("10.2.2.0/24"), netip.MustParsePrefix("100.66.1.0/24"), netip.MustParsePrefix("100.66.1.1/32")}
	if fmt.Sprint(b1.AllowedIPs) != fmt.Sprint(wantIPs) {
		t.Errorf("b-1 allowed IPs = %v, want %v", b1.AllowedIPs, wantIPs)
	}

	t.Run("publishes Kilo annotations in Kilo's formats", func(t *testing.T) {
		n := waitNode(t, ladmin, "a-1", func(n *corev1.Node) bool { return n.Annotations[topology.AnnotationWireGuardIP] != "" })
		a := n.Annotations
		if k, err := kilo.ParseKeyAnnotation(a[topology.AnnotationKey]); err != nil || k != key(1) {
			t.Errorf("key = %q (%v)", a[topology.AnnotationKey], err)
		}
		if e, err := kilo.ParseEndpoint(a[topology.AnnotationEndpoint]); err != nil || e.String() != "192.168.1.1:51820" {
			t.Errorf("endpoint = %q (%v)", a[topology.AnnotationEndpoint], err)
		}
		if a[topology.AnnotationInternalIP] != "192.168.1.1/24" || a[topology.AnnotationWireGuardIP] != "10.4.0.1/16" ||
			a[topology.AnnotationGranularity] != "location" || a[topology.AnnotationDiscoveredEndpoints] != "{}" {
			t.Errorf("annotations = %v", a)
		}
		if ls, err := kilo.ParseLastSeen(a[topology.AnnotationLastSeen]); err != nil || time.Since(ls) > time.Minute {
			t.Errorf("last-seen = %q (%v)", a[topology.AnnotationLastSeen], err)
		}
	})

	kiloAdmin, err := cluster.KiloClient(local.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Run("ClusterMesh status: written by the node the plan names, with cluster-b's counts", func(t *testing.T) {
		// registeredPeers: the remote leaders peered with (b-1 leads
		// location z, b-2 follows), from the plan after the watcher's list.
		st := waitMeshStatus(t, kiloAdmin, "prod", "Ready True ClustersReady, cluster-b 2 nodes, 1 leader peered", func(st clustermesh.ClusterMeshStatus) bool {
			c := meta.FindStatusCondition(st.Conditions, clustermesh.ConditionReady)
			return c != nil && c.Status == metav1.ConditionTrue && c.Reason == clustermesh.ReasonClustersReady &&
				len(st.Clusters) == 1 && st.Clusters[0].Name == "cluster-b" && st.Clusters[0].Nodes == 2 && st.Clusters[0].Synced && st.Clusters[0].Ready &&
				st.Clusters[0].RegisteredPeers == 1
		})
		if c := st.Clusters[0]; c.SkippedNodes != 0 {
			t.Errorf("cluster-b status %+v, want 0 skipped", c)
		}
		// a-1 leads the only segment that runs meshlet.
		if run, ok := agent.Loop.Last(); !ok || !run.Plan.StatusWriter {
			t.Errorf("a-1's last plan: statusWriter %v (a run: %v), want true", run.Plan.StatusWriter, ok)
		}
	})

	t.Run("a remote annotation change reaches the device within 1s", func(t *testing.T) {
		var lat []time.Duration
		for i := 0; i < 5; i++ {
			ep := fmt.Sprintf("198.51.100.%d:51820", 10+i)
			from := wg.count()
			start := time.Now()
			patchAnnotations(t, radmin, "b-1", map[string]string{topology.AnnotationClusterMeshEndpoint: ep})
			got := wg.waitFor(t, from, 10*time.Second, "b-1 at "+ep, func(d topology.Device) bool {
				p, ok := peerNamed(d, "b-1")
				return ok && p.Endpoint == ep
			})
			lat = append(lat, got.at.Sub(start))
		}
		sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
		// Reported, not asserted (a shared 2-core machine); the deadline of
		// each wait is the assertion.
		t.Logf("remote annotation → device: min %v, median %v, max %v", lat[0], lat[len(lat)/2], lat[len(lat)-1])
	})

	t.Run("invalid input becomes an Event and a metric", func(t *testing.T) {
		bad := []byte(`
apiVersion: kilo.squat.ai/v1alpha1
kind: Peer
metadata: {name: bad-key}
spec: {allowedIPs: [10.5.0.1/32], publicKey: "not-a-key"}
`)
		applied, err := apiserver.Apply(ctx, local.AdminConfig(), bad, apiserver.ApplyOptions{})
		if err != nil || len(applied) != 1 {
			t.Fatal(err)
		}
		peer := applied[0]
		deadline := time.Now().Add(20 * time.Second)
		for {
			evs, err := ladmin.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=bad-key"})
			if err != nil {
				t.Fatal(err)
			}
			// With the Peer's UID, `kubectl describe peer bad-key` lists it.
			if len(evs.Items) == 1 && evs.Items[0].Reason == string(topology.ReasonInvalidKey) && evs.Items[0].InvolvedObject.Kind == "Peer" &&
				evs.Items[0].InvolvedObject.UID == peer.GetUID() {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("no InvalidKey event for Peer bad-key: %+v", evs.Items)
			}
			waitTick()
		}
		if v := testutil.ToFloat64(agent.Metrics.Rejections.WithLabelValues(string(topology.ReasonInvalidKey))); v != 1 {
			t.Errorf("meshlet_rejections_total{reason=InvalidKey} = %v, want 1 (once, not at every resync)", v)
		}
		// Every other peer still works.
		if _, ok := peerNamed(wg.since(wg.count() - 1)[0].dev, "b-1"); !ok {
			t.Error("b-1 lost after an invalid Peer")
		}
	})

	t.Run("a bad ClusterMesh edit is rejected and changes nothing", func(t *testing.T) {
		from := wg.count()
		bad := strings.Replace(string(mesh), "allowedNetworks: [10.2.0.0/16, 100.66.1.0/24]", "allowedNetworks: [10.2.0.0/16, 10.244.7.0/24]", 1)
		if _, err := apiserver.Apply(ctx, local.AdminConfig(), []byte(bad), apiserver.ApplyOptions{}); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(20 * time.Second)
		for {
			evs, err := ladmin.CoreV1().Events("kilo-system").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=prod"})
			if err != nil {
				t.Fatal(err)
			}
			if len(evs.Items) > 0 && evs.Items[0].Reason == string(topology.ReasonNetworksOverlap) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("no NetworksOverlap event on the ClusterMesh: %+v", evs.Items)
			}
			waitTick()
		}
		// Make sure runs after the edit have applied, then check that none
		// of them let the rejected edit through.
		patchAnnotations(t, radmin, "b-1", map[string]string{topology.AnnotationClusterMeshEndpoint: "198.51.100.50:51820"})
		wg.waitFor(t, from, 10*time.Second, "a run after the bad edit", func(d topology.Device) bool {
			p, ok := peerNamed(d, "b-1")
			return ok && p.Endpoint == "198.51.100.50:51820"
		})
		for _, a := range wg.since(from) {
			if p, ok := peerNamed(a.dev, "b-1"); !ok || !slices.Contains(p.AllowedIPs, netip.MustParsePrefix("100.66.1.0/24")) {
				t.Fatalf("the rejected edit reached the device: %+v", a.dev.Peers)
			}
		}
		waitMeshStatus(t, kiloAdmin, "prod", "Ready False and NetworksOverlap True", func(st clustermesh.ClusterMeshStatus) bool {
			return meta.IsStatusConditionFalse(st.Conditions, clustermesh.ConditionReady) &&
				meta.IsStatusConditionTrue(st.Conditions, clustermesh.ConditionNetworksOverlap)
		})
		if _, err := apiserver.Apply(ctx, local.AdminConfig(), mesh, apiserver.ApplyOptions{}); err != nil {
			t.Fatal(err)
		}
		waitMeshStatus(t, kiloAdmin, "prod", "Ready True again", func(st clustermesh.ClusterMeshStatus) bool {
			return meta.IsStatusConditionTrue(st.Conditions, clustermesh.ConditionReady)
		})
	})

	t.Run("a remote API outage keeps the plan and resumes", func(t *testing.T) {
		from := wg.count()
		remote.Stop()
		waitGauge(t, agent, 0)
		waitMeshStatus(t, kiloAdmin, "prod", "Ready False RemoteClusterNotReady", func(st clustermesh.ClusterMeshStatus) bool {
			c := meta.FindStatusCondition(st.Conditions, clustermesh.ConditionReady)
			return c != nil && c.Status == metav1.ConditionFalse && c.Reason == clustermesh.ReasonNotReady && len(st.Clusters) == 1 && st.Clusters[0].Nodes == 2
		})
		// Nothing is removed while the remote API is down.
		for _, a := range wg.since(from) {
			if _, ok := peerNamed(a.dev, "b-1"); !ok {
				t.Fatalf("b-1 removed during the outage: %+v", a.dev.Peers)
			}
		}
		remote.Start()
		waitGauge(t, agent, 1)
		from = wg.count()
		patchAnnotations(t, radmin, "b-1", map[string]string{topology.AnnotationClusterMeshEndpoint: "198.51.100.99:51820"})
		wg.waitFor(t, from, 20*time.Second, "b-1's endpoint changed after the outage", func(d topology.Device) bool {
			p, ok := peerNamed(d, "b-1")
			return ok && p.Endpoint == "198.51.100.99:51820"
		})
	})

	t.Run("a rotated kubeconfig Secret switches the remote client live", func(t *testing.T) {
		// New credentials for another read-only ServiceAccount; then the old
		// one is deleted, which revokes its token: updates keep flowing only
		// if meshlet switched.
		sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "meshlet-remote-2", Namespace: "kilo-system"}}
		if _, err := radmin.CoreV1().ServiceAccounts("kilo-system").Create(ctx, sa, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		crb := []byte(`
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: meshlet-remote-2}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: meshlet-remote}
subjects: [{kind: ServiceAccount, name: meshlet-remote-2, namespace: kilo-system}]
`)
		if _, err := apiserver.Apply(ctx, remote.AdminConfig(), crb, apiserver.ApplyOptions{}); err != nil {
			t.Fatal(err)
		}
		newCfg := remote.ServiceAccountConfig(ctx, "kilo-system", "meshlet-remote-2")
		if _, err := ladmin.CoreV1().Secrets("kilo-system").Update(ctx, kubeconfigSecret(t, newCfg, "cluster-b-kubeconfig"), metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		// Wait until the new connection is in use: a change made now is
		// seen, then revoke the old credentials.
		from := wg.count()
		patchAnnotations(t, radmin, "b-1", map[string]string{topology.AnnotationClusterMeshEndpoint: "198.51.100.100:51820"})
		wg.waitFor(t, from, 20*time.Second, "the change after rotation", func(d topology.Device) bool {
			p, ok := peerNamed(d, "b-1")
			return ok && p.Endpoint == "198.51.100.100:51820"
		})
		t.Logf("revoking meshlet-remote at %s", time.Now().UTC().Format(time.RFC3339Nano))
		if err := radmin.CoreV1().ServiceAccounts("kilo-system").Delete(ctx, "meshlet-remote", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		from = wg.count()
		patchAnnotations(t, radmin, "b-1", map[string]string{topology.AnnotationClusterMeshEndpoint: "198.51.100.101:51820"})
		wg.waitFor(t, from, 20*time.Second, "a change seen with the rotated credentials only", func(d topology.Device) bool {
			p, ok := peerNamed(d, "b-1")
			return ok && p.Endpoint == "198.51.100.101:51820"
		})
	})

	t.Run("ClusterMesh status another manager writes is left alone", func(t *testing.T) {
		// Named to come before prod: the writer handles meshes by name, so
		// prod's status changing proves it went past this one.
		other := []byte(`
apiVersion: kilo.squat.ai/v1alpha1
kind: ClusterMesh
metadata: {name: a-operator, namespace: kilo-system}
spec:
  clusters:
  - {name: cluster-a, local: true, allowedNetworks: [10.244.0.0/16, 10.4.0.0/24]}
  - {name: cluster-c, kubeconfigSecretRef: {name: cluster-c-kubeconfig, key: kubeconfig}, allowedNetworks: [10.3.0.0/16]}
`)
		if _, err := apiserver.Apply(ctx, local.AdminConfig(), other, apiserver.ApplyOptions{}); err != nil {
			t.Fatal(err)
		}
		// As the operator does: an update of the status subresource (retried:
		// meshlet may write it first, as it does for every mesh).
		meshletFirst := false
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			var cm clustermesh.ClusterMesh
			if err := kiloAdmin.Get().Namespace("kilo-system").Resource("clustermeshes").Name("a-operator").Do(ctx).Into(&cm); err != nil {
				return err
			}
			meshletFirst = slices.ContainsFunc(cm.ManagedFields, func(mf metav1.ManagedFieldsEntry) bool { return mf.Manager == meshstatus.FieldManager })
			cm.APIVersion, cm.Kind = clustermesh.SchemeGroupVersion.String(), "ClusterMesh"
			cm.Status = clustermesh.ClusterMeshStatus{
				Clusters:   []clustermesh.ClusterStatus{{Name: "cluster-c", RegisteredPeers: 7}},
				Conditions: []metav1.Condition{{Type: clustermesh.ConditionReady, Status: metav1.ConditionTrue, Reason: "Reconciled", LastTransitionTime: metav1.Now()}},
			}
			body, _ := json.Marshal(cm)
			return kiloAdmin.Put().Namespace("kilo-system").Resource("clustermeshes").Name("a-operator").SubResource("status").
				Param("fieldManager", "kilo-clustermesh-operator").Body(body).Do(ctx).Error()
		})
		if err != nil {
			t.Fatal(err)
		}
		// A change prod's status shows: a third node in cluster-b.
		if _, err := radmin.CoreV1().Nodes().Create(ctx, node("b-3", "w", "172.16.0.3/24", "10.2.3.0/24", key(13), nil), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		go keepFresh(ctx, radmin, "b-3")
		waitMeshStatus(t, kiloAdmin, "prod", "cluster-b with 3 nodes", func(st clustermesh.ClusterMeshStatus) bool {
			return len(st.Clusters) == 1 && st.Clusters[0].Nodes == 3
		})
		var after clustermesh.ClusterMesh
		if err := kiloAdmin.Get().Namespace("kilo-system").Resource("clustermeshes").Name("a-operator").Do(ctx).Into(&after); err != nil {
			t.Fatal(err)
		}
		if len(after.Status.Clusters) != 1 || after.Status.Clusters[0].RegisteredPeers != 7 || after.Status.Conditions[0].Reason != "Reconciled" {
			t.Errorf("the operator's status was overwritten: %+v", after.Status)
		}
		for _, mf := range after.ManagedFields {
			if mf.Manager != meshstatus.FieldManager {
				continue
			}
			// Had meshlet written first, it keeps the fields the operator's
			// update left as they were (a condition's type, a transition time
			// of the same second), never one the operator wrote.
			owned := mf.FieldsV1.GetRawString()
			if !meshletFirst {
				t.Errorf("meshlet manages fields of a-operator: %s", owned)
				continue
			}
			for _, leaf := range []string{`"f:clusters"`, `"f:readyClusters"`, `"f:reason":{}`, `"f:message":{}`, `"f:status":{}`} {
				if strings.Contains(owned, leaf) {
					t.Errorf("meshlet manages %s of a-operator, a field the operator wrote: %s", leaf, owned)
				}
			}
		}
	})

	// Everything above ran with exactly the shipped RBAC (manifests/base on
	// the local cluster, manifests/remote on the remote one): the agent
	// made no request either API server refused.
	t.Run("RBAC: the shipped grants are enough", func(t *testing.T) {
		for name, srv := range map[string]*apiserver.Server{"local": local, "remote": remote} {
			refused, err := srv.Forbidden(apiserver.ByMeshlet)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range refused {
				t.Errorf("%s API server refused: %s", name, r)
			}
		}
	})

	t.Run("RBAC: remote credentials are read-only, local role is minimal", func(t *testing.T) {
		ro := kubernetes.NewForConfigOrDie(remote.ServiceAccountConfig(ctx, "kilo-system", "meshlet-remote-2"))
		if _, err := ro.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); err != nil {
			t.Errorf("remote role cannot list nodes: %v", err)
		}
		_, err := ro.CoreV1().Nodes().Patch(ctx, "b-1", types.MergePatchType, []byte(`{"metadata":{"labels":{"x":"y"}}}`), metav1.PatchOptions{})
		if !apierrors.IsForbidden(err) {
			t.Errorf("remote role may patch nodes: %v", err)
		}
		if err := ro.CoreV1().Nodes().Delete(ctx, "b-2", metav1.DeleteOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("remote role may delete nodes: %v", err)
		}
		if _, err := ro.CoreV1().Secrets("kilo-system").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("remote role may read secrets: %v", err)
		}
		lo := kubernetes.NewForConfigOrDie(local.ServiceAccountConfig(ctx, "kilo-system", "meshlet"))
		if _, err := lo.CoreV1().Secrets("default").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("local role may read secrets outside its namespace: %v", err)
		}
		if err := lo.CoreV1().Nodes().Delete(ctx, "a-2", metav1.DeleteOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("local role may delete nodes: %v", err)
		}
	})
}

// keepFresh refreshes last-seen like a running agent would, every 5 s.
func keepFresh(ctx context.Context, cs kubernetes.Interface, names ...string) {
	t := time.NewTicker(5 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, n := range names {
			b, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{
				topology.AnnotationLastSeen: fmt.Sprint(time.Now().Unix())}}})
			_, _ = cs.CoreV1().Nodes().Patch(ctx, n, types.MergePatchType, b, metav1.PatchOptions{})
		}
	}
}

func waitNode(t *testing.T, cs kubernetes.Interface, name string, ok func(*corev1.Node) bool) *corev1.Node {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		n, err := cs.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
		if err == nil && ok(n) {
			return n
		}
		if time.Now().After(deadline) {
			t.Fatalf("node %s never got there: %v %v", name, err, n)
		}
		waitTick()
	}
}

// waitMeshStatus polls a ClusterMesh's status until ok.
func waitMeshStatus(t *testing.T, kiloREST rest.Interface, name, what string, ok func(clustermesh.ClusterMeshStatus) bool) clustermesh.ClusterMeshStatus {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var cm clustermesh.ClusterMesh
		err := kiloREST.Get().Namespace("kilo-system").Resource("clustermeshes").Name(name).Do(context.Background()).Into(&cm)
		if err == nil && ok(cm.Status) {
			return cm.Status
		}
		if time.Now().After(deadline) {
			t.Fatalf("ClusterMesh %s: timed out waiting for %s; status %+v (%v)", name, what, cm.Status, err)
		}
		waitTick()
	}
}

func waitGauge(t *testing.T, a *runner.Agent, want float64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for testutil.ToFloat64(a.Metrics.RemoteClusterReady.WithLabelValues("cluster-b")) != want {
		if time.Now().After(deadline) {
			t.Fatalf("meshlet_remote_cluster_ready{cluster-b} never became %v", want)
		}
		waitTick()
	}
}

// waitTick paces polling of state that has no change notification we can
// subscribe to from the test (API reads, gauges); it is never the thing
// that makes a test pass.
func waitTick() { time.Sleep(50 * time.Millisecond) }
